// Package deploy is fogdeploy's deploy path on one node: the first deploy of
// an app boots it under a checkpoint engine on a clone of its environment,
// waits until it is ready, checkpoints it into a fresh checkpoint image and
// seals both images with a protected snapshot (a checkpoint generation).
// Every later deploy clones both snapshots (copy-on-write, metadata only),
// maps and mounts the clones and restores the app from the checkpoint.
//
//	d, _ := deploy.New(deploy.Config{StateDir: dir, Pool: "fogdeploy", Node: "n1"}, deploy.Deps{...})
//	dep, err := d.Deploy(ctx, app, deploy.Options{})  // boot+checkpoint once, then restore
//	fmt.Println(dep.Timings)                         // clone 20ms, map 40ms, mount 35ms, container 90ms, ready 380ms
//	err = d.Undeploy(ctx, dep.ID)                     // container, mounts, mappings and clones are gone
//
// Every step that creates something is written to the deployment's record
// (StateDir/deployments/<id>.json) before it happens, so that a failure (or
// a later Undeploy or Recover, in another process) removes exactly what was
// made. The lifecycle is split into Checkpoint (produce a generation) and
// Restore (an instance from a generation) so that a warm pool, an adaptive
// boot-or-restore choice, lazy restore and migration can reuse them.
package deploy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/keyedmutex"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// Image names and metadata.
const (
	// GenPrefix starts the images of a checkpoint generation:
	// fdc-<app>-<gen>-env and fdc-<app>-<gen>-ckpt.
	GenPrefix = "fdc-"
	// InstancePrefix starts the clones of a deployment: fdi-<id>-env and
	// fdi-<id>-ckpt.
	InstancePrefix = "fdi-"
	// MetaGeneration holds the Generation record (JSON) on the checkpoint
	// image of a generation.
	MetaGeneration = "fogdeploy.generation"
	// MetaDeployment names the deployment that owns an instance clone.
	MetaDeployment = "fogdeploy.deployment"
	// MetaNode names the node that made an instance clone or a generation.
	MetaNode = "fogdeploy.node"
	// MaxIDLen bounds deployment IDs.
	MaxIDLen = 40
)

// Phases of a deployment.
const (
	PhaseCreating   = "Creating"
	PhaseBooting    = "Booting"
	PhaseRestoring  = "Restoring"
	PhaseRunning    = "Running"
	PhaseFailed     = "Failed"
	PhaseRemoving   = "Removing"
	PhaseCheckpoint = "Checkpointing"
	// PhaseCheckpointed ends a checkpoint refresh: a new generation is
	// sealed and no instance runs.
	PhaseCheckpointed = "Checkpointed"
)

// Config configures a Deployer.
type Config struct {
	// StateDir holds deployment records and mount points on this node.
	StateDir string
	// Pool is the RBD pool (for the mapper).
	Pool string
	// Node names this node in records.
	Node string
	// DMTCPDriver is "container" (default) or "host".
	DMTCPDriver string
	// ReadyInterval is the pause between readiness probes (default 10ms).
	ReadyInterval time.Duration
}

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	if !filepath.IsAbs(c.StateDir) {
		errs = append(errs, fmt.Errorf("deploy state dir %q: give an absolute path", c.StateDir))
	}
	if c.Pool == "" {
		errs = append(errs, errors.New("deploy pool is empty: name the RBD pool"))
	}
	switch c.DMTCPDriver {
	case "", "container", "host":
	default:
		errs = append(errs, fmt.Errorf("dmtcp driver %q: use container or host", c.DMTCPDriver))
	}
	return errors.Join(errs...)
}

// Deps are the components a Deployer drives.
type Deps struct {
	Store  layering.Backend
	Envs   *layering.Manager
	Mapper *mapper.Mapper
	// Container runs DMTCP apps (may be nil when DMTCPDriver is "host").
	Container Driver
	// Host runs CRIU apps (and DMTCP apps with DMTCPDriver "host"); may be
	// nil when no app needs it.
	Host Driver
	Log  *slog.Logger
}

// Deployer deploys apps on this node. It is safe for concurrent use.
type Deployer struct {
	cfg  Config
	deps Deps
	log  *slog.Logger

	// appLock: one producer of an app's first checkpoint on this node.
	appLock keyedmutex.Map[string]
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
	if cfg.DMTCPDriver == "" {
		cfg.DMTCPDriver = "container"
	}
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	for _, dir := range []string{"deployments", "instances"} {
		if err := os.MkdirAll(filepath.Join(cfg.StateDir, dir), 0o700); err != nil {
			return nil, fmt.Errorf("deploy state dir: %w", err)
		}
	}
	return &Deployer{cfg: cfg, deps: deps, log: deps.Log}, nil
}

// Generation is a checkpoint of an app: a sealed environment image and a
// sealed checkpoint image, restorable on any node of the PoP.
type Generation struct {
	App string `json:"app"`
	Gen int    `json:"gen"`
	// Env is the environment's name and EnvFrom the snapshot it was cloned
	// from at boot.
	Env     string           `json:"env"`
	EnvFrom layering.SnapRef `json:"env_from"`
	// EnvSnap and CkptSnap are the sealed snapshots every restore clones.
	EnvSnap  layering.SnapRef `json:"env_snap"`
	CkptSnap layering.SnapRef `json:"ckpt_snap"`
	Engine   string           `json:"engine"`
	// EngineVersion is the engine's version; Driver the driver that ran it.
	EngineVersion string `json:"engine_version,omitempty"`
	Driver        string `json:"driver"`
	// Bytes is the size of the engine's image; CheckpointMS how long
	// writing it took.
	Bytes        int64   `json:"bytes"`
	CheckpointMS float64 `json:"checkpoint_ms"`
	// BootReadyMS is how long the app took from start to ready at boot.
	BootReadyMS float64          `json:"boot_ready_ms"`
	Node        string           `json:"node,omitempty"`
	Created     time.Time        `json:"created"`
	Timings     layering.Timings `json:"timings"`
	Spec        App              `json:"spec"`
	// EnvConfig is the environment's ENV and WORKDIR as the checkpointed
	// app was launched with them; every restore uses it, whatever the
	// environment's tag says since. Nil for generations sealed before it
	// was recorded: their restores use the environment's current one.
	EnvConfig *layering.ImageConfig `json:"env_config,omitempty"`
}

// Deployment is the record of one instance on this node.
type Deployment struct {
	ID    string `json:"id"`
	App   string `json:"app"`
	Node  string `json:"node,omitempty"`
	Phase string `json:"phase"`
	// Gen is the checkpoint generation restored (0 while booting).
	Gen int `json:"gen"`
	// Mode is ModeRestore (from a checkpoint generation) or ModeBoot (the
	// app booted with no checkpoint engine; BootReason says why).
	Mode       string `json:"mode"`
	BootReason string `json:"boot_reason,omitempty"`
	// Booted is set when this deploy had to produce the generation first.
	Booted bool `json:"booted,omitempty"`
	// Images are the RBD images this deployment owns.
	Images []string `json:"images,omitempty"`
	// Mappings are the mapper IDs of its mapped images.
	Mappings []string `json:"mappings,omitempty"`
	// Dir holds its mount points.
	Dir    string  `json:"dir,omitempty"`
	Handle *Handle `json:"handle,omitempty"`
	// Ports maps "6379/tcp" to the address where the instance answers.
	Ports map[string]string `json:"ports,omitempty"`
	// Timings are this deploy's phases in order; EngineReadyMS is the
	// engine's own restart-to-ready (or launch-to-ready) as measured
	// inside the instance, when the driver reports it.
	Timings       layering.Timings `json:"timings"`
	EngineReadyMS float64          `json:"engine_ready_ms,omitempty"`
	Error         string           `json:"error,omitempty"`
	Created       time.Time        `json:"created"`
}

// Total is the sum of the phases.
func (d Deployment) Total() time.Duration {
	var t time.Duration
	for _, p := range d.Timings {
		t += p.Duration
	}
	return t
}

// Deployment modes (Deployment.Mode, Options.Mode).
const (
	// ModeAuto restores, producing the first checkpoint generation if
	// there is none.
	ModeAuto = "auto"
	// ModeRestore: the instance was restored from a checkpoint generation.
	ModeRestore = "restore"
	// ModeCheckpoint asks a node for a new checkpoint generation of the
	// app (a refresh) and no instance.
	ModeCheckpoint = "checkpoint"
)

// What Deploy does when it cannot restore at once (Options.IfBusy,
// Options.IfNoEngine).
const (
	// PolicyWait waits for the deploy that produces the checkpoint.
	PolicyWait = "wait"
	// PolicyBoot boots the app normally, with no checkpoint engine.
	PolicyBoot = "boot"
	// PolicyFail fails the deploy.
	PolicyFail = "fail"
)

// ValidatePolicies checks Options.Mode, IfBusy and IfNoEngine values.
func ValidatePolicies(mode, ifBusy, ifNoEngine string) error {
	var errs []error
	switch mode {
	case "", ModeAuto, ModeBoot:
	default:
		errs = append(errs, fmt.Errorf("mode %q: use auto (restore, checkpointing first if needed) or boot (no checkpoint engine): %w", mode, ErrInvalidSpec))
	}
	switch ifBusy {
	case "", PolicyWait, PolicyBoot:
	default:
		errs = append(errs, fmt.Errorf("if_busy %q: use wait or boot: %w", ifBusy, ErrInvalidSpec))
	}
	switch ifNoEngine {
	case "", PolicyFail, PolicyBoot:
	default:
		errs = append(errs, fmt.Errorf("if_no_engine %q: use fail or boot: %w", ifNoEngine, ErrInvalidSpec))
	}
	return errors.Join(errs...)
}

// Options tune one Deploy.
type Options struct {
	// ID is the deployment ID; "" generates one from the app name.
	ID string
	// Mode is ModeAuto (default) or ModeBoot (always boot, no engine).
	Mode string
	// IfBusy says what a deploy does while another deploy produces the
	// app's first checkpoint: PolicyWait (default) for it, or PolicyBoot
	// normally meanwhile. It never produces a second checkpoint.
	IfBusy string
	// IfNoEngine says what a deploy does when this node cannot run the
	// app's checkpoint engine: PolicyFail (default) or PolicyBoot.
	IfNoEngine string
	// Progress receives each phase as it ends.
	Progress func(phase string, took time.Duration)
	// Prepare, if set, runs when a deploy has to produce the checkpoint
	// first: once the booted app is ready and before it is checkpointed.
	Prepare PrepareFunc
	// LockCheckpoint, if set, is held while this deploy checks for a
	// checkpoint and produces one when there is none: the PoP-wide lock
	// (etcd) that makes the checkpoint exactly once. The node-local lock is
	// always taken too. With wait false it returns an error wrapping
	// ErrBusy at once when another holder has it.
	LockCheckpoint func(ctx context.Context, wait bool) (unlock func(), err error)
	// Sealed, if set, is called with a generation this deploy produced.
	Sealed func(ctx context.Context, g Generation) error
}

// PrepareFunc runs against the booted app before its checkpoint, e.g. to
// warm a cache or load data that every restore then starts with.
type PrepareFunc func(ctx context.Context, t Target) error

// Target is a running instance as PrepareFunc sees it.
type Target struct {
	// Ports maps "6379/tcp" to the address where the app answers.
	Ports map[string]string
	// Root is where this node has the app's environment (its writable
	// clone) mounted; what is written there is part of the checkpoint.
	Root string
}

// CheckpointOptions tune Checkpoint.
type CheckpointOptions struct {
	Progress func(phase string, took time.Duration)
	Prepare  PrepareFunc
}

// NewID returns a fresh deployment ID for app.
func NewID(app string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	if len(app) > MaxIDLen-9 {
		app = strings.TrimRight(app[:MaxIDLen-9], "-._")
	}
	return app + "-" + hex.EncodeToString(b)
}

// ValidateID checks a deployment ID.
func ValidateID(id string) error {
	if err := layering.ValidateName("deployment id", id); err != nil {
		return fmt.Errorf("%w: %w", err, ErrInvalidSpec)
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("deployment id %q is longer than %d characters: %w", id, MaxIDLen, ErrInvalidSpec)
	}
	return nil
}

func (d *Deployer) driver(eng string) (Driver, error) {
	var dr Driver
	switch {
	case eng == engine.NameDMTCP && d.cfg.DMTCPDriver == "container":
		dr = d.deps.Container
	default:
		dr = d.deps.Host
	}
	if dr == nil {
		return nil, fmt.Errorf("%w: no driver configured for the %s engine", ErrDriver, eng)
	}
	return dr, nil
}

// Host returns the host driver (nil if none).
func (d *Deployer) Host() Driver { return d.deps.Host }

// Check reports whether this node can deploy app: the spec, the
// environment, and the engine behind its driver.
func (d *Deployer) Check(ctx context.Context, app App) (driver, version string, err error) {
	app = app.WithDefaults()
	if err := app.Validate(); err != nil {
		return "", "", err
	}
	if _, err := d.deps.Envs.Get(ctx, app.Env); err != nil {
		return "", "", fmt.Errorf("env %q of app %s: %w", app.Env, app.Name, err)
	}
	return d.CheckEngine(ctx, app.Engine)
}

// CheckEngine reports whether this node can run apps with the named engine,
// through which driver and at which engine version.
func (d *Deployer) CheckEngine(ctx context.Context, eng string) (driver, version string, err error) {
	dr, err := d.driver(eng)
	if err != nil {
		return "", "", err
	}
	v, err := dr.Check(ctx, eng)
	return dr.Name(), v, err
}

// Deploy runs an instance of app on this node: a restore from the newest
// checkpoint generation, after producing the first one if there is none.
// Options decide when it boots the app normally instead (Mode, IfBusy,
// IfNoEngine). On error nothing of the deployment is left on the node or in
// the pool.
func (d *Deployer) Deploy(ctx context.Context, app App, opts Options) (Deployment, error) {
	app = app.WithDefaults()
	if err := app.Validate(); err != nil {
		return Deployment{}, err
	}
	if err := ValidatePolicies(opts.Mode, opts.IfBusy, opts.IfNoEngine); err != nil {
		return Deployment{}, err
	}
	if opts.ID == "" {
		opts.ID = NewID(app.Name)
	}
	if err := ValidateID(opts.ID); err != nil {
		return Deployment{}, err
	}
	if _, err := d.Load(opts.ID); err == nil {
		return Deployment{}, fmt.Errorf("deployment %s: %w", opts.ID, ErrExists)
	}
	if opts.Mode == ModeBoot {
		return d.Boot(ctx, app, opts, "requested")
	}
	if _, _, err := d.Check(ctx, app); err != nil {
		if errors.Is(err, ErrDriver) && opts.IfNoEngine == PolicyBoot {
			d.log.Info("booting without a checkpoint engine", "app", app.Name, "reason", err)
			return d.Boot(ctx, app, opts, "no checkpoint engine ("+app.Engine+") on this node")
		}
		return Deployment{}, err
	}
	gen, err := d.Latest(ctx, app.Name)
	var boot layering.Timings
	if errors.Is(err, ErrNoCheckpoint) {
		// One producer per app on this node; the others wait and reuse.
		gen, boot, err = d.produceOnce(ctx, app, opts)
		if errors.Is(err, ErrBusy) {
			d.log.Info("booting while another deploy produces the checkpoint", "app", app.Name)
			return d.Boot(ctx, app, opts, "the first checkpoint is being produced by another deploy")
		}
	}
	if err != nil {
		return Deployment{}, err
	}
	dep, err := d.Restore(ctx, gen, opts)
	if len(boot) > 0 {
		dep.Booted = true
		dep.Timings = append(prefixed("boot.", boot), dep.Timings...)
		if err == nil {
			_ = d.save(&dep)
		}
	}
	return dep, err
}

// produceOnce returns the app's newest generation, producing it under the
// node-local and the caller's (PoP-wide) locks if there is none yet. With
// IfBusy PolicyBoot it returns ErrBusy instead of waiting for a lock.
func (d *Deployer) produceOnce(ctx context.Context, app App, opts Options) (Generation, layering.Timings, error) {
	wait := opts.IfBusy != PolicyBoot
	var unlockApp func()
	if wait {
		unlockApp = d.appLock.Lock(app.Name)
	} else if u, ok := d.appLock.TryLock(app.Name); ok {
		unlockApp = u
	} else {
		return Generation{}, nil, fmt.Errorf("app %s on this node: %w", app.Name, ErrBusy)
	}
	defer unlockApp()
	if opts.LockCheckpoint != nil {
		unlock, err := opts.LockCheckpoint(ctx, wait)
		if err != nil {
			return Generation{}, nil, err
		}
		defer unlock()
	}
	gen, err := d.Latest(ctx, app.Name)
	if !errors.Is(err, ErrNoCheckpoint) {
		return gen, nil, err
	}
	gen, err = d.Checkpoint(ctx, app, CheckpointOptions{Progress: opts.Progress, Prepare: opts.Prepare})
	if err != nil {
		return Generation{}, nil, err
	}
	if opts.Sealed != nil {
		if err := opts.Sealed(ctx, gen); err != nil {
			d.log.Warn("recording the new generation", "app", app.Name, "gen", gen.Gen, "err", err)
		}
	}
	return gen, gen.Timings, nil
}

// CheckBoot reports whether this node can boot apps with no checkpoint
// engine (the boot image of the Container driver).
func (d *Deployer) CheckBoot(ctx context.Context) error {
	c, ok := d.deps.Container.(*Container)
	if !ok || c == nil {
		return fmt.Errorf("%w: booting without an engine needs the container driver", ErrDriver)
	}
	return c.CheckBoot(ctx)
}

// Boot runs an instance of app with no checkpoint engine: a writable clone
// of its environment, mapped and mounted, and the app booted in the boot
// image's container. reason is recorded in Deployment.BootReason. On error
// nothing of it is left.
func (d *Deployer) Boot(ctx context.Context, app App, opts Options, reason string) (_ Deployment, err error) {
	app = app.WithDefaults()
	if err := app.Validate(); err != nil {
		return Deployment{}, err
	}
	if opts.ID == "" {
		opts.ID = NewID(app.Name)
	}
	if err := ValidateID(opts.ID); err != nil {
		return Deployment{}, err
	}
	env, err := d.deps.Envs.Get(ctx, app.Env)
	if err != nil {
		return Deployment{}, fmt.Errorf("env %q of app %s: %w", app.Env, app.Name, err)
	}
	if _, err := d.deps.Envs.CheckDepth(ctx, env.Ref, app.Env); err != nil {
		return Deployment{}, err
	}
	if err := d.CheckBoot(ctx); err != nil {
		return Deployment{}, err
	}
	dr := d.deps.Container
	o, err := d.begin(opts.ID, app.Name, 0, PhaseBooting, opts.Progress)
	if err != nil {
		return Deployment{}, err
	}
	o.rec.Mode, o.rec.BootReason = ModeBoot, reason
	defer o.undoOnError(ctx, &err)
	id := opts.ID
	if err := o.own([]string{InstancePrefix + id + "-env"}, []string{id + "-env"}); err != nil {
		return Deployment{}, err
	}
	envPath, _, err := o.cloneMapMount(ctx, env.Ref, nil, 0)
	if err != nil {
		return Deployment{}, err
	}
	h, err := d.start(ctx, o, dr, Run{Mode: ModeBoot, ID: id, App: app, EnvPath: envPath,
		ImageEnv: env.Config.Env, WorkDir: env.Config.WorkDir})
	if err != nil {
		return Deployment{}, err
	}
	if err := d.waitReady(ctx, dr, h, app, false); err != nil {
		return Deployment{}, err
	}
	o.phase("ready")
	return d.running(ctx, o, dr, h, app, "boot_ready")
}

// running marks an instance that answered Running, with the engine's own
// time to ready (timing phase) when its driver reports it.
func (d *Deployer) running(ctx context.Context, o *op, dr Driver, h Handle, app App, phase string) (Deployment, error) {
	if c, ok := dr.(*Container); ok {
		o.rec.EngineReadyMS = c.engineReady(ctx, h, app, phase)
	}
	o.rec.Phase = PhaseRunning
	if err := d.save(o.rec); err != nil {
		return Deployment{}, err
	}
	d.log.Info("deployed", "id", o.rec.ID, "app", o.rec.App, "mode", o.rec.Mode, "gen", o.rec.Gen, "ports", h.Ports, "timings", o.rec.Timings.String())
	return *o.rec, nil
}

// Logs returns the last n lines of a deployment's output.
func (d *Deployer) Logs(ctx context.Context, id string, n int) ([]string, error) {
	rec, err := d.Load(id)
	if err != nil {
		return nil, err
	}
	if rec.Handle == nil {
		return nil, fmt.Errorf("deployment %s has no instance yet (phase %s)", id, rec.Phase)
	}
	dr := d.driverByName(rec.Handle.Driver)
	if dr == nil {
		return nil, fmt.Errorf("%w: driver %q of deployment %s", ErrDriver, rec.Handle.Driver, id)
	}
	return dr.Logs(ctx, *rec.Handle, n)
}

// Adopt checks, at start, the deployments a previous run left on the
// node: a Running one whose instance still runs is kept; every other one
// (interrupted, failed, or whose instance is gone) is undeployed. It
// returns the kept and the removed IDs.
func (d *Deployer) Adopt(ctx context.Context) (kept, removed []string, err error) {
	recs, err := d.List()
	if err != nil {
		return nil, nil, err
	}
	var errs []error
	for _, r := range recs {
		if r.Phase == PhaseRunning && r.Handle != nil {
			if dr := d.driverByName(r.Handle.Driver); dr != nil {
				if ok, err := dr.Running(ctx, *r.Handle); err == nil && ok {
					kept = append(kept, r.ID)
					continue
				}
			}
		}
		if err := d.Undeploy(ctx, r.ID); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, r.ID)
	}
	return kept, removed, errors.Join(errs...)
}

// Mappings returns the mapping IDs that deployment records own.
func (d *Deployer) Mappings() (map[string]bool, error) {
	recs, err := d.List()
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, r := range recs {
		for _, m := range r.Mappings {
			out[m] = true
		}
	}
	return out, nil
}

func prefixed(p string, t layering.Timings) layering.Timings {
	out := make(layering.Timings, len(t))
	for i, ph := range t {
		out[i] = layering.Phase{Name: p + ph.Name, Duration: ph.Duration}
	}
	return out
}

// GenImage names image kind ("env" or "ckpt") of generation gen of app.
func GenImage(app string, gen int, kind string) string {
	return fmt.Sprintf("%s%s-%d-%s", GenPrefix, app, gen, kind)
}

// ParseGenImage splits fdc-<app>-<gen>-<env|ckpt>; ok is false for any
// other name.
func ParseGenImage(name string) (app string, gen int, kind string, ok bool) {
	rest, ok := strings.CutPrefix(name, GenPrefix)
	if !ok {
		return "", 0, "", false
	}
	i := strings.LastIndex(rest, "-")
	if i < 0 {
		return "", 0, "", false
	}
	rest, kind = rest[:i], rest[i+1:]
	j := strings.LastIndex(rest, "-")
	if j < 0 || (kind != "env" && kind != "ckpt") {
		return "", 0, "", false
	}
	gen, err := strconv.Atoi(rest[j+1:])
	if err != nil || gen < 1 || GenImage(rest[:j], gen, kind) != name {
		return "", 0, "", false
	}
	return rest[:j], gen, kind, true
}

// Generations returns the complete checkpoint generations of app, oldest
// first.
func (d *Deployer) Generations(ctx context.Context, app string) ([]Generation, error) {
	return Generations(ctx, d.deps.Store, app)
}

// Generations returns the complete checkpoint generations of app in the
// store's pool, oldest first.
func Generations(ctx context.Context, store layering.Store, app string) ([]Generation, error) {
	names, err := store.List(ctx)
	if err != nil {
		return nil, err
	}
	var out []Generation
	pre := GenPrefix + app + "-"
	for _, n := range names {
		rest, ok := strings.CutPrefix(n, pre)
		if !ok || !strings.HasSuffix(rest, "-ckpt") {
			continue
		}
		g, err := strconv.Atoi(strings.TrimSuffix(rest, "-ckpt"))
		if err != nil || GenImage(app, g, "ckpt") != n {
			continue
		}
		info, err := store.Stat(ctx, n)
		if errors.Is(err, layering.ErrNotFound) {
			continue
		} else if err != nil {
			return nil, err
		}
		raw := info.Meta[MetaGeneration]
		if raw == "" {
			continue // not sealed yet (or a crash before sealing)
		}
		var gr Generation
		if err := json.Unmarshal([]byte(raw), &gr); err != nil {
			return nil, fmt.Errorf("generation record of %s: %w", n, err)
		}
		out = append(out, gr)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Gen < out[j].Gen })
	return out, nil
}

// Latest returns app's newest complete generation, or ErrNoCheckpoint.
func (d *Deployer) Latest(ctx context.Context, app string) (Generation, error) {
	gens, err := d.Generations(ctx, app)
	if err != nil {
		return Generation{}, err
	}
	if len(gens) == 0 {
		return Generation{}, fmt.Errorf("app %s: %w", app, ErrNoCheckpoint)
	}
	return gens[len(gens)-1], nil
}

// nextGen is one past the highest generation number in use, sealed or not.
func (d *Deployer) nextGen(ctx context.Context, app string) (int, error) {
	names, err := d.deps.Store.List(ctx)
	if err != nil {
		return 0, err
	}
	next := 1
	pre := GenPrefix + app + "-"
	for _, n := range names {
		rest, ok := strings.CutPrefix(n, pre)
		if !ok {
			continue
		}
		i := strings.LastIndexByte(rest, '-')
		if i < 0 {
			continue
		}
		if g, err := strconv.Atoi(rest[:i]); err == nil && GenImage(app, g, rest[i+1:]) == n && g >= next {
			next = g + 1
		}
	}
	return next, nil
}

// op is one multi-step operation: a record written before each step, and
// the timing of each phase.
type op struct {
	d     *Deployer
	rec   *Deployment
	start time.Time
	prog  func(string, time.Duration)
}

func (o *op) phase(name string) {
	now := time.Now()
	took := now.Sub(o.start)
	o.rec.Timings = append(o.rec.Timings, layering.Phase{Name: name, Duration: took})
	o.start = now
	if o.prog != nil {
		o.prog(name, took)
	}
}

// own records images and mappings before they are made.
func (o *op) own(images []string, mappings []string) error {
	o.rec.Images = append(o.rec.Images, images...)
	o.rec.Mappings = append(o.rec.Mappings, mappings...)
	return o.d.save(o.rec)
}

// undoOnError marks the record Failed and undeploys it when *err is set.
func (o *op) undoOnError(ctx context.Context, err *error) {
	if *err == nil {
		return
	}
	o.rec.Phase, o.rec.Error = PhaseFailed, (*err).Error()
	_ = o.d.save(o.rec)
	*err = errors.Join(*err, o.d.Undeploy(context.WithoutCancel(ctx), o.rec.ID))
}

// cloneMapMount clones (or creates) the env and ckpt images of a
// deployment (o.rec.Images) and mounts them under its dir. A record that
// owns only an env image (a boot) gets no checkpoint image.
func (o *op) cloneMapMount(ctx context.Context, env layering.SnapRef, ckpt *layering.SnapRef, ckptSize int64) (envPath, ckptPath string, err error) {
	id := o.rec.ID
	envImg, withCkpt := o.rec.Images[0], len(o.rec.Images) > 1
	st, mp := o.d.deps.Store, o.d.deps.Mapper
	// ckptStep runs f on the checkpoint image, if the record has one.
	ckptStep := func(f func(img string) error) func() error {
		return func() error {
			if !withCkpt {
				return nil
			}
			return f(o.rec.Images[1])
		}
	}
	// The two images are independent: each step runs on both at once.
	if err := both(
		func() error { return st.Clone(ctx, env, envImg) },
		ckptStep(func(img string) error {
			if ckpt != nil {
				return st.Clone(ctx, *ckpt, img)
			}
			return st.Create(ctx, img, ckptSize)
		})); err != nil {
		return "", "", err
	}
	for _, img := range o.rec.Images {
		_ = st.SetMeta(ctx, img, MetaDeployment, id)
		if o.d.cfg.Node != "" {
			_ = st.SetMeta(ctx, img, MetaNode, o.d.cfg.Node)
		}
	}
	o.phase("clone")
	var envMap, ckptMap *mapper.Mapping
	if err := both(
		func() (err error) {
			envMap, err = mp.Map(ctx, mapper.Image{Pool: o.d.cfg.Pool, Name: envImg}, mapper.WithID(id+"-env"))
			return err
		},
		ckptStep(func(img string) (err error) {
			ckptMap, err = mp.Map(ctx, mapper.Image{Pool: o.d.cfg.Pool, Name: img}, mapper.WithID(id+"-ckpt"))
			return err
		})); err != nil {
		return "", "", err
	}
	o.phase("map")
	envPath = filepath.Join(o.rec.Dir, "root")
	if withCkpt {
		ckptPath = filepath.Join(o.rec.Dir, "ckpt")
	}
	if err := both(
		func() error { return mp.Mount(ctx, envMap, envPath, mapper.MountOptions{}) },
		ckptStep(func(string) error {
			return mp.Mount(ctx, ckptMap, ckptPath, mapper.MountOptions{Format: ckpt == nil})
		})); err != nil {
		return "", "", err
	}
	o.phase("mount")
	return envPath, ckptPath, nil
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

// begin creates the record of a new deployment or boot.
func (d *Deployer) begin(id, app string, gen int, phase string, prog func(string, time.Duration)) (*op, error) {
	rec := &Deployment{ID: id, App: app, Node: d.cfg.Node, Phase: phase, Gen: gen, Created: time.Now().UTC(),
		Dir: filepath.Join(d.cfg.StateDir, "instances", id)}
	if err := d.create(rec); err != nil {
		return nil, err
	}
	return &op{d: d, rec: rec, start: time.Now(), prog: prog}, nil
}

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
	h, err := d.start(ctx, o, dr, Run{Mode: ModeLaunch, ID: id, App: app, EnvPath: envPath, CkptPath: ckptPath, Gen: n,
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
		BootReadyMS: float64(bootReady.Microseconds()) / 1000, Node: d.cfg.Node, Spec: app, EnvConfig: &env.Config}
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

// start creates and starts the instance, recording its handle.
func (d *Deployer) start(ctx context.Context, o *op, dr Driver, r Run) (Handle, error) {
	h, err := dr.Start(ctx, r)
	if err != nil {
		return Handle{}, err
	}
	o.rec.Handle = &h
	o.rec.Ports = h.Ports
	if err := d.save(o.rec); err != nil {
		_ = dr.Remove(context.WithoutCancel(ctx), h)
		return Handle{}, err
	}
	o.phase("container")
	return h, nil
}

// Restore runs a new instance from generation g: clone both snapshots, map
// and mount the clones, restart the app from its checkpoint and wait until
// it is ready. On error nothing of it is left.
func (d *Deployer) Restore(ctx context.Context, g Generation, opts Options) (_ Deployment, err error) {
	app := g.Spec.WithDefaults()
	if opts.ID == "" {
		opts.ID = NewID(app.Name)
	}
	if err := ValidateID(opts.ID); err != nil {
		return Deployment{}, err
	}
	if _, err := d.deps.Envs.CheckDepth(ctx, g.EnvSnap, app.Env); err != nil {
		return Deployment{}, err
	}
	dr, err := d.driver(g.Engine)
	if err != nil {
		return Deployment{}, err
	}
	o, err := d.begin(opts.ID, app.Name, g.Gen, PhaseRestoring, opts.Progress)
	if err != nil {
		return Deployment{}, err
	}
	o.rec.Mode = ModeRestore
	defer o.undoOnError(ctx, &err)
	id := opts.ID
	if err := o.own([]string{InstancePrefix + id + "-env", InstancePrefix + id + "-ckpt"}, []string{id + "-env", id + "-ckpt"}); err != nil {
		return Deployment{}, err
	}
	envPath, ckptPath, err := o.cloneMapMount(ctx, g.EnvSnap, &g.CkptSnap, 0)
	if err != nil {
		return Deployment{}, err
	}
	cfg := g.EnvConfig
	if cfg == nil {
		env, _ := d.deps.Envs.Get(ctx, app.Env)
		cfg = &env.Config
	}
	h, err := d.start(ctx, o, dr, Run{Mode: ModeRestart, ID: id, App: app, EnvPath: envPath, CkptPath: ckptPath, Gen: g.Gen,
		ImageEnv: cfg.Env, WorkDir: cfg.WorkDir})
	if err != nil {
		return Deployment{}, err
	}
	if err := d.waitReady(ctx, dr, h, app, true); err != nil {
		return Deployment{}, err
	}
	o.phase("ready")
	return d.running(ctx, o, dr, h, app, "restart_ready")
}

// Undeploy stops a deployment's instance, unmounts and unmaps its clones,
// removes them and its record. It is idempotent and finishes what a failed
// or interrupted deploy left.
func (d *Deployer) Undeploy(ctx context.Context, id string) error {
	rec, err := d.Load(id)
	if err != nil {
		return err
	}
	rec.Phase = PhaseRemoving
	_ = d.save(&rec)
	var errs []error
	if rec.Handle != nil {
		dr := d.driverByName(rec.Handle.Driver)
		if dr != nil {
			if err := dr.Remove(ctx, *rec.Handle); err != nil {
				errs = append(errs, fmt.Errorf("remove instance: %w", err))
			}
		}
	}
	for _, dr := range []Driver{d.deps.Container, d.deps.Host} {
		if s, ok := dr.(Sweeper); ok && dr != nil {
			if err := s.RemoveDeployment(ctx, id); err != nil {
				errs = append(errs, fmt.Errorf("remove unrecorded instances: %w", err))
			}
		}
	}
	if err := d.release(ctx, &rec); err != nil {
		errs = append(errs, err)
	}
	rmErrs := make([]error, len(rec.Images))
	var wg sync.WaitGroup
	for i, img := range rec.Images {
		wg.Go(func() { rmErrs[i] = d.removeImage(ctx, id, img) })
	}
	wg.Wait()
	for i, err := range rmErrs {
		if err != nil && !errors.Is(err, layering.ErrNotFound) {
			errs = append(errs, fmt.Errorf("remove image %s: %w", rec.Images[i], err))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	_ = os.RemoveAll(rec.Dir)
	return d.remove(id)
}

// removeImage removes an image of deployment id. Its mappings are
// released by then; when nothing on this node keeps the image open any
// more (no mapping record, no rbd-fuse), a watcher that the cluster still
// lists is a client that was killed with the image open: an rbd-fuse cut
// off, or a previous agent killed mid-operation. The OSDs keep such a
// watch for osd_client_watch_timeout (30 s), so the image is removed with
// RemoveUnmapped, which evicts dead watchers and retries with bounded
// backoff. Otherwise (or when the mapper cannot tell) plain Remove, which
// refuses while the image is watched.
func (d *Deployer) removeImage(ctx context.Context, id, img string) error {
	users, err := d.deps.Mapper.Users(mapper.Image{Pool: d.cfg.Pool, Name: img})
	if err != nil || len(users) > 0 {
		if err != nil {
			d.log.Warn("cannot tell whether an image is still mapped on this node; not evicting its watchers", "deployment", id, "image", img, "err", err)
		}
		return d.deps.Store.Remove(ctx, img)
	}
	evicted, err := d.deps.Store.RemoveUnmapped(ctx, img)
	for _, e := range evicted {
		d.log.Warn("evicted a dead client that still watched an image (blocklisted for a short while)",
			"deployment", id, "image", img, "client", e.Client, "addr", e.Addr)
	}
	return err
}

// release unmounts and unmaps a record's mappings.
func (d *Deployer) release(ctx context.Context, rec *Deployment) error {
	var errs []error
	for _, m := range rec.Mappings {
		if err := d.deps.Mapper.Release(ctx, m); err != nil && !errors.Is(err, mapper.ErrNotMapped) {
			errs = append(errs, fmt.Errorf("release mapping %s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}

func (d *Deployer) driverByName(name string) Driver {
	for _, dr := range []Driver{d.deps.Container, d.deps.Host} {
		if dr != nil && dr.Name() == name {
			return dr
		}
	}
	return nil
}

// RemoveGeneration removes a checkpoint generation. It refuses, wrapping
// layering.ErrHasChildren, while deployments still use it.
func (d *Deployer) RemoveGeneration(ctx context.Context, app string, gen int) error {
	return RemoveGeneration(ctx, d.deps.Store, app, gen)
}

// RemoveGeneration removes generation gen of app from the pool; it refuses,
// wrapping layering.ErrHasChildren, while deployments still use it.
func RemoveGeneration(ctx context.Context, store layering.Store, app string, gen int) error {
	if _, err := store.Stat(ctx, GenImage(app, gen, "ckpt")); err != nil {
		return fmt.Errorf("generation %d of %s: %w", gen, app, err)
	}
	var errs []error
	for _, kind := range []string{"ckpt", "env"} {
		img := GenImage(app, gen, kind)
		if kids, err := store.Children(ctx, layering.SnapRef{Image: img, Snap: layering.SealedSnap}); err == nil && len(kids) > 0 {
			return fmt.Errorf("generation %d of %s is used by %d deployment(s) (%s): %w", gen, app, len(kids), strings.Join(kids, ", "), layering.ErrHasChildren)
		}
	}
	for _, kind := range []string{"ckpt", "env"} {
		if err := store.Remove(ctx, GenImage(app, gen, kind)); err != nil && !errors.Is(err, layering.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// List returns this node's deployment records, by ID.
func (d *Deployer) List() ([]Deployment, error) {
	ents, err := os.ReadDir(filepath.Join(d.cfg.StateDir, "deployments"))
	if err != nil {
		return nil, err
	}
	var out []Deployment
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		if rec, err := d.Load(id); err == nil {
			out = append(out, rec)
		}
	}
	return out, nil
}

// Load reads a deployment record.
func (d *Deployer) Load(id string) (Deployment, error) {
	if err := ValidateID(id); err != nil && !strings.HasPrefix(id, "boot-") {
		return Deployment{}, err
	}
	b, err := os.ReadFile(d.recordPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return Deployment{}, fmt.Errorf("deployment %s: %w", id, ErrNotFound)
	} else if err != nil {
		return Deployment{}, err
	}
	var rec Deployment
	if err := json.Unmarshal(b, &rec); err != nil {
		return Deployment{}, fmt.Errorf("deployment record %s: %w", id, err)
	}
	return rec, nil
}

// Recover undoes every deployment record left in a state other than
// Running (a deploy interrupted by a crash) and returns their IDs.
func (d *Deployer) Recover(ctx context.Context) ([]string, error) {
	recs, err := d.List()
	if err != nil {
		return nil, err
	}
	var done []string
	var errs []error
	for _, r := range recs {
		if r.Phase == PhaseRunning {
			continue
		}
		if err := d.Undeploy(ctx, r.ID); err != nil {
			errs = append(errs, err)
			continue
		}
		done = append(done, r.ID)
	}
	return done, errors.Join(errs...)
}

func (d *Deployer) recordPath(id string) string {
	return filepath.Join(d.cfg.StateDir, "deployments", id+".json")
}

func (d *Deployer) create(rec *Deployment) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.OpenFile(d.recordPath(rec.ID), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("deployment %s: %w", rec.ID, ErrExists)
	} else if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err = errors.Join(err, f.Sync(), f.Close()); err != nil {
		// A record cut short (a full disk) is unreadable, and would
		// stay behind with its ID taken.
		_ = os.Remove(d.recordPath(rec.ID))
	}
	return err
}

// save replaces a record atomically.
func (d *Deployer) save(rec *Deployment) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	tmp := d.recordPath(rec.ID) + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err = errors.Join(err, f.Sync(), f.Close()); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, d.recordPath(rec.ID))
}

func (d *Deployer) remove(id string) error {
	err := os.Remove(d.recordPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}
