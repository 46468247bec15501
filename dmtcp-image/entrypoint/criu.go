package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/instancectl"
)

// runCRIU is the life of a container whose engine is CRIU (-engine criu).
// This process runs criu itself, through the engine package that the host
// driver uses too: criu check (its kernel-feature cache goes to /run, a
// tmpfs of the container), then the app launched inside the root, or the
// newest complete generation restored into a fresh PID namespace; a
// checkpoint request runs criu dump, which stops the app. Probes, timings,
// orders and generations are those of the DMTCP container.
//
// The app is started through this binary's nocaps mode as /proc/self/exe
// (the forked entrypoint executing itself again, in the app's PID
// namespace), keeping only what a root daemon needs to drop its own
// privileges (appCapNames), so that its image records no more; only this
// process and criu hold the rest of the container's capabilities.
func (s *supervisor) runCRIU() int {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1)
	ctx := context.Background()
	self, err := os.Executable()
	if err != nil {
		s.log.Error("find own binary", "err", err)
		return exitSetup
	}
	s.self = self
	var eng *engine.CRIU
	if s.cfg.criuChecked {
		// A spare ran the check before it was assigned this restart.
		eng = criuEngine(s.cfg, s.log)
	} else {
		t := time.Now()
		var info engine.Info
		eng, info, err = newCRIU(ctx, s.cfg, s.log)
		s.tm.record("check", 0, t, 0, err)
		if err != nil {
			s.log.Error("criu cannot run in this container", "err", err)
			return exitSetup
		}
		s.log.Info("criu found", "version", info.Version, "prefix", info.Prefix)
	}
	for {
		code, again := s.lifeCRIU(ctx, eng, sigs)
		if !again {
			return code
		}
	}
}

// lifeCRIU runs one instance under CRIU: the root prepared, the order
// awaited, the app launched or restored and supervised until it exits, is
// checkpointed, or (-recycle) is released. It returns the container's exit
// status, or again once a recycled container has given its instance back
// and been rearmed for the next.
func (s *supervisor) lifeCRIU(ctx context.Context, eng *engine.CRIU, sigs <-chan os.Signal) (code int, again bool) {
	if s.cfg.rootLater {
		// The host mounts the root and fills the checkpoint volume until
		// it orders: nothing of them is read before.
		if code, ok := s.awaitOrder(sigs); !ok {
			return code, false
		}
	}
	var img engine.Image
	if code := s.pickGenerations(func(gens []generation) (err error) {
		if s.cfg.sourceLater {
			return nil // read once ordered
		}
		img, err = pickImage(s.cfg.ckpt, gens, s.cfg.from, s.cfg.engine)
		return err
	}); code != exitOK {
		return code, false
	}
	if !s.cfg.sourceLater && !s.rootOfImage(img) {
		return exitSetup, false
	}
	if !s.mountRoot() {
		return exitSetup, false
	}
	if s.cfg.mode == modeRestart && s.cfg.wait != "" && !s.restarted && !s.cfg.sourceLater && !s.cfg.rootLater {
		// A recycled container restored this generation already: its
		// images are in the page cache.
		if _, err := os.Stat(s.cfg.wait); err != nil {
			go s.warm(generation{n: img.Generation, images: imageFiles(img)})
		}
	}
	stopOrphans := s.reapOrphans()
	defer stopOrphans()
	if !s.cfg.rootLater {
		if code, ok := s.awaitOrder(sigs); !ok {
			return code, false
		}
	}
	if s.cfg.sourceLater {
		var code int
		if img, code = pickOnceOrdered(s, func(gens []generation) (engine.Image, error) {
			return pickImage(s.cfg.ckpt, gens, s.cfg.from, s.cfg.engine)
		}); code != exitOK {
			return code, false
		}
		if !s.rootOfImage(img) {
			return exitSetup, false
		}
	}

	return s.startCRIU(ctx, eng, img, sigs)
}

// rootOfImage makes the mount point of img's root where it differs from
// this container's: an image written at another root path (by the host
// driver, or in a launch container, whose root is /fog/root where a
// recycled container's is under /fog/mnt) restores at the root's path of
// its checkpoint, and the engine binds this root there.
func (s *supervisor) rootOfImage(img engine.Image) bool {
	if img.Root == "" || img.Root == s.cfg.root {
		return true
	}
	if err := os.MkdirAll(img.Root, 0o755); err != nil {
		s.log.Error("mount point of the checkpoint's root", "root", img.Root, "err", err)
		return false
	}
	return true
}

// startCRIU launches the app under criu, or restores img, and supervises
// it.
func (s *supervisor) startCRIU(ctx context.Context, eng *engine.CRIU, img engine.Image, sigs <-chan os.Signal) (code int, again bool) {
	t := time.Now()
	var proc engine.Process
	var err error
	phase := "launch_ready"
	if s.cfg.mode == modeLaunch {
		// A root app keeps what a root daemon needs to drop its own
		// privileges; an app of a user takes it and keeps nothing.
		argv := append([]string{"/proc/self/exe", modeNoCaps, "-keep", appCapNames}, s.cfg.app...)
		if s.cfg.user != "" {
			argv = append([]string{"/proc/self/exe", modeNoCaps, "-user", s.cfg.user}, s.cfg.app...)
		}
		proc, err = eng.Launch(ctx, engine.LaunchSpec{Argv: argv, Env: s.appEnv(), Dir: s.cfg.workdir, Root: s.cfg.root,
			Stdout: os.Stdout, Stderr: os.Stderr})
	} else {
		phase = "restart_ready"
		lazy := s.lazyRestore()
		s.log.Info("restoring", "gen", img.Generation, "dir", img.Dir, "lazy", lazy)
		proc, err = eng.Restore(ctx, img, engine.RestoreSpec{Root: s.cfg.root, Stdout: os.Stdout, Stderr: os.Stderr, Lazy: lazy})
	}
	if err != nil {
		s.log.Error("start the app under criu", "err", err)
		return exitSetup, false
	}
	s.restarted = s.restarted || s.cfg.mode == modeRestart
	// Only criu restore needs CAP_SYS_TIME (the restored app's time
	// namespace); a later criu dump does not. A recycled container
	// restores again after each release, so its PID 1 keeps it (the app
	// never holds it).
	if !s.cfg.recycle {
		if err := dropCaps(capSysTime); err != nil {
			s.log.Warn("could not drop CAP_SYS_TIME", "err", err)
		}
	}
	s.appPid = proc.Pid()
	s.log.Info("app started", "pid", s.appPid, "engine", s.cfg.engine, "next_gen", s.gen)
	if s.cfg.ready != "" {
		go s.probe(phase, img.Generation, t, s.appGone)
	}
	appDone := make(chan int, 1)
	go func() {
		code, _ := proc.Wait(ctx)
		appDone <- code
	}()
	return s.superviseCRIU(ctx, eng, proc, sigs, appDone)
}

// newCRIU returns the CRIU engine once criu check passed in this
// container. criu writes /proc/sys/kernel/ns_last_pid, which the
// container's /proc has read-only: a fresh procfs of the container's PID
// namespace goes over it first, in the container's own mount namespace.
func newCRIU(ctx context.Context, cfg *config, log *slog.Logger) (*engine.CRIU, engine.Info, error) {
	if err := mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		return nil, engine.Info{}, fmt.Errorf("mount a fresh /proc for criu: %w", err)
	}
	eng := criuEngine(cfg, log)
	info, err := eng.Check(ctx)
	return eng, info, err
}

// criuEngine is the CRIU engine of cfg. Connections open at the
// checkpoint are restored closed: a restored instance has another
// address, and the container has no iptables. Each instance gets a /dev
// of its own, as under DMTCP (prepareRoot).
func criuEngine(cfg *config, log *slog.Logger) *engine.CRIU {
	return engine.NewCRIU(engine.Config{Prefix: cfg.criuPrefix, Logger: log, Timeout: cfg.ckptTimeout, TCPClose: true, PrivateDev: true})
}

// checkEngine is the check mode: it reports on stdout whether the engine
// can run in this container (for CRIU: criu check passes, with the
// container's capabilities) and exits 0 if so, exitSetup if not.
func checkEngine(cfg *config, log *slog.Logger) int {
	if !engine.Of(cfg.engine).KernelCheck {
		fmt.Println(string(cfg.engine) + ": the engine needs no check of the kernel")
		return exitOK
	}
	_, info, err := newCRIU(context.Background(), cfg, log)
	if err != nil {
		fmt.Printf("criu: %v\n", err)
		return exitSetup
	}
	fmt.Printf("criu %s: check passed\n", info.Version)
	return exitOK
}

// superviseCRIU forwards signals to the app, runs the checkpoint that a
// request asks for, gives the instance back on a release (-recycle), and
// returns the container's exit status, or again after a release and the
// rearm that follows it.
func (s *supervisor) superviseCRIU(ctx context.Context, eng *engine.CRIU, proc engine.Process, sigs <-chan os.Signal, appDone <-chan int) (int, bool) {
	dirs := []string{filepath.Dir(s.cfg.trigger)}
	if s.cfg.recycle {
		dirs = append(dirs, filepath.Dir(s.cfg.wait))
	}
	trigger := watchDirs(s.log, dirs, watchSafety, watchFallback)
	defer trigger.stop()
	var (
		ckptDone   chan ckptResult
		terminated bool
		appStatus  = -1
	)
	request := func(by string) {
		if ckptDone != nil || appStatus >= 0 || terminated {
			return
		}
		ckptDone = make(chan ckptResult, 1)
		go func() { ckptDone <- s.dumpCRIU(ctx, eng, proc, by) }()
	}
	for {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGUSR1 {
				request("SIGUSR1")
				continue
			}
			terminated = true
			s.log.Info("forwarding signal to the app", "signal", sig.String())
			_ = proc.Signal(sig)
		case <-trigger.C:
			if s.cfg.recycle && ckptDone == nil && appStatus < 0 && !terminated && exists(s.ctlFile(instancectl.Release)) {
				return s.releaseCRIU(proc, appDone, sigs)
			}
			if _, err := os.Stat(s.cfg.trigger); err == nil {
				_ = os.Remove(s.cfg.trigger)
				request(s.cfg.trigger)
			}
		case appStatus = <-appDone:
			appDone = nil
			close(s.appGone)
			s.log.Info("app exited", "status", appStatus, "during_checkpoint", ckptDone != nil)
			if ckptDone == nil {
				s.tm.record("exit", 0, s.started, 0, nil)
				return appStatus, false
			}
		case res := <-ckptDone:
			ckptDone = nil
			s.tm.record("checkpoint", res.gen.n, res.gen.startedAt(), res.gen.bytes(), res.err)
			if res.err != nil {
				// criu resumes the app when a dump fails; the container
				// was asked to stop after its checkpoint, so it stops.
				s.log.Error("checkpoint failed", "gen", res.gen.n, "err", res.err)
				_ = proc.Stop(context.WithoutCancel(ctx))
				return exitCheckpoint, false
			}
			s.log.Info("checkpoint complete", "gen", res.gen.n, "dir", res.gen.dir, "images", len(res.gen.images), "bytes", res.gen.bytes())
			s.tm.record("exit", res.gen.n, s.started, 0, nil)
			s.reportCheckpoint(res)
			return exitOK, false
		}
	}
}

// releaseCRIU gives a CRIU instance back (-recycle): the app is killed and
// the engine's teardown awaited (its PID namespace's init, the lazy-pages
// daemon, the restore's own mount namespace, which held the root), then
// the container is cleared and rearmed as a DMTCP one is (recycle).
func (s *supervisor) releaseCRIU(proc engine.Process, appDone <-chan int, sigs <-chan os.Signal) (int, bool) {
	_ = proc.Signal(syscall.SIGKILL)
	select {
	case <-appDone:
	case <-time.After(reapWait):
		s.log.Warn("the app's engine did not end its instance in time; killing what is left", "wait", reapWait)
	}
	return s.recycle(sigs)
}

// dumpCRIU writes generation s.gen with criu dump, after -checkpoint-delay.
func (s *supervisor) dumpCRIU(ctx context.Context, eng *engine.CRIU, proc engine.Process, by string) ckptResult {
	gen := generation{n: s.gen, dir: filepath.Join(s.cfg.ckpt, strconv.Itoa(s.gen))}
	s.log.Info("checkpoint requested", "by", by, "gen", gen.n, "dir", gen.dir, "delay", s.cfg.ckptDelay)
	time.Sleep(s.cfg.ckptDelay)
	gen.started = time.Now()
	img, err := eng.Checkpoint(ctx, proc, gen.dir)
	if err != nil {
		return ckptResult{gen: gen, err: fmt.Errorf("%w: %w", errCheckpoint, err)}
	}
	gen.images = imageFiles(img)
	return ckptResult{gen: gen}
}

// pickImage returns the image of generation from (0: the newest complete
// one) that engine eng wrote: a generation is complete once its manifest
// is written.
func pickImage(ckpt string, gens []generation, from int, eng engine.Name) (engine.Image, error) {
	for i := len(gens) - 1; i >= 0; i-- {
		g := gens[i]
		if from != 0 && g.n != from {
			continue
		}
		img, err := engine.ReadImage(g.dir)
		if err == nil && img.Engine != eng {
			err = fmt.Errorf("generation %s was written by %s, not %s", g.dir, img.Engine, eng)
		}
		if err == nil {
			img.Dir, img.Generation = g.dir, g.n
			return img, nil
		}
		if from != 0 {
			return engine.Image{}, fmt.Errorf("generation %s: %w (%w)", g.dir, errNoCheckpoint, err)
		}
	}
	if from != 0 {
		return engine.Image{}, fmt.Errorf("generation %d not found in %s: %w", from, ckpt, errNoCheckpoint)
	}
	return engine.Image{}, fmt.Errorf("%s: %w; launch the app first and checkpoint it", ckpt, errNoCheckpoint)
}

// imageFiles are the absolute paths of an image's files.
func imageFiles(img engine.Image) []string {
	out := make([]string, 0, len(img.Files))
	for _, f := range img.Files {
		out = append(out, filepath.Join(img.Dir, f))
	}
	return out
}

// reapOrphans collects, once a second, the zombies among this process's
// children that nobody waits for: orphans of the app that the container's
// PID 1 inherits. The engine waits for its own children (criu, the PID
// namespace's init, the app) the moment they exit, so a child that is
// still a zombie a second later is an orphan. It returns the stop function.
func (s *supervisor) reapOrphans() (stop func()) {
	done := make(chan struct{})
	go func() {
		seen := map[int]bool{}
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			now := map[int]bool{}
			for _, pid := range engine.ZombieChildren(os.Getpid()) {
				if !seen[pid] {
					now[pid] = true
					continue
				}
				var ws syscall.WaitStatus
				if p, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); err == nil && p == pid {
					s.log.Debug("reaped orphan", "pid", pid, "status", exitStatus(ws))
				}
			}
			seen = now
		}
	}()
	return func() { close(done) }
}
