// Checkpoint: the first deploy of an app boots it under its engine, waits until it is ready,
// checkpoints it and seals both images as a new generation.

package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// Checkpoint boots app on a clone of its environment, waits until it is
// ready, checkpoints it into a new checkpoint image and seals both images:
// the next generation. On error nothing of it is left.
func (d *Deployer) Checkpoint(ctx context.Context, app App, opts CheckpointOptions) (_ Generation, err error) {
	app = app.WithDefaults()
	if err := app.Validate(); err != nil {
		return Generation{}, err
	}
	env, err := d.deps.Envs.Get(ctx, app.Env)
	if err != nil {
		return Generation{}, fmt.Errorf("env %q of app %s: %w", app.Env, app.Name, err)
	}
	if _, err := d.deps.Envs.CheckDepth(ctx, env.Ref, app.Env); err != nil {
		return Generation{}, err
	}
	dr, err := d.driver(app.Engine)
	if err != nil {
		return Generation{}, err
	}
	version, err := dr.Check(ctx, app.Engine)
	if err != nil {
		return Generation{}, err
	}
	n, err := d.nextGen(ctx, app.Name)
	if err != nil {
		return Generation{}, err
	}
	id := fmt.Sprintf("boot-%s-%d", app.Name, n)
	if len(id) > 60 {
		id = fmt.Sprintf("boot-%s-%d", NewID(app.Name)[:20], n)
	}
	o, err := d.begin(id, app.Name, n, PhaseBooting, opts.Progress)
	if err != nil {
		return Generation{}, err
	}
	defer o.undoOnError(ctx, &err)
	envImg, ckptImg := GenImage(app.Name, n, "env"), GenImage(app.Name, n, "ckpt")
	if err := o.own([]string{envImg, ckptImg}, []string{id + "-env", id + "-ckpt"}); err != nil {
		return Generation{}, err
	}
	d.log.Info("booting app for its checkpoint", "app", app.Name, "gen", n, "env", env.Ref.String(), "driver", dr.Name())
	envPath, ckptPath, err := o.cloneMapMount(ctx, env.Ref, nil, app.checkpointBytes())
	if err != nil {
		return Generation{}, err
	}
	h, err := d.start(ctx, o, dr, Run{Mode: RunLaunch, ID: id, App: app, EnvPath: envPath, CkptPath: ckptPath, Gen: n,
		ImageEnv: env.Config.Env, WorkDir: env.Config.WorkDir})
	if err != nil {
		return Generation{}, err
	}
	if err := d.waitReady(ctx, dr, h, app, false); err != nil {
		return Generation{}, err
	}
	o.phase("ready")
	bootReady := o.rec.Timings[len(o.rec.Timings)-1].Duration
	if opts.Prepare != nil {
		if err := opts.Prepare(ctx, Target{Ports: h.Ports, Root: envPath}); err != nil {
			return Generation{}, fmt.Errorf("prepare app %s for its checkpoint: %w", app.Name, err)
		}
		o.phase("prepare")
	}
	o.rec.Phase = PhaseCheckpoint
	_ = d.save(o.rec)
	ck, err := dr.Checkpoint(ctx, h)
	if err != nil {
		return Generation{}, err
	}
	o.phase("checkpoint")
	if ck.EngineVersion != "" {
		version = ck.EngineVersion
	}
	// The checkpoint stopped the app. Unmount and unmap both images, which
	// flushes them through every mapper backend (fsfreeze alone does not
	// reach RBD through rbd-fuse's page cache), then snapshot and protect.
	if err := dr.Remove(ctx, h); err != nil {
		return Generation{}, err
	}
	if err := d.release(ctx, o.rec); err != nil {
		return Generation{}, err
	}
	g := Generation{App: app.Name, Gen: n, Env: app.Env, EnvFrom: env.Ref,
		EnvSnap:  layering.SnapRef{Image: envImg, Snap: layering.SealedSnap},
		CkptSnap: layering.SnapRef{Image: ckptImg, Snap: layering.SealedSnap},
		Engine:   app.Engine, EngineVersion: version, Driver: dr.Name(), Bytes: ck.Bytes, CheckpointMS: ck.MS,
		BootReadyMS: float64(bootReady.Microseconds()) / 1000, Node: d.cfg.Node, Spec: app, EnvConfig: &env.Config, Platform: &d.platform}
	for _, ref := range []layering.SnapRef{g.EnvSnap, g.CkptSnap} {
		if err := d.deps.Store.Snapshot(ctx, ref); err != nil {
			return Generation{}, err
		}
	}
	o.phase("seal")
	g.Created, g.Timings = time.Now().UTC(), o.rec.Timings
	raw, err := json.Marshal(g)
	if err != nil {
		return Generation{}, err
	}
	// The record on the checkpoint image is what makes the generation
	// visible: it is written last.
	if err := d.deps.Store.SetMeta(ctx, ckptImg, MetaGeneration, string(raw)); err != nil {
		return Generation{}, err
	}
	// The images now belong to the generation.
	o.rec.Images, o.rec.Mappings = nil, nil
	if err := d.save(o.rec); err != nil {
		return Generation{}, err
	}
	if err := d.remove(o.rec.ID); err != nil {
		return Generation{}, err
	}
	d.log.Info("checkpoint generation sealed", "app", app.Name, "gen", n, "bytes", ck.Bytes, "timings", g.Timings.String())
	return g, nil
}
