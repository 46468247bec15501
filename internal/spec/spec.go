// Package spec is the vocabulary every layer of fogdeploy shares: an app's
// spec, a checkpoint generation, a node's platform, deployment modes and
// phases, and the errors callers branch on. It depends on nothing above
// the layering library, so the lifecycle (internal/deploy), the PoP state
// (internal/state), the agent and the CLI all import it.
package spec

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// MaxSpecSize bounds an app spec document (YAML or JSON).
const MaxSpecSize = 64 << 10

// Readiness kinds.
const (
	ReadyTCP    = "tcp"
	ReadyHTTP   = "http"
	ReadyExec   = "exec"
	ReadyOutput = "output"
)

// Defaults of an app spec.
const (
	DefaultReadyTimeout   = 60 * time.Second
	DefaultCheckpointSize = "2G"
	maxArgs               = 256
	maxArgLen             = 4096
)

// App is the spec of an app: what runs, in which environment, how to tell
// that it is ready, and with which engine it is checkpointed. It is what
// `fogctl app create` stores and what every deploy of the app uses.
type App struct {
	// Name identifies the app (lower-case letters, digits, '.', '_', '-').
	Name string `yaml:"name" json:"name"`
	// Env is the name of the environment the app runs in.
	Env string `yaml:"env" json:"env"`
	// Command is the app's command line; Command[0] is looked up in the
	// environment's PATH.
	Command []string `yaml:"command" json:"command"`
	// Environment holds extra KEY=VALUE variables for the app.
	Environment []string `yaml:"environment,omitempty" json:"environment,omitempty"`
	// WorkDir is the working directory inside the environment.
	WorkDir string `yaml:"workdir,omitempty" json:"workdir,omitempty"`
	// User is the user of the environment the app runs as: NAME, UID,
	// NAME:GROUP or UID:GID, resolved in the environment's /etc/passwd and
	// /etc/group (e.g. postgres, which refuses to run as root). "" runs the
	// app as root. Either way the app holds no capability.
	User string `yaml:"user,omitempty" json:"user,omitempty"`
	// Ports are the app's ports, published on the node.
	Ports []Port `yaml:"ports,omitempty" json:"ports,omitempty"`
	// Ready says when the app is ready to serve.
	Ready Readiness `yaml:"ready" json:"ready"`
	// Resources limit each instance.
	Resources Resources `yaml:"resources,omitempty" json:"resources,omitempty"`
	// Engine is the checkpoint engine: "dmtcp" (default), "criu", or
	// "auto" (EngineAuto): the first deploy checkpoints the app with each
	// engine the node has that can, and later deploys restore the
	// generation of the engine that restores it fastest on their node.
	Engine engine.Name `yaml:"engine,omitempty" json:"engine,omitempty"`
	// Compression of checkpoint images: "none" (default) or "gzip" (DMTCP).
	Compression string `yaml:"compression,omitempty" json:"compression,omitempty"`
	// CheckpointSize is the size of the checkpoint image (default 2G).
	CheckpointSize string `yaml:"checkpoint_size,omitempty" json:"checkpoint_size,omitempty"`
	// StopSignal stops the app at undeploy: SIGTERM (default), SIGINT,
	// SIGQUIT or SIGHUP; after the driver's stop timeout the app is killed.
	// An instance's clones are removed once it stops, so a signal that
	// ends the app at once loses nothing (PostgreSQL under DMTCP takes
	// SIGQUIT: its smart shutdown on SIGTERM waits for a SIGUSR2 to the
	// checkpointer, the signal DMTCP keeps for itself).
	StopSignal string `yaml:"stop_signal,omitempty" json:"stop_signal,omitempty"`
	// CheckpointDelay is how long the engine waits between the request to
	// checkpoint (once the app is ready and prepared) and the checkpoint,
	// for an app that is still closing the connections it served meanwhile
	// (e.g. Tomcat, whose poller closes them on its next round); 0 = none.
	CheckpointDelay Duration `yaml:"checkpoint_delay,omitempty" json:"checkpoint_delay,omitempty"`
	// SuspendAfter suspends an instance (memory and files into the
	// cluster, its node's resources released) once it has served no
	// connection and used no more CPU than an idle app for that long; a
	// resume brings it back. 0 = never.
	SuspendAfter Duration `yaml:"suspend_after,omitempty" json:"suspend_after,omitempty"`
	// Mode is the mode of the app's deployments that ask for none: auto
	// (default: boot or restore, whichever has been faster on the node),
	// restore or boot.
	Mode Mode `yaml:"mode,omitempty" json:"mode,omitempty"`
	// Pool is how many idle slots of the app's newest generation each
	// node keeps ready (a warm pool: a restore that takes one waits only
	// for its engine); nil is the node's default (agent.pool_size).
	Pool *int `yaml:"pool,omitempty" json:"pool,omitempty"`
	// PostRestore is a command run inside each instance restored from a
	// checkpoint once its app is ready, before the deploy counts it as
	// ready: where an app takes an identity of its own (a reseed of its
	// random state, a new instance ID), which a checkpoint shares with
	// every instance restored from it. It runs as the app's user, in the
	// app's root and network, with the instance's identity in
	// FOGDEPLOY_* variables and in IdentityFile. A non-zero exit fails the
	// deploy.
	PostRestore []string `yaml:"post_restore,omitempty" json:"post_restore,omitempty"`
	// Lazy restores the app's memory lazily (CRIU's lazy pages, engine
	// criu, or auto's CRIU generation): the restored app runs at once and
	// each page is read from the node's copy of the checkpoint on first
	// touch, the rest in the background, so that a large app answers
	// before its whole image is read.
	Lazy bool `yaml:"lazy,omitempty" json:"lazy,omitempty"`
	// Network names a group of apps whose instances reach each other's
	// ports on a node (e.g. a backend and its database). Without it an
	// instance reaches no other instance: each user's backend is alone on
	// the node's network, and its published ports answer from the node.
	Network string `yaml:"network,omitempty" json:"network,omitempty"`
	// Trusted says the operator trusts the app not to exhaust the node:
	// on a node whose host driver cannot bound its instances (no cgroups
	// it can use), only a trusted app runs under an engine whose driver is
	// "host". Any other app of such an engine is refused there, or boots
	// in the container under if_no_engine: boot.
	Trusted bool `yaml:"trusted,omitempty" json:"trusted,omitempty"`
	// Frontend says how the PoP's front ends serve the app beyond each
	// deployment's own endpoint.
	Frontend AppFrontend `yaml:"frontend,omitempty" json:"frontend,omitempty"`
}

// AppFrontend is an app's use of the PoP's front ends.
type AppFrontend struct {
	// OnDemand gives the app a shared endpoint (a PoP port per TCP port of
	// the app, taken when the app is created): a connection to it on a
	// node's front end reaches the app's instance made on demand on that
	// node, which the connection creates (from a slot restored ahead, or a
	// spare) when there is none; the instance is undeployed once idle for
	// IdleAfter. For apps without state of their own to keep: what the
	// instance holds goes with it.
	OnDemand bool `yaml:"on_demand,omitempty" json:"on_demand,omitempty"`
	// IdleAfter undeploys an instance made on demand once it has served no
	// connection and used no more CPU than an idle app for that long
	// (default DefaultIdleAfter).
	IdleAfter Duration `yaml:"idle_after,omitempty" json:"idle_after,omitempty"`
}

// DefaultIdleAfter is AppFrontend.IdleAfter's default.
const DefaultIdleAfter = 5 * time.Minute

// MaxPool bounds App.Pool.
const MaxPool = 64

// MinCPUs is the smallest CPU limit a container runtime takes (a CFS
// quota of 1 ms per 100 ms period).
const MinCPUs = 0.01

// Port is one port of the app.
type Port struct {
	Port  int    `yaml:"port" json:"port"`
	Proto string `yaml:"proto,omitempty" json:"proto,omitempty"`
}

// Readiness says when an app is ready. Exactly one target goes with Kind:
// tcp → Port (and optionally Send/Expect), http → Port and Path (and
// Status), exec → Command (run in the environment, in the app's network),
// output → Phrase printed on stdout or stderr.
type Readiness struct {
	Kind    string   `yaml:"kind" json:"kind"`
	Port    int      `yaml:"port,omitempty" json:"port,omitempty"`
	Path    string   `yaml:"path,omitempty" json:"path,omitempty"`
	Status  int      `yaml:"status,omitempty" json:"status,omitempty"`
	Command []string `yaml:"command,omitempty" json:"command,omitempty"`
	Phrase  string   `yaml:"phrase,omitempty" json:"phrase,omitempty"`
	// Send is written on a tcp connection and the app is ready once the
	// reply starts with Expect (redis: "PING\r\n" and "+PONG").
	Send   string `yaml:"send,omitempty" json:"send,omitempty"`
	Expect string `yaml:"expect,omitempty" json:"expect,omitempty"`
	// Timeout bounds the wait ("60s" by default).
	Timeout Duration `yaml:"timeout,omitempty" json:"timeout,omitempty"`
}

// Resources limit an instance.
type Resources struct {
	// CPUs is a number of CPUs (0.5 = half of one), at least MinCPUs;
	// 0 = no limit.
	CPUs float64 `yaml:"cpus,omitempty" json:"cpus,omitempty"`
	// Memory is a size ("512M"); "" = no limit.
	Memory string `yaml:"memory,omitempty" json:"memory,omitempty"`
}

// Duration is a time.Duration written as "30s" in YAML and JSON.
type Duration time.Duration

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("duration %q: use a number with a unit, e.g. 30s or 2m", b)
	}
	*d = Duration(v)
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// ParseApp reads an app spec from YAML (JSON is YAML too). Unknown fields
// are errors; the spec is validated.
func ParseApp(r io.Reader) (App, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxSpecSize+1))
	if err != nil {
		return App{}, fmt.Errorf("app spec: %w", err)
	}
	if len(data) > MaxSpecSize {
		return App{}, fmt.Errorf("app spec is larger than %d bytes: %w", MaxSpecSize, ErrInvalidSpec)
	}
	var a App
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&a); err != nil {
		if errors.Is(err, io.EOF) {
			return App{}, fmt.Errorf("app spec is empty: %w", ErrInvalidSpec)
		}
		return App{}, fmt.Errorf("app spec: %w: %v", ErrInvalidSpec, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return App{}, fmt.Errorf("app spec holds more than one document: %w", ErrInvalidSpec)
	}
	a = a.WithDefaults()
	if err := a.Validate(); err != nil {
		return App{}, err
	}
	return a, nil
}

// EngineAuto is App.Engine for "each engine that can, then the fastest".
const EngineAuto engine.Name = "auto"

// Engines are the checkpoint engines, in the order mode auto tries them
// (engine's registry).
var Engines = engine.Names()

// WithEngine is a with its engine set to eng (one of Engines), as a
// checkpoint of an app of engine auto runs it.
func (a App) WithEngine(eng engine.Name) App {
	a.Engine = eng
	if !engine.Of(eng).Compression {
		a.Compression = "none"
	}
	return a
}

// SameProcess reports whether a checkpoint of app a can stand for app b:
// the same environment, command, variables, working directory, user and
// engine (after defaults), so that restoring it gives what booting b
// would. An app removed and created again under its name with another
// command, say, must not restore the old app's checkpoints.
func (a App) SameProcess(b App) bool {
	a, b = a.WithDefaults(), b.WithDefaults()
	return a.Env == b.Env && slices.Equal(a.Command, b.Command) && slices.Equal(a.Environment, b.Environment) &&
		a.WorkDir == b.WorkDir && a.User == b.User && (a.Engine == b.Engine || b.Engine == EngineAuto)
}

// WithDefaults fills the optional fields.
func (a App) WithDefaults() App {
	if a.Engine == "" {
		a.Engine = engine.Default()
	}
	if a.Compression == "" {
		a.Compression = "none"
	}
	if a.CheckpointSize == "" {
		a.CheckpointSize = DefaultCheckpointSize
	}
	if a.Ready.Timeout == 0 {
		a.Ready.Timeout = Duration(DefaultReadyTimeout)
	}
	for i := range a.Ports {
		if a.Ports[i].Proto == "" {
			a.Ports[i].Proto = "tcp"
		}
	}
	if a.Ready.Kind == ReadyHTTP && a.Ready.Path == "" {
		a.Ready.Path = "/"
	}
	if a.Frontend.OnDemand && a.Frontend.IdleAfter == 0 {
		a.Frontend.IdleAfter = Duration(DefaultIdleAfter)
	}
	return a
}

// MemoryBytes returns the memory limit in bytes (0: none).
func (a App) MemoryBytes() int64 {
	if a.Resources.Memory == "" {
		return 0
	}
	n, _ := layering.ParseSize("resources.memory", a.Resources.Memory)
	return n
}

// CheckpointBytes returns the checkpoint image size.
func (a App) CheckpointBytes() int64 {
	n, err := layering.ParseSize("checkpoint_size", a.CheckpointSize)
	if err != nil {
		n, _ = layering.ParseSize("checkpoint_size", DefaultCheckpointSize)
	}
	return n
}
