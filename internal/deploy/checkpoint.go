// Checkpoint: the first deploy of an app boots it under its engine, waits until it is ready,
// checkpoints it and seals both images as a new generation.

package deploy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/spec"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// CheckpointAll produces app's next generation with its engine, or, for an
// app of engine auto, one with each engine this node has that can
// checkpoint it (in spec.Engines' order). It fails only when none could.
func (d *Deployer) CheckpointAll(ctx context.Context, app spec.App, opts CheckpointOptions) ([]spec.Generation, error) {
	app = app.WithDefaults()
	if app.Engine != spec.EngineAuto {
		g, err := d.Checkpoint(ctx, app, opts)
		if err != nil {
			return nil, err
		}
		return []spec.Generation{g}, nil
	}
	var gens []spec.Generation
	var errs []error
	for _, eng := range d.drv.Engines(ctx) {
		if _, err := d.drv.driver(app, eng); err != nil {
			d.log.Info("engine auto: not checkpointing with this engine", "app", app.Name, "engine", eng, "reason", err)
			continue
		}
		o := opts
		if opts.Progress != nil {
			o.Progress = func(phase string, took time.Duration) { opts.Progress(string(eng)+"."+phase, took) }
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
			return nil, fmt.Errorf("%w: app %s (engine auto): no engine on this node can checkpoint it", drivers.ErrDriver, app.Name)
		}
		return nil, fmt.Errorf("app %s (engine auto): no engine could checkpoint it: %w", app.Name, errors.Join(errs...))
	}
	return gens, nil
}

// Checkpoint boots app on a clone of its environment, waits until it is
// ready, checkpoints it into a new checkpoint image and seals both images:
// the next generation. On error nothing of it is left.
func (d *Deployer) Checkpoint(ctx context.Context, app spec.App, opts CheckpointOptions) (_ spec.Generation, err error) {
	app = app.WithDefaults()
	env, dr, version, err := d.checkpointable(ctx, app)
	if err != nil {
		return spec.Generation{}, err
	}
	n, err := d.ckpts.nextGen(ctx, app.Name)
	if err != nil {
		return spec.Generation{}, err
	}
	// The slot's images are the generation's: they are sealed in place.
	s, err := d.pool.newSlot(app.Name, n, drivers.RunLaunch, false, "", []string{catalog.GenImage(app.Name, n, "env"), catalog.GenImage(app.Name, n, "ckpt")})
	if err != nil {
		return spec.Generation{}, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, d.pool.ReleaseSlot(context.WithoutCancel(ctx), s.ID))
		}
	}()
	o := d.stages.newOp(&s.Timings, opts.Progress)
	d.log.Info("booting app for its checkpoint", "app", app.Name, "gen", n, "env", env.Ref.String(), "driver", dr.Name(), "slot", s.ID)
	if err := d.stages.provision(ctx, o, s, slotSource{app: app, engine: app.Engine, env: env.Ref, ckptSize: app.CheckpointBytes(),
		config: env.Config}); err != nil {
		return spec.Generation{}, err
	}
	dr, h, err := d.stages.startReady(ctx, o, s, "", app, false)
	if err != nil {
		return spec.Generation{}, err
	}
	bootReady := s.Timings[len(s.Timings)-1].Duration
	if opts.Prepare != nil {
		if err := opts.Prepare(ctx, Target{Ports: h.Ports, Root: h.EnvPath}); err != nil {
			return spec.Generation{}, fmt.Errorf("prepare app %s for its checkpoint: %w", app.Name, err)
		}
		o.phase("prepare")
	}
	ck, err := dr.Checkpoint(ctx, h)
	if err != nil {
		return spec.Generation{}, err
	}
	o.phase("checkpoint")
	if ck.EngineVersion != "" {
		version = ck.EngineVersion
	}
	g := spec.Generation{App: app.Name, Gen: n, Env: app.Env, EnvFrom: env.Ref,
		EnvSnap:  layering.SnapRef{Image: s.Images[0], Snap: layering.SealedSnap},
		CkptSnap: layering.SnapRef{Image: s.Images[1], Snap: layering.SealedSnap},
		Engine:   app.Engine, EngineVersion: version, Driver: dr.Name(), Bytes: ck.Bytes, CheckpointMS: ck.MS,
		BootReadyMS: float64(bootReady.Microseconds()) / 1000, Node: d.cfg.Node, Spec: app, EnvConfig: &env.Config, Platform: &d.platform}
	if err := d.seal(ctx, o, s, dr, h, ck.Exited, &g); err != nil {
		return spec.Generation{}, err
	}
	d.log.Info("checkpoint generation sealed", "app", app.Name, "gen", n, "bytes", ck.Bytes, "timings", g.Timings.String())
	return g, nil
}

// checkpointable checks that app (with defaults) can be checkpointed on
// this node: its spec, one engine, its environment (and its chain's
// depth), and the driver and engine that run it.
func (d *Deployer) checkpointable(ctx context.Context, app spec.App) (env layering.Environment, dr drivers.Driver, version string, err error) {
	if err := app.Validate(); err != nil {
		return env, nil, "", err
	}
	if app.Engine == spec.EngineAuto {
		return env, nil, "", fmt.Errorf("app %s: checkpoint with one engine (CheckpointAll checkpoints with each): %w", app.Name, spec.ErrInvalidSpec)
	}
	if env, err = d.deps.Envs.Get(ctx, app.Env); err != nil {
		return env, nil, "", fmt.Errorf("env %q of app %s: %w", app.Env, app.Name, err)
	}
	if _, err := d.deps.Envs.CheckDepth(ctx, env.Ref, app.Env); err != nil {
		return env, nil, "", err
	}
	if dr, err = d.drv.driver(app, app.Engine); err != nil {
		return env, nil, "", err
	}
	version, err = dr.Check(ctx, app.Engine)
	return env, dr, version, err
}

// seal makes generation g of the checkpointed slot s: the checkpoint
// stopped the app, so its instance is removed, the node keeps a copy of
// what was written, both images are unmounted and unmapped (which flushes
// them through every mapper backend: fsfreeze alone does not reach RBD
// through rbd-fuse's page cache), snapshotted and protected, and the
// generation's record is written last on the checkpoint image: that makes
// it visible. The slot then goes, its images now the generation's. An
// instance whose processes are gone (exited: they held its mounts) is
// removed meanwhile.
func (d *Deployer) seal(ctx context.Context, o *op, s *Slot, dr drivers.Driver, h drivers.Handle, exited bool, g *spec.Generation) error {
	removed := async(func() error { return dr.Remove(ctx, h) })
	defer func() { _ = removed() }()
	if !exited {
		if err := removed(); err != nil {
			return err
		}
	}
	// This node keeps a copy of what was just written (in the page
	// cache), for its restores to read instead of fetching it.
	stage := d.ckpts.stageCheckpoint(ctx, s, h.CkptPath)
	o.phase("stage")
	if err := d.releaseMappings(ctx, s.Mappings); err != nil {
		return err
	}
	if err := both(
		func() error { return d.deps.Store.Snapshot(ctx, g.EnvSnap) },
		func() error { return d.deps.Store.Snapshot(ctx, g.CkptSnap) }); err != nil {
		return err
	}
	if err := removed(); err != nil {
		return err
	}
	o.phase("seal")
	g.Created, g.Timings = time.Now().UTC(), s.Timings
	raw, err := json.Marshal(g)
	if err != nil {
		return err
	}
	if err := d.deps.Store.SetMeta(ctx, g.CkptSnap.Image, map[string]string{catalog.MetaGeneration: string(raw)}); err != nil {
		return err
	}
	d.ckpts.adoptCheckpoint(*g, stage)
	s.Images, s.Mappings, s.Handle = nil, nil, nil
	if err := d.pool.slots.Save(s.ID, s); err != nil {
		return err
	}
	if err := removeDir(s.Dir); err != nil {
		d.log.Warn("the sealed slot's directory stays", "slot", s.ID, "err", err)
	}
	return d.pool.slots.Remove(s.ID)
}
