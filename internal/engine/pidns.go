// The app's own PID namespace under a placeholder init (CRIU: every restored app, and a launched
// one in a root): the app sees its own processes and the init, nothing of the agent's.

package engine

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"

	"github.com/fogdeploy/fogdeploy/internal/procfs"
)

// initScript is the placeholder init of an app's PID namespace: it
// mounts the namespace's /proc on the sandbox's (criu, which runs in
// there, needs it; only a process inside can mount it) and on the app
// root's ($1), with the kernel's control surface hidden (procfs.Script),
// sets the namespace's last PID if asked ($2; only a process inside can),
// says so, and sleeps until the engine kills it.
var initScript = `set -e
mount -t proc proc /proc
if [ "$2" != 0 ]; then echo "$2" > /proc/sys/kernel/ns_last_pid; fi
if [ "$1" != - ]; then
  PROC="$1/proc"
  mount -t proc proc "$PROC"
` + procfs.Script() + `fi
echo ready
exec sleep infinity`

// pidInit says how the placeholder init sets up its namespace.
type pidInit struct {
	sh      string // the shell it runs in
	root    string // the app's root, "" for none
	lastPID int    // if not 0, the namespace's PIDs start above it
}

// startPIDInit starts the placeholder init of a new PID namespace in the
// sandbox and waits until it has mounted its /proc. Processes started
// through do afterwards are born in its namespace, and the init's death
// kills them.
func (sb *sandbox) startPIDInit(ctx context.Context, in pidInit) (*exec.Cmd, error) {
	root := in.root
	if root == "" {
		root = "-"
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	var stderr bytes.Buffer
	cmd := &exec.Cmd{
		Path:   in.sh,
		Args:   []string{"sh", "-c", initScript, "init", root, strconv.Itoa(in.lastPID)},
		Env:    []string{"PATH=" + defaultPath},
		Dir:    "/",
		Stdout: w,
		Stderr: &stderr,
		// An IPC namespace of its own too, which a launched app joins
		// (sandbox.doConfined): criu dumps System V IPC (PostgreSQL's
		// shared memory segment) only from an IPC namespace other than
		// its own.
		SysProcAttr: &syscall.SysProcAttr{Setsid: true, Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWIPC},
	}
	err = sb.do(cmd.Start)
	w.Close()
	if err != nil {
		return nil, fmt.Errorf("start pid namespace init: %w", err)
	}
	fail := func(err error) (*exec.Cmd, error) {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, err
	}
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(r).ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		if strings.TrimSpace(s) != "ready" {
			return fail(fmt.Errorf("pid namespace init failed: %s", strings.TrimSpace(stderr.String())))
		}
	case <-ctx.Done():
		return fail(ctx.Err())
	}
	ns, err := sandboxOf(cmd.Process.Pid, nsPID, nsIPC)
	if err != nil {
		return fail(err)
	}
	sb.setPidNS(ns.pid, ns.ipc) // handed over: ns is not closed
	return cmd, nil
}
