package main

import (
	"fmt"
	"log/slog"
	"sync"
	"syscall"
)

// reaper owns wait4(2) for the whole process: the entrypoint is PID 1, so
// every orphan of the container (a daemonising helper, a killed
// dmtcp_command) becomes its child and must be reaped. Children started
// through start get their status on a channel; all others are reaped and
// logged. Nothing else in the process may call wait.
type reaper struct {
	log     *slog.Logger
	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
}

func newReaper(log *slog.Logger) *reaper {
	return &reaper{log: log, waiters: map[int]chan syscall.WaitStatus{}}
}

// start forks and execs argv[0] and returns its pid and a channel that
// receives its wait status once. The lock is held across the fork so that
// reap cannot collect the child before it is registered.
func (r *reaper) start(argv []string, attr *syscall.ProcAttr) (int, <-chan syscall.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := syscall.ForkExec(argv[0], argv, attr)
	if err != nil {
		return 0, nil, fmt.Errorf("start %s: %w", argv[0], err)
	}
	ch := make(chan syscall.WaitStatus, 1)
	r.waiters[pid] = ch
	return pid, ch, nil
}

// reap collects every child that has exited; call it on SIGCHLD.
func (r *reaper) reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		r.mu.Lock()
		ch, ok := r.waiters[pid]
		delete(r.waiters, pid)
		r.mu.Unlock()
		if ok {
			ch <- ws
			continue
		}
		r.log.Debug("reaped orphan", "pid", pid, "status", exitStatus(ws))
	}
}

// exitStatus maps a wait status to a shell-style exit status.
func exitStatus(ws syscall.WaitStatus) int {
	switch {
	case ws.Exited():
		return ws.ExitStatus()
	case ws.Signaled():
		return exitSignalBase + int(ws.Signal())
	default:
		return exitSignalBase
	}
}
