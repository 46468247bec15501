// The private dmtcp_coordinator of each DMTCP instance: started in the instance's sandbox, asked
// for its peers and their state, and stopped with it.

package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/dmtcpctl"
)

// coordinator is a private dmtcp_coordinator.
type coordinator struct {
	cmd  *exec.Cmd
	port int
	done chan struct{}
	bin  string   // dmtcp_command
	log  *LogTail // its stderr
	// root, if set, is the app's root: the coordinator and dmtcp_command
	// run chrooted into it, holding no capability, so that the app finds
	// nothing of the node through their /proc/PID/root. The coordinator
	// then runs in PID and mount namespaces of its own (the app cannot
	// see it; its /proc, a copy of the sandbox's made before the app's
	// PID namespace mounted its own there, shows it itself), and mnt is
	// its mount namespace, which dmtcp_command joins and the checkpoint
	// directory is attached in too.
	root string
	mnt  *sandbox // nil without a root
}

// startCoordinator starts dmtcp_coordinator inside sb, listening on a
// 127.0.0.1 socket the engine made (handed over as fd 821).
func (d *DMTCP) startCoordinator(sb *sandbox, lay dmtcpLayout) (*coordinator, error) {
	info := *d.info
	c := &coordinator{bin: info.Binaries["dmtcp_command"], done: make(chan struct{}), log: NewLogTail(20), root: lay.root}
	err := sb.run(runOpts{alone: true, confine: c.root != "" && sb.confine}, func() error {
		l, port, err := dmtcpctl.ListenLoopback()
		if err != nil {
			return err
		}
		defer l.Close()
		c.port = port
		extra := make([]*os.File, dmtcpctl.CoordFD-2) // ExtraFiles[i] is fd 3+i
		extra[dmtcpctl.CoordFD-3] = l
		args := dmtcpctl.Coordinator{Port: port, CkptDir: lay.coordCkpt, TmpDir: lay.coordTmp, ExitOnLast: true}.Args()
		c.cmd = &exec.Cmd{
			Path:       info.Binaries["dmtcp_coordinator"],
			Args:       append([]string{"dmtcp_coordinator"}, args...),
			Env:        []string{"PATH=" + defaultPath, "LC_ALL=C"},
			Dir:        "/",
			Stdout:     nil, // only its "dmtcp> " prompts
			Stderr:     c.log,
			ExtraFiles: extra,
		}
		if c.root != "" {
			c.cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: c.root, Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS}
		}
		return c.cmd.Start()
	})
	if err != nil {
		return nil, fmt.Errorf("start dmtcp_coordinator: %w (%w)", ErrUnavailable, err)
	}
	if c.root != "" {
		names := []string{nsMnt}
		if sb.net != nil {
			names = append(names, nsNet)
		}
		var err error
		if c.mnt, err = sandboxOf(c.cmd.Process.Pid, names...); err != nil {
			_ = c.cmd.Process.Kill()
			_ = c.cmd.Wait()
			return nil, fmt.Errorf("start dmtcp_coordinator: %w", err)
		}
		c.mnt.confine = sb.confine
	}
	go func() {
		_ = c.cmd.Wait()
		c.mnt.close()
		close(c.done)
	}()
	return c, nil
}

func (c *coordinator) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// command runs dmtcp_command against the coordinator, inside sb.
func (c *coordinator) command(ctx context.Context, sb *sandbox, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, c.bin, dmtcpctl.CommandArgs(c.port, args...)...)
	cmd.Env = []string{"PATH=" + defaultPath, "LC_ALL=C"}
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = time.Second
	start := sb.do
	if c.mnt != nil {
		// In the coordinator's mount namespace, chrooted, outside the
		// app's PID namespace.
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: c.root}
		start = c.mnt.doConfined
	}
	if err := start(cmd.Start); err != nil {
		return "", err
	}
	err := cmd.Wait()
	return out.String(), err
}

// status asks the coordinator for its peers and whether they run.
func (c *coordinator) status(ctx context.Context, sb *sandbox) (dmtcpctl.State, error) {
	out, err := c.command(ctx, sb, dmtcpctl.Status)
	if err != nil {
		return dmtcpctl.State{}, fmt.Errorf("dmtcp_command -s: %w: %s", err, lastLine([]byte(strings.TrimSpace(out))))
	}
	return dmtcpctl.ParseStatus(out), nil
}

// stop ends the coordinator: it exits by itself once its last client is
// gone (--exit-on-last); otherwise dmtcp_command -q, then SIGKILL (it
// ignores SIGTERM).
func (c *coordinator) stop(d *DMTCP, sb *sandbox) {
	select {
	case <-c.done:
		return
	case <-time.After(2 * time.Second):
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.command(ctx, sb, dmtcpctl.Quit); err != nil {
		d.cfg.Logger.Debug("dmtcp_command -q", "err", err)
	}
	select {
	case <-c.done:
		return
	case <-time.After(2 * time.Second):
	}
	c.kill()
	<-c.done
}

func (c *coordinator) kill() {
	if c.cmd != nil && c.cmd.Process != nil && !c.exited() {
		_ = c.cmd.Process.Kill()
	}
}

// waitPeers waits until n processes have joined the coordinator and the
// computation runs, or the app exits.
func (d *DMTCP) waitPeers(ctx context.Context, p *process, sb *sandbox, c *coordinator, n int) error {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	var last error
	err := pollUntil(ctx, 10*time.Millisecond, p.done, func() (bool, error) {
		if c.exited() {
			return false, errors.New("dmtcp_coordinator exited")
		}
		st, err := c.status(ctx, sb)
		last = err
		return err == nil && st.Peers >= n && st.Running, nil
	})
	if errors.Is(err, ErrExited) {
		return fmt.Errorf("app exited with status %d before it joined the coordinator", p.code)
	}
	if err != nil && last != nil {
		return fmt.Errorf("%w (last status: %w)", err, last)
	}
	return err
}
