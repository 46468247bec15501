package deploy

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Errors of the deploy path. They are wrapped together with the cause, so
// callers branch with errors.Is.
var (
	// ErrInvalidSpec: an app spec (or deploy request) failed validation;
	// nothing was created.
	ErrInvalidSpec = errors.New("invalid app spec")
	// ErrNoCheckpoint: the app has no complete checkpoint generation.
	ErrNoCheckpoint = errors.New("no checkpoint")
	// ErrNotFound: no deployment with that ID on this node.
	ErrNotFound = errors.New("deployment not found")
	// ErrExists: a deployment with that ID exists.
	ErrExists = errors.New("deployment exists")
	// ErrDriver: the driver cannot run the app here (engine or image
	// missing); the error says what to install.
	ErrDriver = errors.New("driver unavailable")
	// ErrNotReady: the app did not become ready in time (the error carries
	// its last log lines).
	ErrNotReady = errors.New("app not ready")
	// ErrCheckpoint: writing the checkpoint failed.
	ErrCheckpoint = errors.New("checkpoint failed")
	// ErrBusy: another deploy is producing the app's checkpoint.
	ErrBusy = errors.New("checkpoint being produced")
)

// Modes of Run.
const (
	ModeLaunch  = "launch"  // boot the app under the engine
	ModeRestart = "restart" // restore the app from a checkpoint generation
	ModeBoot    = "boot"    // run the app with no checkpoint engine (Container only)
)

// Driver runs app instances on this node under a checkpoint engine. It is
// the seam between the deploy lifecycle (clones, mappings, readiness,
// records) and where the app actually runs. Two implementations exist:
// Container (the DMTCP container on Docker, the default for DMTCP) and
// Host (the engines of package engine in private namespaces, used for
// CRIU). Both pass the same behaviour suite (deploy's TestDrivers).
type Driver interface {
	// Name is "container" or "host".
	Name() string
	// Check reports, wrapping ErrDriver, why the driver cannot run an app
	// with the named engine here; it returns the engine's version.
	Check(ctx context.Context, engine string) (version string, err error)
	// Start runs an instance. Launch writes its checkpoint later into
	// generation directory CkptPath/<Gen>; Restart restores generation Gen
	// from CkptPath/<Gen>. On error nothing it started is left.
	Start(ctx context.Context, r Run) (Handle, error)
	// Checkpoint writes the image of a running instance into generation
	// dir r.Gen (as given to Start for Launch; Start's Gen+1 for Restart)
	// and leaves the app stopped.
	Checkpoint(ctx context.Context, h Handle) (Checkpointed, error)
	// Running reports whether the instance's app still runs.
	Running(ctx context.Context, h Handle) (bool, error)
	// Logs returns the app's last n output lines.
	Logs(ctx context.Context, h Handle, n int) ([]string, error)
	// NetPid is a host PID in the instance's network namespace (for exec
	// probes), 0 if none runs.
	NetPid(ctx context.Context, h Handle) (int, error)
	// Remove stops the instance and removes what Start made. It is
	// idempotent: an instance that is already gone is not an error.
	Remove(ctx context.Context, h Handle) error
}

// Sweeper is implemented by drivers that can find a deployment's instances
// without its handle; Undeploy calls it so that an instance created just
// before a crash (and never recorded) is removed too.
type Sweeper interface {
	RemoveDeployment(ctx context.Context, id string) error
}

// Run describes an instance to start.
type Run struct {
	Mode string
	// ID is the deployment ID; it names the container.
	ID  string
	App App
	// EnvPath and CkptPath are the host mount points of the environment
	// clone and the checkpoint clone.
	EnvPath  string
	CkptPath string
	// Gen is the checkpoint generation to write (launch) or to restore
	// (restart).
	Gen int
	// ImageEnv and WorkDir come from the environment's config (ENV and
	// WORKDIR steps); the app's own settings win.
	ImageEnv []string
	WorkDir  string
}

// Handle identifies a running instance; it is stored in the deployment
// record, so that Remove works from another process.
type Handle struct {
	Driver string `json:"driver"`
	// Ref is the driver's reference: a container ID, or a PID.
	Ref string `json:"ref"`
	// Ports maps "6379/tcp" to the host address where it is published.
	Ports map[string]string `json:"ports,omitempty"`
	// Gen is the generation the instance writes at its next checkpoint.
	Gen int `json:"gen"`
	// EnvPath and CkptPath are where Start found the clones.
	EnvPath  string `json:"env_path,omitempty"`
	CkptPath string `json:"ckpt_path,omitempty"`
}

// Checkpointed reports a finished checkpoint.
type Checkpointed struct {
	Gen   int   `json:"gen"`
	Bytes int64 `json:"bytes"`
	// MS is how long writing the image took, as the engine measured it.
	MS float64 `json:"ms"`
	// EngineVersion is the version of the engine that wrote it.
	EngineVersion string `json:"engine_version,omitempty"`
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
