// Resume: a suspended deployment restored on this node (suspend.go made its suspension), through
// the restore's own stages, and what is left of its suspension handed over or removed.

package deploy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

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
	src := slotSource{app: app, engine: susp.Engine, env: susp.Env, gen: &g, lowerOf: &from, resume: true,
		config: d.stages.genConfig(ctx, susp.From), background: opts.Background}
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
	return d.suspensions.adoptSuspension(dep, susp), nil
}

// adoptSuspension hands what is left of the suspension to the resumed
// deployment dep: its writable image (its clone's parent goes after the
// clone), which it keeps, and the checkpoint's image and the hold, which
// DropSuspension removes once the caller recorded dep Running (the
// instance answers meanwhile; until then an undeploy removes them too).
func (sx *Suspensions) adoptSuspension(dep Deployment, susp spec.Suspension) Deployment {
	dep.Images = append(append(dep.Images, susp.Env.Image), susp.Parents...)
	for _, img := range []string{susp.Ckpt.Image, susp.Hold} {
		if img != "" {
			dep.Images = append(dep.Images, img)
		}
	}
	if err := sx.recs.save(&dep); err != nil {
		sx.log.Warn("the resumed deployment does not own its suspension's images; gc removes them once the deployment is gone",
			"deployment", dep.ID, "image", susp.Env.Image, "err", err)
	}
	sx.log.Info("resumed", "id", dep.ID, "app", dep.App, "gen", susp.From.Gen, "ports", dep.Ports, "timings", dep.Timings.String())
	return dep
}

// DropSuspension removes the checkpoint's image and the hold of
// suspension susp, which deployment id resumed from (Resume), and stops
// owning them. A removal that fails leaves the image to the deployment's
// undeploy. Like every change of a deployment, it is not called while
// another runs on id.
func (sx *Suspensions) DropSuspension(ctx context.Context, id string, susp spec.Suspension) {
	var gone []string
	for _, img := range []string{susp.Ckpt.Image, susp.Hold} {
		if img == "" {
			continue
		}
		if err := sx.deps.Store.Remove(ctx, img); err != nil && !errors.Is(err, layering.ErrNotFound) {
			sx.log.Warn("removing a resumed suspension's image; the deployment's undeploy removes it", "deployment", id, "image", img, "err", err)
			continue
		}
		gone = append(gone, img)
	}
	if dep, err := sx.recs.Load(id); err == nil && len(gone) > 0 {
		dep.Images = slices.DeleteFunc(dep.Images, func(i string) bool { return slices.Contains(gone, i) })
		_ = sx.recs.save(&dep)
	}
}
