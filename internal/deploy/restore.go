// Restore: an instance restored from a generation's sealed snapshots, in a warm pool's slot when
// one is idle (start, ready, bind), else in a slot provisioned for it (provision first).

package deploy

import (
	"context"
	"errors"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// Restore runs a new instance from generation g: it takes an idle pool
// slot of g if there is one (a pool hit: only start, ready and bind are
// left), else provisions a slot of its own (clones of both snapshots,
// mapped and mounted, the instance created), then restarts the app from
// its checkpoint and waits until it is ready. On error nothing of it is
// left.
func (d *Deployer) Restore(ctx context.Context, g spec.Generation, opts Options) (Deployment, error) {
	return d.restore(ctx, g, opts, g.Spec, 0, nil)
}

// restore is Restore with the post_restore command and lazy of current,
// the app's spec as it is now; resolved is how long its deploy took to
// look up the generation (its first phase, StepResolve, when not 0).
// fresh, when set, says whether g is still the app's newest (pooledGen,
// knownGen): a pool hit or a restore into a spare slot goes on meanwhile
// and waits for it before it binds, a miss before it provisions.
func (d *Deployer) restore(ctx context.Context, g spec.Generation, opts Options, current spec.App, resolved time.Duration, fresh func() error) (_ Deployment, err error) {
	if fresh == nil {
		fresh = func() error { return nil }
	}
	app := restoredSpec(g, current)
	if opts.ID == "" {
		opts.ID = spec.NewID(app.Name)
	}
	if err := spec.ValidateID(opts.ID); err != nil {
		return Deployment{}, err
	}
	if _, err := d.drv.driver(app, g.Engine); err != nil {
		return Deployment{}, err
	}
	id := opts.ID
	rec := &Deployment{ID: id, App: app.Name, Created: time.Now().UTC(), Instance: spec.Instance{Node: d.cfg.Node, Phase: spec.PhaseRestoring, Gen: g.Gen, Engine: g.Engine, Mode: spec.ModeRestore, Limits: d.limitsOf(app), Reason: opts.Reason}}
	if resolved > 0 {
		rec.Timings = layering.Timings{{Name: string(StepResolve), Duration: resolved}}
		if opts.Progress != nil {
			opts.Progress(string(StepResolve), resolved)
		}
	}
	o := d.stages.newOp(&rec.Timings, opts.Progress)
	s, err := d.claimFor(ctx, o, app.Name, g.Gen, id, opts.NoPool)
	switch {
	case err == nil:
		rec.Slot, rec.Pool = s.ID, spec.PoolHit
		// A pool hit writes its deployment's record once, when it binds
		// the slot: until then the slot's record owns everything, and an
		// error releases the slot.
		done, terr := d.hitTurn(ctx, o)
		if terr != nil {
			// Cancelled while it waited: the slot is as it was claimed.
			d.pool.unclaim(s.ID)
			return Deployment{}, terr
		}
		defer done()
		defer func() {
			if err != nil {
				err = errors.Join(err, d.pool.ReleaseSlot(context.WithoutCancel(ctx), s.ID))
			}
		}()
	case errors.Is(err, ErrNoSlot):
		if s, err = d.slotFor(ctx, o, rec, app, g, opts, fresh); err != nil {
			return Deployment{}, err
		}
		defer d.undoOnError(ctx, rec, &err)
	default:
		return Deployment{}, err
	}
	rec.Ahead = s.Ahead
	dr, _, err := d.stages.startReady(ctx, o, s, id, app, true)
	if err != nil {
		return Deployment{}, err
	}
	if err := fresh(); err != nil {
		return Deployment{}, err
	}
	return d.bind(ctx, o, s, rec, dr, app, "restart_ready")
}

// slotFor is the slot of a restore of generation g for deployment rec
// that found no pool slot of its app: a spare slot that fits it
// (takeSpare), else one provisioned for it (a pool miss; also when its
// spare could not be attached, which is released, once fresh says g is
// still the newest). It creates rec; on error rec is undone.
func (d *Deployer) slotFor(ctx context.Context, o *op, rec *Deployment, app spec.App, g spec.Generation, opts Options, fresh func() error) (_ *Slot, err error) {
	var serr error
	if !opts.NoPool {
		s, err := d.pool.takeSpare(ctx, o, rec, app, g)
		if err == nil {
			return s, nil
		}
		serr = err
	}
	created := rec.Pool == spec.PoolSpare // takeSpare made the record
	if created {
		defer d.undoOnError(ctx, rec, &err)
		if ctx.Err() != nil {
			return nil, serr
		}
		d.log.Warn("restore into a spare slot failed; provisioning a slot of its own", "deployment", rec.ID, "app", app.Name, "slot", rec.Slot, "err", serr)
		if err := d.pool.ReleaseSlot(context.WithoutCancel(ctx), rec.Slot); err != nil {
			return nil, errors.Join(serr, err)
		}
		rec.Slot = ""
	} else if serr != nil && !errors.Is(serr, ErrNoSpare) {
		// A generation removed meanwhile is not an error: the deploy
		// restores the newest.
		return nil, errors.Join(fresh(), serr)
	} else if serr != nil && !errors.Is(serr, errNoIdleSpare) {
		d.log.Info("restore without a spare slot", "deployment", rec.ID, "app", app.Name, "why", serr)
		rec.SpareReason = serr.Error()
	}
	if err := fresh(); err != nil {
		return nil, err
	}
	rec.Pool = spec.PoolMiss
	if !created {
		if err := d.recs.create(rec); err != nil {
			return nil, err
		}
		defer d.undoOnError(ctx, rec, &err)
	}
	return d.provisionFor(ctx, o, rec, app, drivers.RunRestart, g.Gen, nil, slotSource{app: app, engine: g.Engine,
		env: g.EnvSnap, gen: &g, config: d.stages.genConfig(ctx, g), background: opts.Background})
}

// restoredSpec is the spec a restore of generation g runs: the one sealed
// with it, but for what is not part of the checkpoint, which the app's
// spec as it is now (current) says.
func restoredSpec(g spec.Generation, current spec.App) spec.App {
	app := g.Spec.WithDefaults()
	app.PostRestore, app.Lazy = current.PostRestore, current.Lazy && engine.Of(g.Engine).LazyRestore
	app.Trusted = current.Trusted // the operator's word now, not at the generation's time
	return app
}

// claimFor claims an idle pool slot of app's generation gen for deployment
// id, waiting for one being restored ahead if there is no idle one;
// ErrNoSlot when there is none (or noPool).
func (d *Deployer) claimFor(ctx context.Context, o *op, app string, gen int, id string, noPool bool) (*Slot, error) {
	if noPool {
		return nil, ErrNoSlot
	}
	s, err := d.pool.claim(app, gen, id)
	if errors.Is(err, ErrNoSlot) && d.pool.awaitStarting(ctx, app, gen) {
		// A slot was being restored ahead: it is idle now, unless another
		// deploy took it first.
		s, err = d.pool.claim(app, gen, id)
		o.phase(StepAwait)
	}
	return s, err
}

// provisionFor provisions a slot for deployment rec (a pool miss, a boot):
// the deployment's record names the slot before the slot is made.
func (d *Deployer) provisionFor(ctx context.Context, o *op, rec *Deployment, app spec.App, mode drivers.RunMode, gen int, images []string, src slotSource) (*Slot, error) {
	s, err := d.pool.newSlot(app.Name, gen, mode, false, rec.ID, images)
	if err != nil {
		return nil, err
	}
	rec.Slot = s.ID
	if err := d.recs.save(rec); err != nil {
		_ = d.pool.ReleaseSlot(context.WithoutCancel(ctx), s.ID)
		return nil, err
	}
	return s, d.stages.provision(ctx, o, s, src)
}

// undoOnError marks the record Failed and undeploys it when *err is set.
// A deploy that failed because its images' I/O stalled has its mappings
// cut off first: its app may be blocked on them in the kernel, where no
// signal reaches it, and stopping its instance would wait for it.
func (d *Deployer) undoOnError(ctx context.Context, rec *Deployment, err *error) {
	if *err == nil {
		return
	}
	rec.Phase, rec.Error = spec.PhaseFailed, (*err).Error()
	_ = d.recs.save(rec)
	uctx := context.WithoutCancel(ctx)
	if errors.Is(*err, mapper.ErrStalled) {
		if cerr := d.CutOff(uctx, rec.ID); cerr != nil {
			d.log.Warn("cutting off the mappings of a deployment whose I/O stalled", "deployment", rec.ID, "err", cerr)
		}
	}
	*err = errors.Join(*err, d.Undeploy(uctx, rec.ID))
}

// hitTurn waits until a pool hit may run its stages: at most
// Config.HitConcurrency at once, the others in arrival order. A wait is
// the phase StepQueue. done ends the turn.
func (d *Deployer) hitTurn(ctx context.Context, o *op) (done func(), err error) {
	select {
	case d.hits <- struct{}{}:
	default:
		select {
		case d.hits <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		o.phase(StepQueue)
	}
	return func() { <-d.hits }, nil
}
