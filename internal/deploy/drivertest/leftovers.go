package drivertest

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/runtime"
)

// ContainerLeftovers is Harness.Leftovers for a driver whose instances are
// containers of rt: the containers labelled with the deployment, running
// or not.
func ContainerLeftovers(rt runtime.Runtime) func(t *testing.T, id string) []string {
	return func(t *testing.T, id string) []string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		sts, err := rt.List(ctx, map[string]string{runtime.LabelDeployment: id})
		if err != nil {
			t.Fatalf("list containers of %s: %v", id, err)
		}
		var out []string
		for _, st := range sts {
			out = append(out, fmt.Sprintf("container %s (%s)", st.Name, st.Status))
		}
		return out
	}
}

// ProcessLeftovers is Harness.Leftovers for a driver whose instances are
// processes below the test process (the Host driver's engines, their
// helpers and apps): the processes below it, zombies included, that were
// not there when ProcessLeftovers was called. The deployment is not told
// apart, so the suite's subtests, which run one after another, see only
// their own.
func ProcessLeftovers() func(t *testing.T, id string) []string {
	before := map[int]bool{}
	for _, p := range descendants() {
		before[p.pid] = true
	}
	return func(t *testing.T, id string) []string {
		var out []string
		for _, p := range descendants() {
			if !before[p.pid] {
				out = append(out, fmt.Sprintf("process %d [%s] %s", p.pid, p.state, p.cmdline))
			}
		}
		return out
	}
}

type proc struct {
	pid, ppid      int
	state, cmdline string
}

// descendants lists the processes below this one, from /proc.
func descendants() []proc {
	all := map[int]proc{}
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
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		cl, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		cmd := strings.TrimSpace(strings.ReplaceAll(string(cl), "\x00", " "))
		if cmd == "" {
			cmd = "(" + s[strings.IndexByte(s, '(')+1:i] + ")"
		}
		all[pid] = proc{pid: pid, ppid: ppid, state: f[0], cmdline: cmd}
	}
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
