// Limits of instances that run outside any container (the host driver):
// one cgroup per instance, below a parent of the node's, on cgroup v1 (the
// memory, pids and cpu hierarchies) and on cgroup v2.

package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/hint"
)

// Limits bound the processes of one group; a zero field is no bound,
// but for SwapBytes, which only a Limiter writes.
type Limits struct {
	MemoryBytes int64 // memory (v1 memory.limit_in_bytes, v2 memory.max)
	// SwapBytes is the swap allowed beyond MemoryBytes (v1
	// memory.memsw.limit_in_bytes less memory, where the kernel accounts
	// swap; v2 memory.swap.max): 0 is none; no bound without MemoryBytes.
	SwapBytes int64
	Pids      int64   // processes and threads (pids.max)
	CPUs      float64 // CPU time, in CPUs (v1 cpu.cfs_quota_us, v2 cpu.max)
}

// cpuPeriodUS is the CFS period the CPU bound is a quota of.
const cpuPeriodUS = 100000

// Groups makes the cgroups of instances, each a directory named after its
// instance below the parent directory Groups was made with.
type Groups interface {
	// Create makes the group name (a name, not a path) with lim; an
	// existing group of that name is given lim.
	Create(name string, lim Limits) (Group, error)
	// Sweep kills the processes of every group and removes the groups,
	// and says how many it removed: what an agent killed before it
	// stopped its instances left. Only for a parent no running process
	// makes groups in.
	Sweep() (int, error)
	// Version says which hierarchy the groups are in.
	Version() Version
}

// Group is the cgroup of one instance.
type Group interface {
	// Add moves process pid into the group; its later children are born
	// there.
	Add(pid int) error
	// Procs lists the processes in the group.
	Procs() ([]int, error)
	// Remove removes the group; ErrBusy while a process is in it.
	Remove() error
}

// ErrBusy is returned by Group.Remove while the group holds a process.
var ErrBusy = errors.New("cgroup still holds processes")

// limitControllers are the controllers the groups are made in.
var limitControllers = []string{"memory", "pids", "cpu"}

// NewGroups returns the Groups of this node below parent (a name such as
// "fogdeploy-host"): in the cgroup v1 memory, pids and cpu hierarchies
// where they are mounted, else in cgroup v2 when its root delegates
// those controllers.
func NewGroups(p Paths, parent string) (Groups, error) {
	if err := oneElement("parent", parent); err != nil {
		return nil, err
	}
	v, ms, err := limitMounts(p.withDefaults())
	if err != nil {
		return nil, err
	}
	g := &groups{version: v}
	for _, m := range ms {
		g.dirs = append(g.dirs, filepath.Join(m.point, parent))
	}
	return g, g.makeParents()
}

// limitMounts finds the hierarchies limits are written in: cgroup v1's
// memory, pids and cpu ones (in limitControllers' order) where memory is
// mounted in v1, else cgroup v2's one when its root delegates those
// controllers.
func limitMounts(p Paths) (Version, []mount, error) {
	ms, err := readMounts(p.Mountinfo)
	if err != nil {
		return "", nil, err
	}
	if _, ok := ms.v1("memory"); ok {
		var out []mount
		for _, c := range limitControllers {
			m, ok := ms.v1(c)
			if !ok {
				return "", nil, fmt.Errorf("no cgroup v1 %s controller mounted: %w", c, ErrUnsupported)
			}
			out = append(out, m)
		}
		return V1, out, nil
	}
	if m, ok := ms.v2(); ok {
		for _, c := range limitControllers {
			if !hasController(m.point, c) {
				return "", nil, hint.With(fmt.Errorf("cgroup v2 at %s has no %s controller: %w", m.point, c, ErrUnsupported),
					"enable memory, pids and cpu in the root cgroup's cgroup.subtree_control")
			}
		}
		return V2, []mount{m}, nil
	}
	return "", nil, fmt.Errorf("no cgroup memory controller mounted (%s): %w", p.Mountinfo, ErrUnsupported)
}

// ErrInvalidName is returned for a group or parent name that is not one
// path element.
var ErrInvalidName = errors.New("invalid cgroup name")

// groups implements Groups: dirs are the parent's directory in each
// hierarchy (one on cgroup v2).
type groups struct {
	version Version
	dirs    []string
}

func (g *groups) Version() Version { return g.version }

func (g *groups) makeParents() error {
	for _, d := range g.dirs {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("make cgroup %s: %w", d, err)
		}
	}
	if g.version == V2 {
		// The parent hands the controllers down to the instances' groups.
		if err := os.WriteFile(filepath.Join(g.dirs[0], "cgroup.subtree_control"), []byte("+memory +pids +cpu"), 0o644); err != nil {
			return fmt.Errorf("enable memory, pids and cpu below %s: %w", g.dirs[0], err)
		}
	}
	return nil
}

// file is one limit file and the value written to it.
type file struct{ name, value string }

// files are the limit files to write for lim, in order, by controller
// directory index (v1: memory, pids, cpu; v2: the one directory).
func (g *groups) files(lim Limits) [][]file {
	quota := int64(lim.CPUs * cpuPeriodUS)
	period := strconv.Itoa(cpuPeriodUS)
	if g.version == V1 {
		return [][]file{
			{{"memory.limit_in_bytes", bound(lim.MemoryBytes, "-1")}},
			{{"pids.max", bound(lim.Pids, "max")}},
			// The period before the quota: the quota is checked against
			// the period in place.
			{{"cpu.cfs_period_us", period}, {"cpu.cfs_quota_us", bound(quota, "-1")}},
		}
	}
	return [][]file{{
		{"memory.max", bound(lim.MemoryBytes, "max")},
		{"pids.max", bound(lim.Pids, "max")},
		{"cpu.max", bound(quota, "max") + " " + period},
	}}
}

// bound is v as a limit file takes it, or none where v is no bound.
func bound(v int64, none string) string {
	if v > 0 {
		return strconv.FormatInt(v, 10)
	}
	return none
}

// oneElement refuses a group or parent name that is not one path element.
func oneElement(what, name string) error {
	if name == "" || strings.Contains(name, "/") || name == "." || name == ".." {
		return fmt.Errorf("cgroup %s %q: one path element: %w", what, name, ErrInvalidName)
	}
	return nil
}

func (g *groups) Create(name string, lim Limits) (Group, error) {
	if err := oneElement("group", name); err != nil {
		return nil, err
	}
	grp := &group{}
	for _, d := range g.dirs {
		grp.dirs = append(grp.dirs, filepath.Join(d, name))
	}
	files := g.files(lim)
	for i, d := range grp.dirs {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			_ = grp.Remove()
			return nil, fmt.Errorf("make cgroup %s: %w", d, err)
		}
		for _, f := range files[i] {
			if err := os.WriteFile(filepath.Join(d, f.name), []byte(f.value), 0o644); err != nil {
				_ = grp.Remove()
				return nil, fmt.Errorf("limit cgroup %s: %s=%s: %w", d, f.name, f.value, err)
			}
		}
	}
	return grp, nil
}

func (g *groups) Sweep() (int, error) {
	ents, err := os.ReadDir(g.dirs[0])
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		grp := &group{}
		for _, d := range g.dirs {
			grp.dirs = append(grp.dirs, filepath.Join(d, e.Name()))
		}
		if err := grp.kill(); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// kill kills the group's processes until none is left (a process forked
// meanwhile is killed at the next pass), then removes the group.
func (g *group) kill() error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := g.Remove()
		if err == nil || !errors.Is(err, ErrBusy) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kill the processes of a cgroup: %w", err)
		}
		// A process killed stays in its group until it is reaped; the
		// next pass finds it again and waits.
		for _, d := range g.dirs {
			if b, err := os.ReadFile(filepath.Join(d, "cgroup.procs")); err == nil {
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// group implements Group: its directory in each hierarchy.
type group struct{ dirs []string }

func (g *group) Add(pid int) error {
	for _, d := range g.dirs {
		err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
		}
		if err != nil {
			return fmt.Errorf("move pid %d into cgroup %s: %w", pid, d, err)
		}
	}
	return nil
}

func (g *group) Procs() ([]int, error) {
	if len(g.dirs) == 0 {
		return nil, nil
	}
	b, err := os.ReadFile(filepath.Join(g.dirs[0], "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

func (g *group) Remove() error {
	var errs []error
	for _, d := range g.dirs {
		err := os.Remove(d)
		switch {
		case err == nil, errors.Is(err, os.ErrNotExist):
		case errors.Is(err, syscall.EBUSY):
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, ErrBusy))
		default:
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}
