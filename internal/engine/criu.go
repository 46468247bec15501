package engine

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/hint"
)

// CRIU runs apps as plain processes and checkpoints them with CRIU
// (criu dump / criu restore). Images are about ten times smaller than
// DMTCP's and restore is faster, but the kernel must support it (criu check)
// and a restore needs the app's original PIDs free, so every restore gets a
// fresh PID namespace.
//
// A restored app is made a child of the engine: criu joins the new PID
// namespace (whose init is a placeholder that mounts its /proc) and restores
// with --restore-detached --restore-sibling, so Wait returns the app's own
// exit status (criu's would always be 0).
//
// Implements: criu check; criu dump --tcp-established --file-locks;
// criu restore -d -S --tcp-established --file-locks --inherit-fd
// (--tcp-close instead of --tcp-established with Config.TCPClose).
type CRIU struct {
	cfg Config

	mu    sync.Mutex
	info  *Info
	tools map[string]string // sh, mount, sleep
}

var _ Engine = (*CRIU)(nil)

// NewCRIU returns the CRIU engine.
func NewCRIU(cfg Config) *CRIU {
	return &CRIU{cfg: cfg.withDefaults()}
}

// Name implements Engine.
func (c *CRIU) Name() Name { return NameCRIU }

// Check implements Engine: it finds criu (Config.Prefix,
// $FOGDEPLOY_CRIU_PREFIX, /opt/criu, PATH), reads its version and runs
// criu check.
func (c *CRIU) Check(ctx context.Context) (Info, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.info != nil {
		return *c.info, nil
	}
	if err := c.cfg.Validate(); err != nil {
		return Info{}, err
	}
	if err := needRoot(NameCRIU); err != nil {
		return Info{}, err
	}
	prefix, bins, err := locate(c.cfg.Prefix, EnvCRIUPrefix, DefaultCRIUPrefix, []string{"criu"})
	if err != nil {
		return Info{}, hint.With(err, "build CRIU 4.x outside the repo (make criu && make install-criu PREFIX=/opt/criu) or set "+EnvCRIUPrefix)
	}
	tools := map[string]string{}
	for _, t := range []string{"sh", "mount", "sleep"} {
		p, err := exec.LookPath(t)
		if err != nil {
			return Info{}, fmt.Errorf("criu engine needs %s on PATH: %w", t, ErrUnavailable)
		}
		tools[t] = p
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	criu := bins["criu"]
	out, err := exec.CommandContext(ctx, criu, "--version").CombinedOutput()
	if err != nil {
		return Info{}, fmt.Errorf("%s --version: %w (%w): %s", criu, ErrUnavailable, err, lastLine(out))
	}
	version := ""
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "Version:"); ok {
			version = strings.TrimSpace(v)
		}
	}
	out, err = exec.CommandContext(ctx, criu, "check").CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("Looks good")) {
		return Info{}, hint.With(fmt.Errorf("%s check failed: %w: %s", criu, ErrUnavailable, strings.TrimSpace(string(out))),
			"this kernel or criu build cannot checkpoint here (Debian's criu 3.17 fails on new kernels; use CRIU 4.x)")
	}
	info := Info{Name: NameCRIU, Version: version, Prefix: prefix, Binaries: bins}
	c.info, c.tools = &info, tools
	c.cfg.Logger.Debug("criu found", "prefix", prefix, "version", version)
	return info, nil
}

// launchPIDBase is the PID after which an app launched in its own PID
// namespace gets its PIDs: above those that a restore's own processes take
// in the restore's namespace (criu restore runs in there), which needs the
// app's PIDs free.
const launchPIDBase = 1000

// criuProc is the CRIU side of a process.
type criuProc struct {
	*process
	init *exec.Cmd // the PID namespace's placeholder init (restored processes, and launched ones in a root)
	// lazy is the page server of a lazy restore (`criu lazy-pages`); it
	// exits once every page is in the app.
	lazy *lazyPages
	// dumping is held while criu dump runs: criu dump kills the app before
	// it has finished, and the teardown that follows must not kill the PID
	// namespace (and criu in it) under it.
	dumping sync.Mutex
}

// Launch implements Engine: the app is started directly (setsid, stdin
// /dev/null, stdout and stderr pipes the engine owns), in its sandbox when
// Root or NetNS is set, and in a PID namespace of its own under a
// placeholder init (as a restored app) when Root is.
func (c *CRIU) Launch(ctx context.Context, spec LaunchSpec) (_ Process, err error) {
	log := c.cfg.Logger.With("engine", NameCRIU, "phase", "launch")
	if err := validateLaunch(spec, NameCRIU); err != nil {
		return nil, err
	}
	if _, err := c.Check(ctx); err != nil {
		return nil, err
	}
	start := time.Now() // Check is cached after the first call
	env := appEnv(spec)
	path, err := resolveArgv0(spec.Root, spec.Argv[0], env)
	if err != nil {
		return nil, fmt.Errorf("launch %s: %w", spec.Argv[0], err)
	}
	inst, err := os.MkdirTemp(c.cfg.TempDir, "fogdeploy-criu-")
	if err != nil {
		return nil, fmt.Errorf("instance directory: %w", err)
	}
	p := &criuProc{process: &process{engine: NameCRIU, log: log, stopDur: c.cfg.StopTimeout, inst: inst,
		argv: spec.Argv, root: spec.Root}}
	defer func() {
		if err != nil {
			p.abort()
		}
	}()
	if p.sb, err = newSandbox(sandboxSpec{mountNS: spec.Root != "", netNS: spec.NetNS, root: spec.Root,
		confine: c.cfg.Confine && spec.Root != "", privateDev: c.cfg.PrivateDev}); err != nil {
		return nil, fmt.Errorf("launch %s: sandbox: %w", spec.Argv[0], err)
	}
	if spec.Root != "" {
		// In a root, the app runs in a PID namespace of its own, as a
		// restored one does: it sees nothing of its supervisor.
		if err = c.startInit(ctx, p, launchPIDBase); err != nil {
			return nil, fmt.Errorf("launch %s: %w (%w)", spec.Argv[0], ErrLaunch, err)
		}
	}
	if p.out, err = newOutput(spec.Stdout, spec.Stderr); err != nil {
		return nil, err
	}
	dir := spec.Dir
	if dir == "" {
		dir = "/"
	}
	cmd := &exec.Cmd{
		Path:        path,
		Args:        spec.Argv,
		Env:         env,
		Dir:         dir,
		Stdout:      p.out.stdout(),
		Stderr:      p.out.stderr(),
		ExtraFiles:  closeInherited(nil),
		SysProcAttr: &syscall.SysProcAttr{Setsid: true, Chroot: spec.Root},
	}
	if err = p.sb.doConfined(cmd.Start); err != nil {
		return nil, WithOutput(fmt.Errorf("launch %s: %w (%w)", spec.Argv[0], ErrLaunch, err), "the app", p.out.last(10))
	}
	p.out.started()
	p.pid = cmd.Process.Pid
	p.wait = func() (*os.ProcessState, error) { err := cmd.Wait(); return cmd.ProcessState, ignoreExitError(err) }
	p.kill = func() { _ = cmd.Process.Kill() }
	if p.init != nil {
		p.teardown = p.endNamespace(p.init, nil)
	}
	p.supervise()
	p.timings.Launch = time.Since(start)
	log.Info("launched", "app", spec.Argv[0], "pid", p.pid, "root", spec.Root, "netns", spec.NetNS,
		"ms", p.timings.Launch.Milliseconds())
	return p, nil
}

// endNamespace returns the teardown of an app in its PID namespace: once a
// running criu dump has finished, the init is killed (its death kills
// whatever else is left in the namespace), then the page server of a lazy
// restore is stopped.
func (p *criuProc) endNamespace(init *exec.Cmd, lazy *lazyPages) func() {
	return func() {
		p.dumping.Lock()
		defer p.dumping.Unlock()
		_ = init.Process.Kill()
		_ = init.Wait()
		lazy.stop()
	}
}

// abort undoes a failed Launch or Restore.
func (p *criuProc) abort() {
	if p.done != nil {
		p.kill()
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			p.log.Error("process did not go away after a failed start", "pid", p.Pid())
		}
		return
	}
	if p.init != nil && p.init.Process != nil {
		reapRestored(p.init.Process.Pid)
		_ = p.init.Process.Kill()
		_ = p.init.Wait()
	}
	p.lazy.stop()
	if p.out != nil {
		p.out.started()
		p.out.finish(time.Second)
	}
	p.sb.close()
	os.RemoveAll(p.inst)
}

// logTail returns the last error lines of a criu log in the instance dir.
func logTail(path string, n int) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var errs, all []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		all = append(all, l)
		if strings.Contains(l, "Error") && !strings.Contains(l, "RLIMIT_NOFILE") {
			errs = append(errs, l)
		}
	}
	if len(errs) == 0 {
		errs = all
	}
	if len(errs) > n {
		errs = errs[len(errs)-n:]
	}
	return errs
}

// Checkpoint implements Engine: criu dump -t PID -D dir --tcp-established
// --skip-in-flight --file-locks, run inside the app's mount, network and
// PID namespaces (criu sees them as its own and dumps none of them) but
// not its IPC namespace, which criu dumps with its System V objects; the
// files of the app's /dev/shm go with the image (saveShm). criu kills the
// app once the image is written.
func (c *CRIU) Checkpoint(ctx context.Context, proc Process, dir string) (img Image, err error) {
	p, ok := proc.(*criuProc)
	if !ok {
		return Image{}, fmt.Errorf("checkpoint: %T is not a CRIU process: %w", proc, ErrInvalid)
	}
	run, err := p.startCheckpoint(ctx, c, dir, c.cfg.Timeout)
	if err != nil {
		return Image{}, err
	}
	defer run.done()
	ctx, dir, log, info := run.ctx, run.dir, run.log, run.info
	pid := p.Pid()
	stdio := pipedStdio(pid)
	write, err := c.dump(ctx, p, info, dir)
	if err != nil {
		// criu resumes the app when a dump fails; drop the partial image.
		clearDir(dir)
		return Image{}, err
	}
	p.reap(ctx)
	img = Image{Engine: NameCRIU, Version: info.Version, Dir: dir, Root: p.root, Argv: p.argv,
		Created: time.Now(), Write: write, Generation: p.gen + 1, Stdio: stdio}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return Image{}, err
	}
	for _, e := range ents {
		if e.Type().IsRegular() && strings.HasSuffix(e.Name(), ".img") {
			img.Files = append(img.Files, e.Name())
		}
	}
	if len(img.Files) == 0 {
		clearDir(dir)
		return Image{}, fmt.Errorf("checkpoint into %s: criu wrote no .img files: %w", dir, ErrCheckpoint)
	}
	if img, err = sealImage(log, img); err != nil {
		clearDir(dir)
	}
	return img, err
}

// pipedStdio are the app's standard streams that are pipes, by fd, which a
// restore must give it again.
func pipedStdio(pid int) map[int]string {
	stdio := map[int]string{}
	for fd := 0; fd <= 2; fd++ {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, fd)); err == nil && strings.HasPrefix(l, "pipe:") {
			stdio[fd] = l
		}
	}
	return stdio
}

// dump runs `criu dump` of p into dir, in p's sandbox, and returns how
// long it took. criu kills the app once its image is written.
func (c *CRIU) dump(ctx context.Context, p *criuProc, info Info, dir string) (time.Duration, error) {
	pid := p.Pid()
	// The PID criu must use is the app's PID in its own namespace.
	target := pid
	if ns, err := procStatus(pid, "NSpid"); err == nil {
		if f := strings.Fields(ns); len(f) > 0 {
			target, _ = strconv.Atoi(f[len(f)-1])
		}
	}
	// A lazily restored app is dumped once every page is in: the parasite
	// would read the pages still missing through the page server, which a
	// dump's end may stop halfway.
	if err := p.lazy.wait(ctx); err != nil {
		return 0, fmt.Errorf("checkpoint pid %d: %w", pid, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return 0, err
	}
	defer d.Close()
	logName := "dump-" + strconv.FormatInt(time.Now().UnixNano(), 36) + ".log"
	var out bytes.Buffer
	// --skip-in-flight: a connection a client opened that the app has not
	// accepted yet is dropped (the client connects again) rather than
	// failing the dump of an app under load ("In-flight connection").
	cmd := exec.CommandContext(ctx, info.Binaries["criu"], "dump", "-t", strconv.Itoa(target),
		"-D", "/proc/self/fd/3", "--work-dir", p.inst, "-o", logName,
		c.tcpFlag(), "--skip-in-flight", "--file-locks", c.cgroupFlag())
	cmd.ExtraFiles = []*os.File{d}
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = time.Second
	start := time.Now()
	// Run by the app's own real user (effective root, with every
	// capability), criu dump may read the resource limits of an app that
	// runs as a user without CAP_SYS_RESOURCE, which a container rarely has.
	ruid, rgid := procRealIDs(pid)
	p.dumping.Lock()
	if err = p.sb.doAlone(func() error {
		if err := takeRealIDs(ruid, rgid); err != nil {
			return err
		}
		return cmd.Start()
	}); err == nil {
		err = cmd.Wait()
	}
	if err == nil {
		// While the dump holds the sandbox open (the app is gone).
		if _, serr := saveShm(p.sb, p.root, dir); serr != nil {
			p.dumping.Unlock()
			return 0, fmt.Errorf("checkpoint pid %d into %s: %w (%w)", pid, dir, ErrCheckpoint, serr)
		}
	}
	p.dumping.Unlock()
	if err != nil {
		err = fmt.Errorf("checkpoint pid %d into %s: criu dump: %w (%w)", pid, dir, ErrCheckpoint, err)
		return 0, WithOutput(WithOutput(err, "criu", strings.Split(strings.TrimSpace(out.String()), "\n")),
			"criu dump log", logTail(filepath.Join(p.inst, logName), 10))
	}
	return time.Since(start), nil
}

// cgroupFlag is how criu handles the app's cgroups: a confining engine's
// caller puts each instance in a cgroup of its own after the start
// (drivers.Host.Groups), so criu neither dumps nor restores them (a
// restore would make the group of the instance dumped again, and leave
// it); otherwise as criu does by default (soft).
func (c *CRIU) cgroupFlag() string {
	if c.cfg.Confine {
		return "--manage-cgroups=ignore"
	}
	return "--manage-cgroups=soft"
}

// tcpFlag is how criu handles established TCP connections (Config.TCPClose).
func (c *CRIU) tcpFlag() string {
	if c.cfg.TCPClose {
		return "--tcp-close"
	}
	return "--tcp-established"
}

// Restore implements Engine: a sandbox with a fresh PID namespace (and
// network namespace with NetNS), then criu restore -d -S from inside it.
func (c *CRIU) Restore(ctx context.Context, img Image, spec RestoreSpec) (_ Process, err error) {
	start := time.Now()
	log := c.cfg.Logger.With("engine", NameCRIU, "phase", "restore", "image", img.Dir)
	if err := img.check(NameCRIU); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	if err := checkRestoreRoot(img, spec); err != nil {
		return nil, err
	}
	info, err := c.Check(ctx)
	if err != nil {
		return nil, err
	}
	imgDir, err := filepath.Abs(img.Dir)
	if err != nil {
		return nil, err
	}
	// An image whose memory pages are on a remote page server (a
	// migration's source) is restored lazily, from that server.
	remote, err := remotePages(imgDir, spec.Lazy)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", img.Dir, err)
	}
	defer func() {
		if remote != nil {
			remote.Close() // the page server holds its own copy
		}
	}()
	inst, err := os.MkdirTemp(c.cfg.TempDir, "fogdeploy-criu-")
	if err != nil {
		return nil, fmt.Errorf("instance directory: %w", err)
	}
	p := &criuProc{process: &process{engine: NameCRIU, log: log, stopDur: c.cfg.StopTimeout, inst: inst,
		gen: img.Generation, argv: img.Argv, root: img.Root}}
	defer func() {
		if err != nil {
			p.abort()
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	if p.sb, err = newSandbox(sandboxSpec{mountNS: true, netNS: spec.NetNS, root: img.Root, rootSrc: spec.Root,
		confine: c.cfg.Confine, privateDev: c.cfg.PrivateDev}); err != nil {
		return nil, fmt.Errorf("restore %s: sandbox: %w (%w)", img.Dir, ErrRestore, err)
	}
	if err = c.startInit(ctx, p, 0); err != nil {
		return nil, fmt.Errorf("restore %s: %w (%w)", img.Dir, ErrRestore, err)
	}
	if err = restoreShm(p.sb, img.Root, imgDir); err != nil {
		return nil, fmt.Errorf("restore %s: %w (%w)", img.Dir, ErrRestore, err)
	}
	if p.out, err = newOutput(spec.Stdout, spec.Stderr); err != nil {
		return nil, err
	}
	d, err := os.Open(imgDir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	extra, args := c.restoreArgs(img, inst, d, p.out)
	if spec.Lazy {
		// Its failure ends the PID namespace, and so the whole app.
		init := p.init.Process
		if p.lazy, err = startLazyPages(ctx, info.Binaries["criu"], imgDir, inst, remote, log, func() { _ = init.Kill() }); err != nil {
			return nil, fmt.Errorf("restore %s: %w (%w)", img.Dir, ErrRestore, err)
		}
		args = append(args, "--lazy-pages")
	}
	if err = runRestore(ctx, p, info.Binaries["criu"], args, extra); err != nil {
		return nil, fmt.Errorf("restore %s: %w", img.Dir, err)
	}
	app, err := restoredChild(p.init.Process.Pid)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w (%w)", img.Dir, ErrRestore, err)
	}
	p.pid = app.Pid
	p.wait = func() (*os.ProcessState, error) { return app.Wait() }
	p.kill = func() { _ = app.Kill() }
	p.teardown = p.endNamespace(p.init, p.lazy)
	p.supervise()
	p.timings.Restore = time.Since(start)
	log.Info("restored", "pid", p.pid, "root", spec.Root, "netns", spec.NetNS, "lazy", spec.Lazy, "remote_pages", remote != nil, "ms", p.timings.Restore.Milliseconds())
	return p, nil
}

// runRestore runs criu restore with args in p's sandbox, and says why it
// failed with criu's output and the last errors of its log.
func runRestore(ctx context.Context, p *criuProc, criu string, args []string, extra []*os.File) error {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, criu, args...)
	cmd.ExtraFiles = extra
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = time.Second
	err := p.sb.do(cmd.Start)
	if err == nil {
		err = cmd.Wait()
	}
	p.out.started()
	if err != nil {
		err = fmt.Errorf("criu restore: %w (%w)", ErrRestore, err)
		return WithOutput(WithOutput(err, "criu", strings.Split(strings.TrimSpace(out.String()), "\n")),
			"criu restore log", logTail(filepath.Join(p.inst, "restore.log"), 10))
	}
	return nil
}

// startInit starts the placeholder init of the app's PID namespace
// (pidInit) and records it; later steps enter its namespace.
func (c *CRIU) startInit(ctx context.Context, p *criuProc, lastPID int) error {
	init, err := p.sb.startPIDInit(ctx, pidInit{sh: c.tools["sh"], root: p.root, lastPID: lastPID})
	if err != nil {
		return err
	}
	p.init = init
	return nil
}
