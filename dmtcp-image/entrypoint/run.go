package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/fogdeploy/fogdeploy/internal/instancectl"
)

// Exit statuses of the entrypoint itself. Otherwise it exits with the app's
// status (128+N when the app was killed by signal N), or 0 after a
// checkpoint with -after-checkpoint=exit.
const (
	exitOK           = 0
	exitUsage        = 2 // bad flags or arguments
	exitSetup        = 3 // mounts, coordinator or app start failed
	exitNoCheckpoint = 4 // restart found no complete checkpoint generation
	exitCheckpoint   = 5 // a requested checkpoint failed or timed out
	exitSignalBase   = 128
)

// Errors of the entrypoint, wrapped with the details.
var (
	// errNoCheckpoint: restart found no complete generation in /fog/ckpt.
	errNoCheckpoint = errors.New("no complete checkpoint")
	// errCheckpoint: a requested checkpoint failed or timed out.
	errCheckpoint = errors.New("checkpoint failed")
	// errNeedSysAdmin: a mount was refused for lack of a capability.
	errNeedSysAdmin = errors.New("mount not permitted: run the container with --cap-add SYS_ADMIN")
)

const usage = `usage:
  entrypoint launch  [flags] [--] APP [ARGS...]   run APP under DMTCP, chrooted into -root
  entrypoint restart [flags]                      restore the newest generation in -ckpt
  entrypoint boot    [flags] [--] APP [ARGS...]   run APP chrooted into -root with no checkpoint engine
  entrypoint check   -engine criu                 run criu check as a launch or restart would, and exit
  entrypoint spare   -assign FILE [-engine E]     wait for FILE to assign a restart, and become it
Send SIGUSR1 (docker kill -s USR1) or create -trigger to checkpoint into -ckpt/<gen>.
Run "entrypoint launch -h" for the flags.
`

// Main runs the entrypoint with the given arguments and returns its exit
// status.
func Main(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case modeKeep:
		return keep(args[1:])
	case modeNoCaps:
		return noCaps(args[1:])
	case modeRead:
		return readFiles(args[1:])
	case modeSpare:
		ownEnv()
		return spare(args[1:], os.Stderr)
	case modeLaunch, modeRestart, modeBoot, modeCheck:
	case "-h", "-help", "--help", "help":
		fmt.Fprint(os.Stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(os.Stderr, "entrypoint: unknown mode %q\n%s", args[0], usage)
		return exitUsage
	}
	ownEnv()
	cfg, err := parseConfig(args[0], args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "entrypoint %s: %v\n", args[0], err)
		return exitUsage
	}
	log := newLogger(os.Stderr, cfg.logLevel, cfg.logFormat)
	if cfg.mode == modeCheck {
		return checkEngine(cfg, log)
	}
	tw, closeTimings, err := openTimings(cfg.timings)
	if err != nil {
		log.Error("timings", "err", err)
		return exitSetup
	}
	defer closeTimings()
	if cfg.wait != "" && (cfg.timings == "" || cfg.timings == "-") {
		// A slot's host reads its timings from the control directory, a
		// file, rather than through the container's logs.
		ctl, closeCtl, err := openTimings(filepath.Join(filepath.Dir(cfg.wait), instancectl.Timings))
		if err != nil {
			log.Error("timings", "err", err)
			return exitSetup
		}
		defer closeCtl()
		tw = io.MultiWriter(tw, ctl)
	}
	s := newSupervisor(cfg, log, tw)
	return s.run()
}

func newLogger(w io.Writer, level, format string) *slog.Logger {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		lv = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: lv}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if strings.EqualFold(format, "json") {
		h = slog.NewJSONHandler(w, opts)
	}
	return slog.New(h).With("component", "dmtcp-entrypoint")
}

// ownPath is the entrypoint's PATH: the image's directories, whatever the
// container's environment says.
const ownPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// ownEnv empties the entrypoint's environment but for ownPath and
// LC_ALL=C: what runs as PID 1 and the engines it runs with the
// container's capabilities (criu, the coordinator, their tools found on
// PATH) read no variable that anyone but the image set. The app's
// variables come as -env flags, for the app alone.
func ownEnv() {
	os.Clearenv()
	_ = os.Setenv("PATH", ownPath)
	_ = os.Setenv("LC_ALL", "C")
}
