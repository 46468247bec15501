// Boot: an instance started normally, with no checkpoint engine, from a writable clone of its
// environment: provision, start (boot), ready, bind.

package deploy

import (
	"context"
	"fmt"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// Boot runs an instance of app with no checkpoint engine: a slot with a
// writable clone of its environment, mapped and mounted, and the app
// booted in the boot image's container. reason is recorded in
// Deployment.BootReason. On error nothing of it is left.
func (d *Deployer) Boot(ctx context.Context, app spec.App, opts Options, reason string) (_ Deployment, err error) {
	app = app.WithDefaults()
	if err := app.Validate(); err != nil {
		return Deployment{}, err
	}
	if opts.ID == "" {
		opts.ID = spec.NewID(app.Name)
	}
	if err := spec.ValidateID(opts.ID); err != nil {
		return Deployment{}, err
	}
	env, err := d.deps.Envs.Get(ctx, app.Env)
	if err != nil {
		return Deployment{}, fmt.Errorf("env %q of app %s: %w", app.Env, app.Name, err)
	}
	if _, err := d.deps.Envs.CheckDepth(ctx, env.Ref, app.Env); err != nil {
		return Deployment{}, err
	}
	if err := d.drv.CheckBoot(ctx); err != nil {
		return Deployment{}, err
	}
	rec := &Deployment{ID: opts.ID, App: app.Name, Created: time.Now().UTC(), Instance: spec.Instance{Node: d.cfg.Node, Phase: spec.PhaseBooting, Mode: spec.ModeBoot, BootReason: reason, Limits: d.limitsOf(app)}}
	if err := d.recs.create(rec); err != nil {
		return Deployment{}, err
	}
	defer d.undoOnError(ctx, rec, &err)
	o := d.stages.newOp(&rec.Timings, opts.Progress)
	s, err := d.provisionFor(ctx, o, rec, app, drivers.RunBoot, 0, nil, slotSource{app: app, env: env.Ref, config: env.Config, background: opts.Background})
	if err != nil {
		return Deployment{}, err
	}
	dr, _, err := d.stages.startReady(ctx, o, s, rec.ID, app, false)
	if err != nil {
		return Deployment{}, err
	}
	return d.bind(ctx, o, s, rec, dr, app, "boot_ready")
}
