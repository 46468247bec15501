package deploy

import (
	"context"
	"fmt"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// Alive reports whether the instance of Running deployment id still runs
// (a container that exited, or was removed with its dockerd, does not). An
// error means that it cannot tell: no such Running record, or the driver
// does not answer (dockerd restarting).
func (d *Deployer) Alive(ctx context.Context, id string) (bool, error) {
	rec, err := d.recs.Load(id)
	if err != nil {
		return false, err
	}
	if rec.Phase != spec.PhaseRunning || rec.Handle == nil {
		return false, fmt.Errorf("deployment %s is %s, not Running: %w", id, rec.Phase, spec.ErrNotFound)
	}
	dr := d.drv.driverByName(rec.Handle.Driver)
	if dr == nil {
		return false, fmt.Errorf("%w: driver %q of deployment %s", drivers.ErrDriver, rec.Handle.Driver, id)
	}
	return dr.Running(ctx, *rec.Handle)
}
