// Resume: a suspended deployment restored on this node (suspend.go made its suspension), through
// the restore's own stages, and what is left of its suspension handed over or removed.

package deploy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// LazyResumeBytes is the checkpoint size from which a resume restores the
// app's memory lazily (where its engine can): below it, starting the page
// server costs more than reading the pages at once (measured: 16-30 ms more
// with 2.8 MB; 0.1 s less with 271 MB, 2.7 s less with 1 GiB).
const LazyResumeBytes = 32 << 20

// LazyResume reports whether a resume of susp restores its app's memory
// lazily: its engine can, and its checkpoint holds LazyResumeBytes.
func LazyResume(susp spec.Suspension) bool {
	return engine.Of(susp.Engine).LazyRestore && susp.Bytes >= LazyResumeBytes
}

// Resume restores deployment id, suspended as susp, on this node: a
// restore (Options as for Restore, but for the ID, which is id) whose
// environment is the suspension's writable image (its clone, over the
// node's copy of the generation it came from, for an upper layer) and
// whose checkpoint is the suspension's, with the identity seed it had
// (recorded on the checkpoint's image) and no post_restore (it is the same
// instance). Once it runs, the deployment owns the suspension's writable
// image (its clone's parent) and the checkpoint's image and the hold go.
// On error nothing of it is left and the suspension is intact.
func (d *Deployer) Resume(ctx context.Context, app spec.App, id string, susp spec.Suspension, opts Options) (_ Deployment, err error) {
	app = restoredSpec(susp.From, app)
	app.PostRestore = nil
	if err := spec.ValidateID(id); err != nil {
		return Deployment{}, err
	}
	if _, err := d.drv.driver(app, susp.Engine); err != nil {
		return Deployment{}, err
	}
	info, err := d.deps.Store.Stat(ctx, susp.Ckpt.Image)
	if err != nil {
		return Deployment{}, fmt.Errorf("suspension of %s: %w", id, err)
	}
	seed := info.Meta[metaSeed]
	g := susp.From // its checkpoint is the suspension's
	g.Gen, g.Engine, g.CkptSnap, g.Created = susp.CkptGen, susp.Engine, susp.Ckpt, susp.Created
	rec := &Deployment{ID: id, App: app.Name, Created: time.Now().UTC(), Instance: spec.Instance{Node: d.cfg.Node, Phase: spec.PhaseResuming,
		Gen: susp.From.Gen, Engine: susp.Engine, Mode: spec.ModeRestore, Limits: d.limitsOf(app), Reason: "resumed", Pool: spec.PoolMiss}}
	if err := d.recs.create(rec); err != nil {
		return Deployment{}, err
	}
	defer d.undoOnError(ctx, rec, &err)
	o := d.stages.newOp(&rec.Timings, opts.Progress)
	// Restored lazily where the engine can, from LazyResumeBytes: the
	// instance answers before its whole checkpoint is read back from the
	// node's copy (a migration's hand-over or the cluster's), the rest in
	// the background.
	o.lazy = LazyResume(susp)
	app.Lazy = app.Lazy || o.lazy
	s, prepared := d.suspensions.takePrepared(ctx, id, app, susp)
	if !prepared {
		if s, err = d.pool.newSlot(app.Name, g.Gen, drivers.RunRestart, false, id, nil); err != nil {
			return Deployment{}, err
		}
		s.Lower = ""
		if susp.Upper {
			s.Lower = lowerID(app.Name, susp.From.Gen)
		}
	}
	s.Phase, s.Seed, s.KeepSeed, s.Timings = SlotProvisioning, seed, seed != "", nil
	rec.Slot = s.ID
	if err := errors.Join(d.pool.slots.Save(s.ID, s), d.recs.save(rec)); err != nil {
		_ = d.pool.ReleaseSlot(context.WithoutCancel(ctx), s.ID)
		return Deployment{}, err
	}
	from := susp.From
	fetch := opts.Checkpoint
	if fetch == nil && o.lazy && engine.Of(susp.Engine).RemotePages {
		// From the cluster: the pages a lazy restore reads later are read
		// from the suspension's image when the app asks for them.
		fetch = d.ckpts.servedFetch(g)
	}
	src := slotSource{app: app, engine: susp.Engine, env: susp.Env, gen: &g, lowerOf: &from, resume: true,
		config: d.stages.genConfig(ctx, susp.From), background: opts.Background, fetch: fetch}
	if prepared {
		err = d.suspensions.provisionPrepared(ctx, o, s, src)
	} else {
		err = d.stages.provision(ctx, o, s, src)
	}
	if err != nil {
		return Deployment{}, err
	}
	dr, _, err := d.stages.startReady(ctx, o, s, id, app, true)
	if err != nil {
		return Deployment{}, err
	}
	dep, err := d.bind(ctx, o, s, rec, dr, app, "restart_ready")
	if err != nil {
		return Deployment{}, err
	}
	if dep.Handle != nil {
		d.suspensions.releaseRead(id, dep.Handle.CkptPath, susp.CkptGen)
	}
	return d.suspensions.adoptSuspension(dep, susp), nil
}
