// Package dmtcpctl is DMTCP's control protocol as fogdeploy speaks it: the
// private coordinator's listening socket and arguments, the arguments of
// dmtcp_launch and dmtcp_restart, the environment of a process under
// DMTCP, dmtcp_command's requests and answers, and the test that a
// checkpoint's image is complete.
//
// DMTCP is supervised in two places, each starting processes its own way:
// the host driver's engine (internal/engine, exec.Cmd in a sandbox) and the
// DMTCP container's entrypoint (PID 1, its own reaper). Both speak DMTCP
// through this package only.
//
// Implements, for DMTCP 4.2: dmtcp_coordinator --coord-port --ckptdir
// --tmpdir; dmtcp_launch -j; dmtcp_restart -j; dmtcp_command -s, -l, -c,
// -kc, -q.
package dmtcpctl

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Host is the coordinator's address: every coordinator listens on the
// loopback interface of its instance's network namespace.
const Host = "127.0.0.1"

// CoordFD is DMTCP's PROTECTED_COORD_FD: a coordinator that finds a
// listening socket on this descriptor uses it instead of binding 0.0.0.0
// itself (which would expose it on the instance's bridge address).
const CoordFD = 821

// RestartScript is written by the coordinator into the checkpoint
// directory as the last step of a checkpoint: with the images beside it, it
// marks an image as complete.
const RestartScript = "dmtcp_restart_script.sh"

// Binaries are the DMTCP programs a supervisor runs.
var Binaries = []string{"dmtcp_launch", "dmtcp_restart", "dmtcp_command", "dmtcp_coordinator", "mtcp_restart"}

// Requests of dmtcp_command.
const (
	Status         = "-s"  // NUM_PEERS= and RUNNING=
	List           = "-l"  // the peers, PROG[virtPID:realPID]@HOST
	Checkpoint     = "-c"  // checkpoint, the app runs on
	CheckpointKill = "-kc" // checkpoint, then kill the app
	Quit           = "-q"  // kill the peers and the coordinator
)

// ListenLoopback returns a listening TCP socket on 127.0.0.1 with a port the
// kernel chose, for CoordFD. The caller closes it once the coordinator has
// started.
func ListenLoopback() (*os.File, int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("coordinator socket: %w", err)
	}
	if err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err == nil {
		err = unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}})
	}
	if err == nil {
		err = unix.Listen(fd, 128)
	}
	var sa unix.Sockaddr
	if err == nil {
		sa, err = unix.Getsockname(fd)
	}
	in, ok := sa.(*unix.SockaddrInet4)
	if err == nil && !ok {
		err = fmt.Errorf("bound to %T, not IPv4", sa)
	}
	if err != nil {
		_ = unix.Close(fd)
		return nil, 0, fmt.Errorf("coordinator socket on %s: %w", Host, err)
	}
	return os.NewFile(uintptr(fd), "dmtcp-coordinator"), in.Port, nil
}

// Coordinator describes a private dmtcp_coordinator.
type Coordinator struct {
	// Port is the port of the socket handed over on CoordFD.
	Port int
	// CkptDir is where the peers write their images, as the coordinator
	// sees it; TmpDir its temporary directory.
	CkptDir, TmpDir string
	// LogFile, if set, receives its log.
	LogFile string
	// ExitOnLast ends it once its last peer is gone.
	ExitOnLast bool
}

// Args returns its arguments, after the program's name.
func (c Coordinator) Args() []string {
	args := []string{"--coord-port", strconv.Itoa(c.Port), "--ckptdir", c.CkptDir, "--tmpdir", c.TmpDir}
	if c.LogFile != "" {
		args = append(args, "--coord-logfile", c.LogFile)
	}
	if c.ExitOnLast {
		args = append(args, "--exit-on-last")
	} else {
		// A coordinator that outlives its app waits for the next launch.
		args = append(args, "--stale-timeout", "-1")
	}
	return append(args, "-q")
}

// Run describes where a launched or restarted app writes its images.
type Run struct {
	CkptDir, TmpDir string
	Gzip            bool
}

// LaunchArgs returns dmtcp_launch's arguments for app, after the program's
// name: it joins an existing coordinator (-j) and execs into the app.
func (r Run) LaunchArgs(app []string) []string {
	args := []string{"-j", "--ckptdir", r.CkptDir, "--tmpdir", r.TmpDir}
	if r.Gzip {
		args = append(args, "--gzip")
	} else {
		args = append(args, "--no-gzip")
	}
	return append(args, app...)
}

// RestartArgs returns dmtcp_restart's arguments for the images, named
// exactly (no glob), after the program's name.
func (r Run) RestartArgs(images []string) []string {
	return append([]string{"-j", "--ckptdir", r.CkptDir, "--tmpdir", r.TmpDir}, images...)
}

// CleanEnv returns env without locale variables and without any DMTCP_ or
// JALIB_ variable, plus LC_ALL=C: under DMTCP glibc would otherwise map its
// locale archive and gconv cache shared and the image record absolute paths
// to copies of them, so that it cannot move; apps run without DMTCP get the
// same locale.
func CleanEnv(env []string) []string {
	out := make([]string, 0, len(env)+6)
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if k == "LANG" || k == "LANGUAGE" || strings.HasPrefix(k, "LC_") ||
			strings.HasPrefix(k, "DMTCP_") || strings.HasPrefix(k, "JALIB_") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, "LC_ALL=C")
}

// Env returns CleanEnv(env) with what every process under DMTCP needs: the
// coordinator's address, the compression and JALIB_STDERR_PATH (else
// DMTCP's own errors vanish when stderr is a pipe).
func (r Run) Env(env []string, port int) []string {
	gzip := "0"
	if r.Gzip {
		gzip = "1"
	}
	return append(CleanEnv(env), "DMTCP_COORD_HOST="+Host, "DMTCP_COORD_PORT="+strconv.Itoa(port),
		"DMTCP_GZIP="+gzip, "DMTCP_TMPDIR="+r.TmpDir, "JALIB_STDERR_PATH=/dev/stderr")
}

// CommandArgs returns dmtcp_command's arguments for a request to the
// coordinator on port, after the program's name.
func CommandArgs(port int, request ...string) []string {
	return append([]string{"--coord-host", Host, "--coord-port", strconv.Itoa(port)}, request...)
}

// State is what dmtcp_command -s reports.
type State struct {
	Peers   int
	Running bool
}

// ParseStatus reads dmtcp_command -s output.
func ParseStatus(out string) State {
	var s State
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		if v, ok := strings.CutPrefix(l, "NUM_PEERS="); ok {
			s.Peers, _ = strconv.Atoi(strings.TrimSpace(v))
		}
		if v, ok := strings.CutPrefix(l, "RUNNING="); ok {
			s.Running = strings.TrimSpace(v) == "yes"
		}
	}
	return s
}

// listedPID matches the real PID in dmtcp_command -l output.
var listedPID = regexp.MustCompile(`\[\d+:(\d+)\]@`)

// ListedPIDs returns the real PIDs of the peers dmtcp_command -l lists.
func ListedPIDs(out string) []int {
	var pids []int
	for _, m := range listedPID.FindAllStringSubmatch(out, -1) {
		if pid, err := strconv.Atoi(m[1]); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// CheckpointCommandOK reports whether dmtcp_command's exit for a checkpoint
// request means the checkpoint runs: DMTCP 4.2 sends -kc as 'K' then 'c',
// and the 'c' finds the computation already checkpointing, so the command
// exits 2 with "checkpointed and killed". The image files are the real
// test (Complete).
func CheckpointCommandOK(request string, err error, out string) bool {
	return err == nil || (request == CheckpointKill && strings.Contains(out, "checkpointed and killed"))
}

// ErrIncomplete: the directory holds no complete image (yet).
var ErrIncomplete = errors.New("no complete DMTCP image")

// Images returns the checkpoint images (ckpt_*.dmtcp) in dir, sorted, as
// absolute paths if dir is.
func Images(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var images []string
	for _, e := range entries {
		if name := e.Name(); strings.HasPrefix(name, "ckpt_") && strings.HasSuffix(name, ".dmtcp") && e.Type().IsRegular() {
			images = append(images, filepath.Join(dir, name))
		}
	}
	sort.Strings(images)
	return images, nil
}

// Complete returns the images of dir once a checkpoint of peers processes
// is complete there: at least one image per peer (one at least), the
// restart script the coordinator writes last, and no image still being
// written (*.dmtcp.temp). It returns ErrIncomplete otherwise.
func Complete(dir string, peers int) ([]string, error) {
	images, err := Images(dir)
	if err != nil {
		return nil, err
	}
	if len(images) < max(peers, 1) {
		return nil, fmt.Errorf("%s: %d of %d images: %w", dir, len(images), max(peers, 1), ErrIncomplete)
	}
	if _, err := os.Lstat(filepath.Join(dir, RestartScript)); err != nil {
		return nil, fmt.Errorf("%s: no %s: %w", dir, RestartScript, ErrIncomplete)
	}
	if temp, _ := filepath.Glob(filepath.Join(dir, "*.dmtcp.temp")); len(temp) > 0 {
		return nil, fmt.Errorf("%s: %s still being written: %w", dir, filepath.Base(temp[0]), ErrIncomplete)
	}
	return images, nil
}
