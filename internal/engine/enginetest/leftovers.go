package enginetest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// proc is one entry of /proc.
type proc struct {
	pid, ppid, pgrp int
	state, comm     string
	cmdline         string
}

func procs() map[int]proc {
	out := map[int]proc{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 3 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		pgrp, _ := strconv.Atoi(f[2])
		comm := ""
		if j := strings.IndexByte(s, '('); j >= 0 {
			comm = s[j+1 : i]
		}
		cl, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		out[pid] = proc{pid: pid, ppid: ppid, pgrp: pgrp, state: f[0], comm: comm,
			cmdline: strings.TrimSpace(strings.ReplaceAll(string(cl), "\x00", " "))}
	}
	return out
}

// descendants lists the processes below this test process.
func descendants() []proc {
	all := procs()
	self := os.Getpid()
	var out []proc
	for pid, p := range all {
		for q, hops := p, 0; q.ppid != 0 && hops < 64; hops++ {
			if q.ppid == self {
				if pid != self {
					out = append(out, p)
				}
				break
			}
			next, ok := all[q.ppid]
			if !ok {
				break
			}
			q = next
		}
	}
	return out
}

// eventually retries check for up to 10 s (exits and reaping take a moment).
func eventually(check func() []string) []string {
	deadline := time.Now().Add(10 * time.Second)
	for {
		bad := check()
		if len(bad) == 0 || time.Now().After(deadline) {
			return bad
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// assertNoLeftovers fails if any process (coordinator, app, criu, zombie)
// is still below the test process.
func assertNoLeftovers(t *testing.T) {
	t.Helper()
	bad := eventually(func() []string {
		var bad []string
		for _, p := range descendants() {
			bad = append(bad, fmt.Sprintf("%d [%s] (%s) ppid %d pgrp %d: %s", p.pid, p.state, p.comm, p.ppid, p.pgrp, p.cmdline))
		}
		return bad
	})
	if len(bad) > 0 {
		t.Errorf("processes left below the test:\n  %s", strings.Join(bad, "\n  "))
	}
}

// leftoverPort fails if a redis for port survived anywhere on the machine
// (a restored app re-parented to PID 1 would not be our descendant).
func leftoverPort(t *testing.T, port int) {
	t.Helper()
	needle := ":" + strconv.Itoa(port)
	bad := eventually(func() []string {
		var bad []string
		for _, p := range procs() {
			if strings.Contains(p.cmdline, "redis") && strings.Contains(p.cmdline, needle) {
				bad = append(bad, strconv.Itoa(p.pid)+" ["+p.state+"] "+p.cmdline)
			}
		}
		return bad
	})
	if len(bad) > 0 {
		t.Errorf("redis on port %d left running:\n  %s", port, strings.Join(bad, "\n  "))
	}
}

// leftoverMounts fails if the host's mount table mentions any of paths or
// the engines' in-root state directory.
func leftoverMounts(t *testing.T, paths ...string) {
	t.Helper()
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 5 {
			continue
		}
		mnt := f[4]
		if strings.Contains(mnt, ".fogdeploy") {
			t.Errorf("mount left on the host: %s", l)
		}
		for _, p := range paths {
			if p != "" && strings.HasPrefix(mnt, p) {
				t.Errorf("mount left on the host under %s: %s", p, l)
			}
		}
	}
}
