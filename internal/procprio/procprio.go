// Package procprio lowers the CPU and I/O priority of a whole process, every
// thread of it, as deployment work needs beside the instances that serve
// users: the agent (and what it starts: rbd-fuse, CRIU's page server) runs
// at a background priority, the serving instances at the normal one.
//
// Linux keeps a nice value and an I/O priority per thread, and a new thread
// or child inherits its creator's, so lowering every thread of a process
// early lowers all it does afterwards. Containers get their weights from
// their cgroups instead (package cgroup). The I/O priority matters only
// under a scheduler that honours it (bfq); mq-deadline and none ignore it.
package procprio

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// Nice bounds: -20 is the highest priority, 19 the lowest; 0 is the default.
const (
	MinNice = -20
	MaxNice = 19
)

// I/O priority (ioprio_set(2)): the best-effort class, whose 8 levels run
// from 0 (highest) to 7 (lowest); level 4 is the default.
const (
	ioprioClassShift  = 13
	ioprioClassBE     = 2
	ioprioWhoProcess  = 1
	ioprioDefaultLvl  = 4
	ioprioLowestLevel = 7
)

// ErrInvalid wraps an out-of-range nice value.
var ErrInvalid = errors.New("invalid priority")

// Priority is the CPU and I/O priority of a process's threads.
type Priority struct {
	// Nice is the CPU nice value, MinNice to MaxNice.
	Nice int
	// IOLevel is the best-effort I/O level, 0 (highest) to 7 (lowest).
	IOLevel int
}

// Normal is every process's default; Background the lowest best-effort
// priority: work nobody waits for, beside servers that somebody does.
var (
	Normal     = Priority{Nice: 0, IOLevel: ioprioDefaultLvl}
	Background = Priority{Nice: 10, IOLevel: ioprioLowestLevel}
)

// Validate reports a value out of range.
func (p Priority) Validate() error {
	if p.Nice < MinNice || p.Nice > MaxNice {
		return fmt.Errorf("%w: nice %d: want %d to %d", ErrInvalid, p.Nice, MinNice, MaxNice)
	}
	if p.IOLevel < 0 || p.IOLevel > ioprioLowestLevel {
		return fmt.Errorf("%w: I/O level %d: want 0 to %d", ErrInvalid, p.IOLevel, ioprioLowestLevel)
	}
	return nil
}

// Set gives every thread of process pid priority p. Threads that end while
// it runs are skipped; it returns the first other error.
func Set(pid int, p Priority) error {
	if err := p.Validate(); err != nil {
		return err
	}
	tids, err := threads(pid)
	if err != nil {
		return err
	}
	for _, tid := range tids {
		if err := setThread(tid, p); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("priority of thread %d of process %d: %w", tid, pid, err)
		}
	}
	return nil
}

// Of reports the priority of process pid's main thread.
func Of(pid int) (Priority, error) {
	// getpriority(2) returns 20 - nice, so that it is never negative.
	v, err := unix.Getpriority(unix.PRIO_PROCESS, pid)
	if err != nil {
		return Priority{}, fmt.Errorf("nice of process %d: %w", pid, err)
	}
	r, _, errno := unix.Syscall(unix.SYS_IOPRIO_GET, ioprioWhoProcess, uintptr(pid), 0)
	if errno != 0 {
		return Priority{}, fmt.Errorf("I/O priority of process %d: %w", pid, errno)
	}
	level := int(r) & (1<<ioprioClassShift - 1)
	if int(r)>>ioprioClassShift == 0 { // no class set: derived from nice, (nice + 20) / 5
		level = (20 - v + 20) / 5
	}
	return Priority{Nice: 20 - v, IOLevel: level}, nil
}

func setThread(tid int, p Priority) error {
	if err := unix.Setpriority(unix.PRIO_PROCESS, tid, p.Nice); err != nil {
		return err
	}
	prio := ioprioClassBE<<ioprioClassShift | p.IOLevel
	if _, _, errno := unix.Syscall(unix.SYS_IOPRIO_SET, ioprioWhoProcess, uintptr(tid), uintptr(prio)); errno != 0 {
		return errno
	}
	return nil
}

func threads(pid int) ([]int, error) {
	ents, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	if err != nil {
		return nil, fmt.Errorf("threads of process %d: %w", pid, err)
	}
	tids := make([]int, 0, len(ents))
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}
