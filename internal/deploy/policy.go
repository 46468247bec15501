// The deploy decision: Deploy restores the newest generation (of the engine the caller chose, for an
// app of engine auto), producing it once per app if there is none (one per engine, for auto), or boots normally when the options or the node say so (Mode, IfBusy, IfNoEngine). Which of
// the two is faster for an app (mode auto) is the caller's choice (internal/adaptive, in the agent).

package deploy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// Options tune one Deploy.
type Options struct {
	// ID is the deployment ID; "" generates one from the app name.
	ID string
	// Mode is ModeRestore or ModeAuto (default: both restore here) or
	// ModeBoot (always boot, no engine).
	Mode spec.Mode
	// Reason says why the caller chose Mode (mode auto's choice), for
	// Deployment.BootReason of a boot ("" is "requested") and
	// Deployment.Reason of a restore.
	Reason string
	// IfBusy says what a deploy does while another deploy produces the
	// app's first checkpoint: PolicyWait (default) for it, or PolicyBoot
	// normally meanwhile. It never produces a second checkpoint.
	IfBusy spec.Policy
	// IfNoEngine says what a deploy does when this node cannot run the
	// app's checkpoint engine: PolicyFail (default) or PolicyBoot.
	IfNoEngine spec.Policy
	// Engine, for an app of engine auto, is the engine whose newest
	// generation to restore (the caller's choice, internal/adaptive); ""
	// or an engine without a generation restores the newest of any.
	Engine engine.Name
	// NoPool: a restore takes no pool slot (a miss measured on purpose).
	NoPool bool
	// Background runs the instance at background CPU priority, as the
	// pool's slots are provisioned (a measurement nobody waits for).
	Background bool
	// Progress receives each phase as it ends.
	Progress func(phase string, took time.Duration)
	// Prepare, if set, runs when a deploy has to produce the checkpoint
	// first: once the booted app is ready and before it is checkpointed.
	Prepare PrepareFunc
	// LockCheckpoint, if set, is held while this deploy checks for a
	// checkpoint and produces one when there is none: the PoP-wide lock
	// (etcd) that makes the checkpoint exactly once. The node-local lock is
	// always taken too. With wait false it returns an error wrapping
	// spec.ErrBusy at once when another holder has it.
	LockCheckpoint func(ctx context.Context, wait bool) (unlock func(), err error)
	// Sealed, if set, is called with a generation this deploy produced.
	Sealed func(ctx context.Context, g spec.Generation) error
	// Checkpoint, if set, brings a resume's checkpoint files to the node
	// (a migration's hand-over, read from its source); nil: from the
	// suspension's image in the cluster.
	Checkpoint FetchCheckpoint
}

// FetchCheckpoint copies a checkpoint's files into dst, an empty
// directory; fromCluster copies them from the checkpoint's image, once
// sealed.
type FetchCheckpoint func(ctx context.Context, dst string, fromCluster func(context.Context) error) error

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

// Deploy runs an instance of app on this node: a restore from the newest
// checkpoint generation, after producing the first one if there is none.
// Options decide when it boots the app normally instead (Mode, IfBusy,
// IfNoEngine). On error nothing of the deployment is left on the node or in
// the pool.
func (d *Deployer) Deploy(ctx context.Context, app spec.App, opts Options) (Deployment, error) {
	start := time.Now()
	app = app.WithDefaults()
	if err := app.Validate(); err != nil {
		return Deployment{}, err
	}
	if err := spec.ValidatePolicies(opts.Mode, opts.IfBusy, opts.IfNoEngine); err != nil {
		return Deployment{}, err
	}
	if opts.ID == "" {
		opts.ID = spec.NewID(app.Name)
	}
	if err := spec.ValidateID(opts.ID); err != nil {
		return Deployment{}, err
	}
	if _, err := d.recs.Load(opts.ID); err == nil {
		return Deployment{}, fmt.Errorf("deployment %s: %w", opts.ID, spec.ErrExists)
	}
	if opts.Mode == spec.ModeBoot {
		reason := opts.Reason
		if reason == "" {
			reason = "requested"
		}
		return d.Boot(ctx, app, opts, reason)
	}
	// A pool hit checks for a newer generation while it starts (fresh);
	// where there is one, the deploy looks the newest up and restores it.
	var dep Deployment
	for pooled := !opts.NoPool; ; pooled = false {
		gen, fresh, boot, producing, why, err := d.resolve(ctx, app, opts, pooled)
		if why != "" {
			return d.Boot(ctx, app, opts, why)
		}
		if err != nil {
			return Deployment{}, err
		}
		// What the deploy waited for before the restore's own steps
		// (the engine's check, the generation's lookup) is its first
		// phase.
		dep, err = d.restore(ctx, gen, opts, app, time.Since(start)-producing, fresh)
		if errors.Is(err, errNewerGen) && pooled {
			d.log.Info("a newer generation than the one taken: restoring the newest", "app", app.Name, "gen", gen.Gen, "why", err)
			continue
		}
		if len(boot) > 0 {
			dep.Booted = true
			dep.Timings = append(prefixed(spec.BootTimingPrefix, boot), dep.Timings...)
			if err == nil {
				_ = d.recs.save(&dep)
			}
		}
		return dep, err
	}
}

// resolve returns the generation a deploy of app restores: with pooled
// set and an idle slot on the node, the one that slot was filled with
// (pooledGen), else the one this node's last lookup gave (knownGen), and
// fresh, which says whether it is still the app's newest; else (or
// without pooled) the app's newest once the engine is checked (lookup), produced
// first if there is none (boot holds the producing deploy's boot and
// checkpoint, producing its time). why, when set, is why the deploy boots
// instead.
func (d *Deployer) resolve(ctx context.Context, app spec.App, opts Options, pooled bool) (gen spec.Generation, fresh func() error, boot layering.Timings, producing time.Duration, why string, err error) {
	if pooled {
		if g, fresh, ok := d.pool.pooledGen(ctx, app, opts.Engine); ok {
			return g, fresh, nil, 0, "", nil
		}
		if g, fresh, ok := d.ckpts.knownGen(ctx, app, opts.Engine); ok {
			return g, fresh, nil, 0, "", nil
		}
	}
	gen, boot, producing, why, err = d.lookup(ctx, app, opts)
	return gen, nil, boot, producing, why, err
}

// lookup is resolve without the pool: the app's newest generation, once
// the engine is checked, produced first if there is none.
func (d *Deployer) lookup(ctx context.Context, app spec.App, opts Options) (gen spec.Generation, boot layering.Timings, producing time.Duration, why string, err error) {
	// The engine only: a restore needs no environment but the
	// generation's, and a boot or a first checkpoint looks the app's up.
	checked, version, err := d.drv.engineOf(ctx, app)
	if err != nil {
		if errors.Is(err, drivers.ErrDriver) && opts.IfNoEngine == spec.PolicyBoot {
			d.log.Info("booting without a checkpoint engine", "app", app.Name, "reason", err)
			return gen, nil, 0, "no checkpoint engine (" + string(app.Engine) + ") on this node", nil
		}
		return gen, nil, 0, "", err
	}
	gen, err = d.ckpts.CurrentOf(ctx, app, opts.Engine)
	if errors.Is(err, ErrNoCheckpoint) {
		// One producer per app on this node; the others wait and reuse.
		p := time.Now()
		gen, boot, err = d.produceOnce(ctx, app, opts)
		producing = time.Since(p)
		if errors.Is(err, spec.ErrBusy) {
			d.log.Info("booting while another deploy produces the checkpoint", "app", app.Name)
			return gen, nil, 0, "the first checkpoint is being produced by another deploy", nil
		}
	}
	if err != nil {
		return gen, nil, 0, "", err
	}
	if len(boot) == 0 {
		if gen.Engine != checked {
			_, version, _ = d.drv.CheckEngine(ctx, gen.Engine)
		}
		// Automatic cold-boot fallback: a generation this node cannot
		// restore (another engine version, missing CPU features).
		if why := restorableOn(gen, d.platform, version); why != nil {
			d.log.Warn("booting: this node cannot restore the app's generation", "app", app.Name, "gen", gen.Gen, "reason", why)
			d.ckpts.known.forget(app.Name, opts.Engine)
			return gen, nil, 0, strings.TrimPrefix(why.Error(), ErrIncompatible.Error()+": "), nil
		}
	}
	d.ckpts.known.set(app.Name, opts.Engine, gen)
	return gen, boot, producing, "", nil
}

// Restorable reports, wrapping ErrIncompatible, why this node cannot
// restore generation g (another engine version, missing CPU features), or
// nil.
func (d *Deployer) Restorable(ctx context.Context, g spec.Generation) error {
	_, version, _ := d.drv.CheckEngine(ctx, g.Engine)
	return restorableOn(g, d.platform, version)
}

// produceOnce returns the app's newest generation, producing it under the
// node-local and the caller's (PoP-wide) locks if there is none yet. With
// IfBusy PolicyBoot it returns spec.ErrBusy instead of waiting for a lock.
func (d *Deployer) produceOnce(ctx context.Context, app spec.App, opts Options) (spec.Generation, layering.Timings, error) {
	wait := opts.IfBusy != spec.PolicyBoot
	var unlockApp func()
	if wait {
		unlockApp = d.appLock.Lock(app.Name)
	} else if u, ok := d.appLock.TryLock(app.Name); ok {
		unlockApp = u
	} else {
		return spec.Generation{}, nil, fmt.Errorf("app %s on this node: %w", app.Name, spec.ErrBusy)
	}
	defer unlockApp()
	if opts.LockCheckpoint != nil {
		unlock, err := opts.LockCheckpoint(ctx, wait)
		if err != nil {
			return spec.Generation{}, nil, err
		}
		defer unlock()
	}
	gen, err := d.ckpts.CurrentOf(ctx, app, opts.Engine)
	if !errors.Is(err, ErrNoCheckpoint) {
		return gen, nil, err
	}
	gens, err := d.CheckpointAll(ctx, app, CheckpointOptions{Progress: opts.Progress, Prepare: opts.Prepare})
	if err != nil {
		return spec.Generation{}, nil, err
	}
	gen = gens[0]
	var timings layering.Timings
	for _, g := range gens {
		if opts.Sealed != nil {
			if err := opts.Sealed(ctx, g); err != nil {
				d.log.Warn("recording the new generation", "app", app.Name, "gen", g.Gen, "err", err)
			}
		}
		if g.Engine == opts.Engine {
			gen = g
		}
		if len(gens) > 1 {
			// engine auto: each engine's boot and checkpoint.
			timings = append(timings, prefixed(string(g.Engine)+".", g.Timings)...)
		}
	}
	if len(gens) == 1 {
		timings = gen.Timings
	}
	return gen, timings, nil
}
