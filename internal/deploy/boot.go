// Boot: an instance started normally, with no checkpoint engine, from a writable clone of its
// environment.

package deploy

import (
	"context"
	"fmt"
)

// Boot runs an instance of app with no checkpoint engine: a writable clone
// of its environment, mapped and mounted, and the app booted in the boot
// image's container. reason is recorded in Deployment.BootReason. On error
// nothing of it is left.
func (d *Deployer) Boot(ctx context.Context, app App, opts Options, reason string) (_ Deployment, err error) {
	app = app.WithDefaults()
	if err := app.Validate(); err != nil {
		return Deployment{}, err
	}
	if opts.ID == "" {
		opts.ID = NewID(app.Name)
	}
	if err := ValidateID(opts.ID); err != nil {
		return Deployment{}, err
	}
	env, err := d.deps.Envs.Get(ctx, app.Env)
	if err != nil {
		return Deployment{}, fmt.Errorf("env %q of app %s: %w", app.Env, app.Name, err)
	}
	if _, err := d.deps.Envs.CheckDepth(ctx, env.Ref, app.Env); err != nil {
		return Deployment{}, err
	}
	if err := d.CheckBoot(ctx); err != nil {
		return Deployment{}, err
	}
	dr := d.deps.Container
	o, err := d.begin(opts.ID, app.Name, 0, PhaseBooting, opts.Progress)
	if err != nil {
		return Deployment{}, err
	}
	o.rec.Mode, o.rec.BootReason = ModeBoot, reason
	defer o.undoOnError(ctx, &err)
	id := opts.ID
	if err := o.own([]string{InstancePrefix + id + "-env"}, []string{id + "-env"}); err != nil {
		return Deployment{}, err
	}
	envPath, _, err := o.cloneMapMount(ctx, env.Ref, nil, 0)
	if err != nil {
		return Deployment{}, err
	}
	h, err := d.start(ctx, o, dr, Run{Mode: RunBoot, ID: id, App: app, EnvPath: envPath,
		ImageEnv: env.Config.Env, WorkDir: env.Config.WorkDir})
	if err != nil {
		return Deployment{}, err
	}
	if err := d.waitReady(ctx, dr, h, app, false); err != nil {
		return Deployment{}, err
	}
	o.phase("ready")
	return d.running(ctx, o, dr, h, app, "boot_ready")
}
