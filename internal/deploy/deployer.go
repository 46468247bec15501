// Package deploy is fogdeploy's deploy path on one node: the first deploy of
// an app boots it under a checkpoint engine on a clone of its environment,
// waits until it is ready, checkpoints it into a fresh checkpoint image and
// seals both images with a protected snapshot (a checkpoint generation).
// Every later deploy clones the environment's snapshot (copy-on-write,
// metadata only), maps and mounts the clone, and restores the app from the
// node's one read-only copy of the checkpoint (cache.go).
//
//	d, _ := deploy.New(deploy.Config{StateDir: dir, Pool: "fogdeploy", Node: "n1"}, deploy.Deps{...})
//	dep, err := d.Deploy(ctx, app, deploy.Options{})  // boot+checkpoint once, then restore
//	fmt.Println(dep.Timings)                         // clone 20ms, map 40ms, mount 35ms, container 90ms, ready 380ms
//	err = d.Undeploy(ctx, dep.ID)                     // container, mounts, mappings and clones are gone
//
// Every step that creates something is written to the deployment's record
// (StateDir/deployments/<id>.json) before it happens, so that a failure (or
// a later Undeploy or Adopt, in another process) removes exactly what was
// made. The lifecycle is split into Checkpoint (produce a generation) and
// Restore (an instance from a generation) so that a warm pool, an adaptive
// boot-or-restore choice, lazy restore and migration can reuse them.
//
// The deploy path is a few types, each owning its state and its records,
// from the bottom up (each takes only those below it; New wires them):
//
//   - node (node.go): the configuration, the components and their
//     primitives (remove an image, release mappings), shared by all;
//   - Drivers (drivers.go): which driver runs an app, and its engine's check;
//   - Records (records.go): the deployments' records (internal/journal);
//   - EnvCopies (lower.go): the node's read-only copies of generations'
//     environments, and the pool's blank filesystems;
//   - Checkpoints (cache.go, gens.go, known.go): the node's copies of
//     checkpoints, and what it knows of the generations;
//   - Stages (stages.go, ready.go, identity.go, release.go): what an
//     instance goes through in a slot, and the release of what it owns;
//   - Pool (slots.go, pool.go, ahead.go, recycle.go, spare.go): the slots,
//     the warm pools, restore ahead, recycling and spare slots;
//   - Handoffs (handoff.go): the checkpoints a migration's source keeps
//     for its target, and their durable copies;
//   - Suspensions (suspend*.go, prepare.go): suspends, their images, and
//     the slots prepared for a resume;
//   - Deployer: the lifecycle that composes them per deployment: Deploy's
//     choice (policy.go), the three ways an instance starts (boot.go,
//     checkpoint.go with restore.go, resume.go), the handover of a slot
//     (bind.go), undeploy.go, a node's start (adopt.go), liveness and
//     activity (alive.go, activity.go).
//
// errors.go holds the sentinels, compat.go whether a generation restores
// here, coalesce.go lookups shared by callers at once. Where the app runs
// (the container and host drivers, and their behaviour suite) is package
// drivers; the scenarios' nodes, real and of fakes, are deploytest.
package deploy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/gencache"
	"github.com/fogdeploy/fogdeploy/internal/journal"
	"github.com/fogdeploy/fogdeploy/internal/keyedmutex"
	"github.com/fogdeploy/fogdeploy/internal/overlay"
	fdruntime "github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// Config configures a Deployer.
type Config struct {
	// StateDir holds deployment records and mount points on this node.
	StateDir string
	// Pool is the RBD pool (for the mapper).
	Pool string
	// Node names this node in records.
	Node string
	// Drivers maps an engine to the driver that runs its apps: container
	// (the default for an engine not listed) or host.
	Drivers map[engine.Name]spec.DriverName
	// ReadyInterval is the pause between readiness probes (default 10ms).
	ReadyInterval time.Duration
	// CacheBytes is the byte budget of the node's checkpoint cache
	// (StateDir/gens, gencache): every restore of a generation on this
	// node reads its files from one local copy. 0: no limit.
	CacheBytes int64
	// EnvRead is where restores read their environment from (default
	// EnvShared).
	EnvRead EnvRead
	// StopGrace bounds removing an instance beyond its driver's stop
	// timeout (default DefaultStopGrace). A process blocked in the kernel
	// (on the I/O of an image the cluster stopped serving) never exits,
	// and Docker waits for it without end; past the bound, Undeploy fails
	// and its caller cuts the mappings off, which ends the wait.
	StopGrace time.Duration
	// HitConcurrency is how many pool hits run their stages (start, ready,
	// bind) at once on this node; the others wait in arrival order
	// (StepQueue). 0: the number of CPUs plus one (DefaultHitConcurrency).
	// Hits are short and mostly CPU: served all at once they share the
	// CPUs and end together, each as late as the last; served a few at a
	// time, the first end first, and the last no later.
	HitConcurrency int
	// Limits are an instance's where its app spec is silent (the
	// agent's `limits:`); zero: none.
	Limits spec.Limits
	// SparePorts and SpareBytes are what a spare slot is made with
	// (spare.go): how many generic ports its instance publishes, and the
	// size of its writable image; 0: DefaultSparePorts, DefaultSpareBytes.
	SparePorts int
	SpareBytes int64
	// AdoptWait bounds how long Adopt asks again a driver that cannot
	// tell whether an instance runs (default DefaultAdoptWait).
	AdoptWait time.Duration
	// MemoryMerge: a pool slot restored ahead asks its processes' pages
	// to be merged with the identical pages of other instances on the
	// node (internal/ksm; the node's scanner turned on by the caller).
	// Only the container driver's instances ask it.
	MemoryMerge bool
}

// DriverOf is the driver that runs engine eng's apps.
func (c Config) DriverOf(eng engine.Name) spec.DriverName {
	if dr := c.Drivers[eng]; dr != "" {
		return dr
	}
	return spec.DriverContainer
}

// DefaultHitConcurrency is the default Config.HitConcurrency: the number
// of CPUs plus one, so that the CPUs stay busy while one hit waits for the
// disk or the cluster.
func DefaultHitConcurrency() int { return runtime.NumCPU() + 1 }

// DefaultStopGrace is the default Config.StopGrace.
const DefaultStopGrace = 30 * time.Second

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	if !filepath.IsAbs(c.StateDir) {
		errs = append(errs, fmt.Errorf("deploy state dir %q: give an absolute path", c.StateDir))
	}
	if c.StopGrace < 0 {
		errs = append(errs, fmt.Errorf("stop grace %s: give 0 (the default, %s) or more", c.StopGrace, DefaultStopGrace))
	}
	if c.HitConcurrency < 0 {
		errs = append(errs, fmt.Errorf("hit concurrency %d: give 0 (the default, the number of CPUs plus one) or more", c.HitConcurrency))
	}
	if c.SparePorts < 0 || c.SparePorts > fdruntime.MaxSparePorts {
		errs = append(errs, fmt.Errorf("spare ports %d: give 0 (the default, %d) to %d", c.SparePorts, DefaultSparePorts, fdruntime.MaxSparePorts))
	}
	if c.SpareBytes < 0 || (c.SpareBytes > 0 && c.SpareBytes < 64<<20) {
		errs = append(errs, fmt.Errorf("spare bytes %d: give 0 (the default, %d) or at least 64 MiB", c.SpareBytes, DefaultSpareBytes))
	}
	if c.CacheBytes < 0 {
		errs = append(errs, fmt.Errorf("checkpoint cache budget %d bytes: give 0 (no limit) or more", c.CacheBytes))
	}
	if c.Pool == "" {
		errs = append(errs, errors.New("deploy pool is empty: name the RBD pool"))
	}
	switch c.EnvRead {
	case "", EnvShared, EnvClone:
	default:
		errs = append(errs, fmt.Errorf("environment read path %q: use %s or %s", c.EnvRead, EnvShared, EnvClone))
	}
	for eng, dr := range c.Drivers {
		switch dr {
		case "", spec.DriverContainer, spec.DriverHost:
		default:
			errs = append(errs, fmt.Errorf("%s driver %q: use container or host", eng, dr))
		}
	}
	return errors.Join(errs...)
}

// Mapper maps the pool's images on this node and mounts them: the
// mapper's node contract (rbd-layering/mapper's Mapper, and the fake of
// package fakemapper, both held to mappertest.RunNodeSuite).
type Mapper interface {
	mapper.Node
}

// Envs looks environments up (rbd-layering's Manager).
type Envs interface {
	Get(ctx context.Context, name string) (layering.Environment, error)
	// CheckDepth refuses a clone chain past the hard depth and warns past
	// the soft one.
	CheckDepth(ctx context.Context, ref layering.SnapRef, envName string) (warning string, err error)
}

var (
	_ Mapper = (*mapper.Mapper)(nil)
	_ Envs   = (*layering.Manager)(nil)
)

// Deps are the components a Deployer drives.
type Deps struct {
	Store  layering.Backend
	Envs   Envs
	Mapper Mapper
	// Container runs the apps of the engines in the light container (may
	// be nil when every engine's driver is "host").
	Container drivers.Driver
	// Host runs the apps of an engine whose driver is "host"; may be
	// nil when no app needs it.
	Host drivers.Driver
	// Roots mount instances' roots on the shared read path (EnvShared);
	// nil: the kernel's overlay (overlay.Kernel).
	Roots overlay.Roots
	Log   *slog.Logger
}

// Deployer deploys apps on this node. It is safe for concurrent use.
type Deployer struct {
	*node
	// drv picks the driver of each instance (drivers.go).
	drv *Drivers

	// recs are the deployments' records (records.go).
	recs *Records
	// suspensions are the node's suspends and prepared resumes
	// (suspend*.go, prepare.go).
	suspensions *Suspensions
	// pool are the node's slots: the warm pools, the spares (slots.go,
	// pool.go, ahead.go, recycle.go, spare.go).
	pool *Pool
	// hits admits Config.HitConcurrency pool hits at a time (hitTurn).
	hits chan struct{}
	// appLock: one producer of an app's first checkpoint on this node.
	appLock keyedmutex.Map[string]
	// platform is this node's, recorded in the generations it seals.
	platform spec.Platform
	// stages are what an instance goes through in a slot (stages.go).
	stages *Stages
	// ckpts are the node's copies of checkpoints and what it knows of the
	// generations (cache.go, gens.go, known.go).
	ckpts *Checkpoints
	// envs are the node's copies of generations' environments and the
	// pool's blank filesystems (lower.go).
	envs *EnvCopies
}

// New returns a Deployer.
func New(cfg Config, deps Deps) (*Deployer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Store == nil || deps.Envs == nil || deps.Mapper == nil {
		return nil, errors.New("deploy: store, environment manager and mapper are required")
	}
	if cfg.ReadyInterval <= 0 {
		cfg.ReadyInterval = 10 * time.Millisecond
	}
	if cfg.HitConcurrency == 0 {
		cfg.HitConcurrency = DefaultHitConcurrency()
	}
	if cfg.AdoptWait <= 0 {
		cfg.AdoptWait = DefaultAdoptWait
	}
	if cfg.EnvRead == "" {
		cfg.EnvRead = EnvShared
	}
	if cfg.SparePorts == 0 {
		cfg.SparePorts = DefaultSparePorts
	}
	if cfg.SpareBytes == 0 {
		cfg.SpareBytes = DefaultSpareBytes
	}
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	if deps.Roots == nil {
		deps.Roots = overlay.Kernel{}
	}
	if err := mkdirs(cfg.StateDir); err != nil {
		return nil, err
	}
	// Blank filesystems that a killed process was making (upperSource).
	left, _ := filepath.Glob(filepath.Join(cfg.StateDir, "tmp", "blank-*"))
	for _, p := range left {
		_ = os.RemoveAll(p)
	}
	cache, err := gencache.New(filepath.Join(cfg.StateDir, "gens"), cfg.CacheBytes)
	if err != nil {
		return nil, err
	}
	// Copies that a killed process left half made.
	if removed, err := cache.Recover(); err != nil {
		deps.Log.Warn("checkpoint cache: removing what interrupted fills left", "err", err)
	} else if len(removed) > 0 {
		deps.Log.Info("checkpoint cache: removed what interrupted fills left", "paths", removed)
	}
	n := &node{cfg: cfg, deps: deps, log: deps.Log}
	drv := &Drivers{node: n}
	// The parts, from the bottom up: each takes only those below it.
	recs := &Records{node: n, drv: drv,
		deployments: journal.Journal[Deployment]{Dir: filepath.Join(cfg.StateDir, "deployments"), What: "deployment", NotFound: spec.ErrNotFound, Exists: spec.ErrExists, Log: n.log}}
	slots := journal.Journal[Slot]{Dir: filepath.Join(cfg.StateDir, "slots"), What: "slot", NotFound: ErrNoSlot, Exists: spec.ErrExists, Log: n.log}
	envs := &EnvCopies{node: n, blanks: map[int64]layering.SnapRef{},
		lowers: journal.Journal[Lower]{Dir: filepath.Join(cfg.StateDir, "lowers", "records"), What: "environment copy", NotFound: ErrNoLower, Exists: spec.ErrExists, Log: n.log},
		used:   func(id string) (bool, error) { return lowerUsedBy(slots, recs.deployments, id) }}
	ckpts := &Checkpoints{node: n, cache: cache, drv: drv, envs: envs, listSlots: slots.List}
	stages := &Stages{node: n, drv: drv, envs: envs, ckpts: ckpts, slots: slots}
	pool := &Pool{node: n, drv: drv, envs: envs, ckpts: ckpts, recs: recs, stages: stages, slots: slots,
		idle: map[string]idleSlot{}, spares: map[string]Slot{}, claimed: map[string]claimedSlot{}, releasing: map[string]bool{}, starting: map[string]*startingSlot{}}
	suspensions := &Suspensions{node: n, drv: drv, envs: envs, ckpts: ckpts, recs: recs, stages: stages, pool: pool, handoffs: newHandoffs(n, ckpts)}
	return &Deployer{node: n, drv: drv, recs: recs, envs: envs, ckpts: ckpts, stages: stages, pool: pool, suspensions: suspensions,
		platform: spec.HostPlatform(), hits: make(chan struct{}, cfg.HitConcurrency)}, nil
}
