package deploy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/engine"
)

// Host runs instances as supervised processes of this process, under the
// engines of package engine: each app chrooted into its environment clone,
// in private mount, PID and network namespaces. Each published port is a
// listener on 127.0.0.1 that forwards into the app's network namespace.
// It is the driver of the CRIU engine (CRIU needs more privilege than the
// DMTCP container has). Instances end with the process that started them.
type Host struct {
	// Engines by name (engine.NameDMTCP, engine.NameCRIU).
	Engines map[string]engine.Engine
	// LogLines is how many output lines each instance keeps (default 200).
	LogLines int

	mu    sync.Mutex
	insts map[string]*hostInst
}

var _ Driver = (*Host)(nil)

type hostInst struct {
	eng     engine.Engine
	proc    engine.Process
	tail    *engine.LogTail
	proxies []net.Listener
	ckpt    string
	gen     int
	delay   time.Duration // the app's checkpoint_delay
	stopSig string        // the app's stop_signal
	wg      sync.WaitGroup
}

// NewHost returns a Host driver over engines.
func NewHost(engines ...engine.Engine) *Host {
	h := &Host{Engines: map[string]engine.Engine{}, insts: map[string]*hostInst{}}
	for _, e := range engines {
		h.Engines[e.Name()] = e
	}
	return h
}

// Name implements Driver.
func (d *Host) Name() string { return "host" }

// Check implements Driver.
func (d *Host) Check(ctx context.Context, eng string) (string, error) {
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

// Start implements Driver.
func (d *Host) Start(ctx context.Context, r Run) (_ Handle, err error) {
	e, ok := d.Engines[r.App.Engine]
	if !ok {
		return Handle{}, fmt.Errorf("%w: no %s engine configured", ErrDriver, r.App.Engine)
	}
	if r.App.User != "" {
		return Handle{}, fmt.Errorf("%w: user %q: the host driver runs apps as root; run an app that needs a user with the dmtcp engine in the container driver", ErrInvalidSpec, r.App.User)
	}
	n := d.LogLines
	if n <= 0 {
		n = 200
	}
	in := &hostInst{eng: e, tail: engine.NewLogTail(n), ckpt: r.CkptPath, gen: r.Gen, delay: time.Duration(r.App.CheckpointDelay),
		stopSig: r.App.StopSignal}
	switch r.Mode {
	case ModeLaunch:
		env := appEnv(append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}, r.ImageEnv...), r.App.Environment)
		comp := r.App.Compression
		if comp == "none" {
			comp = ""
		}
		in.proc, err = e.Launch(ctx, engine.LaunchSpec{Argv: r.App.Command, Env: env, Dir: firstNonEmpty(r.App.WorkDir, r.WorkDir),
			Root: r.EnvPath, Stdout: in.tail, Stderr: in.tail, NetNS: true, Compression: comp})
	case ModeRestart:
		var img engine.Image
		img, err = engine.ReadImage(genDir(r.CkptPath, r.Gen))
		if err != nil {
			return Handle{}, err
		}
		in.gen = r.Gen + 1
		if img.Root != "" {
			// CRIU restores at the root's path of checkpoint time; the
			// engine binds this instance's root over it in the app's mount
			// namespace, which needs the directory on this node.
			if err := os.MkdirAll(img.Root, 0o755); err != nil {
				return Handle{}, err
			}
		}
		in.proc, err = e.Restore(ctx, img, engine.RestoreSpec{Root: r.EnvPath, Stdout: in.tail, Stderr: in.tail, NetNS: true})
	default:
		return Handle{}, fmt.Errorf("%w: mode %q", ErrInvalidSpec, r.Mode)
	}
	if err != nil {
		return Handle{}, err
	}
	defer func() {
		if err != nil {
			in.close()
			_ = in.proc.Stop(context.WithoutCancel(ctx))
		}
	}()
	h := Handle{Driver: d.Name(), Ref: strconv.Itoa(in.proc.Pid()), Ports: map[string]string{}, Gen: in.gen,
		EnvPath: r.EnvPath, CkptPath: r.CkptPath}
	for _, p := range r.App.Ports {
		if p.Proto == "udp" {
			return Handle{}, fmt.Errorf("%w: the host driver publishes tcp ports only (port %d/udp)", ErrInvalidSpec, p.Port)
		}
		addr, err := in.forward(in.proc.Pid(), p.Port)
		if err != nil {
			return Handle{}, err
		}
		h.Ports[PortKey(p.Port, p.Proto)] = addr
	}
	d.mu.Lock()
	if d.insts == nil {
		d.insts = map[string]*hostInst{}
	}
	d.insts[h.Ref] = in
	d.mu.Unlock()
	return h, nil
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
		return nil, fmt.Errorf("host instance %s: %w (host instances end with the process that started them)", h.Ref, ErrNotFound)
	}
	return in, nil
}

// Checkpoint implements Driver.
func (d *Host) Checkpoint(ctx context.Context, h Handle) (Checkpointed, error) {
	in, err := d.inst(h)
	if err != nil {
		return Checkpointed{}, fmt.Errorf("%w: %w", ErrCheckpoint, err)
	}
	if in.delay > 0 {
		select {
		case <-time.After(in.delay):
		case <-ctx.Done():
			return Checkpointed{}, fmt.Errorf("%w: %w", ErrCheckpoint, ctx.Err())
		}
	}
	img, err := in.eng.Checkpoint(ctx, in.proc, genDir(in.ckpt, in.gen))
	if err != nil {
		return Checkpointed{}, fmt.Errorf("%w: %w", ErrCheckpoint, err)
	}
	return Checkpointed{Gen: in.gen, Bytes: img.Bytes, MS: float64(img.Write.Microseconds()) / 1000, EngineVersion: img.Version}, nil
}

// Running implements Driver.
func (d *Host) Running(ctx context.Context, h Handle) (bool, error) {
	in, err := d.inst(h)
	if err != nil {
		return false, nil
	}
	wctx, cancel := context.WithTimeout(ctx, time.Millisecond)
	defer cancel()
	_, werr := in.proc.Wait(wctx)
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
	return in.proc.Pid(), nil
}

// Remove implements Driver.
func (d *Host) Remove(ctx context.Context, h Handle) error {
	d.mu.Lock()
	in, ok := d.insts[h.Ref]
	delete(d.insts, h.Ref)
	d.mu.Unlock()
	if !ok {
		return nil
	}
	in.close()
	if sig, ok := hostStopSignals[in.stopSig]; ok {
		// The engine's Stop sends SIGTERM; the app's own stop signal goes
		// first, and Stop then finds it exiting.
		_ = in.proc.Signal(sig)
	}
	err := in.proc.Stop(ctx)
	if errors.Is(err, engine.ErrExited) {
		err = nil
	}
	return err
}

// hostStopSignals are the stop signals other than SIGTERM.
var hostStopSignals = map[string]os.Signal{"SIGINT": syscall.SIGINT, "SIGQUIT": syscall.SIGQUIT, "SIGHUP": syscall.SIGHUP}

func genDir(ckpt string, gen int) string { return filepath.Join(ckpt, strconv.Itoa(gen)) }

// outputContains reports whether any line holds phrase.
func outputContains(lines []string, phrase string) bool {
	for _, l := range lines {
		if strings.Contains(l, phrase) {
			return true
		}
	}
	return false
}
