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

// Limits bound the processes of one group; a zero field is no bound.
type Limits struct {
	MemoryBytes int64   // memory (v1 memory.limit_in_bytes, v2 memory.max)
	Pids        int64   // processes and threads (pids.max)
	CPUs        float64 // CPU time, in CPUs (v1 cpu.cfs_quota_us, v2 cpu.max)
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
	if parent == "" || strings.Contains(parent, "/") || parent == "." || parent == ".." {
		return nil, fmt.Errorf("cgroup parent %q: one path element: %w", parent, ErrInvalidName)
	}
	p = p.withDefaults()
	ms, err := readMounts(p.Mountinfo)
	if err != nil {
		return nil, err
	}
	if _, ok := ms.v1("memory"); ok {
		g := &groups{version: V1, parent: parent}
		for _, c := range limitControllers {
			m, ok := ms.v1(c)
			if !ok {
				return nil, fmt.Errorf("no cgroup v1 %s controller mounted: %w", c, ErrUnsupported)
			}
			g.dirs = append(g.dirs, filepath.Join(m.point, parent))
		}
		return g, g.makeParents()
	}
	if m, ok := ms.v2(); ok {
		for _, c := range limitControllers {
			if !hasController(m.point, c) {
				return nil, hint.With(fmt.Errorf("cgroup v2 at %s has no %s controller: %w", m.point, c, ErrUnsupported),
					"enable memory, pids and cpu in the root cgroup's cgroup.subtree_control")
			}
		}
		g := &groups{version: V2, parent: parent, dirs: []string{filepath.Join(m.point, parent)}}
		return g, g.makeParents()
	}
	return nil, fmt.Errorf("no cgroup memory controller mounted (%s): %w", p.Mountinfo, ErrUnsupported)
}

// ErrInvalidName is returned for a group or parent name that is not one
// path element.
var ErrInvalidName = errors.New("invalid cgroup name")

// groups implements Groups: dirs are the parent's directory in each
// hierarchy (one on cgroup v2).
type groups struct {
	version Version
	parent  string
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

// files are the limit files to write for lim, by controller directory
// index (v1: memory, pids, cpu; v2: the one directory).
func (g *groups) files(lim Limits) []map[string]string {
	mem, pids, cpu := "", "", ""
	if g.version == V1 {
		mem, pids, cpu = "-1", "max", "-1"
		if lim.MemoryBytes > 0 {
			mem = strconv.FormatInt(lim.MemoryBytes, 10)
		}
		if lim.Pids > 0 {
			pids = strconv.FormatInt(lim.Pids, 10)
		}
		if lim.CPUs > 0 {
			cpu = strconv.FormatInt(int64(lim.CPUs*cpuPeriodUS), 10)
		}
		return []map[string]string{
			{"memory.limit_in_bytes": mem},
			{"pids.max": pids},
			{"cpu.cfs_period_us": strconv.Itoa(cpuPeriodUS), "cpu.cfs_quota_us": cpu},
		}
	}
	mem, pids, cpu = "max", "max", "max "+strconv.Itoa(cpuPeriodUS)
	if lim.MemoryBytes > 0 {
		mem = strconv.FormatInt(lim.MemoryBytes, 10)
	}
	if lim.Pids > 0 {
		pids = strconv.FormatInt(lim.Pids, 10)
	}
	if lim.CPUs > 0 {
		cpu = strconv.FormatInt(int64(lim.CPUs*cpuPeriodUS), 10) + " " + strconv.Itoa(cpuPeriodUS)
	}
	return []map[string]string{{"memory.max": mem, "pids.max": pids, "cpu.max": cpu}}
}

func (g *groups) Create(name string, lim Limits) (Group, error) {
	if name == "" || strings.Contains(name, "/") || name == "." || name == ".." {
		return nil, fmt.Errorf("cgroup %q: one path element: %w", name, ErrInvalidName)
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
		// cfs_period_us before cfs_quota_us: the quota is checked against
		// the period in place.
		for _, f := range []string{"cpu.cfs_period_us", "cpu.cfs_quota_us", "memory.limit_in_bytes", "pids.max", "memory.max", "cpu.max"} {
			v, ok := files[i][f]
			if !ok {
				continue
			}
			if err := os.WriteFile(filepath.Join(d, f), []byte(v), 0o644); err != nil {
				_ = grp.Remove()
				return nil, fmt.Errorf("limit cgroup %s: %s=%s: %w", d, f, v, err)
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
