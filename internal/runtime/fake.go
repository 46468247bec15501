package runtime

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/hint"
)

// Fake is an in-memory Runtime for unit tests. Its containers run Go
// functions (FakeProgram) in place of processes, but their published TCP
// ports are real listeners on the host, so a test talks to a fake
// container exactly as to a real one. Images are registered with AddImage
// or ImportImage; FakeBusybox provides the few busybox applets that
// runtimetest.RunSuite uses, FakeDMTCP the DMTCP image's entrypoint and a
// redis-server that deploy's driver suite runs.
type Fake struct {
	mu         sync.Mutex
	images     map[string]fakeImage
	containers map[string]*fakeContainer
	network    string
	nextPid    int
	// down, while set, is what Inspect answers: a daemon that does not
	// answer yet (SetDown).
	down error
}

// Alive says whether pid is the main process of a running container
// (what the kernel's /proc says of a real one).
func (f *Fake) Alive(pid int) bool {
	f.mu.Lock()
	cs := make([]*fakeContainer, 0, len(f.containers))
	for _, c := range f.containers {
		cs = append(cs, c)
	}
	f.mu.Unlock()
	for _, c := range cs {
		if st := c.state(); st.Running && st.Pid == pid {
			return true
		}
	}
	return false
}

// SetDown makes Inspect fail with err until SetDown(nil), as a dockerd
// that is starting or restarting does.
func (f *Fake) SetDown(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = err
}

var (
	_ Runtime        = (*Fake)(nil)
	_ Signaler       = (*Fake)(nil)
	_ ImageImporter  = (*Fake)(nil)
	_ ImageInspector = (*Fake)(nil)
	_ Execer         = (*Fake)(nil)
)

// FakeOption configures a Fake.
type FakeOption func(*Fake)

// FakeWithoutBridge makes the Fake behave like a dockerd started with
// --bridge=none: containers get network none and ports are refused.
func FakeWithoutBridge() FakeOption { return func(f *Fake) { f.network = NetworkNone } }

// NewFake returns an empty Fake.
func NewFake(opts ...FakeOption) *Fake {
	f := &Fake{images: map[string]fakeImage{}, containers: map[string]*fakeContainer{}, network: NetworkBridge, nextPid: 10000}
	for _, o := range opts {
		o(f)
	}
	return f
}

// Network reports the network mode containers get: NetworkBridge, or
// NetworkNone with FakeWithoutBridge.
func (f *Fake) Network(context.Context) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.network, nil
}

// fakeContainer is one container of a Fake. Its own mutex guards the run
// state; Fake.mu guards the maps.
type fakeContainer struct {
	id, name string
	spec     Spec
	image    fakeImage
	network  string
	capEff   uint64

	mu        sync.Mutex
	status    string
	running   bool
	exitCode  int
	pid       int
	ports     []Port
	listeners map[string]net.Listener
	started   time.Time
	finished  time.Time
	logs      bytes.Buffer
	cancel    context.CancelCauseFunc
	done      chan struct{}
	removed   bool
	signals   chan string
}

// Causes of a fake container's end, mapped to exit codes like signals.
var (
	errFakeTerm = errors.New("SIGTERM")
	errFakeKill = errors.New("SIGKILL")
)

// Create implements Runtime.
func (f *Fake) Create(ctx context.Context, spec Spec) (string, error) {
	if err := spec.Validate(); err != nil {
		return "", err
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	netMode := f.network
	if spec.Network == NetworkNone {
		netMode = NetworkNone
	} else if ValidNetworkName(spec.Network) && netMode != NetworkNone {
		netMode = spec.Network
	}
	if netMode == NetworkNone && len(spec.Ports) > 0 {
		return "", hint.With(fmt.Errorf("container for app %q publishes %d port(s): %w", spec.App, len(spec.Ports), ErrNoNetwork),
			"start dockerd with its default bridge (not --bridge=none)")
	}
	capEff, err := EffectiveCaps(spec.CapAdd, spec.CapDrop)
	if err != nil {
		return "", err
	}
	for _, b := range spec.Binds {
		if _, err := os.Stat(b.HostPath); err != nil {
			return "", fmt.Errorf("bind source %s: %w (%w)", b.HostPath, ErrInvalidSpec, err)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	img, ok := f.images[normalizeRef(spec.Image)]
	if !ok {
		return "", hint.With(fmt.Errorf("image %q: %w", spec.Image, ErrImageNotFound),
			"no registry is reached: build or import the image on this node (`docker images` lists them)")
	}
	if len(spec.Entrypoint)+len(spec.Cmd)+len(img.cmd) == 0 {
		return "", fmt.Errorf("image %q: %w: no command specified", spec.Image, ErrInvalidSpec)
	}
	id := randomID()
	name := spec.Name
	if name == "" {
		name = "fake_" + id[:8]
	}
	for _, c := range f.containers {
		if c.name == name {
			return "", fmt.Errorf("name %q is used by container %s: %w", name, c.id[:12], ErrConflict)
		}
	}
	ports := make([]Port, len(spec.Ports))
	for i, p := range spec.Ports {
		ports[i] = Port{ContainerPort: p.ContainerPort, Proto: protoOrTCP(p.Proto), HostIP: hostIPOrDefault(p.HostIP), HostPort: p.HostPort}
	}
	spec.Labels = spec.labels()
	f.containers[id] = &fakeContainer{id: id, name: name, spec: spec, image: img, network: netMode, capEff: capEff,
		status: "created", ports: ports, done: closedChan()}
	return id, nil
}

// Start implements Runtime.
func (f *Fake) Start(ctx context.Context, id string) error {
	c, err := f.lookup(id)
	if err != nil {
		return fmt.Errorf("start container %s: %w", id, err)
	}
	f.mu.Lock()
	f.nextPid++
	pid := f.nextPid
	f.mu.Unlock()

	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running {
		return nil
	}
	argv := append(append([]string{}, c.spec.Entrypoint...), c.spec.Cmd...)
	if len(c.spec.Entrypoint) == 0 && len(c.spec.Cmd) == 0 {
		argv = c.image.cmd
	}
	prog, ok := c.image.programs[path.Base(argv[0])]
	if !ok {
		c.exitCode = 127
		return fmt.Errorf("start container %s: exec %q: executable file not found in image %s", c.id[:12], argv[0], c.spec.Image)
	}
	listeners := map[string]net.Listener{}
	ports := make([]Port, len(c.ports))
	for i, p := range c.ports {
		ports[i] = p
		if p.Proto != "tcp" {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort(p.HostIP, strconv.Itoa(int(c.spec.Ports[i].HostPort))))
		if err != nil {
			for _, l := range listeners {
				_ = l.Close()
			}
			return fmt.Errorf("start container %s: publish %d/tcp: %w (%w)", c.id[:12], p.ContainerPort, ErrConflict, err)
		}
		listeners[portKey(p.ContainerPort, p.Proto)] = newFakeListener(l)
		ports[i].HostPort = uint16(l.Addr().(*net.TCPAddr).Port)
	}
	runCtx, cancel := context.WithCancelCause(context.Background())
	c.listeners, c.ports, c.cancel, c.signals = listeners, ports, cancel, make(chan string, 4)
	c.running, c.status, c.pid, c.exitCode = true, "running", pid, 0
	c.started, c.finished = time.Now(), time.Time{}
	done := make(chan struct{})
	c.done = done
	proc := &FakeProcess{Args: argv, Env: c.spec.Env, Stdin: strings.NewReader(""), Stdout: &lockedWriter{c: c}, CapEff: c.capEff, c: c}
	go func() {
		code := prog(runCtx, proc)
		switch context.Cause(runCtx) {
		case errFakeTerm:
			code = 128 + 15
		case errFakeKill:
			code = 128 + 9
		}
		c.mu.Lock()
		for _, l := range c.listeners {
			_ = l.Close()
		}
		c.listeners = nil
		c.running, c.status, c.pid, c.exitCode, c.finished = false, "exited", 0, code, time.Now()
		c.mu.Unlock()
		cancel(nil)
		close(done)
	}()
	return nil
}

// Exec implements Execer: it runs a program of the container's image with
// the container's environment plus spec.Env.
func (f *Fake) Exec(ctx context.Context, id string, spec ExecSpec) (ExecResult, error) {
	if len(spec.Cmd) == 0 {
		return ExecResult{}, fmt.Errorf("exec in container %s: no command: %w", id, ErrInvalidSpec)
	}
	c, err := f.lookup(id)
	if err != nil {
		return ExecResult{}, fmt.Errorf("exec in container %s: %w", id, err)
	}
	c.mu.Lock()
	running, status := c.running, c.status
	env := append(slices.Clone(c.spec.Env), spec.Env...)
	c.mu.Unlock()
	if !running {
		return ExecResult{}, fmt.Errorf("exec in container %s: %w: it is %s", id, ErrConflict, status)
	}
	out := &cappedBuffer{max: MaxExecOutput}
	p := &FakeProcess{Env: env, CapEff: c.capEff, c: c}
	code := p.Run(ctx, spec.Cmd, strings.NewReader(""), out)
	if err := ctx.Err(); err != nil {
		return ExecResult{Output: out.String()}, fmt.Errorf("exec in container %s: %w", id, err)
	}
	return ExecResult{ExitCode: code, Output: out.String()}, nil
}

// Stop implements Runtime.
func (f *Fake) Stop(ctx context.Context, id string, timeout time.Duration) error {
	c, err := f.lookup(id)
	if err != nil {
		return fmt.Errorf("stop container %s: %w", id, err)
	}
	return c.stop(ctx, errFakeTerm, timeout)
}

func (c *fakeContainer) stop(ctx context.Context, cause error, timeout time.Duration) error {
	c.mu.Lock()
	running, cancel, done := c.running, c.cancel, c.done
	c.mu.Unlock()
	if !running {
		return nil
	}
	cancel(cause)
	t := time.NewTimer(timeout + time.Second)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("container %s: program ignored the stop request for %s", c.id[:12], timeout)
	}
}

// Remove implements Runtime.
func (f *Fake) Remove(ctx context.Context, id string) error {
	c, err := f.lookup(id)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err := c.stop(ctx, errFakeKill, 10*time.Second); err != nil {
		return fmt.Errorf("remove container %s: %w", id, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	c.mu.Lock()
	c.removed = true
	c.mu.Unlock()
	delete(f.containers, c.id)
	return nil
}

// SpecOf returns the spec container id was created with, as dockerd's
// inspect shows it (its HostConfig): what a test of a driver reads to see
// the limits and weights the driver asked for.
func (f *Fake) SpecOf(id string) (Spec, error) {
	c, err := f.lookup(id)
	if err != nil {
		return Spec{}, err
	}
	return c.spec, nil
}

// Inspect implements Runtime.
func (f *Fake) Inspect(ctx context.Context, id string) (State, error) {
	f.mu.Lock()
	down := f.down
	f.mu.Unlock()
	if down != nil {
		return State{}, fmt.Errorf("inspect container %s: %w", id, down)
	}
	c, err := f.lookup(id)
	if err != nil {
		return State{}, fmt.Errorf("inspect container %s: %w", id, err)
	}
	return c.state(), nil
}

func (c *fakeContainer) state() State {
	c.mu.Lock()
	defer c.mu.Unlock()
	labels := make(map[string]string, len(c.spec.Labels))
	for k, v := range c.spec.Labels {
		labels[k] = v
	}
	ports := append([]Port(nil), c.ports...)
	if !c.running {
		for i := range ports {
			ports[i].HostPort = c.spec.Ports[i].HostPort
		}
	}
	return State{ID: c.id, Name: c.name, Image: c.spec.Image, Deployment: c.spec.Deployment, App: c.spec.App,
		Labels: labels, Status: c.status, Running: c.running, ExitCode: c.exitCode, Pid: c.pid, Ports: ports,
		Network: c.network, StartedAt: c.started, FinishedAt: c.finished}
}

// List implements Runtime.
func (f *Fake) List(ctx context.Context, labels map[string]string) ([]State, error) {
	f.mu.Lock()
	cs := make([]*fakeContainer, 0, len(f.containers))
	for _, c := range f.containers {
		cs = append(cs, c)
	}
	f.mu.Unlock()
	var out []State
	for _, c := range cs {
		st := c.state()
		if matchLabels(st.Labels, labels) && st.Labels[LabelManaged] == "true" {
			out = append(out, st)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Logs implements Runtime.
func (f *Fake) Logs(ctx context.Context, id string, tail int) (string, error) {
	c, err := f.lookup(id)
	if err != nil {
		return "", fmt.Errorf("logs of container %s: %w", id, err)
	}
	c.mu.Lock()
	all := c.logs.String()
	c.mu.Unlock()
	if tail <= 0 {
		return all, nil
	}
	lines := strings.SplitAfter(all, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if len(lines) > tail {
		lines = lines[len(lines)-tail:]
	}
	return strings.Join(lines, ""), nil
}

// Wait implements Runtime.
func (f *Fake) Wait(ctx context.Context, id string) (int, error) {
	c, err := f.lookup(id)
	if err != nil {
		return 0, fmt.Errorf("wait for container %s: %w", id, err)
	}
	c.mu.Lock()
	done := c.done
	c.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.removed {
		return 0, fmt.Errorf("wait for container %s: %w (removed while waiting)", id, ErrNotFound)
	}
	return c.exitCode, nil
}

// Signal implements Signaler: TERM, INT and KILL end the program; other
// signals go to FakeProcess.Signals, where a program that does not read
// them ignores them, like a process without a handler for them.
// Update implements Updater: the container's spec takes the limits.
func (f *Fake) Update(ctx context.Context, id string, r Resources) error {
	c, err := f.lookup(id)
	if err != nil {
		return fmt.Errorf("update container %s: %w", id, err)
	}
	c.mu.Lock()
	c.spec.NanoCPUs, c.spec.MemoryBytes, c.spec.PidsLimit = r.NanoCPUs, r.MemoryBytes, r.PidsLimit
	c.mu.Unlock()
	return nil
}

func (f *Fake) Signal(ctx context.Context, id, signal string) error {
	c, err := f.lookup(id)
	if err != nil {
		return fmt.Errorf("signal container %s: %w", id, err)
	}
	c.mu.Lock()
	running, cancel, signals := c.running, c.cancel, c.signals
	c.mu.Unlock()
	if !running {
		return fmt.Errorf("signal container %s: %w: not running", id, ErrConflict)
	}
	switch sig := strings.TrimPrefix(strings.ToUpper(signal), "SIG"); sig {
	case "TERM", "INT", "15", "2":
		cancel(errFakeTerm)
	case "KILL", "9":
		cancel(errFakeKill)
	default:
		select {
		case signals <- sig:
		default:
		}
	}
	return nil
}

// lookup finds a container by ID, unique ID prefix or name.
func (f *Fake) lookup(id string) (*fakeContainer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.containers[id]; ok {
		return c, nil
	}
	var found *fakeContainer
	for _, c := range f.containers {
		if c.name == strings.TrimPrefix(id, "/") {
			return c, nil
		}
		if id != "" && strings.HasPrefix(c.id, id) {
			if found != nil {
				return nil, fmt.Errorf("ID prefix %q is ambiguous: %w", id, ErrNotFound)
			}
			found = c
		}
	}
	if found == nil {
		return nil, fmt.Errorf("no container %q: %w", id, ErrNotFound)
	}
	return found, nil
}

type lockedWriter struct{ c *fakeContainer }

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	return w.c.logs.Write(p)
}

func matchLabels(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

func portKey(port uint16, proto string) string {
	return strconv.Itoa(int(port)) + "/" + protoOrTCP(proto)
}

func randomID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}
