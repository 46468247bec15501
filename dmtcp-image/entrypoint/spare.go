package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/instancectl"
)

// modeSpare: a container created for no app waits for the restart it is
// assigned (instancectl.Assign) and becomes it.
const modeSpare = "spare"

// spare is the spare mode: it waits for the assignment file -assign names,
// checks the restart it holds as the restart mode would, drops what that
// restart does not need of the spare's capabilities, and executes this
// binary again as that restart (same PID 1, same container). A
// termination signal before any assignment ends it with status 0.
func spare(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet(modeSpare, flag.ContinueOnError)
	fs.SetOutput(stderr)
	assign := fs.String("assign", "", "file whose appearance assigns the restart this container becomes (its JSON holds the restart's arguments)")
	eng := fs.String("engine", string(engine.Default()), "the engine of the restarts this container may become: "+engine.List(engine.Names()))
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	logFormat := fs.String("log-format", "text", "text or json")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	log := newLogger(stderr, *logLevel, *logFormat).With("mode", modeSpare)
	spares := engine.NamesWith(func(f engine.Facts) bool { return f.SpareSlots })
	if !strings.HasPrefix(*assign, "/") || !slices.Contains(spares, engine.Name(*eng)) || fs.NArg() > 0 {
		fmt.Fprintf(stderr, "entrypoint spare: want -assign ABSOLUTE-FILE and -engine %s, and no argument\n", engine.List(spares))
		return exitUsage
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT)
	env := os.Environ()  // ownEnv's
	var handoff []string // what the restart learns of this spare
	if engine.Of(engine.Name(*eng)).KernelCheck {
		// What the restart would check first, done before it is assigned:
		// criu check fills its kernel-feature cache, which spares the
		// restore a probe of the kernel.
		cfg := &config{criuPrefix: imageCRIUPrefix, ckptTimeout: time.Minute}
		if _, _, err := newCRIU(context.Background(), cfg, log); err != nil {
			log.Error("criu cannot run in this container", "err", err)
			return exitSetup
		}
		handoff = append(handoff, "-criu-checked")
	}
	log.Info("spare: waiting for an assignment", "file", *assign, "engine", *eng)
	w := watchDirs(log, []string{filepath.Dir(*assign)}, watchSafety, watchFallback)
	var b []byte
	for b == nil {
		select {
		case <-w.C:
			if got, err := os.ReadFile(*assign); err == nil {
				b = got
			}
		case sig := <-sigs:
			w.stop()
			log.Info("spare released before any assignment", "signal", sig.String())
			return exitOK
		}
	}
	w.stop()
	assigned := time.Now()
	argv, cfg, err := assignment(b, engine.Name(*eng), stderr)
	if err != nil {
		log.Error("assignment refused", "err", err)
		return exitUsage
	}
	if !engine.Of(cfg.engine).DumpsFromOutside && cfg.user == "" {
		// The app runs as root without capabilities: nothing of this
		// container needs the user switch's.
		if err := dropCaps(capSetuid, capSetgid); err != nil {
			log.Error("drop the user switch's capabilities", "err", err)
			return exitSetup
		}
	}
	self, err := os.Executable()
	if err != nil {
		log.Error("find own binary", "err", err)
		return exitSetup
	}
	signal.Reset()
	log.Info("spare assigned", "args", argv)
	handoff = append(handoff, "-assigned-at", strconv.FormatInt(assigned.UnixNano(), 10))
	err = syscall.Exec(self, append(append([]string{self}, argv...), handoff...), env)
	log.Error("execute the assigned restart", "err", err)
	return exitSetup
}

// recordAssigned records phase "assigned" for a restart a spare became:
// the time it took to become it (from -assigned-at), up to its wait for
// the order.
func (s *supervisor) recordAssigned() {
	if s.cfg.assignedAt <= 0 {
		return
	}
	s.tm.record("assigned", 0, time.Unix(0, s.cfg.assignedAt), 0, nil)
	s.cfg.assignedAt = 0 // once: a recycled container serves again
}

// assignment reads an assignment (instancectl.AssignBody) and returns its
// arguments once they are a restart the restart mode accepts, of engine
// eng, that waits for its order and reads its root only then (-wait and
// -root-later, its root under the mount directory).
func assignment(b []byte, eng engine.Name, stderr io.Writer) ([]string, *config, error) {
	var body instancectl.AssignBody
	if err := json.Unmarshal(b, &body); err != nil {
		return nil, nil, fmt.Errorf("assignment: %w", err)
	}
	if len(body.Args) == 0 || body.Args[0] != modeRestart {
		return nil, nil, fmt.Errorf("assignment %q: want the arguments of a restart (restart [flags])", body.Args)
	}
	cfg, err := parseConfig(modeRestart, body.Args[1:], stderr)
	if err != nil {
		return nil, nil, fmt.Errorf("assignment: %w", err)
	}
	switch {
	case cfg.engine != eng:
		return nil, nil, fmt.Errorf("assignment: engine %s, but this spare was made for %s", cfg.engine, eng)
	case !cfg.rootLater || cfg.wait == "":
		return nil, nil, errors.New("assignment: want -wait and -root-later (the root is mounted before the order)")
	case !strings.HasPrefix(cfg.root, spareMnt) || filepath.Clean(cfg.ckpt) != spareCkpt:
		return nil, nil, fmt.Errorf("assignment: root %s must be under %s and checkpoint volume %s be %s, where the host mounts them", cfg.root, spareMnt, cfg.ckpt, spareCkpt)
	}
	return body.Args, cfg, nil
}

// spareMnt is where a spare's mount directory is bound (its root and
// checkpoint volume are under it).
const spareMnt = "/fog/mnt/"

// spareCkpt is a spare's checkpoint volume (runtime.SpareCkptPath): its
// mount directory's ckpt, bound where a container made for its app has
// its checkpoint, because DMTCP names the files it saved beside an image
// by their paths there.
const spareCkpt = "/fog/ckpt"
