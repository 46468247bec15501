// Restore: an instance restored from clones of a generation's sealed snapshots.

package deploy

import (
	"context"
)

// Restore runs a new instance from generation g: clone both snapshots, map
// and mount the clones, restart the app from its checkpoint and wait until
// it is ready. On error nothing of it is left.
func (d *Deployer) Restore(ctx context.Context, g Generation, opts Options) (_ Deployment, err error) {
	app := g.Spec.WithDefaults()
	if opts.ID == "" {
		opts.ID = NewID(app.Name)
	}
	if err := ValidateID(opts.ID); err != nil {
		return Deployment{}, err
	}
	if _, err := d.deps.Envs.CheckDepth(ctx, g.EnvSnap, app.Env); err != nil {
		return Deployment{}, err
	}
	dr, err := d.driver(g.Engine)
	if err != nil {
		return Deployment{}, err
	}
	o, err := d.begin(opts.ID, app.Name, g.Gen, PhaseRestoring, opts.Progress)
	if err != nil {
		return Deployment{}, err
	}
	o.rec.Mode = ModeRestore
	defer o.undoOnError(ctx, &err)
	id := opts.ID
	if err := o.own([]string{InstancePrefix + id + "-env", InstancePrefix + id + "-ckpt"}, []string{id + "-env", id + "-ckpt"}); err != nil {
		return Deployment{}, err
	}
	envPath, ckptPath, err := o.cloneMapMount(ctx, g.EnvSnap, &g.CkptSnap, 0)
	if err != nil {
		return Deployment{}, err
	}
	cfg := g.EnvConfig
	if cfg == nil {
		env, _ := d.deps.Envs.Get(ctx, app.Env)
		cfg = &env.Config
	}
	h, err := d.start(ctx, o, dr, Run{Mode: RunRestart, ID: id, App: app, EnvPath: envPath, CkptPath: ckptPath, Gen: g.Gen,
		ImageEnv: cfg.Env, WorkDir: cfg.WorkDir})
	if err != nil {
		return Deployment{}, err
	}
	if err := d.waitReady(ctx, dr, h, app, true); err != nil {
		return Deployment{}, err
	}
	o.phase("ready")
	return d.running(ctx, o, dr, h, app, "restart_ready")
}
