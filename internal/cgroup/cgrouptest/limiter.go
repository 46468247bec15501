package cgrouptest

import (
	"errors"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/cgroup"
)

// LimiterHarness is one cgroup.Limiter under test.
type LimiterHarness struct {
	Limiter cgroup.Limiter
	// Process returns a process in a cgroup of its own (memory, pids and
	// cpu), which the test may bound; it goes away with the test.
	Process func(t *testing.T) int
	// HasSwap says whether the kernel accounts swap (v1 memsw, v2
	// memory.swap.max): where it does not, Limits reads no swap.
	HasSwap bool
	// Used, if set, is what the process's cgroup counts as used.
	Used int64
}

// RunLimiter runs the suite of cgroup.Limiter; newHarness is called once
// per subtest.
func RunLimiter(t *testing.T, newHarness func(t *testing.T) LimiterHarness) {
	t.Run("LimitThenRead", func(t *testing.T) {
		h := newHarness(t)
		pid := h.Process(t)
		// Bounded, raised (memory and swap grow past the bound before),
		// lowered, then no bound at all.
		for _, lim := range []cgroup.Limits{
			{MemoryBytes: 64 << 20, SwapBytes: 64 << 20, Pids: 100, CPUs: 0.5},
			{MemoryBytes: 512 << 20, SwapBytes: 512 << 20, Pids: 500, CPUs: 1.5},
			{MemoryBytes: 32 << 20, SwapBytes: 0, Pids: 50, CPUs: 0.25},
			{MemoryBytes: 48 << 20, SwapBytes: 16 << 20, Pids: 0, CPUs: 0},
			{},
		} {
			if err := h.Limiter.Limit(pid, lim); err != nil {
				t.Fatalf("Limit(%d, %+v): %v", pid, lim, err)
			}
			got, err := h.Limiter.Limits(pid)
			if err != nil {
				t.Fatalf("Limits(%d) after Limit(%+v): %v", pid, lim, err)
			}
			want := lim
			if !h.HasSwap {
				want.SwapBytes = 0
			}
			if got != want {
				t.Fatalf("after Limit(%+v), Limits = %+v; want %+v", lim, got, want)
			}
		}
	})
	t.Run("InvalidLimitsChangeNothing", func(t *testing.T) {
		h := newHarness(t)
		pid := h.Process(t)
		kept := cgroup.Limits{MemoryBytes: 96 << 20, Pids: 64, CPUs: 1}
		if err := h.Limiter.Limit(pid, kept); err != nil {
			t.Fatal(err)
		}
		for _, lim := range []cgroup.Limits{{MemoryBytes: -1}, {Pids: -2}, {CPUs: -0.5}, {CPUs: 0.001}, {SwapBytes: -1, MemoryBytes: 1 << 20}} {
			if err := h.Limiter.Limit(pid, lim); !errors.Is(err, cgroup.ErrInvalidLimits) {
				t.Fatalf("Limit(%+v) = %v, want ErrInvalidLimits", lim, err)
			}
		}
		if got, err := h.Limiter.Limits(pid); err != nil || got != kept {
			t.Fatalf("after refused Limits, Limits = %+v, %v; want %+v kept", got, err, kept)
		}
	})
	t.Run("MemoryUsed", func(t *testing.T) {
		h := newHarness(t)
		pid := h.Process(t)
		// What its cgroup uses is within the bound it runs under (a
		// process moved into a cgroup of its own after it started may
		// use none of it yet: its earlier pages stay counted where they
		// were).
		if err := h.Limiter.Limit(pid, cgroup.Limits{MemoryBytes: 256 << 20}); err != nil {
			t.Fatal(err)
		}
		if n, err := h.Limiter.MemoryUsed(pid); err != nil || n < 0 || n > 256<<20 {
			t.Fatalf("MemoryUsed(%d) = %d, %v; want at most its 256 MiB bound", pid, n, err)
		}
		if h.Used > 0 {
			if n, _ := h.Limiter.MemoryUsed(pid); n != h.Used {
				t.Errorf("MemoryUsed(%d) = %d; want the %d bytes its cgroup counts", pid, n, h.Used)
			}
		}
	})
	t.Run("NoProcess", func(t *testing.T) {
		h := newHarness(t)
		for _, pid := range []int{0, -4, 1 << 30} {
			if err := h.Limiter.Limit(pid, cgroup.Limits{Pids: 10}); !errors.Is(err, cgroup.ErrNoProcess) {
				t.Fatalf("Limit(%d) = %v, want ErrNoProcess", pid, err)
			}
			if _, err := h.Limiter.Limits(pid); !errors.Is(err, cgroup.ErrNoProcess) {
				t.Fatalf("Limits(%d) = %v, want ErrNoProcess", pid, err)
			}
			if _, err := h.Limiter.MemoryUsed(pid); !errors.Is(err, cgroup.ErrNoProcess) {
				t.Fatalf("MemoryUsed(%d) = %v, want ErrNoProcess", pid, err)
			}
		}
	})
}
