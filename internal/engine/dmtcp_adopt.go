// A DMTCP restore of an app whose parent was PID 1 at checkpoint time: dmtcp_restart double-forks and
// exits, and the engine, a child subreaper, adopts the restored app.

package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/dmtcpctl"
	"golang.org/x/sys/unix"
)

// adoption hands the app adopted after a forking dmtcp_restart to kill,
// which may run before or after it is found.
type adoption struct {
	mu     sync.Mutex
	app    *os.Process
	killed bool
	once   sync.Once
	done   chan struct{}
}

func (a *adoption) finish(app *os.Process) {
	a.mu.Lock()
	a.app = app
	if app != nil && a.killed {
		_ = app.Kill()
	}
	a.mu.Unlock()
	a.once.Do(func() { close(a.done) })
}

func (a *adoption) kill() {
	a.mu.Lock()
	a.killed = true
	if a.app != nil {
		_ = a.app.Kill()
	}
	a.mu.Unlock()
}

// reapGroup reaps the zombie children of ours in process group pgid: the
// intermediate process of dmtcp_restart's double fork is re-parented to us
// and nobody else would wait for it. dmtcp_restart runs in its own group,
// so this touches nothing else.
func reapGroup(pgid int) {
	for _, pid := range childrenOf(os.Getpid()) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:]) // state ppid pgrp ...
		if len(f) < 3 || f[0] != "Z" || f[2] != strconv.Itoa(pgid) || pid == pgid {
			continue
		}
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	}
}

// adopt finds the app that a forking dmtcp_restart left behind: a process
// the coordinator lists (dmtcp_command -l prints PROG[virtPID:realPID])
// once it has been re-parented to self (us, or the init of its PID
// namespace). The intermediate process of the double
// fork is our child for a moment too, so the coordinator is the authority.
func (d *DMTCP) adopt(p *process, c *coordinator, self string) (*os.Process, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var last string
	for ctx.Err() == nil {
		out, err := c.command(ctx, p.sb, dmtcpctl.List)
		last = strings.TrimSpace(out)
		if err == nil {
			for _, pid := range dmtcpctl.ListedPIDs(out) {
				if ppid, err := procStatus(pid, "PPid"); err == nil && ppid == self {
					return os.FindProcess(pid)
				}
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil, fmt.Errorf("dmtcp_restart forked but no restored app was re-parented to pid %s (coordinator lists: %s): %w",
		self, last, ErrRestore)
}

// waitExit waits until process pid, which is not our child, has exited
// (its pidfd becomes readable).
func waitExit(pid int) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("watch pid %d: %w", pid, err)
	}
	defer unix.Close(fd)
	for {
		_, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, -1)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
