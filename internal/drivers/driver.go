// Package drivers runs a deployment's instance where its app runs: in the
// light DMTCP container (Container, container*.go: the environment and
// checkpoint clones bound into a container of the DMTCP image, which runs
// DMTCP or CRIU, or boots the app) or on the node itself (Host, host.go:
// the engines of internal/engine, for trusted apps). The deployer (package
// deploy) drives them through Driver: create, then start; checkpoint,
// recycle, raise, exec, remove. envcheck.go checks what an environment needs
// under DMTCP. Both drivers pass one behaviour suite (drivertest), the
// container driver also on the fake runtime.
package drivers

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// Errors of the drivers. They are wrapped together with the cause, so
// callers branch with errors.Is; the spec's (spec.ErrInvalidSpec,
// spec.ErrNotFound, spec.ErrExists) are used as they are.
var (
	// ErrDriver: the driver cannot run the app here (engine or image
	// missing); the error says what to install.
	ErrDriver = errors.New("driver unavailable")
	// ErrCheckpoint: writing the checkpoint failed.
	ErrCheckpoint = errors.New("checkpoint failed")
)

// RunMode says how a driver runs an instance (Run.Mode). It is a driver's
// vocabulary, not a deployment's: a deployment restored from a generation
// (Deployment.Mode ModeRestore) was first launched, checkpointed, then
// restarted.
type RunMode string

// Run modes.
const (
	// RunLaunch boots the app under its checkpoint engine; its checkpoint
	// goes into generation Run.Gen.
	RunLaunch RunMode = "launch"
	// RunRestart restores the app from checkpoint generation Run.Gen; its
	// next checkpoint goes into Run.Gen+1.
	RunRestart RunMode = "restart"
	// RunBoot runs the app with no checkpoint engine (Container only).
	RunBoot RunMode = "boot"
)

// Valid reports whether m is one of the run modes.
func (m RunMode) Valid() bool {
	switch m {
	case RunLaunch, RunRestart, RunBoot:
		return true
	}
	return false
}

// Driver runs app instances on this node under a checkpoint engine. It is
// the seam between the deploy lifecycle (clones, mappings, readiness,
// records) and where the app actually runs. Two implementations exist:
// Container (the DMTCP container on Docker, the default for DMTCP) and
// Host (the engines of package engine in private namespaces, used for
// CRIU). Both pass the same behaviour suite, drivertest.RunSuite
// (TestDriverSuiteContainer, TestDriverSuiteHost, and
// TestDriverSuiteContainerFake over runtime.Fake).
//
// An instance is created, then started: Create makes everything it needs
// without running the app, so that instances can be made ahead of the
// request that starts them.
//
//	h, err := dr.Create(ctx, drivers.Run{Mode: drivers.RunRestart, ID: id, App: app, EnvPath: env, CkptPath: ckpt, Gen: 3})
//	// record h: from here on Remove(h) undoes the instance, in any process
//	h, err = dr.Start(ctx, h)          // the app runs; h.Ports["6379/tcp"] is where it answers
//	ck, err := dr.Checkpoint(ctx, h)   // generation h.Gen (4) written, the app stopped
//	err = dr.Remove(ctx, h)            // nothing left; again: still nil
type Driver interface {
	// Name is "container" or "host".
	Name() string
	// Check reports, wrapping ErrDriver, why the driver cannot run an app
	// with the named engine here; it returns the engine's version.
	Check(ctx context.Context, eng engine.Name) (version string, err error)
	// Create makes an instance of r without running its app: a created
	// container whose entrypoint waits (Container), or a checked run with
	// its checkpoint image read (Host). A run that cannot start (a mode
	// the driver does not know, an empty command) is refused with
	// spec.ErrInvalidSpec. Launch writes its checkpoint later into generation
	// directory CkptPath/<Gen>; Restart restores generation Gen from
	// CkptPath/<Gen>. Creating a run whose instance exists returns that
	// instance; a different instance under the same ID is spec.ErrExists. On
	// error nothing is left.
	Create(ctx context.Context, r Run) (Handle, error)
	// Start runs the app of a created instance and returns its handle with
	// the addresses of its published ports. Starting a running instance
	// returns it as it is; one that no longer exists is spec.ErrNotFound. On
	// error the instance is left for Remove.
	Start(ctx context.Context, h Handle) (Handle, error)
	// Checkpoint writes the image of a running instance into generation
	// dir h.Gen (Run.Gen for Launch, Run.Gen+1 for Restart) and leaves the
	// app stopped.
	Checkpoint(ctx context.Context, h Handle) (Checkpointed, error)
	// Running reports whether the instance's app runs (false for an
	// instance that is created but not started, or gone).
	Running(ctx context.Context, h Handle) (bool, error)
	// Logs returns the app's last n output lines.
	Logs(ctx context.Context, h Handle, n int) ([]string, error)
	// NetPid is a host PID in the instance's network namespace (for exec
	// probes), 0 if none runs.
	NetPid(ctx context.Context, h Handle) (int, error)
	// Exec runs a command inside the started instance, in its root and
	// network namespace, as its app's user and without capabilities where
	// the driver runs the app so, and waits until it exits. A command that
	// runs and fails is not an error (the result's exit code says it); an
	// instance that does not run is spec.ErrNotFound.
	Exec(ctx context.Context, h Handle, e Exec) (runtime.ExecResult, error)
	// Remove stops the instance, started or only created, and removes
	// what Create and Start made. It is idempotent: an instance that is
	// already gone is not an error.
	Remove(ctx context.Context, h Handle) error
}

// Exec is a command to run inside an instance (Driver.Exec).
type Exec struct {
	Argv []string
	// Env holds KEY=VALUE variables added to the app's.
	Env []string
	// User is the app's user (App.User); "" is root.
	User string
}

// Targeter is implemented by drivers whose instances have an address of
// their own that the node reaches: Targets gives, for each TCP port of h
// ("6379/tcp"), the address and port that reach the app there without the
// runtime's published port (a front end's kernel route).
type Targeter interface {
	Targets(ctx context.Context, h Handle) (map[string]netip.AddrPort, error)
}

// Sweeper is implemented by drivers that can find a deployment's instances
// without its handle; Undeploy calls it so that an instance created just
// before a crash (and never recorded) is removed too.
type Sweeper interface {
	RemoveDeployment(ctx context.Context, id string) error
}

// LateSourcer is a Driver whose instances read their checkpoint source,
// or their root and checkpoint volume, only once started, so that they
// can be created while these are being filled (Run.SourceLater,
// Run.RootLater): the light container binds the directories at Create
// and its entrypoint reads them after the order.
type LateSourcer interface {
	Driver
	TakesSourceLater() bool
	TakesRootLater() bool
}

// Run describes an instance to create.
type Run struct {
	Mode RunMode
	// Limits are the node's defaults of an instance's limits; the app's
	// resources win over them (spec.App.LimitsOver).
	Limits spec.Limits
	// ID is the deployment ID; it names the instance (its container).
	ID  string
	App spec.App
	// EnvPath and CkptPath are the host mount points of the environment
	// clone and the checkpoint clone.
	EnvPath  string
	CkptPath string
	// CkptSource is the node's read-only copy of the generation a restart
	// restores (the checkpoint cache); restart reads it instead of
	// CkptPath/Gen, and CkptPath is the instance's own (a later checkpoint
	// of it goes there).
	CkptSource string
	// SourceLater: CkptSource is still being filled when Create runs, and
	// is whole once Start is called. Only drivers that are LateSourcers
	// take it.
	SourceLater bool
	// RootLater: a restart's root is mounted at EnvPath (under a shared
	// mount directory, its parent, as for Resettable) and the generation
	// it restores put into CkptPath only after Create, before Start; the
	// environment is checked at EnvFiles meanwhile, a read-only tree of
	// the same environment's files. Only drivers that are LateSourcers
	// take it.
	RootLater bool
	EnvFiles  string
	// CkptShared: CkptPath lies in a shared mount of the host, where the
	// host may mount a generation's directory after Create (a checkpoint
	// written into memory, Handle.CkptShared); the Container driver binds
	// it with slave propagation.
	CkptShared bool
	// Gen is the checkpoint generation to write (launch) or to restore
	// (restart).
	Gen int
	// ImageEnv and WorkDir come from the environment's config (ENV and
	// WORKDIR steps); the app's own settings win.
	ImageEnv []string
	WorkDir  string
	// CtlPath is a host directory of the instance's own, through which
	// Start orders a created instance to run (the Container driver's
	// entrypoint waits for an order file there).
	CtlPath string
	// Background creates the instance at the lowest CPU priority, for a
	// warm pool's slot that waits; Start raises it to normal.
	Background bool
	// Resettable: EnvPath is a mount that the deployer can reset between
	// two instances (an overlay under a shared mount directory, its
	// parent), so that a Recycler may serve instance after instance in
	// the same instance.
	Resettable bool
}

// validate refuses, wrapping spec.ErrInvalidSpec, a run that no driver can
// create.
func (r Run) validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("run of app %q: "+format+": %w", append(append([]any{r.App.Name}, args...), spec.ErrInvalidSpec)...))
	}
	if !r.Mode.Valid() {
		bad("mode %q: use %s, %s or %s", r.Mode, RunLaunch, RunRestart, RunBoot)
	}
	if r.ID == "" {
		bad("no deployment ID")
	}
	if r.EnvPath == "" {
		bad("no environment mount")
	}
	if (r.Mode == RunLaunch || r.Mode == RunBoot) && len(r.App.Command) == 0 {
		bad("the command is empty")
	}
	if (r.Mode == RunLaunch || r.Mode == RunRestart) && r.CkptPath == "" {
		bad("no checkpoint mount for mode %s", r.Mode)
	}
	if r.SourceLater && (r.Mode != RunRestart || r.CkptSource == "") {
		bad("a source filled later is for a restart from a checkpoint source")
	}
	if r.RootLater && (r.Mode != RunRestart || r.CkptSource != "" || r.SourceLater || r.EnvFiles == "") {
		bad("a root mounted later is for a restart from its own checkpoint volume, its environment's files given")
	}
	return errors.Join(errs...)
}

// Handle identifies an instance, created or running; it is stored in the
// deployment record, so that Remove works from another process.
type Handle struct {
	Driver string `json:"driver"`
	// Ref is the driver's reference, the same from Create to Remove: a
	// container ID (Container), or the deployment ID (Host, whose
	// instances live in the process that created them).
	Ref string `json:"ref"`
	// Ports maps "6379/tcp" to the host address where it is published;
	// Start fills it.
	Ports map[string]string `json:"ports,omitempty"`
	// IP is the instance's own address, where the host reaches its ports
	// without the runtime's port proxy (Container; "" when it has none):
	// the ready probe's.
	IP string `json:"ip,omitempty"`
	// Gen is the generation the instance writes at its next checkpoint.
	Gen int `json:"gen"`
	// EnvPath and CkptPath are where Create found the clones.
	EnvPath  string `json:"env_path,omitempty"`
	CkptPath string `json:"ckpt_path,omitempty"`
	// CtlPath is Run.CtlPath, and Background Run.Background.
	CtlPath    string `json:"ctl_path,omitempty"`
	Background bool   `json:"background,omitempty"`
	// Deployment is the deployment that Start runs the instance as (its
	// identity inside the instance); the deployer sets it when a
	// deployment binds the instance's slot.
	Deployment string `json:"deployment,omitempty"`
	// Recycle: the instance can serve again after its app ends
	// (Recycler).
	Recycle bool `json:"recycle,omitempty"`
	// RootLater: its root was mounted after Create (Run.RootLater).
	RootLater bool `json:"root_later,omitempty"`
	// CkptShared: a directory mounted in CkptPath after Create shows up in
	// the instance (Run.CkptShared, where the driver takes it).
	CkptShared bool `json:"ckpt_shared,omitempty"`
	// Pid is the host PID of the container's main process as Create found
	// it running (Container): while that process is still the container's,
	// Start and Running need no runtime call.
	Pid int `json:"pid,omitempty"`
	// MemoryMerge: Start orders the app's processes to share their
	// identical pages with other instances' (Container; internal/ksm).
	MemoryMerge bool `json:"memory_merge,omitempty"`
	// Lazy: Start orders a restart to restore the app's memory lazily
	// where its engine can (Container; a resume's).
	Lazy bool `json:"lazy,omitempty"`
	// StopSignal is the app's stop signal where its container was made
	// with another (a spare slot's, SIGTERM): Remove sends it first.
	StopSignal string `json:"stop_signal,omitempty"`
}

// ErrNotRecyclable: the instance cannot serve another deployment; it is
// removed instead.
var ErrNotRecyclable = errors.New("instance cannot be recycled")

// Recycler is implemented by drivers whose instances can serve one
// deployment after another (Handle.Recycle), so that an undeployed
// instance goes back to the warm pool instead of being removed and made
// anew: Recycle ends the app, calls reset (which resets the instance's
// root to the generation's) once nothing in the instance uses the root,
// and leaves the instance created, at background priority and waiting for
// Start's next order, as Create does. An instance that cannot serve again
// is ErrNotRecyclable, and is left to Remove.
type Recycler interface {
	Recycle(ctx context.Context, h Handle, reset func(context.Context) error) (Handle, error)
}

// Raiser is a Driver whose instances can run at background priority ahead
// of a deployment (a warm pool's slot restored ahead, StartAhead) and be
// raised to normal priority when one binds them.
type Raiser interface {
	// Raise gives h's instance the normal CPU and I/O weight; h says
	// whether it ran at background priority.
	Raise(ctx context.Context, h Handle) (Handle, error)
}

// Checkpointed reports a finished checkpoint.
type Checkpointed struct {
	Gen   int   `json:"gen"`
	Bytes int64 `json:"bytes"`
	// MS is how long writing the image took, as the engine measured it.
	MS float64 `json:"ms"`
	// EngineVersion is the version of the engine that wrote it.
	EngineVersion string `json:"engine_version,omitempty"`
	// Exited: every process of the instance is gone, and with them its
	// mounts of the root (the instance's root can be unmounted before the
	// instance is removed).
	Exited bool `json:"exited,omitempty"`
}

// PortKey is the key of Handle.Ports: "6379/tcp".
func PortKey(port int, proto string) string {
	if proto == "" {
		proto = "tcp"
	}
	return fmt.Sprintf("%d/%s", port, proto)
}

// appEnv merges the environment's variables with the app's (the app's win).
func appEnv(image, app []string) []string {
	out := make([]string, 0, len(image)+len(app))
	idx := map[string]int{}
	for _, kv := range append(append([]string{}, image...), app...) {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := idx[k]; ok {
			out[i] = kv
			continue
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	return out
}
