package deploy

import (
	"context"
	"fmt"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// Drivers is which driver runs an app on this node: the engine's
// (Config's per-engine driver), the container driver for a boot without
// an engine, and a host driver only for the apps it may run (trusted, as
// root). It checks that the engine behind each works.
type Drivers struct {
	*node
}

// driver is the driver of app's instances under engine eng. A host
// driver that cannot bound its instances (no cgroups: Host.Limited) runs
// only apps the operator marked trusted (ErrUntrusted).
func (dv *Drivers) driver(app spec.App, eng engine.Name) (drivers.Driver, error) {
	dr, err := dv.engineDriver(eng)
	if err != nil {
		return nil, err
	}
	if dr == dv.deps.Host && !hostLimited(dr) && !app.Trusted {
		return nil, hint.With(fmt.Errorf("%w: app %s under the %s engine: %w", drivers.ErrDriver, app.Name, eng, ErrUntrusted),
			"this node's host driver cannot bound its instances (no cgroup memory, pids and cpu controllers it can use): mark the app `trusted: true` only if you trust it not to exhaust the node, or run the engine in the light container (agent.drivers: {"+string(eng)+": container})")
	}
	if dr == dv.deps.Host && app.User != "" {
		return nil, hint.With(fmt.Errorf("%w: app %s runs as user %s: the host driver runs apps as root", drivers.ErrDriver, app.Name, app.User),
			"run the "+string(eng)+" engine in the light container (agent.drivers: {"+string(eng)+": container}), which runs an app as its user")
	}
	return dr, nil
}

// hostLimited says whether host driver dr bounds its instances.
func hostLimited(dr drivers.Driver) bool {
	l, ok := dr.(interface{ Limited() bool })
	return ok && l.Limited()
}

// engineDriver is the driver this node runs engine eng's apps with.
func (dv *Drivers) engineDriver(eng engine.Name) (drivers.Driver, error) {
	var dr drivers.Driver
	switch {
	case dv.cfg.DriverOf(eng) == spec.DriverContainer:
		dr = dv.deps.Container
	default:
		dr = dv.deps.Host
	}
	if dr == nil {
		return nil, fmt.Errorf("%w: no driver configured for the %s engine", drivers.ErrDriver, eng)
	}
	return dr, nil
}

// driverByRun is the driver of an instance in mode of an app with engine
// eng: the Container driver boots apps without an engine.
func (dv *Drivers) driverByRun(app spec.App, mode drivers.RunMode, eng engine.Name) (drivers.Driver, error) {
	if mode != drivers.RunBoot {
		return dv.driver(app, eng)
	}
	if dv.deps.Container == nil {
		return nil, fmt.Errorf("%w: booting without an engine needs the container driver", drivers.ErrDriver)
	}
	return dv.deps.Container, nil
}

// Host returns the host driver (nil if none).
func (dv *Drivers) Host() drivers.Driver { return dv.deps.Host }

// Check reports whether this node can deploy app: the spec, the
// environment, and the engine behind its driver.
func (dv *Drivers) Check(ctx context.Context, app spec.App) (driver, version string, err error) {
	app = app.WithDefaults()
	if err := app.Validate(); err != nil {
		return "", "", err
	}
	if _, err := dv.deps.Envs.Get(ctx, app.Env); err != nil {
		return "", "", fmt.Errorf("env %q of app %s: %w", app.Env, app.Name, err)
	}
	eng, version, err := dv.engineOf(ctx, app)
	if err != nil {
		return "", "", err
	}
	dr, _ := dv.engineDriver(eng)
	return dr.Name(), version, nil
}

// engineOf checks the engine app (validated) runs under on this node, the
// first this node has for engine auto (whose driver runs app), and returns
// it with its version.
func (dv *Drivers) engineOf(ctx context.Context, app spec.App) (eng engine.Name, version string, err error) {
	eng = app.Engine
	if eng == spec.EngineAuto {
		var engs []engine.Name
		for _, e := range dv.Engines(ctx) {
			if _, err := dv.driver(app, e); err == nil {
				engs = append(engs, e)
			}
		}
		if len(engs) == 0 {
			return "", "", fmt.Errorf("%w: app %s (engine auto): this node has no checkpoint engine that runs it", drivers.ErrDriver, app.Name)
		}
		eng = engs[0]
	}
	if _, err := dv.driver(app, eng); err != nil {
		return "", "", err
	}
	_, version, err = dv.CheckEngine(ctx, eng)
	return eng, version, err
}

// Engines lists the checkpoint engines this node can run (spec.Engines'
// order).
func (dv *Drivers) Engines(ctx context.Context) []engine.Name {
	var out []engine.Name
	for _, e := range spec.Engines {
		if _, _, err := dv.CheckEngine(ctx, e); err == nil {
			out = append(out, e)
		}
	}
	return out
}

// CheckEngine reports whether this node can run apps with the named engine,
// through which driver and at which engine version.
func (dv *Drivers) CheckEngine(ctx context.Context, eng engine.Name) (driver, version string, err error) {
	dr, err := dv.engineDriver(eng)
	if err != nil {
		return "", "", err
	}
	v, err := dr.Check(ctx, eng)
	return dr.Name(), v, err
}

// CheckBoot reports whether this node can boot apps with no checkpoint
// engine (the boot image of the Container driver).
func (dv *Drivers) CheckBoot(ctx context.Context) error {
	c, ok := dv.deps.Container.(*drivers.Container)
	if !ok || c == nil {
		return fmt.Errorf("%w: booting without an engine needs the container driver", drivers.ErrDriver)
	}
	return c.CheckBoot(ctx)
}

func (dv *Drivers) driverByName(name string) drivers.Driver {
	for _, dr := range []drivers.Driver{dv.deps.Container, dv.deps.Host} {
		if dr != nil && dr.Name() == name {
			return dr
		}
	}
	return nil
}

// Drivers returns the node's choice of drivers.
func (d *Deployer) Drivers() *Drivers { return d.drv }
