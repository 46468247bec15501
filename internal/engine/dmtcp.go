package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/dmtcpctl"
	"github.com/fogdeploy/fogdeploy/internal/hint"
)

// DMTCP runs apps under DMTCP (dmtcp_launch, dmtcp_restart), the default
// engine. Each Process gets a private dmtcp_coordinator, a child of the
// engine that listens on 127.0.0.1 inside the app's network namespace (the
// listening socket is made by the engine and handed over as fd 821, because
// the coordinator itself always binds 0.0.0.0).
//
// Implements: dmtcp_coordinator --exit-on-last; dmtcp_launch -j;
// dmtcp_command -s / -kc / -q; dmtcp_restart -j.
type DMTCP struct {
	cfg Config

	mu    sync.Mutex
	info  *Info // cached successful Check
	tools dmtcpTools
}

var _ Engine = (*DMTCP)(nil)

// Paths inside a Root, all on the tmpfs the sandbox mounts on /tmp, so the
// environment clone is not written to.
const (
	rootStateDir = "/tmp/.fogdeploy"
	rootCkptDir  = rootStateDir + "/ckpt" // the checkpoint directory is attached here
	rootImgDir   = rootStateDir + "/img"  // the image being restored, read-only
	rootTmpDir   = rootStateDir + "/tmp"  // DMTCP's tmpdir
)

// NewDMTCP returns the DMTCP engine.
func NewDMTCP(cfg Config) *DMTCP {
	return &DMTCP{cfg: cfg.withDefaults()}
}

// Name implements Engine.
func (d *DMTCP) Name() Name { return NameDMTCP }

// Check implements Engine: it finds the binaries (Config.Prefix,
// $FOGDEPLOY_DMTCP_PREFIX, /opt/dmtcp, PATH) and runs dmtcp_launch --version.
func (d *DMTCP) Check(ctx context.Context) (Info, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.info != nil {
		return *d.info, nil
	}
	if err := d.cfg.Validate(); err != nil {
		return Info{}, err
	}
	if err := needRoot(NameDMTCP); err != nil {
		return Info{}, err
	}
	prefix, bins, err := locate(d.cfg.Prefix, EnvDMTCPPrefix, DefaultDMTCPPrefix, dmtcpctl.Binaries)
	if err != nil {
		return Info{}, hint.With(err, "build DMTCP 4.2 outside the repo (./configure --prefix=/opt/dmtcp && make install) or set "+EnvDMTCPPrefix)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bins["dmtcp_launch"], "--version").CombinedOutput()
	if err != nil {
		return Info{}, fmt.Errorf("%s --version: %w (%w): %s", bins["dmtcp_launch"], ErrUnavailable, err, lastLine(out))
	}
	// "dmtcp_launch (DMTCP) 4.2.0"
	first, _, _ := strings.Cut(string(out), "\n")
	f := strings.Fields(first)
	if len(f) == 0 {
		return Info{}, fmt.Errorf("%s --version printed nothing: %w", bins["dmtcp_launch"], ErrUnavailable)
	}
	info := Info{Name: NameDMTCP, Version: f[len(f)-1], Prefix: prefix, Binaries: bins}
	d.info = &info
	d.tools = findDMTCPTools()
	d.cfg.Logger.Debug("dmtcp found", "prefix", prefix, "version", info.Version)
	return info, nil
}

// dmtcpProc is the DMTCP side of a process.
type dmtcpProc struct {
	*process
	init    *exec.Cmd // the PID namespace's placeholder init (in a root)
	coord   *coordinator
	ckptDir string // the checkpoint mount point, as the coordinator sees it
	gzip    bool
}

// Launch implements Engine: a private coordinator, then
// dmtcp_launch -j --ckptdir C --tmpdir T ARGV (which execs into the app, so
// Pid is the app's).
func (d *DMTCP) Launch(ctx context.Context, spec LaunchSpec) (_ Process, err error) {
	log := d.cfg.Logger.With("engine", NameDMTCP, "phase", "launch")
	if err := validateLaunch(spec, NameDMTCP); err != nil {
		return nil, err
	}
	info, err := d.checkInRoot(ctx, spec.Root)
	if err != nil {
		return nil, err
	}
	start := time.Now() // Check is cached after the first call
	env := appEnv(spec)
	if _, err := resolveArgv0(spec.Root, spec.Argv[0], env); err != nil {
		return nil, fmt.Errorf("launch %s: %w", spec.Argv[0], err)
	}
	lay, err := d.newInstance(func(inst string) dmtcpLayout { return d.layout(inst, spec.Root, info.Prefix, "") })
	if err != nil {
		return nil, err
	}
	p := &dmtcpProc{process: &process{engine: NameDMTCP, log: log, stopDur: d.cfg.StopTimeout, inst: lay.inst,
		argv: spec.Argv, root: spec.Root}, ckptDir: lay.nsCkpt}
	defer func() {
		if err != nil {
			p.abort()
		}
	}()
	if err = d.prepare(ctx, p, lay, spec.NetNS, spec.Stdout, spec.Stderr); err != nil {
		return nil, fmt.Errorf("launch %s: %w", spec.Argv[0], err)
	}
	p.gzip = spec.Compression == "gzip"
	run := dmtcpctl.Run{CkptDir: lay.appCkpt, TmpDir: lay.appTmp, Gzip: p.gzip}
	dir := spec.Dir
	if dir == "" {
		dir = "/"
	}
	cmd := &exec.Cmd{
		Path:        info.Binaries["dmtcp_launch"],
		Args:        append([]string{"dmtcp_launch"}, run.LaunchArgs(spec.Argv)...),
		Env:         run.Env(env, p.coord.port),
		Dir:         dir,
		Stdout:      p.out.stdout(),
		Stderr:      p.out.stderr(),
		ExtraFiles:  closeInherited(nil),
		SysProcAttr: &syscall.SysProcAttr{Chroot: spec.Root},
	}
	if p.pid, err = p.startApp(ctx, lay, cmd); err != nil {
		return nil, fmt.Errorf("launch %s: start dmtcp_launch: %w (%w)", spec.Argv[0], ErrLaunch, err)
	}
	p.out.started()
	p.wait = func() (*os.ProcessState, error) { err := cmd.Wait(); return cmd.ProcessState, ignoreExitError(err) }
	p.kill = func() { _ = cmd.Process.Kill(); p.coord.kill(); p.killInit() }
	p.teardown = func() { p.coord.stop(d, p.sb); p.endInit() }
	p.supervise()

	// The app runs once it has joined the coordinator.
	if err = d.waitPeers(ctx, p.process, p.sb, p.coord, 1); err != nil {
		return nil, d.failed(fmt.Errorf("launch %s: %w (%w)", strings.Join(spec.Argv, " "), ErrLaunch, err), p)
	}
	p.timings.Launch = time.Since(start)
	log.Info("launched", "app", spec.Argv[0], "pid", p.pid, "coord_port", p.coord.port, "root", spec.Root,
		"netns", spec.NetNS, "ms", p.timings.Launch.Milliseconds())
	return p, nil
}

func ignoreExitError(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return nil
	}
	return err
}

// abort kills whatever a failed Launch or Restore started and waits for the
// teardown, so that nothing outlives the failed call.
func (p *dmtcpProc) abort() {
	if p.done != nil {
		p.kill()
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			p.log.Error("process did not go away after a failed start", "pid", p.Pid())
		}
		return
	}
	if p.coord != nil {
		p.coord.kill()
		<-p.coord.done
	}
	p.endInit()
	if p.out != nil {
		p.out.started()
		p.out.finish(time.Second)
	}
	p.sb.close()
	os.RemoveAll(p.inst)
}

// restartCmd is dmtcp_restart of img's files, chrooted into root,
// joining p's coordinator.
func restartCmd(info Info, lay dmtcpLayout, img Image, root string, p *dmtcpProc) *exec.Cmd {
	run := dmtcpctl.Run{CkptDir: lay.appCkpt, TmpDir: lay.appTmp, Gzip: p.gzip}
	images := make([]string, len(img.Files))
	for i, f := range img.Files {
		images[i] = filepath.Join(lay.appImg, f) // exact names: no glob
	}
	return &exec.Cmd{
		Path:       info.Binaries["dmtcp_restart"],
		Args:       append([]string{"dmtcp_restart"}, run.RestartArgs(images)...),
		Env:        run.Env([]string{"PATH=" + defaultPath, "HOME=/"}, p.coord.port),
		Dir:        "/",
		Stdout:     p.out.stdout(),
		Stderr:     p.out.stderr(),
		ExtraFiles: closeInherited(nil),
		// Its own process group, so that reapGroup finds the zombies of a
		// double fork.
		SysProcAttr: &syscall.SysProcAttr{Chroot: root, Setpgid: img.Orphan},
	}
}

// checkInRoot checks the engine, and that its prefix can be bound into
// root (a system prefix cannot).
func (d *DMTCP) checkInRoot(ctx context.Context, root string) (Info, error) {
	info, err := d.Check(ctx)
	if err != nil {
		return Info{}, err
	}
	if root != "" && d.tools.err != nil {
		return Info{}, d.tools.err
	}
	if root != "" && isSystemPrefix(info.Prefix) {
		return Info{}, hint.With(fmt.Errorf("dmtcp prefix %s cannot be bound into root %s: %w", info.Prefix, root, ErrUnavailable),
			"install DMTCP under its own prefix, e.g. /opt/dmtcp, and set Config.Prefix")
	}
	return info, nil
}

// waitRestarted waits for a restored app started by cmd (dmtcp_restart,
// which execs into it). If the app's parent was PID 1 at checkpoint time
// (orphan), dmtcp_restart forks and exits: the app, now our child as we
// are a child subreaper (or PID 1), is adopted and waited for instead.
func (d *DMTCP) waitRestarted(p *dmtcpProc, cmd *exec.Cmd, orphan bool, ad *adoption) func() (*os.ProcessState, error) {
	return func() (*os.ProcessState, error) {
		err := cmd.Wait()
		if !orphan || !cmd.ProcessState.Success() {
			ad.finish(nil)
			return cmd.ProcessState, ignoreExitError(err)
		}
		// In a PID namespace of its own, the app is re-parented to its
		// init, not to us: it is watched, not waited for.
		parent := strconv.Itoa(os.Getpid())
		if p.init != nil {
			parent = p.initPid()
		}
		app, aerr := d.adopt(p.process, p.coord, parent)
		reapGroup(cmd.Process.Pid)
		if aerr != nil {
			ad.finish(nil)
			return nil, aerr
		}
		p.setPid(app.Pid)
		ad.finish(app)
		if p.init != nil {
			return nil, waitExit(app.Pid)
		}
		ps, err := app.Wait()
		reapGroup(cmd.Process.Pid)
		return ps, err
	}
}

// failed adds the app's and the coordinator's last output and a hint.
func (d *DMTCP) failed(err error, p *dmtcpProc) error {
	lines := p.out.last(15)
	joined := strings.Join(lines, "\n")
	switch {
	case strings.Contains(joined, "GLIBC_2."):
		err = hint.With(err, "the root's glibc is too old for this DMTCP build (needs 2.34+: bookworm, jammy or newer)")
	case strings.Contains(joined, "Unable to find checkpointed copy of file"):
		err = hint.With(err, "the image was written without LC_ALL=C and cannot move; restore it at its original path")
	case strings.Contains(joined, "mtcp_readfile"):
		err = hint.With(err, "a file in the root is smaller than at checkpoint time; restore on the environment snapshot taken with the image")
	}
	err = WithOutput(err, "the app", lines)
	if p.coord != nil {
		err = WithOutput(err, "dmtcp_coordinator", p.coord.log.Last(8))
	}
	return err
}

// Checkpoint implements Engine: it attaches dir at the app's checkpoint
// directory (inside the sandbox only), runs dmtcp_command -kc (checkpoint,
// then kill), and polls for ckpt_*.dmtcp plus dmtcp_restart_script.sh,
// which the coordinator writes last (dmtcp_command -bc does not block in
// DMTCP 4.2).
func (d *DMTCP) Checkpoint(ctx context.Context, proc Process, dir string) (img Image, err error) {
	p, ok := proc.(*dmtcpProc)
	if !ok {
		return Image{}, fmt.Errorf("checkpoint: %T is not a DMTCP process: %w", proc, ErrInvalid)
	}
	run, err := p.startCheckpoint(ctx, d, dir, d.cfg.Timeout)
	if err != nil {
		return Image{}, err
	}
	defer run.done()
	ctx, dir, log, info := run.ctx, run.dir, run.log, run.info
	st, err := p.coord.status(ctx, p.sb)
	if err != nil {
		return Image{}, fmt.Errorf("checkpoint pid %d: %w (%w)", p.Pid(), ErrCheckpoint, err)
	}
	ppid, _ := procStatus(p.Pid(), "PPid")
	if err := p.attach(dir); err != nil {
		return Image{}, fmt.Errorf("checkpoint pid %d: %w (%w)", p.Pid(), ErrCheckpoint, err)
	}
	defer func() {
		if err != nil {
			// Nothing of a failed checkpoint stays: not the mounts in the
			// namespaces (they would keep dir busy), not a partial image.
			p.detach()
			clearDir(dir)
		}
	}()
	start := time.Now()
	// DMTCP 4.2 sends 'K' then 'c'; the 'c' finds the computation already
	// checkpointing and dmtcp_command exits 2 with this message. The files
	// below are the real test.
	if out, cerr := p.coord.command(ctx, p.sb, dmtcpctl.CheckpointKill); !dmtcpctl.CheckpointCommandOK(dmtcpctl.CheckpointKill, cerr, out) {
		err = fmt.Errorf("checkpoint pid %d: dmtcp_command -kc: %w (%w): %s", p.Pid(), ErrCheckpoint, cerr, strings.TrimSpace(out))
		return Image{}, err
	}
	files, err := p.awaitImage(ctx, dir, st.Peers)
	write := time.Since(start)
	if err != nil {
		// The app is suspended mid-checkpoint or already gone: end it.
		p.kill()
		<-p.done
		err = d.failed(fmt.Errorf("checkpoint pid %d into %s: %w (%w)", p.Pid(), dir, ErrCheckpoint, err), p)
		return Image{}, err
	}
	// -kc kills the app once its image is written.
	p.reap(ctx)
	img = Image{Engine: NameDMTCP, Version: info.Version, Dir: dir, Root: p.root, Argv: p.argv,
		Created: time.Now(), Write: write, Generation: p.gen + 1, Orphan: ppid == "1" || ppid == p.initPid()}
	if p.gzip {
		img.Compression = "gzip"
	}
	for _, f := range files {
		img.Files = append(img.Files, filepath.Base(f))
	}
	img, err = sealImage(log, img)
	return img, err
}

// awaitImage waits until dir holds the complete image of the computation's
// peers processes, and returns its files.
func (p *dmtcpProc) awaitImage(ctx context.Context, dir string, peers int) ([]string, error) {
	var files []string
	complete := func() bool {
		var cerr error
		files, cerr = dmtcpctl.Complete(dir, peers)
		return cerr == nil
	}
	err := pollUntil(ctx, 5*time.Millisecond, nil, func() (bool, error) {
		if complete() {
			return true, nil
		}
		if p.exited() && p.coord.exited() {
			// Both gone: look one last time, then give up.
			if complete() {
				return true, nil
			}
			return false, errors.New("app and coordinator exited without a complete image")
		}
		return false, nil
	})
	return files, err
}

// Restore implements Engine: a private coordinator in the new sandbox, then
// dmtcp_restart -j --ckptdir C --tmpdir T ckpt_*.dmtcp. dmtcp_restart execs
// into the app, so it stays a child of the engine. Only if the app's parent
// was PID 1 at checkpoint time does dmtcp_restart fork and exit; then the
// engine, a child subreaper, adopts the app.
func (d *DMTCP) Restore(ctx context.Context, img Image, spec RestoreSpec) (_ Process, err error) {
	start := time.Now()
	log := d.cfg.Logger.With("engine", NameDMTCP, "phase", "restore", "image", img.Dir)
	if err := img.check(NameDMTCP); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	if spec.Lazy {
		return nil, hint.With(fmt.Errorf("restore %s: DMTCP cannot restore lazily: %w", img.Dir, ErrInvalid), "lazy restore needs the criu engine")
	}
	if err := validateRoot(spec.Root); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	info, err := d.checkInRoot(ctx, spec.Root)
	if err != nil {
		return nil, err
	}
	imgDir, err := filepath.Abs(img.Dir)
	if err != nil {
		return nil, err
	}
	lay, err := d.newInstance(func(inst string) dmtcpLayout { return d.layout(inst, spec.Root, info.Prefix, imgDir) })
	if err != nil {
		return nil, err
	}
	p := &dmtcpProc{process: &process{engine: NameDMTCP, log: log, stopDur: d.cfg.StopTimeout, inst: lay.inst,
		gen: img.Generation, argv: img.Argv, root: spec.Root}, ckptDir: lay.nsCkpt, gzip: img.Compression == "gzip"}
	defer func() {
		if err != nil {
			p.abort()
		}
	}()
	if img.Orphan && spec.Root == "" {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return nil, fmt.Errorf("restore %s: become child subreaper: %w (%w)", img.Dir, ErrRestore, err)
		}
	}
	if err = d.prepare(ctx, p, lay, spec.NetNS, spec.Stdout, spec.Stderr); err != nil {
		return nil, fmt.Errorf("restore %s: %w (%w)", img.Dir, ErrRestore, err)
	}
	cmd := restartCmd(info, lay, img, spec.Root, p)
	if p.pid, err = p.startApp(ctx, lay, cmd); err != nil {
		return nil, fmt.Errorf("restore %s: start dmtcp_restart: %w (%w)", img.Dir, ErrRestore, err)
	}
	p.out.started()
	ad := &adoption{done: make(chan struct{})}
	p.wait = d.waitRestarted(p, cmd, img.Orphan, ad)
	p.kill = func() {
		_ = cmd.Process.Kill()
		ad.kill()
		p.coord.kill()
		p.killInit()
	}
	p.teardown = func() { p.coord.stop(d, p.sb); p.endInit() }
	p.supervise()

	if err = d.waitPeers(ctx, p.process, p.sb, p.coord, len(img.Files)); err != nil {
		return nil, d.failed(fmt.Errorf("restore %s: %w (%w)", img.Dir, ErrRestore, err), p)
	}
	if img.Orphan {
		// Pid must name the app, not the exited dmtcp_restart.
		select {
		case <-ad.done:
		case <-ctx.Done():
			err = ctx.Err()
			return nil, fmt.Errorf("restore %s: adopt the restored app: %w (%w)", img.Dir, ErrRestore, err)
		}
	}
	if img.Orphan && p.exited() {
		err = fmt.Errorf("restore %s: the restored app exited (status %d): %w", img.Dir, p.code, ErrRestore)
		return nil, d.failed(err, p)
	}
	p.timings.Restore = time.Since(start)
	log.Info("restored", "pid", p.Pid(), "coord_port", p.coord.port, "root", spec.Root, "netns", spec.NetNS,
		"ms", p.timings.Restore.Milliseconds())
	return p, nil
}
