package enginetest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

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
		for _, p := range testenv.Descendants() {
			bad = append(bad, fmt.Sprintf("%d [%s] (%s) ppid %d pgrp %d: %s", p.PID, p.State, p.Comm, p.PPID, p.PGRP, p.Cmdline))
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
		for _, p := range testenv.Procs() {
			if strings.Contains(p.Cmdline, "redis") && strings.Contains(p.Cmdline, needle) {
				bad = append(bad, strconv.Itoa(p.PID)+" ["+p.State+"] "+p.Cmdline)
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
