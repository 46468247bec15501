// Package cgrouptest is the conformance suite of cgroup.Priority: every
// implementation passes it, on the real hierarchy of the machine and on
// file trees that stand for the other version.
package cgrouptest

import (
	"errors"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/cgroup"
)

// Harness is one implementation under test.
type Harness struct {
	Priority cgroup.Priority
	// Process returns a process in a cgroup of its own, which the test
	// may reweight; it goes away with the test.
	Process func(t *testing.T) int
	// RootProcess returns a process of the root cgroup.
	RootProcess func(t *testing.T) int
	// HasIO says whether the hierarchy has an I/O weight.
	HasIO bool
}

// Run runs the suite; newHarness is called once per subtest.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Run("SetThenGet", func(t *testing.T) {
		h := newHarness(t)
		pid := h.Process(t)
		for _, w := range []cgroup.Weights{cgroup.Background, {CPU: 200, IO: 150}, cgroup.Normal} {
			a, err := h.Priority.Set(pid, w)
			if err != nil {
				t.Fatalf("Set(%d, %+v): %v", pid, w, err)
			}
			if !a.CPU {
				t.Fatalf("Set(%+v) did not apply the CPU weight: %+v", w, a)
			}
			if a.IO != h.HasIO {
				t.Fatalf("Set(%+v) applied the I/O weight: %v, want %v", w, a.IO, h.HasIO)
			}
			got, err := h.Priority.Get(pid)
			if err != nil {
				t.Fatal(err)
			}
			if got.CPU != w.CPU {
				t.Fatalf("after Set(%+v), CPU weight %d, want %d", w, got.CPU, w.CPU)
			}
			if h.HasIO && got.IO != w.IO {
				t.Fatalf("after Set(%+v), I/O weight %d, want %d", w, got.IO, w.IO)
			}
			if !h.HasIO && got.IO != 0 {
				t.Fatalf("no I/O weight here, but Get says %d", got.IO)
			}
		}
	})
	t.Run("InvalidWeightChangesNothing", func(t *testing.T) {
		h := newHarness(t)
		pid := h.Process(t)
		if _, err := h.Priority.Set(pid, cgroup.Weights{CPU: 300, IO: 300}); err != nil {
			t.Fatal(err)
		}
		for _, w := range []cgroup.Weights{{CPU: 0, IO: 100}, {CPU: 100, IO: 10001}, {CPU: -1, IO: -1}} {
			if _, err := h.Priority.Set(pid, w); !errors.Is(err, cgroup.ErrInvalidWeight) {
				t.Fatalf("Set(%+v) = %v, want ErrInvalidWeight", w, err)
			}
		}
		if got, err := h.Priority.Get(pid); err != nil || got.CPU != 300 {
			t.Fatalf("after refused Sets, Get = %+v, %v; want CPU 300 kept", got, err)
		}
	})
	t.Run("NoProcess", func(t *testing.T) {
		h := newHarness(t)
		for _, pid := range []int{0, -4, 1 << 30} {
			if _, err := h.Priority.Set(pid, cgroup.Normal); !errors.Is(err, cgroup.ErrNoProcess) {
				t.Fatalf("Set(%d) = %v, want ErrNoProcess", pid, err)
			}
			if _, err := h.Priority.Get(pid); !errors.Is(err, cgroup.ErrNoProcess) {
				t.Fatalf("Get(%d) = %v, want ErrNoProcess", pid, err)
			}
		}
	})
	t.Run("RootCgroupRefused", func(t *testing.T) {
		h := newHarness(t)
		pid := h.RootProcess(t)
		if pid <= 0 {
			t.Fatal("the harness gives no process of the root cgroup")
		}
		if _, err := h.Priority.Set(pid, cgroup.Background); !errors.Is(err, cgroup.ErrUnsupported) {
			t.Fatalf("Set on a root-cgroup process = %v, want ErrUnsupported", err)
		}
	})
	t.Run("Describe", func(t *testing.T) {
		h := newHarness(t)
		d := h.Priority.Describe()
		if !strings.HasPrefix(d, "cgroup "+string(h.Priority.Version())+": ") {
			t.Fatalf("Describe() = %q, want it to start with the version", d)
		}
		if strings.Contains(d, "no I/O weight") == h.HasIO {
			t.Fatalf("Describe() = %q, but HasIO is %v", d, h.HasIO)
		}
	})
}
