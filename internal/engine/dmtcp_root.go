// What a DMTCP instance in a root needs beyond the engine's binaries: the
// host tools, the PID namespace's init, the wrapper that starts DMTCP in
// there, and the checkpoint directory attached where both the app and the
// coordinator write.

package engine

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/hint"
)

// dmtcpTools are the host programs an instance in a root needs: sh for
// the placeholder init of its PID namespace, and a static busybox bound
// into the root as the parent of dmtcp_launch and dmtcp_restart there
// (DMTCP fails to start a process whose parent is outside its PID
// namespace: "Unable to open /proc/self/stat").
type dmtcpTools struct {
	sh, busybox string
	err         error // why they are missing
}

// findDMTCPTools looks the tools up on PATH.
func findDMTCPTools() dmtcpTools {
	var t dmtcpTools
	var err error
	if t.sh, err = exec.LookPath("sh"); err != nil {
		t.err = fmt.Errorf("dmtcp engine in a root needs sh on PATH: %w", ErrUnavailable)
		return t
	}
	if t.busybox, err = exec.LookPath("busybox"); err != nil || !staticELF(t.busybox) {
		t.err = hint.With(fmt.Errorf("dmtcp engine in a root needs a static busybox on PATH (found %q): %w", t.busybox, ErrUnavailable),
			"install busybox-static")
	}
	return t
}

// staticELF reports whether path is an ELF executable without a program
// interpreter, which runs in any root.
func staticELF(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}

// wrapperScript runs its arguments as a child and exits with its status:
// the parent of dmtcp_launch and dmtcp_restart inside the app's PID
// namespace.
const wrapperScript = `"$@" & wait $!`

// attach mounts the checkpoint directory dir where the app writes its
// image, in the sandbox and, in a root, in the coordinator's mount
// namespace, where it writes the restart script.
func (p *dmtcpProc) attach(dir string) error {
	if err := p.sb.attach(dir, p.ckptDir); err != nil {
		return err
	}
	if p.coord.mnt != nil {
		if err := p.coord.mnt.attach(dir, p.ckptDir); err != nil {
			_ = p.sb.detach(p.ckptDir)
			return err
		}
	}
	return nil
}

// detach undoes attach.
func (p *dmtcpProc) detach() {
	_ = p.sb.detach(p.ckptDir)
	if p.coord.mnt != nil {
		_ = p.coord.mnt.detach(p.ckptDir)
	}
}

// initPid is the host pid of the PID namespace's init ("" without one).
func (p *dmtcpProc) initPid() string {
	if p.init == nil || p.init.Process == nil {
		return ""
	}
	return strconv.Itoa(p.init.Process.Pid)
}

// killInit kills the placeholder init of p's PID namespace, if any: the
// kernel then kills every process left in there.
func (p *dmtcpProc) killInit() {
	if p.init != nil && p.init.Process != nil {
		_ = p.init.Process.Kill()
	}
}

// endInit kills the init and waits for it.
func (p *dmtcpProc) endInit() {
	if p.init != nil && p.init.Process != nil {
		_ = p.init.Process.Kill()
		_ = p.init.Wait()
	}
}

// startApp starts cmd (dmtcp_launch or dmtcp_restart) in p's sandbox and
// returns the app's pid. In a root, cmd runs chrooted in the app's PID
// namespace (confined, with Config.Confine) as the child of the busybox
// wrapper (wrapperScript): the pid is the wrapper's child, which execs
// into the app.
func (p *dmtcpProc) startApp(ctx context.Context, lay dmtcpLayout, cmd *exec.Cmd) (int, error) {
	if lay.sh == "" {
		if err := p.sb.do(cmd.Start); err != nil {
			return 0, err
		}
		return cmd.Process.Pid, nil
	}
	cmd.Args = append([]string{"sh", "-c", wrapperScript, "sh", cmd.Path}, cmd.Args[1:]...)
	cmd.Path = lay.sh
	if err := p.sb.doConfined(cmd.Start); err != nil {
		return 0, err
	}
	var pid int
	err := pollUntil(ctx, time.Millisecond, nil, func() (bool, error) {
		if kids := kernelChildren(cmd.Process.Pid); len(kids) > 0 {
			pid = kids[0]
			return true, nil
		}
		if st, err := procStatus(cmd.Process.Pid, "State"); err != nil || strings.HasPrefix(st, "Z") {
			return false, errors.New("the wrapper exited before it started its child")
		}
		return false, nil
	})
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return 0, err
	}
	return pid, nil
}

// prepare makes p's sandbox, starts its coordinator and (in a root) its
// PID namespace's init, and opens its output.
func (d *DMTCP) prepare(ctx context.Context, p *dmtcpProc, lay dmtcpLayout, netNS bool, stdout, stderr io.Writer) (err error) {
	if p.sb, err = newSandbox(lay.sandboxSpec(netNS, d.cfg.Confine)); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	// The coordinator first, outside the app's PID namespace (in a root,
	// in one of its own): the app cannot see it.
	if p.coord, err = d.startCoordinator(p.sb, lay); err != nil {
		return err
	}
	if lay.root != "" {
		// The app's own PID namespace: it sees its processes, the
		// wrapper and the init, nothing of the agent's.
		if p.init, err = p.sb.startPIDInit(ctx, pidInit{sh: d.tools.sh, root: lay.root}); err != nil {
			return err
		}
	}
	p.out, err = newOutput(stdout, stderr)
	return err
}
