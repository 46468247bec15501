// Prepared resumes: a migration's target makes the instance that will resume the deployment (its
// slot's directory, the node's copy of its environment, its light container created and waiting)
// while the source still checkpoints it. The resume then only clones, maps and mounts the
// suspension's writable image under the waiting container, copies its checkpoint in, and orders
// it to start: the container's creation (0.2-0.5 s) is off the time the instance answers nothing.

package deploy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// SlotPrepared: the slot waits for the resume of its deployment
// (PrepareResume): its container is created, its root not mounted yet.
const SlotPrepared SlotPhase = "Prepared"

// ErrNotPreparable: this node cannot make an instance ahead of its root
// (the host driver, an image whose entrypoint lacks -root-later, restores
// that read their own clone of the environment). A suspension whose root
// is its own clone finds a prepared instance unfit, and is resumed
// without it.
var ErrNotPreparable = errors.New("cannot prepare a resume ahead")

// PrepareResume makes, on this node, the instance that will resume
// deployment id, running generation gen of app elsewhere and being
// suspended to move here: a slot whose light container waits for its
// root and its checkpoint (drivers.Run.RootLater), over the node's copy
// of the generation's environment. Resume takes it. A slot that no resume
// takes is released with DropPrepared, or at the agent's next start
// (RecoverSlots: it has no deployment's record here).
func (sx *Suspensions) PrepareResume(ctx context.Context, app spec.App, id string, gen int) (_ Slot, err error) {
	if err := spec.ValidateID(id); err != nil {
		return Slot{}, err
	}
	if s, ok := sx.prepared(id); ok {
		return s, nil
	}
	from, ok, err := catalog.ReadGen(ctx, sx.deps.Store, app.Name, gen)
	if err != nil {
		return Slot{}, err
	}
	if !ok {
		return Slot{}, fmt.Errorf("deployment %s: generation %d of %s is not sealed: %w", id, gen, app.Name, spec.ErrNotFound)
	}
	eng := from.Engine
	app = restoredSpec(from, app)
	app.PostRestore = nil
	if sx.cfg.EnvRead != EnvShared {
		return Slot{}, fmt.Errorf("deployment %s: restores read their own clone of the environment: %w", id, ErrNotPreparable)
	}
	dr, err := sx.drv.driverByRun(app, drivers.RunRestart, eng)
	if err != nil {
		return Slot{}, err
	}
	if ls, ok := dr.(drivers.LateSourcer); !ok || !ls.TakesRootLater() {
		return Slot{}, fmt.Errorf("deployment %s: driver %s: %w", id, dr.Name(), ErrNotPreparable)
	}
	s, err := sx.pool.newSlot(app.Name, from.Gen, drivers.RunRestart, false, id, nil)
	if err != nil {
		return Slot{}, err
	}
	s.Engine = eng
	defer func() {
		if err != nil {
			err = errors.Join(err, sx.pool.ReleaseSlot(context.WithoutCancel(ctx), s.ID))
		}
	}()
	o := sx.stages.newOp(&s.Timings, nil)
	lower, err := sx.envs.lowerFor(ctx, from)
	if err != nil {
		return Slot{}, err
	}
	o.phase(StepLower)
	mnt, ckpt := filepath.Join(s.Dir, "mnt"), sharedCkptDir(s.Dir)
	if err := os.MkdirAll(ckpt, 0o755); err != nil {
		return Slot{}, fmt.Errorf("slot %s checkpoint directory: %w", s.ID, err)
	}
	if err := sx.deps.Roots.MountShared(mnt); err != nil {
		return Slot{}, err
	}
	run := instanceSource{envPath: filepath.Join(mnt, "root"), ckptPath: ckpt, rootLater: lower.Root}
	// resume: its root is the suspension's, never reset for another.
	if err := sx.stages.createInstance(ctx, s, slotSource{app: app, engine: eng, config: sx.stages.genConfig(ctx, from), resume: true}, run); err != nil {
		return Slot{}, err
	}
	o.phase(StepContainer)
	s.Phase = SlotPrepared
	if err := sx.pool.slots.Save(s.ID, s); err != nil {
		return Slot{}, err
	}
	sx.log.Info("resume prepared", "deployment", id, "slot", s.ID, "app", app.Name, "gen", from.Gen, "engine", eng, "timings", s.Timings.String())
	return *s, nil
}

// prepared returns the slot prepared for deployment id's resume, if any.
func (sx *Suspensions) prepared(id string) (Slot, bool) {
	all, err := sx.pool.slots.List()
	if err != nil {
		return Slot{}, false
	}
	for _, s := range all {
		if s.Phase == SlotPrepared && s.Deployment == id {
			return s, true
		}
	}
	return Slot{}, false
}

// Prepared lists the deployments whose resume this node prepared.
func (sx *Suspensions) Prepared() []string {
	all, _ := sx.pool.slots.List()
	var ids []string
	for _, s := range all {
		if s.Phase == SlotPrepared {
			ids = append(ids, s.Deployment)
		}
	}
	return ids
}

// DropPrepared releases the slot prepared for deployment id's resume (no
// error if there is none).
func (sx *Suspensions) DropPrepared(ctx context.Context, id string) error {
	sx.dropEarly(id)
	s, ok := sx.prepared(id)
	if !ok {
		return nil
	}
	return sx.pool.ReleaseSlot(ctx, s.ID)
}

// takePrepared returns the slot prepared for the resume of deployment id
// from suspension susp, if there is one that fits it (same engine and
// app, its root an overlay of the node's copy of the generation it came
// from); one that does not fit is released.
func (sx *Suspensions) takePrepared(ctx context.Context, id string, app spec.App, susp spec.Suspension) (*Slot, bool) {
	s, ok := sx.prepared(id)
	if !ok {
		return nil, false
	}
	if s.App != app.Name || s.Engine != susp.Engine || !susp.Upper || s.Lower != lowerID(app.Name, susp.From.Gen) || s.Handle == nil {
		sx.log.Info("the resume prepared does not fit the suspension; resuming without it", "deployment", id, "slot", s.ID)
		sx.dropEarly(id)
		if err := sx.pool.ReleaseSlot(context.WithoutCancel(ctx), s.ID); err != nil {
			sx.log.Warn("releasing a prepared resume", "slot", s.ID, "err", err)
		}
		return nil, false
	}
	return &s, true
}

// earlyReads are the checkpoints read into prepared slots while their
// sources still store the rest of the suspensions (ReadEarly), by
// deployment.
type earlyReads struct {
	mu    sync.Mutex
	reads map[string]*earlyRead
	// memory are the deployments whose resume took a read into memory,
	// until the instance runs (releaseRead).
	memory map[string]bool
}

// earlyRead is one: done is closed once err is known. memory: it is
// read into memory (its directory a file system in memory, which the
// resume lets go once the instance runs: releaseRead).
type earlyRead struct {
	gen    int
	done   chan struct{}
	err    error
	cancel context.CancelFunc
	memory bool
}

// errNoEarlyRead: no early read of that checkpoint.
var errNoEarlyRead = errors.New("no early read")

// ReadEarly copies generation gen of deployment id's checkpoint (of
// bytes bytes) into the slot prepared for its resume with read, in the
// background, while the migration's source still stores the rest of the
// suspension: the resume then finds it there (provisionPrepared), or
// copies it again where this read failed. It reads it into memory where
// the node has room for it and the engine restores it whole (memory
// released once the instance runs). It reports false, reading nothing,
// where no slot is prepared for id or a read of gen is under way or done.
func (sx *Suspensions) ReadEarly(ctx context.Context, id string, gen int, bytes int64, read func(ctx context.Context, dst string) error) bool {
	// Under the lock takeEarly takes: a resume that takes the slot
	// (its phase saved before it asks takeEarly) either finds this read
	// or is seen here, and no read begins in a slot a resume fills.
	sx.early.mu.Lock()
	s, ok := sx.prepared(id)
	if !ok {
		sx.early.mu.Unlock()
		return false
	}
	if sx.early.reads == nil {
		sx.early.reads = map[string]*earlyRead{}
	}
	if r, ok := sx.early.reads[id]; ok && r.gen == gen {
		sx.early.mu.Unlock()
		return false
	}
	rctx, cancel := context.WithCancel(ctx)
	r := &earlyRead{gen: gen, done: make(chan struct{}), cancel: cancel}
	sx.early.reads[id] = r
	sx.early.mu.Unlock()
	dst := drivers.GenDir(slotCkptDir(s), gen)
	go func() {
		defer close(r.done)
		start := time.Now()
		r.err = sx.readDir(dst)
		if r.err == nil && s.Handle != nil && s.Handle.CkptShared && !engine.Of(s.Engine).LazyRestore {
			r.memory = sx.readIntoMemory(id, dst, bytes)
		}
		if r.err == nil {
			r.err = read(rctx, dst)
		}
		sx.log.Info("checkpoint read early into a prepared resume", "deployment", id, "gen", gen, "in_memory", r.memory,
			"ms", time.Since(start).Milliseconds(), "err", r.err)
	}()
	return true
}

// takeEarly waits for the early read of generation gen of deployment
// id's checkpoint and forgets it: nil if it copied the checkpoint,
// errNoEarlyRead if there was none of gen.
func (sx *Suspensions) takeEarly(ctx context.Context, id string, gen int) error {
	sx.early.mu.Lock()
	r, ok := sx.early.reads[id]
	delete(sx.early.reads, id)
	sx.early.mu.Unlock()
	if !ok {
		return errNoEarlyRead
	}
	if r.gen != gen {
		r.cancel()
		<-r.done
		return errNoEarlyRead
	}
	select {
	case <-ctx.Done():
		r.cancel()
		<-r.done
		return ctx.Err()
	case <-r.done:
		r.cancel()
		if r.err == nil && r.memory {
			sx.early.mu.Lock()
			if sx.early.memory == nil {
				sx.early.memory = map[string]bool{}
			}
			sx.early.memory[id] = true
			sx.early.mu.Unlock()
		}
		return r.err
	}
}

// dropEarly stops deployment id's early read, if any, and waits for it.
func (sx *Suspensions) dropEarly(id string) {
	sx.early.mu.Lock()
	r, ok := sx.early.reads[id]
	delete(sx.early.reads, id)
	sx.early.mu.Unlock()
	if ok {
		r.cancel()
		<-r.done
	}
}

// provisionPrepared is provision for a slot made by PrepareResume: the
// suspension's writable image cloned, mapped and mounted under the node's
// copy of its generation's environment, where the waiting container sees
// it, and its checkpoint g copied into the instance's checkpoint volume
// meanwhile. It leaves s in SlotIdle, its timings without a container.
func (sx *Suspensions) provisionPrepared(ctx context.Context, o *op, s *Slot, src slotSource) error {
	g := *src.gen
	dst := drivers.GenDir(slotCkptDir(*s), g.Gen)
	start := time.Now()
	wait := async(func() error {
		err := sx.takeEarly(ctx, s.Deployment, g.Gen)
		if err == nil {
			return nil // read while the source stored the suspension
		}
		if !errors.Is(err, errNoEarlyRead) {
			sx.log.Warn("the checkpoint read early is not whole; read again", "deployment", s.Deployment, "gen", g.Gen, "err", err)
		}
		if err := sx.readDir(dst); err != nil {
			return err
		}
		_, err = sx.ckpts.fetchFrom(ctx, g, dst, src.fetch)
		return err
	})
	defer func() { _ = wait() }()
	lower, err := sx.envs.lowerFor(ctx, *src.lowerOf)
	if err != nil {
		return err
	}
	if err := sx.stages.cloneSlot(ctx, s, src, src.env, lower); err != nil {
		return err
	}
	o.phase(StepClone)
	envMap, _, err := sx.stages.mapSlot(ctx, s)
	if err != nil {
		return err
	}
	o.phase(StepMap)
	if _, _, err := sx.stages.mountSlot(ctx, s, envMap, nil, lower); err != nil {
		return err
	}
	o.phase(StepMount)
	if err := wait(); err != nil {
		return err
	}
	s.Fetched = true
	o.phase(StepFetch)
	sx.log.Debug("suspension's checkpoint copied into a prepared instance", "slot", s.ID, "gen", g.Gen, "ms", time.Since(start).Milliseconds())
	s.Gen, s.Handle.Gen = g.Gen, g.Gen+1
	s.Phase = SlotIdle
	return sx.pool.slots.Save(s.ID, s)
}
