package deploy

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/cgroup"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/hint"
)

// TestHostDriverTrustedOnly: on a node whose DMTCP driver is "host" and
// cannot bound its instances (no cgroups), an app runs under DMTCP only if
// its spec says trusted; CRIU, in the container, runs every app, and
// engine auto picks it for an untrusted one. Where the host driver bounds
// its instances, it runs every app.
func TestHostDriverTrustedOnly(t *testing.T) {
	host, container := &drivers.Host{}, &drivers.Container{}
	d := &Deployer{drv: &Drivers{node: &node{cfg: Config{Drivers: map[engine.Name]spec.DriverName{engine.NameDMTCP: spec.DriverHost}}, deps: Deps{Host: host, Container: container}}}}
	stranger := spec.App{Name: "chat", Engine: engine.NameDMTCP}
	_, err := d.drv.driver(stranger, engine.NameDMTCP)
	if !errors.Is(err, ErrUntrusted) || !errors.Is(err, drivers.ErrDriver) {
		t.Fatalf("untrusted app under the host driver: %v; want ErrUntrusted and ErrDriver", err)
	}
	if h := hint.Of(err); !strings.Contains(h, "trusted: true") || !strings.Contains(h, "agent.drivers: {dmtcp: container}") {
		t.Errorf("hint %q; want both ways out", h)
	}
	if dr, err := d.drv.driver(stranger, engine.NameCRIU); err != nil || dr != drivers.Driver(container) {
		t.Errorf("untrusted app under the container driver: %v, %v; want the container", dr, err)
	}
	trusted := stranger
	trusted.Trusted = true
	if dr, err := d.drv.driver(trusted, engine.NameDMTCP); err != nil || dr != drivers.Driver(host) {
		t.Errorf("trusted app under the host driver: %v, %v; want the host driver", dr, err)
	}
	// A boot needs no engine: the container, trusted or not.
	if dr, err := d.drv.driverByRun(stranger, drivers.RunBoot, engine.NameDMTCP); err != nil || dr != drivers.Driver(container) {
		t.Errorf("boot of an untrusted app: %v, %v; want the container", dr, err)
	}
	if _, _, err := d.drv.engineOf(context.Background(), stranger); !errors.Is(err, ErrUntrusted) {
		t.Errorf("engineOf(untrusted, dmtcp) = %v; want ErrUntrusted", err)
	}
	host.Groups = fakeGroups{}
	if dr, err := d.drv.driver(stranger, engine.NameDMTCP); err != nil || dr != drivers.Driver(host) {
		t.Errorf("untrusted app under a host driver that bounds its instances: %v, %v; want the host driver", dr, err)
	}
}

// fakeGroups stands for a node's cgroups (internal/cgroup's suite runs
// the real ones).
type fakeGroups struct{ cgroup.Groups }
