// Package activity tells whether an instance is in use: the CPU time of its processes, and the
// TCP connections established on its ports, read from /proc (no service, no capability beyond
// reading the node's /proc).
package activity

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ErrGone: the process is gone.
var ErrGone = errors.New("process gone")

// Sample is what an instance was doing at one moment.
type Sample struct {
	At time.Time
	// CPU is the CPU time its processes have used (user and system).
	CPU time.Duration
	// Connections is how many TCP connections are established on its
	// ports.
	Connections int
}

// ticks is the kernel's USER_HZ, in which /proc/PID/stat counts CPU time.
const ticks = 100

// Of samples the process tree of pid (pid and its descendants) and the
// TCP connections established, in pid's network namespace, on a local
// port among ports (none: every established connection counts).
func Of(pid int, ports []int) (Sample, error) {
	s := Sample{At: time.Now()}
	pids := append([]int{pid}, descendants(pid)...)
	for i, p := range pids {
		t, err := cpuOf(p)
		if err != nil {
			if i == 0 {
				return s, fmt.Errorf("pid %d: %w", pid, ErrGone)
			}
			continue // gone meanwhile
		}
		s.CPU += t
	}
	for _, f := range []string{"tcp", "tcp6"} {
		n, err := established(filepath.Join("/proc", strconv.Itoa(pid), "net", f), ports)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return s, err
		}
		s.Connections += n
	}
	return s, nil
}

// Idle reports whether, between samples a and b, there was no connection
// (at b) and the processes used at most cpuShare of one CPU.
func Idle(a, b Sample, cpuShare float64) bool {
	span := b.At.Sub(a.At)
	if b.Connections > 0 || span <= 0 {
		return false
	}
	return float64(b.CPU-a.CPU) <= cpuShare*float64(span)
}

// cpuOf is process pid's user and system time.
func cpuOf(pid int) (time.Duration, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	// The command may hold spaces and parentheses: fields start after
	// the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("pid %d: unreadable stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("pid %d: short stat", pid)
	}
	// After ')': state(0) ppid(1) ... utime(11) stime(12).
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("pid %d: %w", pid, err)
	}
	return time.Duration(ut+st) * time.Second / ticks, nil
}

// descendants lists the processes below pid.
func descendants(pid int) []int {
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p), "task", strconv.Itoa(p), "children"))
		if err != nil {
			continue
		}
		for _, c := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(c); err == nil {
				out = append(out, n)
				queue = append(queue, n)
			}
		}
	}
	return out
}

// established counts the ESTABLISHED sockets of a /proc/net/tcp table
// whose local port is among ports (every one if ports is empty).
func established(path string, ports []int) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 4 || fs[3] != "01" { // 01: TCP_ESTABLISHED
			continue
		}
		_, hexPort, ok := strings.Cut(fs[1], ":")
		if !ok {
			continue
		}
		port, err := strconv.ParseUint(hexPort, 16, 16)
		if err != nil {
			continue
		}
		if len(ports) == 0 || contains(ports, int(port)) {
			n++
		}
	}
	return n, sc.Err()
}

func contains(ports []int, p int) bool {
	for _, q := range ports {
		if q == p {
			return true
		}
	}
	return false
}
