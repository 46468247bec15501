package drivers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/cgroup"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/instancectl"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
)

// ContainerRuntime is what the Container driver needs of a runtime: the
// moby-backed runtime.Docker, or runtime.Fake in unit tests.
type ContainerRuntime interface {
	runtime.Runtime
	runtime.Signaler
	runtime.ImageInspector
	runtime.Execer
}

// Labels of the DMTCP image (dmtcp-image/Dockerfile). An image with
// DMTCPVersionLabel is a fogdeploy DMTCP image, whatever its tag.
const (
	// DMTCPVersionLabel holds the version of the DMTCP it packages.
	DMTCPVersionLabel = "io.fogdeploy.dmtcp.version"
	// DMTCPGlibcLabel holds the oldest glibc its DMTCP runs on ("2.36"):
	// DMTCP's tools run on the environment's C library.
	DMTCPGlibcLabel = "io.fogdeploy.dmtcp.glibc"
	// CRIUVersionLabel holds the version of the CRIU the image carries
	// too ("" or absent: none); such an image runs CRIU apps as well.
	CRIUVersionLabel = "io.fogdeploy.criu.version"
	// RecycleLabel marks an image whose entrypoint serves instance after
	// instance (its -recycle flag): the engines it does so for, comma
	// separated ("dmtcp,criu"); "1", from images that recycled DMTCP
	// instances only, stands for "dmtcp".
	RecycleLabel = "io.fogdeploy.recycle"
	// SourceLaterLabel, "1", marks an image whose entrypoint reads a
	// restart's checkpoint source once ordered (-source-later).
	SourceLaterLabel = "io.fogdeploy.source-later"
	// RootLaterLabel, "1", marks an image whose entrypoint prepares a
	// restart's root and reads its checkpoint volume once ordered
	// (-root-later).
	RootLaterLabel = "io.fogdeploy.root-later"
	// SpareLabel, "1", marks an image whose entrypoint waits as a spare
	// for the restart it is assigned (its spare mode).
	SpareLabel = "io.fogdeploy.spare"
)

// Container runs instances in the DMTCP container (dmtcp-image/): the
// environment clone bound at /fog/root, the checkpoint clone at /fog/ckpt,
// the app's ports published on 127.0.0.1, capabilities SYS_ADMIN,
// SYS_CHROOT and SETPCAP only (all dropped for the app). Instances survive
// a restart of the process that started them. An image that carries CRIU
// too (CRIUVersionLabel) runs apps of the criu engine in the same
// container, whose entrypoint then runs criu dump and criu restore itself,
// with runtime.CRIUCapabilities (again none for the app).
type Container struct {
	RT ContainerRuntime
	// Image is the DMTCP image, e.g. fogdeploy/dmtcp:4.2.0. "" finds it
	// by its label (DMTCPVersionLabel): the newest such image on the node,
	// as `make dmtcp-image` built it.
	Image string
	// BootImage runs apps with no checkpoint engine (RunBoot), e.g.
	// fogdeploy/boot:latest from `dmtcp-image/build.sh -b`.
	BootImage string
	// StopTimeout is how long Remove lets the app stop after SIGTERM.
	StopTimeout time.Duration
	// Priority raises a background slot's container to normal priority
	// when Start binds it (nil: it keeps the weight it was created with).
	Priority cgroup.Priority
	// Limiter gives a spare its app's limits in the kernel's cgroup files
	// when it is assigned (nil: through the runtime, runtime.Updater,
	// 15-20 ms on the restore's path).
	Limiter cgroup.Limiter

	mu    sync.Mutex
	found dmtcpImage // what Check found last
	// checkMu serializes the engines' kernel checks; checks are the
	// last one's outcome, by engine.
	checkMu sync.Mutex
	checks  map[engine.Name]kernelCheck
}

var _ Driver = (*Container)(nil)

// Name implements Driver.
func (c *Container) Name() string { return string(spec.DriverContainer) }

// TakesSourceLater: the light container's entrypoint reads a restart's
// checkpoint source once ordered to start (LateSourcer), where the image
// found says so (SourceLaterLabel).
func (c *Container) TakesSourceLater() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.found.sourceLater
}

// TakesRootLater: the light container's entrypoint prepares a restart's
// root and reads its checkpoint volume once ordered to start
// (LateSourcer), where the image found says so (RootLaterLabel).
func (c *Container) TakesRootLater() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.found.rootLater
}

// Networks of instances (runtime.Spec.Network).
const (
	// IsolatedNetwork holds the instances of apps without a network
	// group: none reaches another's ports.
	IsolatedNetwork = runtime.NetworkPrefix + "isolated"
	// groupNetworkPrefix starts the network of a group (App.Network),
	// whose instances reach each other's ports.
	groupNetworkPrefix = runtime.NetworkPrefix + "group-"
)

// networkOf is the network an instance of app joins.
func networkOf(app spec.App) string {
	if app.Network == "" {
		return IsolatedNetwork
	}
	return groupNetworkPrefix + app.Network
}

// probedInside reports whether the entrypoint runs the app's readiness
// probe itself, from inside the container, and so measures the engine's
// own time to ready (launch_ready / restart_ready / boot_ready): it does
// for TCP and HTTP probes.
func probedInside(rd spec.Readiness) bool {
	return rd.Kind == spec.ReadyTCP || rd.Kind == spec.ReadyHTTP
}

// escape writes \r, \n, \t and \ as the entrypoint's flag escapes.
func escape(s string) string {
	return strings.NewReplacer(`\`, `\\`, "\r", `\r`, "\n", `\n`, "\t", `\t`).Replace(s)
}

// Create implements Driver: the container, started, with the environment
// and checkpoint clones bound, its ports published, its root prepared and
// (for DMTCP) its coordinator listening, and its entrypoint waiting for the
// order that Start writes into Run.CtlPath. Everything but the app's own
// start is done here, ahead of the request that Start serves.
func (c *Container) Create(ctx context.Context, r Run) (Handle, error) {
	if err := r.validate(); err != nil {
		return Handle{}, err
	}
	if r.CtlPath == "" {
		return Handle{}, fmt.Errorf("run of app %q: no control directory (Run.CtlPath): %w", r.App.Name, spec.ErrInvalidSpec)
	}
	// The entrypoint binds it where the app reads its identity (identity.go).
	if err := os.MkdirAll(filepath.Join(r.CtlPath, instancectl.IdentityDir), 0o755); err != nil {
		return Handle{}, fmt.Errorf("control directory of the instance: %w", err)
	}
	spec, recycle, err := c.containerSpec(ctx, r)
	if err != nil {
		return Handle{}, err
	}
	h := Handle{Driver: c.Name(), EnvPath: r.EnvPath, CkptPath: r.CkptPath, CtlPath: r.CtlPath, Gen: r.Gen, Background: r.Background,
		Recycle: recycle, RootLater: r.RootLater, CkptShared: r.CkptShared}
	if r.Mode == RunRestart {
		h.Gen = r.Gen + 1
	}
	return c.started(ctx, h, spec)
}

// started creates the container of spec (or finds the one a call before
// created, existing), starts it if it has not run, and returns h with its
// reference, host ports, main process and address. On error the
// container is removed.
func (c *Container) started(ctx context.Context, h Handle, spec runtime.Spec) (_ Handle, err error) {
	id, err := c.RT.Create(ctx, spec)
	if errors.Is(err, runtime.ErrConflict) {
		h, err = c.existing(ctx, h, spec, err)
		if err != nil {
			return Handle{}, err
		}
		id = h.Ref
	} else if err != nil {
		return Handle{}, err
	}
	h.Ref = id
	// From here on, an error leaves the container to the caller's Remove
	// (it has the handle's Ref only if it recorded it): remove it here.
	defer func() {
		if err != nil {
			_ = c.Remove(context.WithoutCancel(ctx), h)
		}
	}()
	st, err := c.RT.Inspect(ctx, id)
	if err != nil {
		return Handle{}, err
	}
	if st.Status == statusCreated {
		if err := c.RT.Start(ctx, id); err != nil {
			return Handle{}, err
		}
		if st, err = c.RT.Inspect(ctx, id); err != nil {
			return Handle{}, err
		}
	}
	if h.Ports, err = c.ports(st); err != nil {
		return Handle{}, err
	}
	h.Pid, h.IP = st.Pid, st.IP
	return h, nil
}

// state is the runtime's state of h's container, or, while h.Pid is still
// a process of that container (its cgroup names the container), a running
// state without asking the runtime: Start and the ready wait are on a
// deploy's critical path, and a runtime call there costs dockerd CPU and
// waits behind every other call of a busy node.
func (c *Container) state(ctx context.Context, h Handle) (runtime.State, error) {
	if h.Pid > 0 && c.ownsPid(h) {
		return runtime.State{ID: h.Ref, Status: "running", Running: true, Pid: h.Pid}, nil
	}
	return c.RT.Inspect(ctx, h.Ref)
}

// existing returns the handle of the container that took spec's name, if
// it is the one spec describes (the same deployment, image and labels)
// and has not run yet or still runs: Create is idempotent. Any other
// container under that name is spec.ErrExists.
func (c *Container) existing(ctx context.Context, h Handle, rs runtime.Spec, conflict error) (Handle, error) {
	st, err := c.RT.Inspect(ctx, rs.Name)
	if err != nil {
		return Handle{}, fmt.Errorf("instance of deployment %s: %w (%w)", rs.Deployment, spec.ErrExists, conflict)
	}
	same := st.Image == rs.Image && st.Labels[runtime.LabelDeployment] == rs.Deployment && st.Labels[runtime.LabelApp] == rs.App
	for k, v := range rs.Labels {
		same = same && st.Labels[k] == v
	}
	if !same || (st.Status != statusCreated && !st.Running) {
		return Handle{}, hint.With(fmt.Errorf("instance of deployment %s: container %s (%s) exists: %w", rs.Deployment, st.Name, st.Status, spec.ErrExists),
			"undeploy the deployment first, or deploy under another ID")
	}
	h.Ref = st.ID
	return h, nil
}

// statusCreated is the status of a container that has never run.
const statusCreated = "created"

// ports reads the host addresses of a running container's published ports.
func (c *Container) ports(st runtime.State) (map[string]string, error) {
	ports := map[string]string{}
	for _, p := range st.Ports {
		key := PortKey(int(p.ContainerPort), p.Proto)
		if _, done := ports[key]; done {
			continue
		}
		hp := st.HostPort(p.ContainerPort, p.Proto)
		if hp == 0 && st.Running {
			return nil, fmt.Errorf("container %s publishes no host port for %s", shortRef(st.ID), key)
		}
		// An app that exited at once has no host port; waiting for it to
		// be ready then says that it exited, with its output.
		ports[key] = net.JoinHostPort(runtime.DefaultHostIP, strconv.Itoa(int(hp)))
	}
	return ports, nil
}

// Start implements Driver: it orders the waiting entrypoint to start the
// app (a file in the control directory, naming h.Deployment) and, for a
// background slot, raises its CPU priority to normal first. It costs a
// file write and one inspect: everything else was done by Create.
func (c *Container) Start(ctx context.Context, h Handle) (Handle, error) {
	if h.CtlPath == "" {
		return Handle{}, fmt.Errorf("container %s has no control directory: %w", shortRef(h.Ref), spec.ErrInvalidSpec)
	}
	st, err := c.state(ctx, h)
	if errors.Is(err, runtime.ErrNotFound) {
		return Handle{}, fmt.Errorf("container %s: %w (%w)", shortRef(h.Ref), spec.ErrNotFound, err)
	}
	if err != nil {
		return Handle{}, err
	}
	if st.Running && ordered(h) {
		return h, nil // started already
	}
	if !st.Running {
		return Handle{}, hint.With(fmt.Errorf("container %s is not waiting for an order (%s, exit code %d); an instance starts once", shortRef(h.Ref), st.Status, st.ExitCode),
			"remove it and create a new instance")
	}
	if h, err = c.raise(st.Pid, h); err != nil {
		return Handle{}, err
	}
	if err := writeOrder(h); err != nil {
		return Handle{}, err
	}
	return h, nil
}

// Checkpoint implements Driver: SIGUSR1 to the entrypoint, which writes
// generation h.Gen with `dmtcp_command -kc` and exits 0.
//
// Where the container's main process can be watched (Handle.Pid, a
// pidfd), the checkpoint is known once that process has exited, from the
// report its entrypoint wrote just before (instancectl.Checkpointed): the
// runtime reports the container's exit 0.1-0.2 s later, once it has torn
// down its network and cgroup. Its processes and their mounts are gone
// by then (Checkpointed.Exited); the container itself is left to Remove.
func (c *Container) Checkpoint(ctx context.Context, h Handle) (Checkpointed, error) {
	exited, stop := c.watchExit(h)
	defer stop()
	if err := c.RT.Signal(ctx, h.Ref, "USR1"); err != nil {
		return Checkpointed{}, fmt.Errorf("%w: %w", ErrCheckpoint, err)
	}
	if exited != nil {
		if ck, ok := c.reported(ctx, h, exited); ok {
			return ck, nil
		}
	}
	return c.Checkpointed(ctx, h)
}

// Checkpointed waits until instance h's container has exited after a
// checkpoint asked of it, and returns the checkpoint its entrypoint
// reported: what an agent that asked and was stopped before the answer
// reads at its restart.
func (c *Container) Checkpointed(ctx context.Context, h Handle) (Checkpointed, error) {
	code, err := c.RT.Wait(ctx, h.Ref)
	logs, _ := c.RT.Logs(context.WithoutCancel(ctx), h.Ref, 400)
	if err != nil {
		return Checkpointed{}, fmt.Errorf("%w: %w", ErrCheckpoint, err)
	}
	for _, t := range runtime.ParseTimings(logs) {
		if t.Phase == "checkpoint" && t.Error == "" && code == 0 {
			return Checkpointed{Gen: t.Gen, Bytes: t.Bytes, MS: t.MS, Exited: true}, nil
		}
	}
	return Checkpointed{}, engine.WithOutput(fmt.Errorf("%w: the light container exited %d without a complete checkpoint", ErrCheckpoint, code),
		"the container", lastLines(logs, 20))
}

// Running implements Driver: the container runs and was ordered to start
// its app (a created instance's container runs too, waiting).
func (c *Container) Running(ctx context.Context, h Handle) (bool, error) {
	st, err := c.state(ctx, h)
	if errors.Is(err, runtime.ErrNotFound) {
		return false, nil
	}
	return st.Running && (h.CtlPath == "" || ordered(h)), err
}

// Exec implements Driver: through the runtime's exec, the entrypoint's
// keeper joins the app's PID and mount namespaces, chroots into the
// environment, takes the app's user, drops every capability and runs
// e.Argv, as it runs the app: the command sees what the app sees.
func (c *Container) Exec(ctx context.Context, h Handle, e Exec) (runtime.ExecResult, error) {
	if len(e.Argv) == 0 {
		return runtime.ExecResult{}, fmt.Errorf("exec in container %s: no command: %w", shortRef(h.Ref), spec.ErrInvalidSpec)
	}
	if h.CtlPath != "" && !ordered(h) {
		return runtime.ExecResult{}, fmt.Errorf("container %s: %w (created, not started)", shortRef(h.Ref), spec.ErrNotFound)
	}
	cmd := []string{runtime.DMTCPEntrypoint, "keep", "-join"}
	if e.User != "" {
		cmd = append(cmd, "-user", e.User)
	}
	cmd = append(append(cmd, runtime.DMTCPRoot(h.EnvPath, h.Recycle || h.RootLater), "/"), e.Argv...)
	r, err := c.RT.Exec(ctx, h.Ref, runtime.ExecSpec{Cmd: cmd, Env: e.Env})
	if errors.Is(err, runtime.ErrNotFound) || errors.Is(err, runtime.ErrConflict) {
		return r, fmt.Errorf("container %s: %w (%w)", shortRef(h.Ref), spec.ErrNotFound, err)
	}
	return r, err
}

// Logs implements Driver.
func (c *Container) Logs(ctx context.Context, h Handle, n int) ([]string, error) {
	logs, err := c.RT.Logs(ctx, h.Ref, n)
	if err != nil {
		return nil, err
	}
	return lastLines(logs, n), nil
}

// NetPid implements Driver: the entrypoint's PID, which shares the app's
// network namespace; 0 before Start ordered the app to run.
func (c *Container) NetPid(ctx context.Context, h Handle) (int, error) {
	if h.CtlPath != "" && !ordered(h) {
		return 0, nil
	}
	st, err := c.state(ctx, h)
	if err != nil {
		return 0, err
	}
	return st.Pid, nil
}

// Remove implements Driver: it stops the container if it runs and removes
// it, whether it ever started or not.
func (c *Container) Remove(ctx context.Context, h Handle) error {
	if h.Ref == "" {
		return nil
	}
	if h.StopSignal != "" {
		c.signalStop(ctx, h)
	}
	if err := c.RT.Stop(ctx, h.Ref, c.StopTimeoutOrDefault()); err != nil && !errors.Is(err, runtime.ErrNotFound) {
		return err
	}
	return c.RT.Remove(ctx, h.Ref)
}

// signalStop stops the app of a container made with another stop signal
// (a spare's) with its own, h.StopSignal, and waits up to the stop timeout
// for it to exit: the entrypoint passes the signal on to the app. What is
// still running after it gets the container's stop and SIGKILL.
func (c *Container) signalStop(ctx context.Context, h Handle) {
	if err := c.RT.Signal(ctx, h.Ref, h.StopSignal); err != nil {
		return
	}
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for deadline := time.Now().Add(c.StopTimeoutOrDefault()); time.Now().Before(deadline); {
		if st, err := c.RT.Inspect(ctx, h.Ref); err != nil || !st.Running {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// DefaultStopTimeout is how long an instance may take to stop after
// SIGTERM unless its driver says otherwise: Docker's default, and the
// engines' (engine.Config.StopTimeout).
const DefaultStopTimeout = 10 * time.Second

// StopTimeoutOrDefault is how long Remove lets the app stop after SIGTERM.
func (c *Container) StopTimeoutOrDefault() time.Duration {
	if c.StopTimeout > 0 {
		return c.StopTimeout
	}
	return DefaultStopTimeout
}

// RemoveDeployment implements Sweeper: it removes every container labelled
// with deployment id, also one whose handle was never recorded (the
// process that created it died before it could).
func (c *Container) RemoveDeployment(ctx context.Context, id string) error {
	sts, err := c.RT.List(ctx, map[string]string{runtime.LabelDeployment: id})
	if err != nil {
		return err
	}
	var errs []error
	for _, st := range sts {
		errs = append(errs, c.Remove(ctx, Handle{Driver: c.Name(), Ref: st.ID}))
	}
	return errors.Join(errs...)
}

func shortRef(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

func lastLines(s string, n int) []string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) == 1 && lines[0] == "" {
		return nil
	}
	if n > 0 && len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return lines
}
