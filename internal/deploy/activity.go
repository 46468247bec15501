package deploy

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/fogdeploy/fogdeploy/internal/activity"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// Activity samples what deployment id's running instance is doing: the CPU
// time of its processes and the connections established on its ports
// (internal/activity), for an idle suspend.
func (d *Deployer) Activity(ctx context.Context, id string) (activity.Sample, error) {
	rec, err := d.recs.Load(id)
	if err != nil {
		return activity.Sample{}, err
	}
	if rec.Phase != spec.PhaseRunning || rec.Handle == nil {
		return activity.Sample{}, fmt.Errorf("deployment %s is %s: %w", id, rec.Phase, ErrNotSuspendable)
	}
	dr := d.drv.driverByName(rec.Handle.Driver)
	if dr == nil {
		return activity.Sample{}, fmt.Errorf("%w: driver %q of deployment %s", drivers.ErrDriver, rec.Handle.Driver, id)
	}
	pid, err := dr.NetPid(ctx, *rec.Handle)
	if err != nil {
		return activity.Sample{}, err
	}
	var ports []int
	for key := range rec.Ports {
		if p, _, ok := strings.Cut(key, "/"); ok {
			if n, err := strconv.Atoi(p); err == nil {
				ports = append(ports, n)
			}
		}
	}
	return activity.Of(pid, ports)
}
