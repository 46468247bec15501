package main

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/dmtcpctl"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/instancectl"
)

// supervisor is PID 1 of the DMTCP container.
type supervisor struct {
	cfg     *config
	log     *slog.Logger
	tm      *timings
	reaper  *reaper
	null    *os.File
	self    string // this binary, for the keep, nocaps and read modes
	started time.Time

	gen       int // generation the next checkpoint writes
	coordPid  int
	coordPort int
	appPid    int // the keeper, parent of the app
	// restarted: a restart ran in this container already (-recycle), so
	// its checkpoint's images are in the page cache and no warm read is
	// needed before the next.
	restarted bool

	// appGone is closed once the app has exited: a checkpoint still
	// waiting for its images then gives up after appGoneGrace instead of
	// the whole -checkpoint-timeout.
	appGone chan struct{}
	// ordered is the order of the instance it runs (waitOrder), which a
	// recycled container's next order replaces.
	ordered instancectl.OrderBody
}

// appGoneGrace is how long a checkpoint may still complete after the app
// exited. A -kc checkpoint stops the app once its images are written, so a
// complete generation shows up at once; an app that died during the
// checkpoint (DMTCP gave up on it) never writes one.
var appGoneGrace = 5 * time.Second

func newSupervisor(cfg *config, log *slog.Logger, timingsOut io.Writer) *supervisor {
	return &supervisor{
		cfg:     cfg,
		log:     log.With("mode", cfg.mode),
		tm:      &timings{w: timingsOut, mode: cfg.mode},
		reaper:  newReaper(log),
		started: time.Now(),
		appGone: make(chan struct{}),
	}
}

// run does the whole life of the container and returns its exit status.
func (s *supervisor) run() int {
	if engine.Of(s.cfg.engine).DumpsFromOutside && s.cfg.mode != modeBoot {
		return s.runCRIU()
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1)
	null, err := os.Open(os.DevNull)
	if err != nil {
		s.log.Error("open /dev/null", "err", err)
		return exitSetup
	}
	s.null = null
	for {
		code, again := s.life(sigs)
		if !again {
			return code
		}
	}
}

// life runs one instance: the root prepared, the order awaited, the app
// run until it exits or is checkpointed. It returns the container's exit
// status, or again once a recycled container has given its instance back
// and been rearmed for the next (-recycle).
func (s *supervisor) life(sigs <-chan os.Signal) (code int, again bool) {
	appDone, coordDone, code := s.start(sigs)
	if appDone == nil {
		s.shutdownCoordinator()
		return code, false
	}

	trigger, stopWatch := s.watchTriggers()
	defer stopWatch()
	var (
		ckptDone   chan ckptResult
		exitAfter  bool // the app is being stopped by a checkpoint
		appStatus  = -1
		terminated bool
	)
	for {
		select {
		case sig := <-sigs:
			switch sig {
			case syscall.SIGCHLD:
				s.reaper.reap()
			case syscall.SIGUSR1:
				if s.cfg.mode == modeBoot {
					s.log.Warn("checkpoint requested, but boot mode runs no checkpoint engine; ignored")
					continue
				}
				if ckptDone == nil && appStatus < 0 && !terminated {
					ckptDone, exitAfter = s.checkpoint("SIGUSR1")
				}
			default:
				terminated = true
				s.log.Info("forwarding signal to the app", "signal", sig.String())
				_ = syscall.Kill(s.appPid, sig.(syscall.Signal))
			}
		case <-trigger:
			if s.cfg.recycle && ckptDone == nil && appStatus < 0 && !terminated && exists(s.ctlFile(instancectl.Release)) {
				return s.recycle(sigs)
			}
			if s.cfg.mode != modeBoot && ckptDone == nil && appStatus < 0 && !terminated {
				if _, err := os.Stat(s.cfg.trigger); err == nil {
					_ = os.Remove(s.cfg.trigger)
					ckptDone, exitAfter = s.checkpoint(s.cfg.trigger)
				}
			}
		case ws := <-coordDone:
			coordDone = nil
			s.coordPid = 0
			s.log.Warn("the DMTCP coordinator exited; the app runs on but cannot be checkpointed", "status", exitStatus(ws))
		case ws := <-appDone:
			appStatus = exitStatus(ws)
			appDone = nil
			close(s.appGone)
			s.log.Info("app exited", "status", appStatus, "during_checkpoint", ckptDone != nil)
			if ckptDone == nil {
				s.shutdownCoordinator()
				s.tm.record("exit", 0, s.started, 0, nil)
				return appStatus, false
			}
		case res := <-ckptDone:
			ckptDone = nil
			if code, end := s.checkpointed(res, appDone, appStatus, exitAfter); end {
				return code, false
			}
		}
	}
}

// watchTriggers watches for a release (-recycle) and a checkpoint request:
// files that appear in the control and checkpoint directories. The channel
// is nil when neither can come.
func (s *supervisor) watchTriggers() (<-chan struct{}, func()) {
	var dirs []string
	if s.cfg.recycle {
		dirs = append(dirs, filepath.Dir(s.cfg.wait))
	}
	if s.cfg.mode != modeBoot {
		dirs = append(dirs, filepath.Dir(s.cfg.trigger))
	}
	if len(dirs) == 0 {
		return nil, func() {}
	}
	w := watchDirs(s.log, dirs, watchSafety, watchFallback)
	return w.C, w.stop
}

// checkpointed handles a checkpoint's end: a failed one ends the life if
// the app is gone or was being stopped by it; a complete one ends it if it
// stopped the app (exitAfter) or the app exited meanwhile (appStatus >= 0).
// With -after-checkpoint=continue the app runs on: DMTCP fixed the image
// directory at launch, so the next checkpoint rewrites this generation.
func (s *supervisor) checkpointed(res ckptResult, appDone <-chan syscall.WaitStatus, appStatus int, exitAfter bool) (code int, end bool) {
	s.tm.record("checkpoint", res.gen.n, res.gen.startedAt(), res.gen.bytes(), res.err)
	if res.err != nil {
		s.log.Error("checkpoint failed", "gen", res.gen.n, "err", res.err)
		if appStatus >= 0 || exitAfter {
			s.stopApp(appDone)
			s.shutdownCoordinator()
			return exitCheckpoint, true
		}
		return 0, false
	}
	s.log.Info("checkpoint complete", "gen", res.gen.n, "dir", res.gen.dir, "images", len(res.gen.images), "bytes", res.gen.bytes())
	switch {
	case exitAfter:
		s.stopApp(appDone)
		s.shutdownCoordinator()
		s.tm.record("exit", res.gen.n, s.started, 0, nil)
		s.reportCheckpoint(res)
		return exitOK, true
	case appStatus >= 0:
		s.shutdownCoordinator()
		return appStatus, true
	}
	return 0, false
}

// start prepares the root, starts the coordinator and the app, and returns
// the channels their wait statuses arrive on. On failure it returns a nil
// app channel and the exit status.
func (s *supervisor) start(sigs <-chan os.Signal) (app, coord <-chan syscall.WaitStatus, code int) {
	self, err := os.Executable()
	if err != nil {
		s.log.Error("find own binary", "err", err)
		return nil, nil, exitSetup
	}
	s.self = self
	if s.cfg.mode == modeBoot {
		return s.boot(sigs)
	}
	ordered := false
	if s.cfg.rootLater {
		// The host mounts the root and fills the checkpoint volume until
		// it orders: nothing of them is read before.
		if code, ok := s.awaitOrder(sigs); !ok {
			return nil, nil, code
		}
		ordered = true
	}
	var from generation
	if code := s.pickGenerations(func(gens []generation) (err error) {
		if s.cfg.sourceLater {
			return nil // read once ordered
		}
		from, err = pickRestore(s.cfg.ckpt, gens, s.cfg.from)
		return err
	}); code != exitOK {
		return nil, nil, code
	}
	if !s.mountRoot() {
		return nil, nil, exitSetup
	}

	t := time.Now()
	ckptDir := filepath.Join(s.cfg.ckpt, strconv.Itoa(s.gen))
	if s.cfg.user != "" {
		// The app's processes write their images themselves, as the app's
		// user, and this process has no CAP_CHOWN: the generation's
		// directory is open to all (the checkpoint volume is the
		// instance's own).
		if err := openDir(ckptDir); err != nil {
			s.log.Error("checkpoint generation directory", "err", err)
			return nil, nil, exitSetup
		}
	}
	pid, port, coordDone, err := s.startCoordinator(ckptDir)
	if err != nil {
		s.log.Error("start the DMTCP coordinator", "err", err)
		return nil, nil, exitSetup
	}
	s.coordPid, s.coordPort = pid, port
	s.tm.record("coordinator", 0, t, 0, nil)
	s.log.Info("coordinator listening", "addr", "127.0.0.1:"+strconv.Itoa(port), "pid", pid)

	if s.cfg.mode == modeRestart && s.cfg.wait != "" && !s.cfg.sourceLater && !ordered {
		// A slot that waits (a warm pool's) reads its checkpoint ahead;
		// one whose order is already there restarts at once.
		if _, err := os.Stat(s.cfg.wait); err != nil && !s.restarted {
			go s.warm(from)
		}
	}
	if !ordered {
		if code, ok := s.awaitOrder(sigs); !ok {
			return nil, nil, code
		}
	}
	if s.cfg.sourceLater {
		var code int
		if from, code = pickOnceOrdered(s, func(gens []generation) (generation, error) {
			return pickRestore(s.cfg.ckpt, gens, s.cfg.from)
		}); code != exitOK {
			return nil, nil, code
		}
	}
	done, ok := s.startApp(from)
	if !ok {
		return nil, nil, exitSetup
	}
	return done, coordDone, exitOK
}

// pickGenerations reads the checkpoint volume's generations: a restart
// picks the one it restores from them (pick), and s.gen is the number the
// next checkpoint takes. It returns exitOK, or why the entrypoint ends.
func (s *supervisor) pickGenerations(pick func(gens []generation) error) int {
	gens, err := generations(s.cfg.ckpt)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Error("checkpoint dir", "err", err)
		return exitSetup
	}
	if s.cfg.mode == modeRestart {
		if err := pick(gens); err != nil {
			s.log.Error("nothing to restore", "err", err)
			return exitNoCheckpoint
		}
	}
	s.gen = s.cfg.gen
	if s.gen == 0 {
		s.gen = nextGeneration(gens)
	}
	return exitOK
}

// pickOnceOrdered reads the checkpoint volume's generations once the
// order is given (-source-later: the host filled the one to restore
// meanwhile) and picks what to restore from them.
func pickOnceOrdered[T any](s *supervisor, pick func(gens []generation) (T, error)) (T, int) {
	var zero T
	gens, err := generations(s.cfg.ckpt)
	if err != nil {
		s.log.Error("checkpoint dir", "err", err)
		return zero, exitSetup
	}
	v, err := pick(gens)
	if err != nil {
		s.log.Error("nothing to restore", "err", err)
		return zero, exitNoCheckpoint
	}
	return v, exitOK
}

// startApp launches the app under DMTCP, or restarts generation from, and
// probes its readiness when -ready says how.
func (s *supervisor) startApp(from generation) (<-chan syscall.WaitStatus, bool) {
	var argv []string
	t := time.Now()
	run := s.dmtcpRun()
	if s.cfg.mode == modeLaunch {
		argv = append([]string{filepath.Join(s.cfg.prefix, "bin", "dmtcp_launch")}, run.LaunchArgs(s.cfg.app)...)
	} else {
		argv = append([]string{filepath.Join(s.cfg.prefix, "bin", "dmtcp_restart")}, run.RestartArgs(from.images)...)
		s.log.Info("restoring", "gen", from.n, "images", from.images)
	}
	appPid, done, err := s.startKeeper(argv)
	if err != nil {
		return nil, false
	}
	s.restarted = s.restarted || s.cfg.mode == modeRestart
	s.log.Info("app started", "pid", appPid, "argv", argv, "next_gen", s.gen)
	if s.cfg.ready != "" {
		phase := "launch_ready"
		if s.cfg.mode == modeRestart {
			phase = "restart_ready"
		}
		go s.probe(phase, from.n, t, s.appGone)
	}
	return done, true
}

// boot is start for boot mode: the root without the DMTCP prefix and the
// checkpoint volume, no coordinator, and the app run directly by the keeper.
func (s *supervisor) boot(sigs <-chan os.Signal) (app, coord <-chan syscall.WaitStatus, code int) {
	if !s.mountRoot() {
		return nil, nil, exitSetup
	}
	if code, ok := s.awaitOrder(sigs); !ok {
		return nil, nil, code
	}
	t := time.Now()
	appPid, done, err := s.startKeeper(s.cfg.app)
	if err != nil {
		return nil, nil, exitSetup
	}
	s.log.Info("app started", "pid", appPid, "argv", s.cfg.app)
	if s.cfg.ready != "" {
		go s.probe("boot_ready", 0, t, s.appGone)
	}
	return done, nil, exitOK
}

// awaitOrder waits for the order with -wait, and reports whether to go on
// and, if not, the exit status: 0 for a slot released before its order.
func (s *supervisor) awaitOrder(sigs <-chan os.Signal) (int, bool) {
	if s.cfg.wait == "" {
		return exitOK, true
	}
	if _, err := s.waitOrder(sigs); errors.Is(err, errReleased) {
		s.log.Info("released before an order")
		return exitOK, false
	} else if err != nil {
		s.log.Error("wait for an order", "err", err)
		return exitSetup, false
	}
	return exitOK, true
}

// mountRoot prepares the root. It records the mount timing and reports
// success.
func (s *supervisor) mountRoot() bool {
	t := time.Now()
	if err := prepareRoot(s.cfg); err != nil {
		s.log.Error("prepare the environment clone", "root", s.cfg.root, "err", err)
		return false
	}
	s.tm.record("mount", 0, t, 0, nil)
	return true
}

// dropMountRights drops CAP_SYS_ADMIN for good once the app's init has
// mounted its namespace's /proc; criu dump and criu restore need it, and a
// recycled container unmounts the root's mounts after each instance (the
// app never holds it: nocaps, the keeper).
func (s *supervisor) dropMountRights() {
	if engine.Of(s.cfg.engine).DumpsFromOutside || s.cfg.recycle {
		return
	}
	if err := dropCaps(capSysAdmin); err != nil {
		s.log.Warn("could not drop CAP_SYS_ADMIN for good; add CAP_SETPCAP to the container", "err", err)
	}
}

// startKeeper starts argv in the app's own PID and mount namespaces,
// under their init and the keeper (appns.go), chrooted into the root, and
// records the init's PID as the app's. The mount rights go once the init
// runs.
func (s *supervisor) startKeeper(argv []string) (int, <-chan syscall.WaitStatus, error) {
	keeperArgv := []string{s.self, modeKeep, "-init"}
	if s.cfg.user != "" {
		keeperArgv = append(keeperArgv, "-user", s.cfg.user)
	}
	keeperArgv = append(append(keeperArgv, s.cfg.root, s.cfg.workdir), argv...)
	pid, done, err := s.reaper.start(keeperArgv, &syscall.ProcAttr{
		Env:   s.appEnv(),
		Files: []uintptr{s.null.Fd(), os.Stdout.Fd(), os.Stderr.Fd()},
		Sys:   &syscall.SysProcAttr{Cloneflags: appNSFlags},
	})
	if err != nil {
		s.log.Error("start the app", "argv", argv, "err", err)
		return 0, nil, err
	}
	s.appPid = pid
	s.dropMountRights()
	return pid, done, nil
}

// dmtcpRun is where the app writes its images: the generation's
// directory, uncompressed (the checkpoint volume is the instance's own and
// a restore reads it at once).
func (s *supervisor) dmtcpRun() dmtcpctl.Run {
	return dmtcpctl.Run{CkptDir: filepath.Join(s.cfg.ckpt, strconv.Itoa(s.gen)), TmpDir: "/tmp"}
}

// appEnv is the app's environment: its -env variables, with a PATH, a
// HOME and the container's HOSTNAME where they lack them (what Docker
// gave an app that ran as the container's process), under DMTCP's
// settings (dmtcpctl.Run.Env). Boot mode and CRIU get the same locale,
// LC_ALL=C. Nothing of the entrypoint's own environment is in it.
func (s *supervisor) appEnv() []string {
	env := slices.Clone(s.cfg.appEnv)
	has := func(key string) bool {
		return slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, key+"=") })
	}
	if !has("PATH") {
		env = append(env, "PATH="+ownPath)
	}
	if !has("HOME") {
		env = append(env, "HOME=/root")
	}
	if h, err := os.Hostname(); err == nil && !has("HOSTNAME") {
		env = append(env, "HOSTNAME="+h)
	}
	if s.cfg.mode == modeBoot || engine.Of(s.cfg.engine).DumpsFromOutside {
		return dmtcpctl.CleanEnv(env)
	}
	return s.dmtcpRun().Env(env, s.coordPort)
}
