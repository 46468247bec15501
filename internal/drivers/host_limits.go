// The limits of the host driver's instances: a cgroup each, and the
// open-files limit of every process of the app's PID namespace.

package drivers

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/cgroup"
	"github.com/fogdeploy/fogdeploy/internal/engine"
)

// limit makes the cgroup of run r's instance, whose app is process pid,
// and moves every process of the app's PID namespace into it, until a
// pass finds none outside (a process forked meanwhile by one not yet
// moved is moved by the next pass; one forked later is born inside). Each
// also gets the open-files limit.
func limit(gs cgroup.Groups, r Run, pid int) (cgroup.Group, error) {
	lim := r.App.LimitsOver(r.Limits)
	g, err := gs.Create(r.ID, cgroup.Limits{MemoryBytes: lim.MemoryBytes, Pids: lim.Pids, CPUs: lim.CPUs})
	if err != nil {
		return nil, fmt.Errorf("limits of host instance %s: %w", r.ID, err)
	}
	moved := map[int]bool{}
	for pass := 0; ; pass++ {
		fresh := 0
		for _, p := range engine.InPIDNamespace(pid) {
			if moved[p] {
				continue
			}
			if err := g.Add(p); err != nil && !errors.Is(err, cgroup.ErrNoProcess) {
				return g, fmt.Errorf("limits of host instance %s: %w", r.ID, err)
			}
			if lim.OpenFiles > 0 {
				rl := unix.Rlimit{Cur: lim.OpenFiles, Max: lim.OpenFiles}
				if err := unix.Prlimit(p, unix.RLIMIT_NOFILE, &rl, nil); err != nil && !errors.Is(err, unix.ESRCH) {
					return g, fmt.Errorf("limit the open files of pid %d of host instance %s: %w", p, r.ID, err)
				}
			}
			moved[p] = true
			fresh++
		}
		if fresh == 0 {
			return g, nil
		}
		if pass == 20 {
			return g, fmt.Errorf("limits of host instance %s: its processes kept forking while they were moved", r.ID)
		}
	}
}

// removeGroup removes the instance's cgroup once its processes are gone
// (after the app's end, which the engine reports once the app's PID
// namespace is torn down), once.
func (in *hostInst) removeGroup() {
	in.ungroup.Do(func() {
		if in.group == nil {
			return
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := in.group.Remove()
			if err == nil || !errors.Is(err, cgroup.ErrBusy) || time.Now().After(deadline) {
				// A group still busy is left for Groups.Sweep at the
				// agent's next start.
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}
