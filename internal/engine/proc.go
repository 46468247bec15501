package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/hint"
)

// output carries an app's stdout and stderr through pipes the engine owns,
// to the caller's writers and to a LogTail used in error messages. Owning
// the pipes lets CRIU reconnect them at restore (--inherit-fd) and keeps a
// forking dmtcp_restart from blocking Wait.
type output struct {
	outR, outW *os.File
	errR, errW *os.File // nil when stdout and stderr share one pipe
	tail       *LogTail
	wg         sync.WaitGroup
}

func newOutput(stdout, stderr io.Writer) (*output, error) {
	o := &output{tail: NewLogTail(40)}
	var err error
	if o.outR, o.outW, err = os.Pipe(); err != nil {
		return nil, err
	}
	shared := sameWriter(stdout, stderr)
	if !shared {
		if o.errR, o.errW, err = os.Pipe(); err != nil {
			o.outR.Close()
			o.outW.Close()
			return nil, err
		}
	}
	o.copy(o.outR, stdout)
	if !shared {
		o.copy(o.errR, stderr)
	}
	return o, nil
}

func (o *output) copy(r *os.File, w io.Writer) {
	dst := io.Writer(o.tail)
	if w != nil {
		dst = io.MultiWriter(w, o.tail)
	}
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		_, _ = io.Copy(dst, r)
	}()
}

// sameWriter reports whether a and b are the same writer (os/exec's rule).
func sameWriter(a, b io.Writer) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a == b
}

// stdout and stderr are the child's ends.
func (o *output) stdout() *os.File { return o.outW }
func (o *output) stderr() *os.File {
	if o.errW != nil {
		return o.errW
	}
	return o.outW
}

// started closes our copies of the child's ends, so EOF comes when the app
// exits.
func (o *output) started() {
	o.outW.Close()
	if o.errW != nil {
		o.errW.Close()
	}
}

// finish waits up to d for the copies to end, then cuts them off (a
// grandchild may still hold a pipe).
func (o *output) finish(d time.Duration) {
	done := make(chan struct{})
	go func() { o.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
	}
	o.outR.Close()
	if o.errR != nil {
		o.errR.Close()
	}
	<-done
}

// last returns the last n lines the app printed.
func (o *output) last(n int) []string { return o.tail.Last(n) }

// process is the supervised Process both engines return.
type process struct {
	engine  Name
	log     *slog.Logger
	timings Timings
	stopDur time.Duration
	gen     int      // generation of the image it was restored from; 0 if launched
	argv    []string // original command line
	root    string   // the root it runs in ("" = host)

	mu  sync.Mutex
	pid int // the app, as seen on the host

	sb   *sandbox
	out  *output
	inst string // per-instance state directory, removed at the end

	// wait blocks until the app is gone and returns its status; kill ends
	// the app and whatever keeps it alive; teardown runs after wait, before
	// the namespaces are closed.
	wait     func() (*os.ProcessState, error)
	kill     func()
	teardown func()

	done chan struct{}
	code int
	err  error

	checkpointing sync.Mutex // one Checkpoint at a time
}

// supervise starts the reaper: once p.wait returns, it tears everything
// down and then releases Wait.
func (p *process) supervise() {
	p.done = make(chan struct{})
	go func() {
		ps, err := p.wait()
		switch {
		case ps != nil:
			p.code = exitCode(ps)
		case err != nil:
			p.code, p.err = -1, err
		}
		if p.teardown != nil {
			p.teardown()
		}
		if p.out != nil {
			p.out.finish(2 * time.Second)
		}
		p.sb.close()
		if p.inst != "" {
			if err := removeAllSettled(p.inst); err != nil {
				p.log.Warn("remove instance directory", "dir", p.inst, "err", err)
			}
		}
		p.log.Debug("process gone", "pid", p.Pid(), "code", p.code)
		close(p.done)
	}()
}

func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// Pid implements Process.
func (p *process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid
}

func (p *process) setPid(pid int) {
	p.mu.Lock()
	p.pid = pid
	p.mu.Unlock()
}

// Timings implements Process.
func (p *process) Timings() Timings { return p.timings }

// Wait implements Process.
func (p *process) Wait(ctx context.Context) (int, error) {
	select {
	case <-p.done:
		return p.code, p.err
	case <-ctx.Done():
		return -1, ctx.Err()
	}
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Signal implements Process.
func (p *process) Signal(sig os.Signal) error {
	if p.exited() {
		return fmt.Errorf("signal pid %d: %w", p.Pid(), ErrExited)
	}
	s, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Errorf("signal %v: not a syscall.Signal: %w", sig, ErrInvalid)
	}
	if err := syscall.Kill(p.Pid(), s); err != nil {
		return fmt.Errorf("signal pid %d: %w", p.Pid(), err)
	}
	return nil
}

// Stop implements Process.
func (p *process) Stop(ctx context.Context) error {
	if p.exited() {
		return nil
	}
	_ = p.Signal(syscall.SIGTERM)
	grace := time.NewTimer(p.stopDur)
	defer grace.Stop()
	select {
	case <-p.done:
		return nil
	case <-grace.C:
		p.log.Warn("app ignored SIGTERM, killing it", "pid", p.Pid(), "after", p.stopDur)
	case <-ctx.Done():
	}
	p.kill()
	// The kill is final; give the reaper a bounded time even if ctx is done.
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("stop pid %d: still running 10s after SIGKILL", p.Pid())
	}
}

// emptyDir creates dir if needed and fails with ErrInvalid unless it is
// empty.
func emptyDir(dir string) error {
	if dir == "" {
		return fmt.Errorf("checkpoint directory is empty string: %w", ErrInvalid)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("checkpoint directory %s: %w", dir, err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("checkpoint directory %s: %w", dir, err)
	}
	if len(ents) > 0 {
		return hint.With(fmt.Errorf("checkpoint directory %s is not empty (%d entries, e.g. %q): %w",
			dir, len(ents), ents[0].Name(), ErrInvalid),
			"use a fresh empty directory for each checkpoint generation")
	}
	return nil
}

// clearDir removes what a failed checkpoint wrote into dir (which
// emptyDir had found empty).
func clearDir(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		_ = os.RemoveAll(filepath.Join(dir, e.Name()))
	}
}

// pollUntil calls cond every interval until it returns true or an error,
// ctx is done, or stop is closed.
func pollUntil(ctx context.Context, interval time.Duration, stop <-chan struct{}, cond func() (bool, error)) error {
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-stop:
			return ErrExited
		case <-time.After(interval):
		}
	}
}

// closeInherited pads extra (a Cmd's ExtraFiles) with nil entries, which
// close those fds in the child, up to the highest fd this process inherited
// without close-on-exec. Go opens every file close-on-exec, but fds
// inherited from our own parent are passed on to every child; DMTCP warns
// about them and CRIU cannot dump a pipe it does not know.
func closeInherited(extra []*os.File) []*os.File {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return extra
	}
	top := -1
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < 3 || fd < 3+len(extra) {
			continue
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err == nil && flags&unix.FD_CLOEXEC == 0 && fd > top && fd < 4096 {
			top = fd
		}
	}
	for top >= 3+len(extra) {
		extra = append(extra, nil)
	}
	return extra
}

// beginCheckpoint is the start both engines' Checkpoint share: it allows one
// checkpoint at a time, refuses an exited app, and makes dir absolute and
// checks that it is empty. The caller must call unlock when done.
func (p *process) beginCheckpoint(dir string) (abs string, log *slog.Logger, unlock func(), err error) {
	if !p.checkpointing.TryLock() {
		return "", nil, nil, fmt.Errorf("checkpoint pid %d: another checkpoint is running: %w", p.Pid(), ErrInvalid)
	}
	defer func() {
		if err != nil {
			p.checkpointing.Unlock()
		}
	}()
	log = p.log.With("phase", "checkpoint", "pid", p.Pid(), "image", dir)
	if p.exited() {
		return "", nil, nil, fmt.Errorf("checkpoint pid %d: %w", p.Pid(), ErrExited)
	}
	if abs, err = filepath.Abs(dir); err != nil {
		return "", nil, nil, err
	}
	if err := emptyDir(abs); err != nil {
		return "", nil, nil, err
	}
	return abs, log, p.checkpointing.Unlock, nil
}

// removeAllSettled removes dir, retrying for up to a second while a process
// that is still exiting (the engine's last writes: a log, its stats) adds
// to it ("directory not empty").
func removeAllSettled(dir string) error {
	deadline := time.Now().Add(time.Second)
	for {
		err := os.RemoveAll(dir)
		if err == nil || !errors.Is(err, syscall.ENOTEMPTY) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// reap waits until a checkpointed app, which its engine killed once its
// image was written, is gone with what it ran in (so that the image's
// directory is no longer mounted anywhere); past ctx it kills it.
func (p *process) reap(ctx context.Context) {
	if _, err := p.Wait(ctx); err != nil {
		p.kill()
		<-p.done
	}
}

// sealImage writes img's manifest, the end of every engine's checkpoint.
func sealImage(log *slog.Logger, img Image) (Image, error) {
	if err := img.writeManifest(); err != nil {
		return Image{}, fmt.Errorf("checkpoint into %s: manifest: %w (%w)", img.Dir, ErrCheckpoint, err)
	}
	log.Info("checkpoint complete", "files", len(img.Files), "bytes", img.Bytes, "ms", img.Write.Milliseconds(),
		"generation", img.Generation)
	return img, nil
}

// checkpointRun is a checkpoint begun by startCheckpoint.
type checkpointRun struct {
	ctx  context.Context // bounded by the engine's timeout
	dir  string          // the image's directory, absolute
	log  *slog.Logger
	info Info // the engine, as checked
	done func()
}

// startCheckpoint begins a checkpoint of p into dir by engine e: p's
// checkpoint lock taken (one at a time), e checked, and the context bounded
// by timeout. done releases both.
func (p *process) startCheckpoint(ctx context.Context, e Engine, dir string, timeout time.Duration) (checkpointRun, error) {
	dir, log, unlock, err := p.beginCheckpoint(dir)
	if err != nil {
		return checkpointRun{}, err
	}
	info, err := e.Check(ctx)
	if err != nil {
		unlock()
		return checkpointRun{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	return checkpointRun{ctx: ctx, dir: dir, log: log, info: info, done: func() { cancel(); unlock() }}, nil
}

// takeRealIDs sets the real uid and gid of the calling thread alone (a
// raw syscall: Go's own change every thread), keeping its effective and
// saved ids and so its capabilities; the processes it starts inherit them.
// Only for a locked thread that is discarded (sandbox.doAlone). Nothing
// changes for ids of 0.
func takeRealIDs(uid, gid int) error {
	keep := ^uintptr(0) // -1: unchanged
	if gid != 0 {
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESGID, uintptr(gid), keep, keep); e != 0 {
			return fmt.Errorf("set the real gid to %d: %w", gid, e)
		}
	}
	if uid != 0 {
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, uintptr(uid), keep, keep); e != 0 {
			return fmt.Errorf("set the real uid to %d: %w", uid, e)
		}
	}
	return nil
}
