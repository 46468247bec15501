package cgrouptest

import (
	"fmt"
	"sync"

	"github.com/fogdeploy/fogdeploy/internal/cgroup"
)

// Fake is a cgroup.Priority over weights kept in memory, for unit tests
// whose processes are fakes too (runtime.Fake's): a process exists while
// Alive says so (or once Add made it), in a cgroup of its own at the
// default weights (or Initial's) until Set, or in the root cgroup, whose
// weights it refuses to change as the kernel's hierarchy does. It passes
// Run (TestConformanceInMemory).
type Fake struct {
	// Initial, if set, gives the weights of a process that Set never
	// changed (those its container was created with); nil: the defaults.
	Initial func(pid int) cgroup.Weights
	// Alive, if set, says whether a process exists (runtime.Fake.Alive:
	// the main process of a running fake container).
	Alive func(pid int) bool
	// procs are the processes Add made: true for one of the root cgroup.
	procs map[int]bool

	mu   sync.Mutex
	w    map[int]cgroup.Weights
	lim  map[int]cgroup.Limits
	used map[int]int64
}

var (
	_ cgroup.Priority = (*Fake)(nil)
	_ cgroup.Limiter  = (*Fake)(nil)
)

// NewFake returns a Fake without processes.
func NewFake() *Fake {
	return &Fake{w: map[int]cgroup.Weights{}, lim: map[int]cgroup.Limits{}, procs: map[int]bool{}}
}

// Add makes process pid exist, in the root cgroup if root.
func (f *Fake) Add(pid int, root bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.procs[pid] = root
}

// pidMax is the kernel's highest pid_max.
const pidMax = 1 << 22

func (f *Fake) weights(pid int) (cgroup.Weights, error) {
	root, added := f.procs[pid]
	if pid <= 0 || pid > pidMax || !added && (f.Alive == nil || !f.Alive(pid)) {
		return cgroup.Weights{}, fmt.Errorf("process %d: %w", pid, cgroup.ErrNoProcess)
	}
	if root {
		return cgroup.Weights{}, fmt.Errorf("process %d is in the root cgroup: %w", pid, cgroup.ErrUnsupported)
	}
	if w, ok := f.w[pid]; ok {
		return w, nil
	}
	if f.Initial != nil {
		return f.Initial(pid), nil
	}
	return cgroup.Normal, nil
}

// Version implements cgroup.Priority.
func (f *Fake) Version() cgroup.Version { return cgroup.V2 }

// Set implements cgroup.Priority.
func (f *Fake) Set(pid int, w cgroup.Weights) (cgroup.Applied, error) {
	if err := w.Validate(); err != nil {
		return cgroup.Applied{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.weights(pid); err != nil {
		return cgroup.Applied{}, err
	}
	f.w[pid] = w
	return cgroup.Applied{CPU: true, IO: true}, nil
}

// Get implements cgroup.Priority.
func (f *Fake) Get(pid int) (cgroup.Weights, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.weights(pid)
}

// Describe implements cgroup.Priority.
func (f *Fake) Describe() string { return "cgroup v2: cpu.weight and io.weight (in memory)" }

// Limit implements cgroup.Limiter.
func (f *Fake) Limit(pid int, lim cgroup.Limits) error {
	if err := lim.Validate(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.weights(pid); err != nil {
		return err
	}
	if lim.MemoryBytes == 0 {
		lim.SwapBytes = 0
	}
	f.lim[pid] = lim
	return nil
}

// Limits implements cgroup.Limiter: a process Limit never bounded has no
// bound.
func (f *Fake) Limits(pid int) (cgroup.Limits, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.weights(pid); err != nil {
		return cgroup.Limits{}, err
	}
	return f.lim[pid], nil
}

// FakeMemoryUsed is what MemoryUsed reads of a process SetMemoryUsed
// never set.
const FakeMemoryUsed = 4 << 20

// SetMemoryUsed makes pid's cgroup use n bytes of memory.
func (f *Fake) SetMemoryUsed(pid int, n int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.used == nil {
		f.used = map[int]int64{}
	}
	f.used[pid] = n
}

// MemoryUsed implements cgroup.Limiter.
func (f *Fake) MemoryUsed(pid int) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.weights(pid); err != nil {
		return 0, err
	}
	if n, ok := f.used[pid]; ok {
		return n, nil
	}
	return FakeMemoryUsed, nil
}
