// Package runtime runs fogdeploy's app containers: the narrow interface that
// pop-agent uses instead of the moby client, its two implementations (Docker,
// over dockerd, and Fake, in memory) and the spec of the "DMTCP container"
// (DMTCPContainer) that launches or restores an app from a checkpoint.
//
// A deploy, as pop-agent drives it:
//
//	spec := runtime.Spec{
//		Deployment: "d-42", App: "shop",
//		Image: "fogdeploy/dmtcp:4.2.0",
//		Binds: []runtime.Bind{{HostPath: envMount, ContainerPath: "/fog/root"},
//			{HostPath: ckptMount, ContainerPath: "/fog/ckpt"}},
//		Ports: []runtime.Port{{ContainerPort: 6379}}, // published on 127.0.0.1:<any free port>
//	}
//	id, err := rt.Create(ctx, spec)   // labels io.fogdeploy.{managed,deployment,app}
//	err = rt.Start(ctx, id)
//	st, err := rt.Inspect(ctx, id)    // st.Ports[0].HostPort is where the app answers
//	...
//	err = rt.Stop(ctx, id, 10*time.Second)
//	err = rt.Remove(ctx, id)          // idempotent
//
// Every implementation passes runtimetest.RunSuite. Containers get their own
// network namespace on the daemon's default bridge; a daemon without one
// (dockerd --bridge=none) falls back to network "none", which Docker.Network
// reports, and then a Spec with Ports is refused with ErrNoNetwork.
// Nothing here ever runs a privileged container: capabilities are added one
// by one (Spec.CapAdd).
package runtime

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Labels that every container created through a Runtime carries.
const (
	// LabelManaged is "true" on every fogdeploy container (the same key as
	// internal/docker.LabelManaged).
	LabelManaged = "io.fogdeploy.managed"
	// LabelDeployment holds Spec.Deployment.
	LabelDeployment = "io.fogdeploy.deployment"
	// LabelApp holds Spec.App.
	LabelApp = "io.fogdeploy.app"
)

// ValidNetworkName says whether name is one of fogdeploy's own networks:
// "fogdeploy-" then 1 to 40 lowercase letters, digits or '-'.
func ValidNetworkName(name string) bool {
	rest, ok := strings.CutPrefix(name, NetworkPrefix)
	if !ok || len(rest) == 0 || len(rest) > 40 {
		return false
	}
	for _, c := range rest {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// NetworkPrefix starts the names of fogdeploy's networks.
const NetworkPrefix = "fogdeploy-"

// Network modes.
const (
	NetworkBridge = "bridge" // default: a private network namespace per container
	NetworkNone   = "none"   // loopback only; no published ports
)

// DefaultHostIP is where ports are published when Port.HostIP is empty:
// only the node itself (and pop-agent's proxy) reaches the app.
const DefaultHostIP = "127.0.0.1"

// Errors returned by every Runtime. Library errors are wrapped together with
// these, so callers branch with errors.Is.
var (
	// ErrNotFound: no container with that ID (or name).
	ErrNotFound = errors.New("container not found")
	// ErrImageNotFound: the image is not on the node; no container was created.
	ErrImageNotFound = errors.New("image not found")
	// ErrInvalidSpec: the Spec is incomplete or contradicts itself.
	ErrInvalidSpec = errors.New("invalid container spec")
	// ErrNoNetwork: ports were requested but the daemon has no bridge network.
	ErrNoNetwork = errors.New("no bridge network for published ports")
	// ErrConflict: the name is taken, or the host port is in use.
	ErrConflict = errors.New("container conflict")
	// ErrUnavailable: the container daemon cannot be reached.
	ErrUnavailable = errors.New("container runtime unavailable")
)

// Runtime creates, runs and removes containers. Implementations are safe for
// concurrent use. IDs are those of the implementation (Docker: the full
// container ID); methods also accept a container name.
type Runtime interface {
	// Create makes a container from spec, without starting it. It adds the
	// labels LabelManaged=true, LabelDeployment and LabelApp. On error no
	// container is left behind.
	Create(ctx context.Context, spec Spec) (id string, err error)
	// Start starts a created or stopped container.
	Start(ctx context.Context, id string) error
	// Stop sends the stop signal (SIGTERM), waits up to timeout, then kills.
	// Stopping a container that is not running is not an error.
	Stop(ctx context.Context, id string, timeout time.Duration) error
	// Remove kills and removes the container with its anonymous volumes.
	// A container that does not exist is not an error.
	Remove(ctx context.Context, id string) error
	// Inspect reports the container's state.
	Inspect(ctx context.Context, id string) (State, error)
	// List returns the fogdeploy containers (running or not) whose labels
	// include all of labels.
	List(ctx context.Context, labels map[string]string) ([]State, error)
	// Logs returns the last tail lines of stdout and stderr, interleaved as
	// written; tail <= 0 means all.
	Logs(ctx context.Context, id string, tail int) (string, error)
	// Wait blocks until the container is not running and returns its exit
	// code. It returns at once for a container that has already exited.
	Wait(ctx context.Context, id string) (exitCode int, err error)
}

// Signaler is implemented by runtimes that can send a signal to a
// container's main process, e.g. "USR1" to ask the DMTCP container for a
// checkpoint.
type Signaler interface {
	Signal(ctx context.Context, id, signal string) error
}

// Execer is implemented by runtimes that can run a command in a running
// container, in its namespaces and with its capabilities (docker exec).
type Execer interface {
	// Exec runs spec in container id and waits until it exits. A command
	// that runs and fails is not an error: ExecResult.ExitCode says so.
	// A container that does not exist is ErrNotFound; one that is not
	// running, ErrConflict.
	Exec(ctx context.Context, id string, spec ExecSpec) (ExecResult, error)
}

// ExecSpec is a command to run in a container.
type ExecSpec struct {
	Cmd []string
	// Env holds KEY=VALUE variables added to the container's.
	Env []string
}

// ExecResult is how an Exec ended.
type ExecResult struct {
	ExitCode int
	// Output is its standard output and error, interleaved, up to
	// MaxExecOutput bytes (the first ones).
	Output string
}

// MaxExecOutput bounds ExecResult.Output.
const MaxExecOutput = 64 << 10

// ImageInspector is implemented by runtimes that can tell whether an image
// is on the node, and with which labels.
type ImageInspector interface {
	// ImageLabels returns the labels of image ref; ErrImageNotFound if the
	// node does not have it.
	ImageLabels(ctx context.Context, ref string) (map[string]string, error)
	// FindImages returns the images of the node that carry label (with any
	// value), newest first; none is not an error.
	FindImages(ctx context.Context, label string) ([]Image, error)
}

// Image is an image on the node.
type Image struct {
	// Ref is the image's first tag, or its ID when it has none.
	Ref     string
	ID      string
	Labels  map[string]string
	Created time.Time
}

// ImageConfig is what ImportImage sets on the image it makes.
type ImageConfig struct {
	// Cmd is the image's default command.
	Cmd []string
	// Labels are the image's labels.
	Labels map[string]string
}

// Validate reports, wrapping ErrInvalidSpec, a label key that is empty or
// holds white space, a quote or '='.
func (c ImageConfig) Validate() error {
	for k := range c.Labels {
		if k == "" || strings.ContainsAny(k, " \t\r\n=\"'") {
			return fmt.Errorf("image label key %q is empty or has white space, a quote or '=': %w", k, ErrInvalidSpec)
		}
	}
	return nil
}

// ImageImporter is implemented by runtimes that can make an image from a
// root filesystem tarball (`docker import`), so that tests and demos need no
// registry.
type ImageImporter interface {
	ImportImage(ctx context.Context, ref string, rootfsTar []byte, cfg ImageConfig) error
	// RemoveImage removes image ref; ErrImageNotFound if the node does not
	// have it.
	RemoveImage(ctx context.Context, ref string) error
}

// Spec describes a container.
type Spec struct {
	// Name is the container name; empty lets the runtime choose.
	Name string
	// Deployment and App identify the container; they become labels.
	Deployment string
	App        string
	// Image is a local image reference; nothing is ever pulled.
	Image string
	// Entrypoint and Cmd replace the image's when non-empty.
	Entrypoint []string
	Cmd        []string
	// Env holds KEY=VALUE pairs.
	Env        []string
	WorkingDir string
	// Binds are host paths mounted into the container (the environment
	// clone at /fog/root, the checkpoint clone at /fog/ckpt).
	Binds []Bind
	// Ports are published on the host.
	Ports []Port
	// CapAdd and CapDrop adjust the daemon's default capability set
	// ("SYS_ADMIN" or "CAP_SYS_ADMIN"; CapDrop "ALL" empties it first). For
	// an exact set, use CapDrop: {"ALL"} and list the set in CapAdd. A
	// container is never privileged.
	CapAdd  []string
	CapDrop []string
	// SecurityOpt are passed as-is ("no-new-privileges", "apparmor=...").
	SecurityOpt []string
	// Tmpfs are fresh tmpfs mounts of the container: path -> mount options
	// ("size=1m,mode=0755"; "" for the defaults).
	Tmpfs map[string]string
	// Devices are host devices made available in the container.
	Devices []Device
	// NanoCPUs limits CPU (1e9 = one CPU); 0 = no limit.
	NanoCPUs int64
	// MemoryBytes limits memory; 0 = no limit.
	MemoryBytes int64
	// ReadOnlyRoot mounts the container's own root filesystem read-only
	// (its binds and tmpfs mounts keep their modes).
	ReadOnlyRoot bool
	// PidsLimit bounds the container's processes and threads; 0 = no
	// limit.
	PidsLimit int64
	// OpenFiles is the RLIMIT_NOFILE of its processes (soft and hard);
	// 0 keeps the runtime's.
	OpenFiles uint64
	// LogBytes bounds one file of its output that the runtime keeps, and
	// LogFiles how many (json-file rotation); 0 keeps the runtime's.
	LogBytes int64
	LogFiles int
	// CPUShares is the container's relative CPU weight at creation (1024
	// is the default; 2 is the lowest, for work that waits, such as a
	// warm pool's slot); 0 leaves the runtime's default.
	CPUShares int64
	// Labels are added to the fogdeploy labels (which win on conflict).
	Labels map[string]string
	// Network is NetworkBridge (the default when empty), NetworkNone, or
	// the name of a bridge network of fogdeploy's, made on first use
	// (ValidNetworkName): its containers reach no other container's ports
	// unless NetworkOpen, where they reach each other's (never those of
	// another network). Published ports answer from the node either way.
	Network     string
	NetworkOpen bool
	// StopSignal overrides the image's ("SIGTERM" when neither sets one).
	StopSignal string
}

// Bind mounts HostPath at ContainerPath.
type Bind struct {
	HostPath      string
	ContainerPath string
	ReadOnly      bool
	// Propagation is the bind's mount propagation: "" (private) or
	// PropagationSlave, where mounts and unmounts made later under
	// HostPath on the host (which must be a shared mount) show up in the
	// container, and none made in the container reach the host.
	Propagation string
}

// PropagationSlave is Bind.Propagation for host-to-container propagation.
const PropagationSlave = "rslave"

// Port publishes ContainerPort/Proto on HostIP:HostPort.
type Port struct {
	ContainerPort uint16
	// Proto is "tcp" (when empty) or "udp".
	Proto string
	// HostIP defaults to DefaultHostIP.
	HostIP string
	// HostPort 0 lets the host choose a free port.
	HostPort uint16
}

// Device makes a host device available in the container.
type Device struct {
	HostPath      string
	ContainerPath string // defaults to HostPath
	Permissions   string // defaults to "rwm"
}

// State is what a runtime reports about a container.
type State struct {
	ID         string
	Name       string
	Image      string
	Deployment string
	App        string
	Labels     map[string]string
	// Status is "created", "running", "exited", ... as the runtime says it.
	Status  string
	Running bool
	// ExitCode is meaningful once the container has run and stopped.
	ExitCode int
	// Pid is the host PID of the main process while running, else 0.
	Pid int
	// Ports are the published ports; HostPort is the port actually bound
	// once the container runs.
	Ports   []Port
	Network string
	// IP is the container's own address on its network while it runs
	// ("" when it has none or the runtime does not say): the host reaches
	// its ports there without the runtime's port proxy.
	IP         string
	StartedAt  time.Time
	FinishedAt time.Time
}

// HostPort returns the host port published for containerPort/proto
// (proto "" = "tcp"), or 0.
func (s State) HostPort(containerPort uint16, proto string) uint16 {
	proto = protoOrTCP(proto)
	for _, p := range s.Ports {
		if p.ContainerPort == containerPort && protoOrTCP(p.Proto) == proto && p.HostPort != 0 {
			return p.HostPort
		}
	}
	return 0
}

// Validate reports every problem of the spec, each wrapping ErrInvalidSpec.
func (s Spec) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidSpec}, args...)...))
	}
	if s.Image == "" {
		bad("no image")
	}
	for _, b := range s.Binds {
		if !strings.HasPrefix(b.HostPath, "/") || !strings.HasPrefix(b.ContainerPath, "/") {
			bad("bind %q -> %q: both paths must be absolute", b.HostPath, b.ContainerPath)
		}
		if strings.ContainsAny(b.HostPath+b.ContainerPath, ":,") {
			bad("bind %q -> %q: paths must not contain ':' or ','", b.HostPath, b.ContainerPath)
		}
	}
	for path, opts := range s.Tmpfs {
		if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, ":,") || strings.ContainsAny(opts, " \t\n") {
			bad("tmpfs %q (%q): want an absolute path without ':' or ',', and options without spaces", path, opts)
		}
	}
	if n := s.Network; n != "" && n != NetworkBridge && n != NetworkNone && !ValidNetworkName(n) {
		bad("network %q: want %s, %s, or a name of fogdeploy's (fogdeploy-...: lowercase letters, digits and '-')", n, NetworkBridge, NetworkNone)
	}
	for _, p := range s.Ports {
		if p.ContainerPort == 0 {
			bad("port with container port 0")
		}
		if pr := protoOrTCP(p.Proto); pr != "tcp" && pr != "udp" {
			bad("port %d: protocol %q (want tcp or udp)", p.ContainerPort, p.Proto)
		}
	}
	for _, d := range s.Devices {
		if !strings.HasPrefix(d.HostPath, "/dev/") {
			bad("device %q is not under /dev", d.HostPath)
		}
	}
	if s.Network == NetworkNone && len(s.Ports) > 0 {
		bad("ports cannot be published with network %s", NetworkNone)
	}
	if s.NanoCPUs < 0 || s.MemoryBytes < 0 || s.CPUShares < 0 || s.PidsLimit < 0 || s.LogBytes < 0 || s.LogFiles < 0 {
		bad("negative CPU or memory limit")
	}
	for _, c := range append(append([]string{}, s.CapAdd...), s.CapDrop...) {
		if c == "" || strings.ContainsAny(c, " \t,") {
			bad("capability %q", c)
		}
	}
	return errors.Join(errs...)
}

// labels returns the container's labels: spec.Labels plus fogdeploy's.
func (s Spec) labels() map[string]string {
	l := make(map[string]string, len(s.Labels)+3)
	for k, v := range s.Labels {
		l[k] = v
	}
	l[LabelManaged] = "true"
	l[LabelDeployment] = s.Deployment
	l[LabelApp] = s.App
	return l
}

func protoOrTCP(p string) string {
	if p == "" {
		return "tcp"
	}
	return strings.ToLower(p)
}

func hostIPOrDefault(ip string) string {
	if ip == "" {
		return DefaultHostIP
	}
	return ip
}
