package drivers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/cgroup"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// Host runs instances as supervised processes of this process, under the
// engines of package engine: each app chrooted into its environment clone,
// in private mount, PID, IPC and network namespaces, with a private /dev,
// as root without capabilities when its engines confine
// (engine.Config.Confine), and bounded by a cgroup of its own (Groups).
// Each published port is a listener on 127.0.0.1 that forwards into the
// app's network namespace. It runs the engines whose driver is "host"
// (agent.drivers). Instances end with the process
// that started them.
type Host struct {
	// Engines by name (engine.Names).
	Engines map[engine.Name]engine.Engine
	// LogLines is how many output lines each instance keeps (default 200).
	LogLines int
	// Groups, if set, makes each instance's cgroup: its limits (the
	// app's resources over the node's defaults, Run.Limits) bound it
	// there, its open files by RLIMIT_NOFILE. Nil runs instances without
	// limits.
	Groups cgroup.Groups

	mu    sync.Mutex
	insts map[string]*hostInst
}

var _ Driver = (*Host)(nil)

// hostInst is one instance: its run from Create, and from Start its
// process and port forwarders.
type hostInst struct {
	eng  engine.Engine
	run  Run
	img  engine.Image // the image to restore (RunRestart)
	tail *engine.LogTail

	mu      sync.Mutex // held by Start and Remove
	removed bool
	proc    engine.Process // nil until started
	proxies []net.Listener
	ports   map[string]string
	wg      sync.WaitGroup
	group   cgroup.Group // nil without Host.Groups
	ungroup sync.Once    // removes group once its processes are gone
}

// NewHost returns a Host driver over engines.
func NewHost(engines ...engine.Engine) *Host {
	h := &Host{Engines: map[engine.Name]engine.Engine{}, insts: map[string]*hostInst{}}
	for _, e := range engines {
		h.Engines[e.Name()] = e
	}
	return h
}

// Limited says whether the driver bounds its instances (Groups is set).
func (d *Host) Limited() bool { return d != nil && d.Groups != nil }

// Name implements Driver.
func (d *Host) Name() string { return string(spec.DriverHost) }

// Check implements Driver.
func (d *Host) Check(ctx context.Context, eng engine.Name) (string, error) {
	e, ok := d.Engines[eng]
	if !ok {
		return "", fmt.Errorf("%w: no %s engine configured", ErrDriver, eng)
	}
	info, err := e.Check(ctx)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrDriver, err)
	}
	return info.Version, nil
}

// Create implements Driver: it checks the run, reads the image a restart
// restores and makes the directory CRIU restores at, and keeps the run for
// Start. The handle's Ref is the deployment ID.
func (d *Host) Create(ctx context.Context, r Run) (Handle, error) {
	if err := r.validate(); err != nil {
		return Handle{}, err
	}
	if r.Mode == RunBoot {
		return Handle{}, fmt.Errorf("%w: mode %s: the host driver runs apps under a checkpoint engine; booting without one needs the container driver", spec.ErrInvalidSpec, r.Mode)
	}
	if r.App.User != "" {
		return Handle{}, fmt.Errorf("%w: user %q: the host driver runs apps as root; run an app that needs a user with the dmtcp engine in the container driver", spec.ErrInvalidSpec, r.App.User)
	}
	for _, p := range r.App.Ports {
		if p.Proto == "udp" {
			return Handle{}, fmt.Errorf("%w: the host driver publishes tcp ports only (port %d/udp)", spec.ErrInvalidSpec, p.Port)
		}
	}
	e, ok := d.Engines[r.App.Engine]
	if !ok {
		return Handle{}, fmt.Errorf("%w: no %s engine configured", ErrDriver, r.App.Engine)
	}
	n := d.LogLines
	if n <= 0 {
		n = 200
	}
	in := &hostInst{eng: e, run: r, tail: engine.NewLogTail(n)}
	if r.Mode == RunRestart {
		dir := GenDir(r.CkptPath, r.Gen)
		if r.CkptSource != "" {
			dir = r.CkptSource
		}
		img, err := engine.ReadImage(dir)
		if err != nil {
			return Handle{}, err
		}
		if img.Root != "" {
			// CRIU restores at the root's path of checkpoint time; the
			// engine binds this instance's root over it in the app's mount
			// namespace, which needs the directory on this node.
			if err := os.MkdirAll(img.Root, 0o755); err != nil {
				return Handle{}, err
			}
		}
		in.img = img
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.insts == nil {
		d.insts = map[string]*hostInst{}
	}
	if old, ok := d.insts[r.ID]; ok {
		if !reflect.DeepEqual(old.run, r) {
			return Handle{}, fmt.Errorf("host instance of deployment %s: %w", r.ID, spec.ErrExists)
		}
		return old.handle(d.Name()), nil
	}
	d.insts[r.ID] = in
	return in.handle(d.Name()), nil
}

// handle returns the instance's handle as it is now.
func (in *hostInst) handle(driver string) Handle {
	r := in.run
	h := Handle{Driver: driver, Ref: r.ID, Gen: r.Gen, EnvPath: r.EnvPath, CkptPath: r.CkptPath}
	if r.Mode == RunRestart {
		h.Gen = r.Gen + 1
	}
	if in.ports != nil {
		h.Ports = maps.Clone(in.ports)
	}
	return h
}

// Start implements Driver: it launches or restores the app under its
// engine and publishes its ports.
func (d *Host) Start(ctx context.Context, h Handle) (_ Handle, err error) {
	in, err := d.inst(h)
	if err != nil {
		return Handle{}, err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.removed {
		return Handle{}, fmt.Errorf("host instance %s: %w (removed)", h.Ref, spec.ErrNotFound)
	}
	if in.proc != nil {
		return in.handle(d.Name()), nil
	}
	r := in.run
	var proc engine.Process
	switch r.Mode {
	case RunLaunch:
		env := appEnv(append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}, r.ImageEnv...), r.App.Environment)
		comp := r.App.Compression
		if comp == "none" {
			comp = ""
		}
		proc, err = in.eng.Launch(ctx, engine.LaunchSpec{Argv: r.App.Command, Env: env, Dir: firstNonEmpty(r.App.WorkDir, r.WorkDir),
			Root: r.EnvPath, Stdout: in.tail, Stderr: in.tail, NetNS: true, Compression: comp})
	case RunRestart:
		proc, err = in.eng.Restore(ctx, in.img, engine.RestoreSpec{Root: r.EnvPath, Stdout: in.tail, Stderr: in.tail, NetNS: true,
			Lazy: r.App.Lazy && engine.Of(in.eng.Name()).LazyRestore})
	}
	if err != nil {
		return Handle{}, err
	}
	defer func() {
		if err != nil {
			in.close()
			in.proxies = nil
			_ = proc.Stop(context.WithoutCancel(ctx))
			in.removeGroup()
		}
	}()
	if d.Groups != nil {
		if in.group, err = limit(d.Groups, r, proc.Pid()); err != nil {
			return Handle{}, err
		}
		// An app that ends by itself (a checkpoint that kills it)
		// leaves no group either.
		go func() {
			_, _ = proc.Wait(context.Background())
			in.removeGroup()
		}()
	}
	ports := map[string]string{}
	for _, p := range r.App.Ports {
		addr, err := in.forward(proc.Pid(), p.Port)
		if err != nil {
			return Handle{}, err
		}
		ports[PortKey(p.Port, p.Proto)] = addr
	}
	in.proc, in.ports = proc, ports
	return in.handle(d.Name()), nil
}

// Exec implements Driver: argv runs as the app does, in its namespaces
// (mount, network, IPC, PID), chrooted into the instance's clone, as root
// without capabilities (engine.StartIn), with the app's environment.
func (d *Host) Exec(ctx context.Context, h Handle, e Exec) (runtime.ExecResult, error) {
	if len(e.Argv) == 0 {
		return runtime.ExecResult{}, fmt.Errorf("exec in host instance %s: no command: %w", h.Ref, spec.ErrInvalidSpec)
	}
	if e.User != "" {
		return runtime.ExecResult{}, fmt.Errorf("exec in host instance %s as %q: %w: the host driver runs apps as root", h.Ref, e.User, spec.ErrInvalidSpec)
	}
	in, err := d.inst(h)
	if err != nil {
		return runtime.ExecResult{}, err
	}
	in.mu.Lock()
	proc, run := in.proc, in.run
	in.mu.Unlock()
	if proc == nil {
		return runtime.ExecResult{}, fmt.Errorf("host instance %s: %w (not started)", h.Ref, spec.ErrNotFound)
	}
	var out bytes.Buffer
	cmd := &exec.Cmd{Args: e.Argv, Stdout: &out, Stderr: &out,
		Env: append(appEnv(append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"},
			run.ImageEnv...), run.App.Environment), e.Env...)}
	if err := engine.StartIn(proc.Pid(), cmd); err != nil {
		return runtime.ExecResult{}, fmt.Errorf("exec in host instance %s: %w", h.Ref, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = cmd.Process.Kill() })
	err = cmd.Wait()
	stop()
	res := runtime.ExecResult{Output: out.String()}
	if len(res.Output) > runtime.MaxExecOutput {
		res.Output = res.Output[:runtime.MaxExecOutput]
	}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee) && ctx.Err() == nil:
		res.ExitCode = ee.ExitCode()
	case err != nil:
		return res, fmt.Errorf("exec in host instance %s: %w", h.Ref, err)
	}
	return res, nil
}

// forward listens on 127.0.0.1:0 and copies each connection to port in
// the app's network namespace.
func (in *hostInst) forward(pid, port int) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("publish port %d: %w", port, err)
	}
	in.proxies = append(in.proxies, ln)
	dial := engine.NetNSDialer(pid)
	target := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	in.wg.Add(1)
	go func() {
		defer in.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := dial(context.Background(), "tcp", target)
				if err != nil {
					return
				}
				defer u.Close()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(u, c); closeWrite(u); done <- struct{}{} }()
				go func() { _, _ = io.Copy(c, u); closeWrite(c); done <- struct{}{} }()
				<-done
				<-done
			}()
		}
	}()
	return ln.Addr().String(), nil
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

func (in *hostInst) close() {
	for _, l := range in.proxies {
		_ = l.Close()
	}
	in.wg.Wait()
}

func (d *Host) inst(h Handle) (*hostInst, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	in, ok := d.insts[h.Ref]
	if !ok {
		return nil, fmt.Errorf("host instance %s: %w (host instances end with the process that started them)", h.Ref, spec.ErrNotFound)
	}
	return in, nil
}

// started returns the instance's process, nil while it is only created.
func (in *hostInst) started() engine.Process {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.proc
}

// Checkpoint implements Driver.
func (d *Host) Checkpoint(ctx context.Context, h Handle) (Checkpointed, error) {
	in, err := d.inst(h)
	if err != nil {
		return Checkpointed{}, fmt.Errorf("%w: %w", ErrCheckpoint, err)
	}
	proc := in.started()
	if proc == nil {
		return Checkpointed{}, fmt.Errorf("%w: host instance %s is created but not started", ErrCheckpoint, h.Ref)
	}
	if delay := time.Duration(in.run.App.CheckpointDelay); delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return Checkpointed{}, fmt.Errorf("%w: %w", ErrCheckpoint, ctx.Err())
		}
	}
	gen := in.handle(d.Name()).Gen
	img, err := in.eng.Checkpoint(ctx, proc, GenDir(in.run.CkptPath, gen))
	if err != nil {
		return Checkpointed{}, fmt.Errorf("%w: %w", ErrCheckpoint, err)
	}
	return Checkpointed{Gen: gen, Bytes: img.Bytes, MS: float64(img.Write.Microseconds()) / 1000, EngineVersion: img.Version}, nil
}

// Running implements Driver.
func (d *Host) Running(ctx context.Context, h Handle) (bool, error) {
	in, err := d.inst(h)
	if err != nil {
		return false, nil
	}
	proc := in.started()
	if proc == nil {
		return false, nil
	}
	wctx, cancel := context.WithTimeout(ctx, time.Millisecond)
	defer cancel()
	_, werr := proc.Wait(wctx)
	return errors.Is(werr, context.DeadlineExceeded), nil
}

// Logs implements Driver.
func (d *Host) Logs(_ context.Context, h Handle, n int) ([]string, error) {
	in, err := d.inst(h)
	if err != nil {
		return nil, err
	}
	return in.tail.Last(n), nil
}

// NetPid implements Driver.
func (d *Host) NetPid(_ context.Context, h Handle) (int, error) {
	in, err := d.inst(h)
	if err != nil {
		return 0, err
	}
	if proc := in.started(); proc != nil {
		return proc.Pid(), nil
	}
	return 0, nil
}

// Remove implements Driver: it stops the app if it was started, closes
// its port forwarders and forgets the instance.
func (d *Host) Remove(ctx context.Context, h Handle) error {
	d.mu.Lock()
	in, ok := d.insts[h.Ref]
	delete(d.insts, h.Ref)
	d.mu.Unlock()
	if !ok {
		return nil
	}
	// Waits for a Start under way.
	in.mu.Lock()
	defer in.mu.Unlock()
	in.removed = true
	if in.proc == nil {
		return nil
	}
	in.close()
	if sig, ok := hostStopSignals[in.run.App.StopSignal]; ok {
		// The engine's Stop sends SIGTERM; the app's own stop signal goes
		// first, and Stop then finds it exiting.
		_ = in.proc.Signal(sig)
	}
	err := in.proc.Stop(ctx)
	if errors.Is(err, engine.ErrExited) {
		err = nil
	}
	in.removeGroup()
	return err
}

// hostStopSignals are the stop signals other than SIGTERM.
var hostStopSignals = map[string]os.Signal{"SIGINT": syscall.SIGINT, "SIGQUIT": syscall.SIGQUIT, "SIGHUP": syscall.SIGHUP}

// GenDir is the directory of checkpoint generation gen in the checkpoint
// volume ckpt.
func GenDir(ckpt string, gen int) string { return filepath.Join(ckpt, strconv.Itoa(gen)) }

// OutputContains reports whether any line holds phrase.
func OutputContains(lines []string, phrase string) bool {
	for _, l := range lines {
		if strings.Contains(l, phrase) {
			return true
		}
	}
	return false
}
