package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/instancectl"
)

// Modes of the entrypoint.
const (
	modeLaunch  = "launch"
	modeRestart = "restart"
	modeBoot    = "boot"   // run the app with no checkpoint engine
	modeCheck   = "check"  // can the engine run in this container? (criu check)
	modeKeep    = "keep"   // internal: the app's parent, see keeper.go
	modeNoCaps  = "nocaps" // internal: exec without capabilities, see keeper.go
	modeRead    = "read"   // internal: read files as their owner, see warm.go
)

// What to do once a checkpoint is complete.
const (
	afterExit     = "exit"
	afterContinue = "continue"
)

// config is the entrypoint's whole configuration: flags with defaults that
// match the container contract in dmtcp-image/README.md.
type config struct {
	mode         string
	root         string        // environment clone, the app's root
	ckpt         string        // checkpoint volume (same path inside the root)
	prefix       string        // installed DMTCP prefix (same path inside the root)
	gen          int           // generation to write; 0 = one past the newest
	from         int           // restart: generation to restore; 0 = newest complete
	ready        string        // host:port probed to report readiness; "" = none
	readySend    string        // sent on each probe connection (Go-quoted escapes allowed)
	readyExpect  string        // the reply must start with this
	readyHTTP    string        // path of an HTTP GET probe on ready ("" = none)
	readyStatus  int           // the GET's status that means ready (0 = any 2xx)
	readyTimeout time.Duration // how long the probe tries
	ckptTimeout  time.Duration // how long a checkpoint may take
	ckptDelay    time.Duration // wait between a checkpoint request and the checkpoint
	after        string        // afterExit or afterContinue
	trigger      string        // request file that starts a checkpoint
	timings      string        // JSON-lines timings file; "-" = stdout
	wait         string        // wait for this order file before starting the app ("" = start at once)
	workdir      string        // app's working directory inside the root
	user         string        // the app's user in the root ("" = root, without capabilities)
	logLevel     string
	logFormat    string
	engine       engine.Name // one of engine.Names
	criuPrefix   string      // installed CRIU prefix (engine criu)
	lazy         bool        // restart with CRIU's lazy pages
	sourceLater  bool        // restart: -from is read only once ordered (the host still fills it)
	rootLater    bool        // restart: nothing is read or prepared before the order (the host still mounts the root and fills the checkpoint volume)
	recycle      bool        // serve instance after instance (release, rearm)
	app          []string    // launch: the app's argv
	// appEnv is the app's environment (-env, repeated): data for the app
	// alone. The entrypoint's own environment is never the app's, and
	// nothing of it steers the entrypoint (ownEnv).
	appEnv []string
	// assignedAt (Unix nanoseconds) and criuChecked are set by a spare on
	// the restart it becomes (spare.go): when it read its assignment, and
	// that it ran criu check in this container already.
	assignedAt  int64
	criuChecked bool
}

// The prefixes of the engines in the image, written into the binary when
// the image is built (dmtcp-image/build.sh: -ldflags -X): the image's
// own facts, which no variable of the container can change.
var (
	imageDMTCPPrefix = "/opt/dmtcp"
	imageCRIUPrefix  = "/opt/criu"
)

func parseConfig(mode string, args []string, stderr io.Writer) (*config, error) {
	c := &config{mode: mode}
	fs := flag.NewFlagSet(mode, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.root, "root", "/fog/root", "environment clone to use as the app's root")
	fs.StringVar(&c.ckpt, "ckpt", "/fog/ckpt", "checkpoint directory (generations are subdirectories 1, 2, ...)")
	fs.StringVar(&c.prefix, "prefix", imageDMTCPPrefix, "installed DMTCP prefix")
	fs.IntVar(&c.gen, "gen", 0, "generation to write at checkpoint (0: one past the newest)")
	fs.IntVar(&c.from, "from", 0, "restart: generation to restore (0: newest complete)")
	fs.StringVar(&c.ready, "ready", "", "TCP address inside the container whose first accepted connection marks the app ready")
	fs.StringVar(&c.readySend, "ready-send", "", `bytes to send on each -ready connection, e.g. "PING\r\n" (\r \n \t escapes allowed)`)
	fs.StringVar(&c.readyExpect, "ready-expect", "", `the app is ready once a -ready reply starts with this, e.g. "+PONG"`)
	fs.StringVar(&c.readyHTTP, "ready-http", "", "path of an HTTP/1.0 GET sent on each -ready connection; the app is ready once it answers -ready-status")
	fs.IntVar(&c.readyStatus, "ready-status", 0, "with -ready-http: the status that means ready (0: any 2xx)")
	fs.DurationVar(&c.readyTimeout, "ready-timeout", 2*time.Minute, "how long to probe -ready")
	fs.DurationVar(&c.ckptTimeout, "checkpoint-timeout", 5*time.Minute, "how long a checkpoint may take")
	fs.DurationVar(&c.ckptDelay, "checkpoint-delay", 0, "wait this long after a checkpoint request before checkpointing (the app finishes closing connections meanwhile)")
	fs.StringVar(&c.after, "after-checkpoint", afterExit, "exit (the checkpoint stops the app; exit 0) or continue (keep running; a later checkpoint rewrites the same generation)")
	fs.StringVar(&c.trigger, "trigger", "", "file whose appearance requests a checkpoint (default: <ckpt>/checkpoint.request)")
	fs.StringVar(&c.wait, "wait", "", "prepare everything (root, coordinator), then wait for this file to appear before starting the app: a pre-started slot; its JSON content names the instance")
	fs.StringVar(&c.timings, "timings", "-", "where phase timings go as JSON lines: a file, or - for stdout")
	fs.StringVar(&c.workdir, "workdir", "/", "app's working directory inside the root")
	fs.StringVar(&c.user, "user", "", "run the app as this user of the root (NAME, UID, NAME:GROUP or UID:GID); needs CAP_SETUID and CAP_SETGID in the container")
	fs.StringVar((*string)(&c.engine), "engine", string(engine.Default()), "checkpoint engine: dmtcp (a coordinator in the container) or criu (criu dump and criu restore run by this process; needs the capabilities of runtime.CRIUCapabilities)")
	fs.StringVar(&c.criuPrefix, "criu-prefix", imageCRIUPrefix, "installed CRIU prefix (engine criu)")
	fs.BoolVar(&c.lazy, "lazy", false, "restart: with engine criu, restore with lazy pages (the app runs before all its memory is in)")
	fs.BoolVar(&c.sourceLater, "source-later", false, "restart with -wait and -from: generation -from is whole only once the order is given (the host is still copying it), so it is read after the order")
	fs.BoolVar(&c.rootLater, "root-later", false, "restart with -wait: the root and the checkpoint volume are ready only once the order is given (the host still mounts the root, under a directory bound with slave propagation, and fills the volume), so the root is prepared and the generation read after the order")
	fs.BoolVar(&c.recycle, "recycle", false, "restart with -wait: on -wait's directory's release file, end the app and wait for its rearm file to serve the next order in the same container (the root must be a mount the host resets meanwhile, seen through slave propagation)")
	fs.Func("env", "KEY=VALUE of the app's environment (repeat it); the app gets no other variable of the container's", func(kv string) error {
		if err := checkEnvVar(kv); err != nil {
			return err
		}
		c.appEnv = append(c.appEnv, kv)
		return nil
	})
	fs.Int64Var(&c.assignedAt, "assigned-at", 0, "internal: when a spare read the assignment this restart is (Unix nanoseconds)")
	fs.BoolVar(&c.criuChecked, "criu-checked", false, "internal: a spare ran criu check in this container before it became this restart")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.logFormat, "log-format", "text", "text or json (logs go to stderr)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	c.app = fs.Args()
	c.readySend, c.readyExpect = unescape(c.readySend), unescape(c.readyExpect)
	if c.trigger == "" {
		c.trigger = filepath.Join(c.ckpt, instancectl.CheckpointRequest)
	}
	return c, c.validate()
}

func (c *config) validate() error {
	var errs []error
	takesApp := c.mode == modeLaunch || c.mode == modeBoot
	if takesApp && len(c.app) == 0 {
		errs = append(errs, fmt.Errorf("%s needs the app's command after the flags (%s [flags] -- app args...)", c.mode, c.mode))
	}
	if takesApp && len(c.app) > 0 && strings.HasPrefix(c.app[0], "-") {
		errs = append(errs, fmt.Errorf("app %q looks like a flag: put the entrypoint's flags before the app", c.app[0]))
	}
	if c.mode == modeRestart && len(c.app) > 0 {
		errs = append(errs, fmt.Errorf("restart takes no command (got %q): the app comes from the checkpoint image", c.app))
	}
	if c.after != afterExit && c.after != afterContinue {
		errs = append(errs, fmt.Errorf("-after-checkpoint %q: want %s or %s", c.after, afterExit, afterContinue))
	}
	if c.ckptDelay < 0 || c.ckptDelay > time.Minute {
		errs = append(errs, fmt.Errorf("-checkpoint-delay %s: want 0 to 1m", c.ckptDelay))
	}
	if c.readyHTTP != "" && (!strings.HasPrefix(c.readyHTTP, "/") || strings.ContainsAny(c.readyHTTP, " \r\n")) {
		errs = append(errs, fmt.Errorf("-ready-http %q: want a path that starts with / and has no space or line break", c.readyHTTP))
	}
	if c.readyHTTP != "" && (c.readySend != "" || c.readyExpect != "") {
		errs = append(errs, errors.New("-ready-http makes its own request: drop -ready-send and -ready-expect"))
	}
	if c.readyStatus != 0 && (c.readyStatus < 100 || c.readyStatus > 599 || c.readyHTTP == "") {
		errs = append(errs, fmt.Errorf("-ready-status %d: want 100 to 599, with -ready-http", c.readyStatus))
	}
	if c.gen < 0 || c.from < 0 {
		errs = append(errs, errors.New("-gen and -from must be >= 0"))
	}
	if c.wait != "" && (!strings.HasPrefix(c.wait, "/") || strings.HasSuffix(c.wait, "/")) {
		errs = append(errs, fmt.Errorf("-wait %q: want the absolute path of a file", c.wait))
	}
	if c.recycle && (c.mode != modeRestart || c.wait == "") {
		errs = append(errs, errors.New("-recycle is for restart with -wait: drop -recycle"))
	}
	if c.sourceLater && (c.mode != modeRestart || c.wait == "" || c.from == 0) {
		errs = append(errs, errors.New("-source-later is for restart with -wait and -from: drop -source-later"))
	}
	if c.rootLater && (c.mode != modeRestart || c.wait == "") {
		errs = append(errs, errors.New("-root-later is for restart with -wait: drop -root-later"))
	}
	if f, ok := engine.Lookup(c.engine); !ok {
		errs = append(errs, fmt.Errorf("-engine %q: want %s", c.engine, engine.List(engine.Names())))
	} else {
		if c.lazy && !f.LazyRestore {
			errs = append(errs, fmt.Errorf("-lazy needs an engine with lazy restore (%s): %s has none", engine.List(engine.NamesWith(func(f engine.Facts) bool { return f.LazyRestore })), c.engine))
		}
		if c.lazy && c.mode != modeRestart {
			errs = append(errs, errors.New("-lazy is for restart only"))
		}
		if f.DumpsFromOutside && c.after == afterContinue {
			errs = append(errs, fmt.Errorf("-after-checkpoint continue: %s's dump stops the app; use exit", c.engine))
		}
	}
	for name, p := range map[string]string{"-root": c.root, "-ckpt": c.ckpt, "-prefix": c.prefix, "-workdir": c.workdir, "-criu-prefix": c.criuPrefix} {
		if !strings.HasPrefix(p, "/") {
			errs = append(errs, fmt.Errorf("%s %q must be an absolute path", name, p))
		}
	}
	return errors.Join(errs...)
}

// checkEnvVar checks one KEY=VALUE of the app's environment: a key that
// is not empty and holds neither "=" nor a NUL byte, and a value without
// a NUL byte.
func checkEnvVar(kv string) error {
	k, _, ok := strings.Cut(kv, "=")
	switch {
	case !ok || k == "":
		return fmt.Errorf("-env %q: want KEY=VALUE", kv)
	case strings.ContainsRune(kv, 0):
		return fmt.Errorf("-env %q: a NUL byte cannot be in an environment variable", k)
	}
	return nil
}

// unescape turns the escapes \r, \n, \t and \\ into their bytes.
func unescape(s string) string {
	return strings.NewReplacer(`\\`, `\`, `\r`, "\r", `\n`, "\n", `\t`, "\t").Replace(s)
}
