// Suspend and resume: a running instance is checkpointed with its file-system changes, both
// sealed as snapshots of RBD images of their own, and its slot is released; a resume on any node
// of the PoP restores it from them, with the same ID and identity seed, through the restore's
// own stages.
//
//	Suspend: checkpoint (the app stops) → store (its image copied into an RBD image, while the
//	instance, its mounts and mappings go; each image snapshotted once written) → seal
//	Resume:  a restore whose environment is the suspension's writable image (over the node's copy
//	of the generation it came from) and whose checkpoint is the suspension's

package deploy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// Steps of a suspend (Suspension.Timings).
const (
	StepCheckpoint Step = "checkpoint"
	// StepStore: the checkpoint copied into its image while the instance
	// is released, and both images sealed.
	StepStore Step = "store"
	StepSeal  Step = "seal"
)

// Suspensions are the node's suspends of running instances (each step
// journaled in the deployment's record), the images they leave in the
// cluster, and the slots prepared ahead for a resume (prepare.go).
type Suspensions struct {
	*node
	drv    *Drivers
	envs   *EnvCopies
	ckpts  *Checkpoints
	recs   *Records
	stages *Stages
	pool   *Pool
	// handoffs are the checkpoints kept here for a migration's target.
	handoffs *Handoffs
	// early are the checkpoints read into slots prepared here before
	// their suspensions are sealed (ReadEarly).
	early earlyReads
}

// SuspendOptions say how a suspend goes.
type SuspendOptions struct {
	// Progress is told each step as it ends.
	Progress func(string, time.Duration)
	// Handoff keeps the checkpoint on this node, where a migration's
	// target reads it (Handoffs): the suspension is Pending on this node
	// until the caller has its durable copy written (Handoffs.Store) or
	// needs it no more (Handoffs.Finish).
	Handoff bool
	// Kept, with Handoff, is told of the hand-over once the checkpoint's
	// files are in it, before the instance is released and its files
	// sealed: its target may read it from then on (ReadEarly), with the
	// suspension as far as it got (its engine, its bytes).
	Kept func(Handoff, spec.Suspension)
}

// Suspensions returns the node's suspensions.
func (d *Deployer) Suspensions() *Suspensions { return d.suspensions }

// Suspension images: the checkpoint's and the clone that holds the
// generation the instance came from, named after the deployment; the
// checkpoint's after the suspend too, whose image a migration's source
// may still write while the instance, resumed, is suspended again.
func suspendCkptImage(id string, created time.Time) string {
	return catalog.InstancePrefix + id + "-susp-" + strconv.FormatInt(created.UnixMilli(), 36)
}

// ckptImageOf is the checkpoint image of suspension susp of rec: named
// after the suspend, or, for a suspend an earlier version began, after
// the deployment alone.
func ckptImageOf(rec Deployment, susp spec.Suspension) string {
	if legacy := catalog.InstancePrefix + rec.ID + "-susp"; slices.Contains(rec.Images, legacy) {
		return legacy
	}
	return suspendCkptImage(rec.ID, susp.Created)
}
func suspendHoldImage(id string) string { return catalog.InstancePrefix + id + "-hold" }

// metaSeed, on a suspension's checkpoint image, is its instance's identity
// seed, which its resume keeps (the cluster's, not the PoP's state: a
// status is shown to every client of the deployment).
const metaSeed = "fogdeploy.seed"

// Suspend checkpoints deployment id's running instance, its memory and
// its file-system changes, into images of their own, sealed as snapshots
// (spec.Suspension), and releases everything else it held on this node.
// The deployment's record stays, PhaseSuspended with the suspension,
// until Forget: the caller records the suspension elsewhere first.
//
// Each step is journaled in the record (PhaseSuspending, with the
// suspension as far as it got), and Suspend of a deployment left
// Suspending by a crash goes on from there: a checkpoint asked before
// the crash is read from its instance, or asked again. A suspend that
// fails otherwise leaves the deployment Failed (its checkpoint may have
// stopped its app), its images owned by its record (Undeploy removes
// them).
//
// With o.Handoff the checkpoint's files stay here (Handoffs) and the
// suspension is sealed, Pending on this node, once the instance is
// released: its checkpoint is copied into the cluster behind it.
func (sx *Suspensions) Suspend(ctx context.Context, id string, app spec.App, o SuspendOptions) (_ spec.Suspension, err error) {
	rec, err := sx.recs.Load(id)
	if err != nil {
		return spec.Suspension{}, err
	}
	if rec.Phase == spec.PhaseSuspended && rec.Suspension != nil {
		return *rec.Suspension, nil
	}
	susp, continuing, err := sx.beginSuspend(ctx, rec)
	if err != nil {
		return spec.Suspension{}, err
	}
	s := &suspension{sx: sx, rec: rec, susp: susp, continuing: continuing, o: sx.stages.newOp(&susp.Timings, o.Progress), opts: o,
		envImg: rec.Images[0], ckptImg: ckptImageOf(rec, susp), asked: continuing, held: func() error { return nil }}
	s.o.timings = &s.susp.Timings
	defer func() { s.end(ctx, err) }()
	if err := s.own(); err != nil {
		return spec.Suspension{}, err
	}
	if err := s.checkpoint(ctx, app); err != nil {
		return spec.Suspension{}, err
	}
	if err := s.keep(); err != nil {
		return spec.Suspension{}, err
	}
	if s.kept != nil && o.Kept != nil {
		o.Kept(*s.kept, s.susp)
	}
	if err := s.store(ctx); err != nil {
		return spec.Suspension{}, err
	}
	return s.seal(ctx)
}

// suspension is one Suspend under way, in its stages (own, checkpoint,
// store, seal): the record it journals, the suspension as far as it got,
// and what it holds until it ends.
type suspension struct {
	sx   *Suspensions
	rec  Deployment
	susp spec.Suspension
	// continuing: a suspend cut short got this far before.
	continuing bool
	o          *op
	opts       SuspendOptions
	// kept is the hand-over of its checkpoint (opts.Handoff), once kept;
	// storing, that the suspend is past its store step (the hand-over
	// is the suspension's then).
	kept    *Handoff
	storing bool
	// envImg is the instance's writable image, ckptImg the checkpoint's.
	envImg, ckptImg string
	// asked: a checkpoint was asked of the instance (here or before a
	// crash), which may have stopped its app. holding: its generation
	// is held (sealSuspension). exited: the checkpoint ended its app.
	asked, holding, exited bool
	// mounted unmounts the checkpoint's image while it is mounted; held
	// lets the hold of its generation go.
	mounted, held func() error
	// memory: the checkpoint is written into memory (checkpointInMemory).
	memory bool
}

// journal records how far it got.
func (s *suspension) journal() error {
	s.rec.Suspension = &s.susp
	return s.sx.recs.save(&s.rec)
}

// own records the checkpoint's image as the deployment's, before it is
// made.
func (s *suspension) own() error {
	if s.continuing {
		return nil
	}
	s.rec.Phase, s.rec.Images = spec.PhaseSuspending, append(s.rec.Images, s.ckptImg)
	return s.journal()
}

// checkpoint checkpoints the instance into its image, made, mapped,
// formatted and mounted while the checkpoint runs, off the time the app
// answers nothing (a hand-over's is only made: its files are copied into
// it later, if ever); so is the hold of its generation. A suspend that got
// past it before skips it.
func (s *suspension) checkpoint(ctx context.Context, app spec.App) error {
	sx, id := s.sx, s.rec.ID
	if s.rec.Handle == nil || s.susp.CkptGen != 0 {
		return nil
	}
	size := max(app.CheckpointBytes(), 2*s.susp.From.Bytes)
	if err := sx.deps.Store.Create(ctx, s.ckptImg, size); err != nil && !errors.Is(err, layering.ErrExists) {
		return err
	}
	// Tagged before it is mapped: librbd's metadata writes wait for
	// the exclusive lock of an image that rbd-fuse holds open, and
	// may wait for ever (a mapping a crash left goes first).
	if s.continuing {
		_ = sx.deps.Mapper.Release(ctx, suspendMapping(id))
	}
	if err := sx.deps.Store.SetMeta(ctx, s.ckptImg, withSeed(sx.suspensionMeta(id), s.rec.Seed)); err != nil {
		return err
	}
	var err error
	if !s.opts.Handoff {
		// A hand-over's image is mapped only if its durable copy is
		// written (Handoffs.Store), not beside the checkpoint.
		if s.mounted, err = sx.mountSuspension(ctx, &s.rec, s.ckptImg); err != nil {
			return err
		}
	}
	if s.held, err = sx.holdSoon(ctx, &s.rec, s.susp); err != nil {
		s.held = func() error { return nil }
		return err
	}
	if s.opts.Handoff && !s.continuing {
		// Its files are handed over, not copied into the cluster: written
		// into the hand-over's directory, in memory where there is room.
		s.memory = sx.prepareHandoff(s.rec)
	}
	s.holding, s.asked = true, true
	if s.exited, err = sx.checkpointInstance(ctx, s.rec, &s.susp, s.continuing); err != nil {
		return err
	}
	if err := s.journal(); err != nil {
		return err
	}
	s.o.phase(StepCheckpoint)
	return nil
}

// store copies the instance's files and checkpoint into the
// suspension's images and releases the instance.
func (s *suspension) store(ctx context.Context) error {
	if s.rec.Handle == nil {
		return nil
	}
	if s.mounted == nil && !s.opts.Handoff { // continuing after the checkpoint
		var err error
		if s.mounted, err = s.sx.mountSuspension(ctx, &s.rec, s.ckptImg); err != nil {
			return err
		}
	}
	if err := s.sx.storeAndRelease(ctx, &s.rec, &s.susp, suspendImages{env: s.envImg, ckpt: s.ckptImg, mounted: s.mounted, exited: s.exited, kept: s.kept}); err != nil {
		return err
	}
	// A hand-over's checkpoint goes into the cluster behind the suspend,
	// if its target does not run it first (Handoffs.Store).
	s.storing = s.kept != nil
	s.mounted = nil // released
	if err := s.journal(); err != nil {
		return err
	}
	s.o.phase(StepStore)
	return nil
}

// seal seals the suspension's images and hands them over: the record owns
// nothing now, the suspension all.
func (s *suspension) seal(ctx context.Context) (spec.Suspension, error) {
	held := s.held
	s.held = func() error { return nil }
	if err := held(); err != nil {
		return spec.Suspension{}, err
	}
	if err := s.sx.sealSuspension(ctx, &s.rec, &s.susp, s.holding); err != nil {
		return spec.Suspension{}, err
	}
	if err := removeDir(s.rec.Dir); err != nil {
		return spec.Suspension{}, err
	}
	s.o.phase(StepSeal)
	if s.kept != nil {
		s.susp.Pending = s.sx.cfg.Node
	}
	s.rec.Owned, s.rec.Phase, s.rec.Ports = Owned{}, spec.PhaseSuspended, nil
	if err := s.journal(); err != nil {
		return spec.Suspension{}, err
	}
	s.sx.log.Info("suspended", "id", s.rec.ID, "app", s.rec.App, "gen", s.susp.From.Gen, "ckpt_gen", s.susp.CkptGen, "bytes", s.susp.Bytes,
		"env", s.susp.Env.String(), "in_memory", s.memory, "timings", s.susp.Timings.String())
	return s.susp, nil
}

// end lets go of what the suspend holds, and, when it failed (err), undoes
// it while nothing stopped the app (it runs on as before), or records the
// deployment Failed.
func (s *suspension) end(ctx context.Context, err error) {
	_ = s.held()
	if s.mounted != nil && err != nil {
		_ = s.mounted()
		_ = s.sx.deps.Mapper.Release(context.WithoutCancel(ctx), suspendMapping(s.rec.ID))
	}
	if err != nil && ctx.Err() == nil && s.opts.Handoff && s.kept == nil && s.rec.Handle != nil {
		// What prepareHandoff made for a checkpoint never kept goes (an
		// instance that runs on would write its next one there).
		if uerr := s.sx.deps.Roots.Unbind(drivers.GenDir(s.rec.Handle.CkptPath, s.rec.Handle.Gen)); uerr != nil {
			s.sx.log.Warn("unbinding a migration's checkpoint directory; unbound with its instance", "deployment", s.rec.ID, "err", uerr)
		}
		s.sx.handoffs.removeFiles(s.rec.ID)
	}
	switch {
	case err == nil || ctx.Err() != nil:
	case !s.asked:
		// Nothing stopped the app: it runs on as before.
		s.sx.undoSuspend(context.WithoutCancel(ctx), &s.rec, s.ckptImg)
	default:
		s.rec.Phase, s.rec.Error = spec.PhaseFailed, err.Error()
		_ = s.sx.recs.save(&s.rec)
		if s.kept != nil && !s.storing {
			s.sx.handoffs.Drop(context.WithoutCancel(ctx), s.rec.ID)
		}
	}
}

// keep moves the checkpoint's files into a hand-over (opts.Handoff), where
// the migration's target reads them.
func (s *suspension) keep() error {
	if !s.opts.Handoff {
		return nil
	}
	if h, err := s.sx.handoffs.Get(s.rec.ID); err == nil && h.Gen == s.susp.CkptGen {
		s.kept = &h // kept before a crash, maybe after its instance went
		return nil
	}
	if s.rec.Handle == nil {
		return nil
	}
	h, err := s.sx.handoffs.keep(s.rec.ID, s.susp.CkptGen, drivers.GenDir(s.rec.Handle.CkptPath, s.susp.CkptGen), s.ckptImg,
		suspendMapping(s.rec.ID), s.susp.Bytes)
	if err != nil {
		return err
	}
	s.kept = &h
	return nil
}

// beginSuspend is the suspension of rec as far as a suspend cut short got
// (continuing), or a new one.
func (sx *Suspensions) beginSuspend(ctx context.Context, rec Deployment) (spec.Suspension, bool, error) {
	if rec.Phase == spec.PhaseSuspending && rec.Suspension != nil {
		return *rec.Suspension, true, nil
	}
	from, err := sx.suspendable(ctx, rec)
	if err != nil {
		return spec.Suspension{}, false, err
	}
	return spec.Suspension{From: from, Engine: rec.Engine, Upper: rec.Lower != "", Node: sx.cfg.Node, Created: time.Now().UTC()}, false, nil
}

// checkpointInstance checkpoints rec's instance into susp (continuing a
// suspend cut short, it reads the checkpoint asked before; checkpointOf).
// exited: the instance's processes are gone (drivers.Checkpointed.Exited).
func (sx *Suspensions) checkpointInstance(ctx context.Context, rec Deployment, susp *spec.Suspension, continuing bool) (exited bool, err error) {
	dr := sx.drv.driverByName(rec.Handle.Driver)
	if dr == nil {
		return false, fmt.Errorf("%w: driver %q of deployment %s", drivers.ErrDriver, rec.Handle.Driver, rec.ID)
	}
	ck, err := checkpointOf(ctx, dr, *rec.Handle, continuing)
	if err != nil {
		return false, err
	}
	susp.CkptGen, susp.Bytes = ck.Gen, ck.Bytes
	sx.log.Debug("instance checkpointed for its suspend", "deployment", rec.ID, "gen", ck.Gen, "bytes", ck.Bytes, "engine_ms", ck.MS, "exited", ck.Exited)
	return ck.Exited, nil
}

// undoSuspend gives rec back its Running record when a suspend failed
// before its checkpoint was asked: the checkpoint's image goes.
func (sx *Suspensions) undoSuspend(ctx context.Context, rec *Deployment, ckptImg string) {
	made := []string{ckptImg, suspendHoldImage(rec.ID)}
	rec.Phase, rec.Suspension, rec.Error = spec.PhaseRunning, nil, ""
	rec.Images = slices.DeleteFunc(rec.Images, func(img string) bool { return slices.Contains(made, img) })
	if err := sx.recs.save(rec); err != nil {
		sx.log.Warn("undoing a suspend that failed before its checkpoint", "deployment", rec.ID, "err", err)
		return
	}
	for _, img := range made {
		if err := sx.deps.Store.Remove(ctx, img); err != nil && !errors.Is(err, layering.ErrNotFound) {
			sx.log.Warn("removing the image of a suspend that failed before its checkpoint; gc removes it", "image", img, "err", err)
		}
	}
}

// journalMapping records mapping id among rec's before it is made: a
// crash leaves it to the release.
func (sx *Suspensions) journalMapping(rec *Deployment, id string) (string, error) {
	if slices.Contains(rec.Mappings, id) {
		return id, nil
	}
	rec.Mappings = append(rec.Mappings, id)
	return id, sx.recs.save(rec)
}

// checkpointOf checkpoints instance h with dr; continuing a suspend cut
// short, it reads the checkpoint that an instance which has exited wrote
// when it was asked before (drivers.Container.Checkpointed), and asks one
// of an instance that still runs (asked twice, an entrypoint that is
// checkpointing goes on).
func checkpointOf(ctx context.Context, dr drivers.Driver, h drivers.Handle, continuing bool) (drivers.Checkpointed, error) {
	type reader interface {
		Checkpointed(context.Context, drivers.Handle) (drivers.Checkpointed, error)
	}
	if r, ok := dr.(reader); ok && continuing {
		if running, err := dr.Running(ctx, h); err == nil && !running {
			return r.Checkpointed(ctx, h)
		}
	}
	return dr.Checkpoint(ctx, h)
}

// suspendable checks that rec's instance can be suspended and returns the
// generation it was restored from.
func (sx *Suspensions) suspendable(ctx context.Context, rec Deployment) (spec.Generation, error) {
	no := func(why, fix string) error {
		return hint.With(fmt.Errorf("deployment %s: %s: %w", rec.ID, why, ErrNotSuspendable), fix)
	}
	switch {
	case rec.Phase != spec.PhaseRunning:
		return spec.Generation{}, no("it is "+string(rec.Phase), "suspend a Running deployment")
	case rec.Mode != spec.ModeRestore || rec.Handle == nil || len(rec.Images) == 0:
		return spec.Generation{}, no("it was booted without a checkpoint engine, which alone can save its memory",
			"deploy it with mode restore (or auto, once its app has a generation)")
	}
	from, ok, err := catalog.ReadGen(ctx, sx.deps.Store, rec.App, rec.Gen)
	if err != nil {
		return spec.Generation{}, err
	}
	if !ok {
		return spec.Generation{}, no(fmt.Sprintf("generation %d of %s, which it was restored from, is gone", rec.Gen, rec.App),
			"a deployment can be suspended while the generation it was restored from exists")
	}
	return from, nil
}

// sealSuspension ends a suspend whose images are sealed: the size of its
// writable image, and, for an overlay's upper layer, a clone of the
// generation's environment that holds it (made already if held).
func (sx *Suspensions) sealSuspension(ctx context.Context, rec *Deployment, susp *spec.Suspension, held bool) error {
	st := sx.deps.Store
	if info, err := st.Stat(ctx, susp.Env.Image); err == nil {
		susp.EnvBytes = info.Used
	}
	if !susp.Upper {
		return nil
	}
	if !held {
		made, err := sx.holdSoon(ctx, rec, *susp)
		if err == nil {
			err = made()
		}
		if err != nil {
			return err
		}
	}
	susp.Hold = suspendHoldImage(rec.ID)
	return nil
}

// holdSoon journals in rec the clone that holds the generation a
// suspension with an upper layer came from, and starts to make it (once:
// a clone made before is kept); the function it returns waits for it.
// Nothing is held for a suspension of a whole root.
func (sx *Suspensions) holdSoon(ctx context.Context, rec *Deployment, susp spec.Suspension) (func() error, error) {
	if !susp.Upper {
		return func() error { return nil }, nil
	}
	hold := suspendHoldImage(rec.ID)
	if !slices.Contains(rec.Images, hold) {
		rec.Images = append(rec.Images, hold)
		if err := sx.recs.save(rec); err != nil {
			return nil, err
		}
	}
	st, meta := sx.deps.Store, sx.suspensionMeta(rec.ID)
	return async(func() error {
		if err := st.Clone(ctx, susp.From.EnvSnap, hold); err != nil && !errors.Is(err, layering.ErrExists) {
			return err
		}
		return st.SetMeta(ctx, hold, meta)
	}), nil
}

// Forget drops the record of a suspended deployment, whose suspension is
// recorded elsewhere now.
func (sx *Suspensions) Forget(id string) error {
	rec, err := sx.recs.Load(id)
	if err != nil {
		return err
	}
	if rec.Phase != spec.PhaseSuspended {
		return fmt.Errorf("deployment %s is %s, not Suspended: %w", id, rec.Phase, ErrNotSuspendable)
	}
	return sx.recs.remove(id)
}

// Suspended lists the suspended deployments whose record this node still
// holds (Forget was not called: the caller did not record them yet).
func (sx *Suspensions) Suspended() ([]Deployment, error) {
	recs, err := sx.recs.List()
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(recs, func(r Deployment) bool { return r.Phase != spec.PhaseSuspended }), nil
}

// RemoveLost removes the images of suspension susp, whose checkpoint was
// lost with the node that handed it over (its image is that node's, which
// removes it if it comes back; gc, once the deployment is gone).
func (sx *Suspensions) RemoveLost(ctx context.Context, susp spec.Suspension) error {
	for _, img := range susp.Images() {
		if img == susp.Ckpt.Image {
			continue
		}
		if err := sx.deps.Store.Remove(ctx, img); err != nil && !errors.Is(err, layering.ErrNotFound) {
			return err
		}
	}
	return nil
}

// RemoveSuspension removes the images of suspension susp.
func (sx *Suspensions) RemoveSuspension(ctx context.Context, susp spec.Suspension) error {
	return catalog.RemoveSuspension(ctx, sx.deps.Store, susp)
}
