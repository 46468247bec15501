// The stages of every instance, whatever starts it, over a slot:
//
//	provision (clone, map, mount, lower, fetch, create) → start (launch, restart or boot) → ready → bind → release
//
// provision makes a slot: the instance's clones, mapped and mounted, and its
// instance created with everything but the app's own start done (the
// Container driver's entrypoint waits for an order). start orders it to run,
// ready waits until the app answers, and bind hands the slot's resources to
// the deployment (release, in undeploy.go, removes them). Boot, the first
// deploy's checkpoint and restore are this one pipeline with a different run
// mode; a warm pool's slot (pool.go) is provisioned before any request, and
// a deploy that takes one runs only start, ready and bind.
//
// Every step is written to the record that owns what it makes (the slot's,
// then the deployment's) before it is made, and each stage can be run again.

package deploy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/journal"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// Step names a timed step of a deploy or a slot (the Name of a phase in
// Deployment.Timings and Slot.Timings).
type Step string

// Steps.
const (
	// StepResolve: a deploy's checks and lookups before its restore's own
	// steps (the engine, the app's newest generation).
	StepResolve   Step = "resolve"
	StepClone     Step = "clone"
	StepMap       Step = "map"
	StepMount     Step = "mount"
	StepContainer Step = "container" // the driver's Create
	StepStart     Step = "start"     // the driver's Start
	StepReady     Step = "ready"
	// StepPostRestore runs App.PostRestore in a restored instance.
	StepPostRestore Step = "post_restore"
	StepBind        Step = "bind"
	// StepQueue: a pool hit waited for its turn (Config.HitConcurrency).
	StepQueue Step = "queue"
)

// Stages are the stages an instance goes through in a slot, each step
// written into the slot's record before it happens: provision (clone, map,
// mount, the node's copies, the container), start and ready (the app's
// identity, readiness, post_restore), and the release of what a slot or a
// deployment owns.
type Stages struct {
	*node
	drv   *Drivers
	envs  *EnvCopies
	ckpts *Checkpoints
	// slots are the records of the slots the stages run in.
	slots journal.Journal[Slot]
}

// ProvisionSteps are the steps of provision, which a pool hit does not wait
// for.
var ProvisionSteps = []Step{StepLower, StepClone, StepMap, StepMount, StepFetch, StepContainer}

// op times the steps of one pipeline run: each phase goes to *timings and
// to prog.
type op struct {
	start   time.Time
	timings *layering.Timings
	prog    func(string, time.Duration)
	// merge: the instance's start asks its pages to be merged with
	// other instances' (a pool slot restored ahead, Config.MemoryMerge).
	merge bool
	// lazy: the instance's start asks its restore to read the app's
	// memory lazily where the engine can (a resume's).
	lazy bool
}

func (sg *Stages) newOp(timings *layering.Timings, prog func(string, time.Duration)) *op {
	return &op{start: time.Now(), timings: timings, prog: prog}
}

func (o *op) phase(step Step) {
	name := string(step)
	now := time.Now()
	took := now.Sub(o.start)
	*o.timings = append(*o.timings, layering.Phase{Name: name, Duration: took})
	o.start = now
	if o.prog != nil {
		o.prog(name, took)
	}
}

func prefixed(p string, t layering.Timings) layering.Timings {
	out := make(layering.Timings, len(t))
	for i, ph := range t {
		out[i] = layering.Phase{Name: p + ph.Name, Duration: ph.Duration}
	}
	return out
}

// provision runs the provision stage of slot s (a record already created,
// in SlotProvisioning, owning its images and mappings): clone or create its
// images, map and mount them under s.Dir, bring a restore's checkpoint to
// the node (meanwhile), and create its instance. src says where the images
// come from. It leaves s in SlotIdle.
func (sg *Stages) provision(ctx context.Context, o *op, s *Slot, src slotSource) (err error) {
	// A restore reads its checkpoint from the node's copy (cache.go),
	// fetched while the environment is cloned, mapped and mounted, and,
	// where the driver reads it only once started, while its instance is
	// created too.
	var source string
	var fetched bool
	wait := func() error { return nil }
	known, fetching := make(chan string, 1), make(chan struct{})
	if src.gen != nil {
		wait = async(func() error {
			defer close(fetching)
			e, f, err := sg.ckpts.ckptSource(ctx, *src.gen, func(dir string) { known <- dir }, src.fetch)
			source, fetched = e.Dir, f
			return err
		})
		defer func() { _ = wait() }()
	}
	env, lower, lowerMade, err := sg.envs.slotEnv(ctx, o, s, src)
	defer func() { _, _ = lowerMade() }() // nothing of it outlives the call
	if err != nil {
		return err
	}
	if err := sg.cloneSlot(ctx, s, src, env, lower); err != nil {
		return err
	}
	o.phase(StepClone)
	envMap, ckptMap, err := sg.mapSlot(ctx, s)
	if err != nil {
		return err
	}
	o.phase(StepMap)
	if lower.App != "" && lower.Root == "" {
		// Made meanwhile.
		if lower, err = lowerMade(); err != nil {
			return err
		}
		o.phase(StepLower)
	}
	envPath, ckptPath, err := sg.mountSlot(ctx, s, envMap, ckptMap, lower)
	if err != nil {
		return err
	}
	o.phase(StepMount)
	inst := instanceSource{envPath: envPath, ckptPath: ckptPath}
	if src.gen != nil {
		// The instance's own checkpoint directory (where a later
		// checkpoint of it would go); the generation it restores is
		// bound read-only inside it.
		if err := os.MkdirAll(ckptPath, 0o755); err != nil {
			return fmt.Errorf("slot %s checkpoint directory: %w", s.ID, err)
		}
		if dir, ok := sg.ckpts.sourceLater(s, src, known, fetching); ok {
			inst.source, inst.later = dir, true
			if err := sg.createInstance(ctx, s, src, inst); err != nil {
				return err
			}
			o.phase(StepContainer)
		}
		if err := wait(); err != nil {
			return err
		}
		s.Fetched = fetched
		o.phase(StepFetch)
	}
	if !inst.later {
		inst.source = source
		if err := sg.createInstance(ctx, s, src, inst); err != nil {
			return err
		}
		o.phase(StepContainer)
	}
	s.Phase = SlotIdle
	return sg.slots.Save(s.ID, s)
}

// onCkpt runs f on the slot's checkpoint image, if it has one.
func onCkpt(s *Slot, f func(img string) error) func() error {
	return func() error {
		if len(s.Images) < 2 {
			return nil
		}
		return f(s.Images[1])
	}
}

// cloneSlot makes the slot's images (the environment's clone, an empty
// checkpoint image) at once and tags them with what they belong to.
func (sg *Stages) cloneSlot(ctx context.Context, s *Slot, src slotSource, env layering.SnapRef, lower Lower) error {
	st := sg.deps.Store
	shared := lower.App != "" // a zero Lower: not on the shared read path
	if err := both(
		func() error {
			if shared && !src.resume {
				return sg.envs.cloneBlank(ctx, env, lower, s.Images[0])
			}
			return st.Clone(ctx, env, s.Images[0])
		},
		onCkpt(s, func(img string) error { return st.Create(ctx, img, src.ckptSize) })); err != nil {
		return err
	}
	meta := map[string]string{catalog.MetaSlot: s.ID}
	if shared {
		meta[catalog.MetaRestores] = lower.App + "/" + strconv.Itoa(lower.Gen)
	}
	if s.Deployment != "" {
		meta[catalog.MetaDeployment] = s.Deployment
	}
	if sg.cfg.Node != "" {
		meta[catalog.MetaNode] = sg.cfg.Node
	}
	for _, img := range s.Images {
		_ = st.SetMeta(ctx, img, meta)
	}
	return nil
}

// mapSlot maps the slot's images at once.
func (sg *Stages) mapSlot(ctx context.Context, s *Slot) (envMap, ckptMap *mapper.Mapping, err error) {
	mp := sg.deps.Mapper
	err = both(
		func() (err error) {
			envMap, err = mp.Map(ctx, mapper.Image{Pool: sg.cfg.Pool, Name: s.Images[0]}, mapper.WithID(s.Mappings[0]))
			return err
		},
		onCkpt(s, func(img string) (err error) {
			ckptMap, err = mp.Map(ctx, mapper.Image{Pool: sg.cfg.Pool, Name: img}, mapper.WithID(s.Mappings[1]))
			return err
		}))
	return envMap, ckptMap, err
}

// mountSlot mounts the slot's mappings at once (the checkpoint image
// formatted on first mount) and, on the shared read path, the overlay of
// the node's copy under the clone. It returns the instance's root and
// checkpoint directory ("" for a boot).
func (sg *Stages) mountSlot(ctx context.Context, s *Slot, envMap, ckptMap *mapper.Mapping, lower Lower) (envPath, ckptPath string, err error) {
	mp := sg.deps.Mapper
	envPath = filepath.Join(s.Dir, "root")
	if s.Lower != "" {
		// The clone takes the overlay's upper directory.
		envPath = filepath.Join(s.Dir, "disk")
	}
	if s.Mode != drivers.RunBoot {
		ckptPath = slotCkptDir(*s)
	}
	if err := both(
		func() error { return mp.Mount(ctx, envMap, envPath, mapper.MountOptions{}) },
		onCkpt(s, func(string) error { return mp.Mount(ctx, ckptMap, ckptPath, mapper.MountOptions{Format: true}) })); err != nil {
		return "", "", err
	}
	if lower.App != "" {
		if envPath, err = sg.envs.overlayRoot(ctx, lower, s.Dir); err != nil {
			return "", "", err
		}
	}
	return envPath, ckptPath, nil
}

// slotCkptDir is slot s's checkpoint volume: its checkpoint image's mount
// (s.Dir/ckpt), or, without one, a directory of its own. On the shared
// read path that directory lies in the shared mount of its root
// (sharedCkptDir), where the host can mount a generation's directory in
// memory for a migration's checkpoint after the instance is made.
func slotCkptDir(s Slot) string {
	if s.Handle != nil && s.Handle.CkptPath != "" {
		return s.Handle.CkptPath
	}
	if len(s.Images) < 2 && s.Lower != "" {
		return sharedCkptDir(s.Dir)
	}
	return filepath.Join(s.Dir, "ckpt")
}

// sharedCkptDir is the checkpoint volume of a slot in directory dir that
// lies in the shared mount of its root (dir/mnt, overlayRoot).
func sharedCkptDir(dir string) string { return filepath.Join(dir, "mnt", "ckpt") }

// instanceSource is where a slot's instance finds its root and its
// checkpoint: later, its source is still being fetched when it is
// created (drivers.Run.SourceLater).
type instanceSource struct {
	envPath, ckptPath, source string
	later                     bool
	// rootLater, if set, is the environment's files (the node's copy):
	// the root at envPath is mounted, and the checkpoint put in ckptPath,
	// only after the instance is created (drivers.Run.RootLater).
	rootLater string
}

// createInstance creates the slot's instance with its driver, waiting
// (not started), and records it.
func (sg *Stages) createInstance(ctx context.Context, s *Slot, src slotSource, in instanceSource) error {
	ctl := filepath.Join(s.Dir, "ctl")
	if err := os.MkdirAll(ctl, 0o755); err != nil {
		return fmt.Errorf("slot %s control directory: %w", s.ID, err)
	}
	dr, err := sg.drv.driverByRun(src.app, s.Mode, src.engine)
	if err != nil {
		return err
	}
	gen := s.Gen
	if in.rootLater != "" {
		gen = 0 // the newest it finds once ordered: the one put there
	}
	run := drivers.Run{Mode: s.Mode, ID: s.ID, App: src.app, EnvPath: in.envPath, CkptPath: in.ckptPath, CkptSource: in.source, SourceLater: in.later, Gen: gen,
		ImageEnv: src.config.Env, WorkDir: src.config.WorkDir, CtlPath: ctl, Background: s.Pool || src.background, Limits: sg.cfg.Limits, Resettable: s.Lower != "" && !src.resume,
		RootLater: in.rootLater != "", EnvFiles: in.rootLater, CkptShared: in.ckptPath != "" && in.ckptPath == sharedCkptDir(s.Dir)}
	h, err := dr.Create(ctx, run)
	if err != nil {
		return err
	}
	s.Handle, s.Ports = &h, h.Ports
	if err := sg.slots.Save(s.ID, s); err != nil {
		_ = dr.Remove(context.WithoutCancel(ctx), h)
		return err
	}
	return nil
}

// slotSource is what a slot's images and instance are made from.
type slotSource struct {
	app spec.App
	// engine is the checkpoint engine (RunLaunch, RunRestart).
	engine engine.Name
	// env is the environment snapshot to clone.
	env layering.SnapRef
	// gen is the generation a RunRestart slot restores (its checkpoint
	// comes from the node's cache); a RunLaunch slot writes a fresh
	// checkpoint image of ckptSize bytes instead.
	gen      *spec.Generation
	ckptSize int64
	// resume: env is a suspension's writable image (spec.Suspension),
	// over the node's copy of lowerOf's environment when the slot has a
	// Lower; its instance serves once (its root cannot be reset).
	resume  bool
	lowerOf *spec.Generation
	// config is the environment's ENV and WORKDIR.
	config layering.ImageConfig
	// background creates the instance at background CPU priority, as a
	// pool slot's (Options.Background).
	background bool
	// fetch, if set, brings gen's checkpoint (Options.Checkpoint).
	fetch FetchCheckpoint
}

// async runs f in the background; the function it returns waits for f's
// error (once; later calls return it again).
func async(f func() error) (wait func() error) {
	done := make(chan error, 1)
	go func() { done <- f() }()
	var err error
	waited := false
	return func() error {
		if !waited {
			err, waited = <-done, true
		}
		return err
	}
}

// both runs a and b concurrently and joins their errors.
func both(a, b func() error) error {
	var wg sync.WaitGroup
	var ea, eb error
	wg.Go(func() { ea = a() })
	wg.Go(func() { eb = b() })
	wg.Wait()
	return errors.Join(ea, eb)
}

// startReady runs the start and ready stages of slot s for deployment
// dep: it orders the instance to run as dep (or, restored ahead, raises
// it) and waits until its app is ready. restored says whether the app
// comes from a checkpoint.
func (sg *Stages) startReady(ctx context.Context, o *op, s *Slot, dep string, app spec.App, restored bool) (drivers.Driver, drivers.Handle, error) {
	if s.Handle == nil {
		return nil, drivers.Handle{}, fmt.Errorf("slot %s has no instance", s.ID)
	}
	dr := sg.drv.driverByName(s.Handle.Driver)
	if dr == nil {
		return nil, drivers.Handle{}, fmt.Errorf("%w: driver %q of slot %s", drivers.ErrDriver, s.Handle.Driver, s.ID)
	}
	h := *s.Handle
	h.Deployment = dep
	id, err := sg.identify(ctx, s, h, app, restored)
	if err != nil {
		return nil, drivers.Handle{}, err
	}
	if s.Ahead {
		// Restored ahead (ahead.go), its app runs already: starting it
		// is raising it to the normal weight.
		r, ok := dr.(drivers.Raiser)
		if !ok {
			return nil, drivers.Handle{}, fmt.Errorf("slot %s: driver %s: %w", s.ID, s.Handle.Driver, ErrNotAhead)
		}
		if h, err = r.Raise(ctx, h); err != nil {
			return nil, drivers.Handle{}, err
		}
		s.Handle = &h
		o.phase(StepRaise)
		return dr, h, sg.ready(ctx, o, dr, h, app, restored, id)
	}
	h.MemoryMerge, h.Lazy = o.merge, o.lazy
	if h, err = dr.Start(ctx, h); err != nil {
		return nil, drivers.Handle{}, err
	}
	s.Handle, s.Ports = &h, h.Ports
	if err := sg.slots.Save(s.ID, s); err != nil {
		return nil, drivers.Handle{}, err
	}
	o.phase(StepStart)
	return dr, h, sg.ready(ctx, o, dr, h, app, restored, id)
}

// identify writes the identity of deployment h.Deployment where slot s's
// instance reads it (identity.go).
func (sg *Stages) identify(ctx context.Context, s *Slot, h drivers.Handle, app spec.App, restored bool) (spec.Identity, error) {
	if !s.KeepSeed || s.Seed == "" {
		s.Seed = newSeed()
	}
	id := spec.Identity{Instance: h.Deployment, App: app.Name, Node: sg.cfg.Node, Slot: s.ID, Seed: s.Seed, Started: time.Now().UTC()}
	if restored {
		id.Gen = s.Gen
	}
	if h.EnvPath == "" {
		return id, nil
	}
	if bound, err := writeIdentityCtl(h, id); bound || err != nil {
		return id, err
	}
	if err := writeIdentityWithin(ctx, h.EnvPath, id, readyTimeout(app)); err != nil {
		if errors.Is(err, mapper.ErrStalled) || ctx.Err() != nil {
			return id, err
		}
		if restored && len(app.PostRestore) > 0 {
			return id, hint.With(err, "post_restore reads the identity: give the environment a /run directory that is not a symbolic link")
		}
		sg.log.Warn("the instance gets no identity file", "slot", s.ID, "deployment", h.Deployment, "err", err)
	}
	return id, nil
}

// ready runs the ready stage of instance h: it waits until its app is
// ready, then runs a restored app's post_restore with identity id.
func (sg *Stages) ready(ctx context.Context, o *op, dr drivers.Driver, h drivers.Handle, app spec.App, restored bool, id spec.Identity) error {
	if err := sg.waitReady(ctx, dr, h, app, restored); err != nil {
		return err
	}
	o.phase(StepReady)
	if restored && len(app.PostRestore) > 0 {
		if err := sg.postRestore(ctx, dr, h, app, id); err != nil {
			return err
		}
		o.phase(StepPostRestore)
	}
	return nil
}

// genConfig is the ENV and WORKDIR generation g was launched with (the
// environment's current ones for generations that did not record them).
func (sg *Stages) genConfig(ctx context.Context, g spec.Generation) layering.ImageConfig {
	if g.EnvConfig != nil {
		return *g.EnvConfig
	}
	env, _ := sg.deps.Envs.Get(ctx, g.Env)
	return env.Config
}
