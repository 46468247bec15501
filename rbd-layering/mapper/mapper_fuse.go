package mapper

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/procprio"
	"github.com/fogdeploy/fogdeploy/internal/procstat"
)

// fuseBackend exposes one image as a file with one rbd-fuse process and
// attaches that file to a loop device:
//
//	CEPH_ARGS="--id ID --keyring K" rbd-fuse -c CONF -p POOL -r IMAGE -f StateDir/fuse/<id>
//	losetup --find --show StateDir/fuse/<id>/IMAGE
//
// rbd-fuse runs detached in its own session, so it survives the death of
// the process that started it; Recover finds it again through the record
// (PID, start time, and the mount directory in its command line).
// Detach runs `losetup -d` (only if the loop device still backs our file),
// `umount` (or `fusermount -u`) on the mount directory, and waits for
// rbd-fuse to exit, killing it after Config.Timeout.
//
// rbd-fuse (Ceph 16) cannot expose a snapshot: mapping Image.Snap fails
// with ErrUnsupported. It is never run pool-wide (-r is always given): a
// pool-wide rbd-fuse keeps every image open, and `rbd rm` then fails with
// "image still has watchers".
type fuseBackend struct {
	cfg Config
	run runner
	log *slog.Logger
}

func (b *fuseBackend) Name() string { return BackendFuse }

func (b *fuseBackend) Probe(ctx context.Context) error {
	if err := needTools("rbd-fuse", "losetup", "umount"); err != nil {
		return err
	}
	if !fileExists("/dev/fuse") {
		return errors.New("/dev/fuse is missing (no FUSE support)")
	}
	if !fileExists("/dev/loop-control") {
		return errors.New("/dev/loop-control is missing (no loop driver)")
	}
	return nil
}

func (b *fuseBackend) dir(id string) string { return filepath.Join(b.cfg.StateDir, "fuse", id) }

// env is the environment of rbd-fuse: ours, with CEPH_ARGS carrying the
// cephx identity (rbd-fuse has no --id/--keyring flags of its own) and a
// connect bound, and a lean process: every mapped image has an rbd-fuse of
// its own, idle most of its life (an idle spare slot's), so it runs one
// messenger worker instead of three, one malloc arena instead of one per
// thread, gives freed memory back past glibc's default 128 KiB
// instead of a threshold that grows with every large free, and keeps one
// recent log entry in memory instead of 10000 (its log goes nowhere but a
// crash report). Together they take about 2.3 MiB of the 11 MiB an idle
// rbd-fuse holds, and read and write an image as fast on a node's few
// cores (docs/evaluation.md). An arena count already in our environment
// keeps both malloc settings ours.
func (b *fuseBackend) env() []string {
	var env []string
	arenas := false
	for _, kv := range os.Environ() {
		switch {
		case strings.HasPrefix(kv, "CEPH_ARGS="):
			continue
		case strings.HasPrefix(kv, "MALLOC_ARENA_MAX="):
			arenas = true
		}
		env = append(env, kv)
	}
	if !arenas {
		env = append(env, "MALLOC_ARENA_MAX=1", "MALLOC_TRIM_THRESHOLD_=131072")
	}
	args := "--id " + b.cfg.id()
	if b.cfg.Keyring != "" {
		args += " --keyring " + b.cfg.Keyring
	}
	args += fmt.Sprintf(" --client_mount_timeout %d --ms_async_op_threads 1 --log_max_recent 1", max(1, int(b.cfg.timeout().Seconds())))
	return append(env, "CEPH_ARGS="+args)
}

func (b *fuseBackend) Attach(ctx context.Context, img Image, rec *Record, save func() error) (string, error) {
	if img.Snap != "" {
		return "", fmt.Errorf("map %s: rbd-fuse cannot expose a snapshot: %w (hint: clone the snapshot and map the clone, or use the krbd or nbd backend)", img, ErrUnsupported)
	}
	dir := b.dir(rec.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("map %s: %w", img, err)
	}
	rec.FuseDir = dir
	if err := save(); err != nil {
		return "", err
	}

	logPath := dir + ".log"
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return "", fmt.Errorf("map %s: %w", img, err)
	}
	// Not CommandContext: rbd-fuse must outlive ctx and this process.
	cmd := exec.Command("rbd-fuse", "-c", b.cfg.CephConf, "-p", img.Pool, "-r", img.Name, "-f", dir)
	cmd.Env = b.env()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	start := time.Now()
	err = cmd.Start()
	logf.Close()
	if err != nil {
		return "", fmt.Errorf("map %s: start rbd-fuse: %w", img, err)
	}
	pid := cmd.Process.Pid
	// rbd-fuse is deployment work: it runs at the background CPU and I/O
	// priority, below the instances that serve users.
	if err := procprio.Set(pid, procprio.Background); err != nil {
		b.log.Warn("rbd-fuse runs at normal priority", "image", img.String(), "err", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }() // reap it if it dies while we live
	pstart, _ := procstat.Start(pid)
	rec.FusePID, rec.FuseStart = pid, pstart
	if err := save(); err != nil {
		return "", err
	}

	file := filepath.Join(dir, img.Name)
	if err := b.waitReady(ctx, img, dir, file, cmd, exited, logPath); err != nil {
		return "", err
	}
	b.log.Debug("rbd-fuse ready", "id", rec.ID, "image", img.String(), "pid", pid, "ms", time.Since(start).Milliseconds())

	rec.LoopBacking = file
	if err := save(); err != nil {
		return "", err
	}
	var dev string
	err = guard(ctx, b, *rec, b.cfg.timeout(), b.log, func() (err error) {
		dev, err = b.run.loopAttach(ctx, file, rec.ReadOnly)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("map %s: attach loop device: %w", img, err)
	}
	rec.LoopDev = dev
	return dev, save()
}

// waitReady waits until dir is a FUSE mount whose listing shows the image
// file. An image missing from a live mount is ErrImageNotFound.
func (b *fuseBackend) waitReady(ctx context.Context, img Image, dir, file string, cmd *exec.Cmd, exited <-chan struct{}, logPath string) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.timeout())
	defer cancel()
	// failed reads cmd.ProcessState only once exited is closed (no race
	// with the reaping goroutine).
	failed := func(what string) error {
		code := -1
		select {
		case <-exited:
			code = cmd.ProcessState.ExitCode()
			what = fmt.Sprintf("%s (%s)", what, cmd.ProcessState)
		default:
		}
		msg := "rbd-fuse " + what
		if out, err := os.ReadFile(logPath); err == nil {
			if tail := lastLines(string(out), 4); tail != "" {
				msg += ": " + tail
			}
		}
		// rbd-fuse mounts first and connects on the first request: it
		// exits 90 when it cannot connect and 91 when the pool is missing.
		// Some builds crash (SIGSEGV) on a missing pool instead of
		// exiting 91, so an unexplained death asks the cluster.
		switch {
		case code == 91 || (code != 90 && b.poolMissing(ctx, img.Pool)):
			return fmt.Errorf("map %s: pool %q does not exist: %w (%s) (hint: `ceph osd pool ls` lists the pools)", img, img.Pool, ErrImageNotFound, msg)
		case code == 90 || strings.Contains(msg, "failed to fetch mon config"):
			return fmt.Errorf("map %s: cannot connect to the cluster: %s (hint: check Config.CephConf, Config.ID and Config.Keyring, and that `ceph -s` answers)", img, msg)
		}
		return fmt.Errorf("map %s: %s", img, msg)
	}
	var missingSince time.Time
	for {
		select {
		case <-exited:
			return failed("exited")
		case <-ctx.Done():
			return failed(fmt.Sprintf("did not mount %s within %s", dir, b.cfg.timeout()))
		case <-time.After(10 * time.Millisecond):
		}
		ms, err := mountsAt(dir)
		if err != nil {
			return err
		}
		if len(ms) == 0 || !strings.HasPrefix(ms[len(ms)-1].FSType, "fuse") {
			continue
		}
		// The first request blocks until rbd-fuse has connected to the
		// cluster, so stat in the background and keep watching.
		res := make(chan error, 1)
		go func() { _, err := os.Stat(file); res <- err }()
		select {
		case err := <-res:
			switch {
			case err == nil:
				return nil
			case errors.Is(err, fs.ErrNotExist):
				// rbd-fuse answers ENOENT also when its listing or its
				// rbd_open failed for a moment (it lists the pool anew at
				// every lookup, and a failed list or open reads as a
				// missing image): only an image missing for
				// fuseMissingSettle is one.
				if missingSince.IsZero() {
					missingSince = time.Now()
				}
				if time.Since(missingSince) < fuseMissingSettle {
					b.log.Debug("rbd-fuse does not show the image yet", "image", img.String())
					continue
				}
				msg := ""
				if out, err := os.ReadFile(logPath); err == nil {
					if tail := lastLines(string(out), 2); tail != "" {
						msg = " (rbd-fuse: " + tail + ")"
					}
				}
				return fmt.Errorf("map %s: %w%s (hint: `rbd ls %s` lists the pool's images)", img, ErrImageNotFound, msg, img.Pool)
			default:
				b.log.Debug("rbd-fuse not ready", "image", img.String(), "err", err)
			}
		case <-exited:
			return failed("exited")
		case <-ctx.Done():
			// Mounted, but the first request got no answer: the cluster
			// does not serve the image. Cut rbd-fuse off, which also
			// ends the stat above.
			if _, err := b.Abort(context.WithoutCancel(ctx), Record{ID: filepath.Base(dir), Image: img, FuseDir: dir}); err != nil {
				b.log.Warn("cutting off a stalled rbd-fuse", "image", img.String(), "err", err)
			}
			return fmt.Errorf("map %s: rbd-fuse did not answer on %s within %s: %w (hint: the cluster does not serve the image's I/O; `ceph -s` shows OSDs down or a full pool)",
				img, dir, b.cfg.timeout(), ErrStalled)
		}
	}
}

// fuseMissingSettle is how long an image rbd-fuse does not show is taken
// for a passing failure of its listing before it is taken for missing.
const fuseMissingSettle = 2 * time.Second

// poolMissing reports whether the cluster answers and does not list pool.
// It is false when the cluster cannot be asked.
func (b *fuseBackend) poolMissing(ctx context.Context, pool string) bool {
	out, err := b.run.run(context.WithoutCancel(ctx), b.env(), "rados", "-c", b.cfg.CephConf, "lspools")
	if err != nil {
		b.log.Debug("cannot list pools", "err", err)
		return false
	}
	return !slices.Contains(strings.Fields(out), pool)
}

func (b *fuseBackend) Detach(ctx context.Context, rec Record) error {
	if rec.LoopBacking != "" {
		// The backing path holds the mapping ID, so any loop device backed
		// by it is ours, also one attached just before a crash.
		devs := loopsBacking(rec.LoopBacking)
		if rec.LoopDev != "" && !slices.Contains(devs, rec.LoopDev) {
			devs = append(devs, rec.LoopDev)
		}
		for _, dev := range devs {
			if err := b.run.loopDetach(ctx, dev, rec.LoopBacking); err != nil {
				return fmt.Errorf("release %s (%s): detach %s: %w", rec.ID, rec.Image, dev, err)
			}
		}
	}
	if rec.FuseDir == "" {
		return nil
	}
	dir := rec.FuseDir
	wasMounted := false
	for range 4 {
		ms, err := mountsAt(dir)
		if err != nil {
			return err
		}
		if len(ms) == 0 || !strings.HasPrefix(ms[len(ms)-1].FSType, "fuse") {
			break
		}
		wasMounted = true
		if err := b.run.umount(ctx, dir); err != nil {
			if _, ferr := b.run.run(ctx, nil, "fusermount", "-u", dir); ferr != nil {
				return fmt.Errorf("release %s (%s): unmount rbd-fuse at %s: %w", rec.ID, rec.Image, dir, errors.Join(err, ferr))
			}
		}
	}
	if err := b.stopProcess(ctx, rec, !wasMounted); err != nil {
		return err
	}
	if ms, _ := mountsAt(dir); len(ms) == 0 {
		if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			b.log.Warn("could not remove rbd-fuse mount directory", "dir", dir, "err", err)
		}
		os.Remove(dir + ".log")
	}
	return nil
}

// stopProcess waits for our rbd-fuse to exit after its unmount, and kills
// it after the timeout (at once with SIGTERM if it never mounted).
func (b *fuseBackend) stopProcess(ctx context.Context, rec Record, neverMounted bool) error {
	var pids []int
	if procstat.Alive(rec.FusePID, rec.FuseStart) && cmdlineMatches(procCmdline(rec.FusePID), "rbd-fuse", rec.FuseDir) {
		pids = append(pids, rec.FusePID)
	}
	// Started but not yet recorded when a crash hit: the mount directory
	// in its command line names it.
	for _, pid := range findProcs("rbd-fuse", rec.FuseDir) {
		if !slices.Contains(pids, pid) {
			pids = append(pids, pid)
		}
	}
	for _, pid := range pids {
		start, ok := procstat.Start(pid)
		if !ok {
			continue
		}
		if neverMounted {
			syscall.Kill(pid, syscall.SIGTERM)
		}
		wctx, cancel := context.WithTimeout(ctx, b.cfg.timeout())
		gone := waitExit(wctx, pid, start)
		cancel()
		if gone {
			continue
		}
		if !procstat.Alive(pid, start) || !cmdlineMatches(procCmdline(pid), "rbd-fuse", rec.FuseDir) {
			continue
		}
		b.log.Warn("rbd-fuse did not exit; killing it", "id", rec.ID, "image", rec.Image.String(), "pid", pid)
		syscall.Kill(pid, syscall.SIGKILL)
		wctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		gone = waitExit(wctx, pid, start)
		cancel()
		if !gone {
			return fmt.Errorf("release %s (%s): rbd-fuse pid %d survives SIGKILL: %w", rec.ID, rec.Image, pid, ErrBusy)
		}
	}
	return nil
}

// Abort implements aborter: it kills the mapping's rbd-fuse (SIGKILL). The
// kernel then fails every pending and later request on its filesystem, so
// a losetup, mount, umount or app blocked on the loop device returns. A
// stuck rbd-fuse cannot be asked to give up: it retries a request that
// timed out (rados_osd_op_timeout) without end.
func (b *fuseBackend) Abort(ctx context.Context, rec Record) (bool, error) {
	dir := rec.FuseDir
	if dir == "" {
		dir = b.dir(rec.ID)
	}
	pids := findProcs("rbd-fuse", dir)
	for _, pid := range pids {
		start, ok := procstat.Start(pid)
		if !ok {
			continue
		}
		b.log.Warn("image I/O stalled: killing its rbd-fuse", "id", rec.ID, "image", rec.Image.String(), "pid", pid)
		syscall.Kill(pid, syscall.SIGKILL)
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		gone := waitExit(wctx, pid, start)
		cancel()
		if !gone {
			return true, fmt.Errorf("abort %s (%s): rbd-fuse pid %d survives SIGKILL: %w", rec.ID, rec.Image, pid, ErrBusy)
		}
	}
	return len(pids) > 0, nil
}
