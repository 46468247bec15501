// Checkpoint: the first deploy of an app boots it under its engine, waits until it is ready,
// checkpoints it and seals both images as a new generation.

package deploy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// CheckpointAll produces app's next generation with its engine, or, for an
// app of engine auto, one with each engine this node has that can
// checkpoint it (in spec.Engines' order). It fails only when none could.
func (d *Deployer) CheckpointAll(ctx context.Context, app App, opts CheckpointOptions) ([]Generation, error) {
	app = app.WithDefaults()
	if app.Engine != EngineAuto {
		g, err := d.Checkpoint(ctx, app, opts)
		if err != nil {
			return nil, err
		}
		return []Generation{g}, nil
	}
	var gens []Generation
	var errs []error
	for _, eng := range d.Engines(ctx) {
		if why := app.CanCheckpointWith(eng); why != "" {
			d.log.Info("engine auto: not checkpointing with this engine", "app", app.Name, "engine", eng, "reason", why)
			continue
		}
		o := opts
		if opts.Progress != nil {
			o.Progress = func(phase string, took time.Duration) { opts.Progress(eng+"."+phase, took) }
		}
		g, err := d.Checkpoint(ctx, app.WithEngine(eng), o)
		if err != nil {
			d.log.Warn("engine auto: checkpointing with this engine failed; the others are used", "app", app.Name, "engine", eng, "err", err)
			errs = append(errs, fmt.Errorf("%s: %w", eng, err))
			continue
		}
		gens = append(gens, g)
	}
	if len(gens) == 0 {
		if len(errs) == 0 {
			return nil, fmt.Errorf("%w: app %s (engine auto): no engine on this node can checkpoint it", ErrDriver, app.Name)
		}
		return nil, fmt.Errorf("app %s (engine auto): no engine could checkpoint it: %w", app.Name, errors.Join(errs...))
	}
	return gens, nil
}

// Checkpoint boots app on a clone of its environment, waits until it is
// ready, checkpoints it into a new checkpoint image and seals both images:
// the next generation. On error nothing of it is left.
func (d *Deployer) Checkpoint(ctx context.Context, app App, opts CheckpointOptions) (_ Generation, err error) {
	app = app.WithDefaults()
	if err := app.Validate(); err != nil {
		return Generation{}, err
	}
	if app.Engine == EngineAuto {
		return Generation{}, fmt.Errorf("app %s: checkpoint with one engine (CheckpointAll checkpoints with each): %w", app.Name, ErrInvalidSpec)
	}
	env, err := d.deps.Envs.Get(ctx, app.Env)
	if err != nil {
		return Generation{}, fmt.Errorf("env %q of app %s: %w", app.Env, app.Name, err)
	}
	if _, err := d.deps.Envs.CheckDepth(ctx, env.Ref, app.Env); err != nil {
		return Generation{}, err
	}
	dr, err := d.driver(app, app.Engine)
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
	envImg, ckptImg := GenImage(app.Name, n, "env"), GenImage(app.Name, n, "ckpt")
	// The slot's images are the generation's: they are sealed in place.
	s, err := d.newSlot(app.Name, n, RunLaunch, false, "", []string{envImg, ckptImg})
	if err != nil {
		return Generation{}, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, d.ReleaseSlot(context.WithoutCancel(ctx), s.ID))
		}
	}()
	o := d.newOp(&s.Timings, opts.Progress)
	d.log.Info("booting app for its checkpoint", "app", app.Name, "gen", n, "env", env.Ref.String(), "driver", dr.Name(), "slot", s.ID)
	if err := d.provision(ctx, o, s, slotSource{app: app, engine: app.Engine, env: env.Ref, ckptSize: app.CheckpointBytes(),
		config: env.Config}); err != nil {
		return Generation{}, err
	}
	dr, h, err := d.startReady(ctx, o, s, "", app, false)
	if err != nil {
		return Generation{}, err
	}
	bootReady := s.Timings[len(s.Timings)-1].Duration
	if opts.Prepare != nil {
		if err := opts.Prepare(ctx, Target{Ports: h.Ports, Root: h.EnvPath}); err != nil {
			return Generation{}, fmt.Errorf("prepare app %s for its checkpoint: %w", app.Name, err)
		}
		o.phase("prepare")
	}
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
	// This node keeps a copy of what was just written (in the page
	// cache), for its restores to read instead of fetching it.
	stage := d.stageCheckpoint(ctx, s, h.CkptPath)
	o.phase("stage")
	if err := d.releaseMappings(ctx, s.Mappings); err != nil {
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
	g.Created, g.Timings = time.Now().UTC(), s.Timings
	raw, err := json.Marshal(g)
	if err != nil {
		return Generation{}, err
	}
	// The record on the checkpoint image is what makes the generation
	// visible: it is written last.
	if err := d.deps.Store.SetMeta(ctx, ckptImg, map[string]string{MetaGeneration: string(raw)}); err != nil {
		return Generation{}, err
	}
	d.adoptCheckpoint(g, stage)
	// The images now belong to the generation.
	s.Images, s.Mappings, s.Handle = nil, nil, nil
	if err := d.slots.save(s.ID, s); err != nil {
		return Generation{}, err
	}
	if err := removeDir(s.Dir); err != nil {
		d.log.Warn("the sealed slot's directory stays", "slot", s.ID, "err", err)
	}
	if err := d.slots.remove(s.ID); err != nil {
		return Generation{}, err
	}
	d.log.Info("checkpoint generation sealed", "app", app.Name, "gen", n, "bytes", ck.Bytes, "timings", g.Timings.String())
	return g, nil
}
