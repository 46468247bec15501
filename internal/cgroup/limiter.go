// The limits of the cgroup a running process is in, read and changed in the kernel's own files: a
// spare instance, made with the node's limits before any app was known, takes its app's when it is
// assigned, in well under a millisecond where the container runtime's update takes 15-20 ms.

package cgroup

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/fogdeploy/fogdeploy/internal/hint"
)

// Limiter reads and changes the limits of a running process's cgroup.
type Limiter interface {
	// Limit gives pid's cgroup lim: memory (with lim.SwapBytes of swap
	// beyond it), processes and CPU time; a zero field removes that
	// bound. It refuses a process of the root cgroup (ErrUnsupported)
	// and an invalid lim (ErrInvalidLimits), changing nothing.
	Limit(pid int, lim Limits) error
	// Limits reads the limits of pid's cgroup; SwapBytes is 0 where the
	// kernel does not account swap.
	Limits(pid int) (Limits, error)
	// MemoryUsed reads the memory pid's cgroup uses now (its processes'
	// and the files they cached), what its memory bound counts.
	MemoryUsed(pid int) (int64, error)
}

// ErrInvalidLimits is returned for limits no cgroup takes.
var ErrInvalidLimits = errors.New("invalid cgroup limits")

// minCPUQuotaUS is the smallest CFS quota the kernel takes (1 ms).
const minCPUQuotaUS = 1000

// Validate reports a negative bound, or a CPU bound below the kernel's
// smallest quota.
func (lim Limits) Validate() error {
	var errs []error
	if lim.MemoryBytes < 0 || lim.SwapBytes < 0 || lim.Pids < 0 || lim.CPUs < 0 || math.IsNaN(lim.CPUs) {
		errs = append(errs, fmt.Errorf("memory %d, swap %d, pids %d, CPUs %g: none may be negative", lim.MemoryBytes, lim.SwapBytes, lim.Pids, lim.CPUs))
	}
	if lim.CPUs > 0 && int64(lim.CPUs*cpuPeriodUS) < minCPUQuotaUS {
		errs = append(errs, fmt.Errorf("CPUs %g: at least %g", lim.CPUs, float64(minCPUQuotaUS)/cpuPeriodUS))
	}
	if lim.CPUs > math.MaxInt64/cpuPeriodUS {
		errs = append(errs, fmt.Errorf("CPUs %g: too many", lim.CPUs))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidLimits, err)
	}
	return nil
}

// NewLimiter returns the Limiter of this node: in the cgroup v1 memory,
// pids and cpu hierarchies where memory is mounted there, else in cgroup
// v2.
func NewLimiter(p Paths) (Limiter, error) {
	p = p.withDefaults()
	v, ms, err := limitMounts(p)
	if err != nil {
		return nil, err
	}
	return &limiter{proc: p.Proc, version: v, mounts: ms}, nil
}

// limiter implements Limiter: mounts are the memory, pids and cpu
// hierarchies on cgroup v1, the one hierarchy on v2.
type limiter struct {
	proc    string
	version Version
	mounts  []mount
}

// dirs are pid's cgroup directories, in the order of l.mounts.
func (l *limiter) dirs(pid int) ([]string, error) {
	cgs, err := procCgroups(l.proc, pid)
	if err != nil {
		return nil, err
	}
	keys := limitControllers
	if l.version == V2 {
		keys = []string{""}
	}
	dirs := make([]string, len(keys))
	for i, k := range keys {
		path, ok := cgs[k]
		if !ok {
			return nil, fmt.Errorf("pid %d has no cgroup %s %s controller: %w", pid, l.version, k, ErrUnsupported)
		}
		if filepath.Clean("/"+path) == "/" {
			return nil, hint.With(fmt.Errorf("pid %d is in the root cgroup (%s %s): %w", pid, l.version, k, ErrUnsupported),
				"limiting it would limit the whole machine; run the process in a container or a child cgroup")
		}
		if dirs[i], err = l.mounts[i].dir(path); err != nil {
			return nil, err
		}
	}
	return dirs, nil
}

func (l *limiter) Limit(pid int, lim Limits) error {
	if err := lim.Validate(); err != nil {
		return err
	}
	dirs, err := l.dirs(pid)
	if err != nil {
		return err
	}
	quota := bound(int64(lim.CPUs*cpuPeriodUS), "-1")
	period := strconv.Itoa(cpuPeriodUS)
	swap := lim.SwapBytes
	if lim.MemoryBytes == 0 {
		swap = 0 // no bound on either
	}
	var writes []file
	var where []string
	add := func(dir string, fs ...file) {
		for _, f := range fs {
			writes, where = append(writes, f), append(where, dir)
		}
	}
	if l.version == V1 {
		mem, pids, cpu := dirs[0], dirs[1], dirs[2]
		memory := file{"memory.limit_in_bytes", bound(lim.MemoryBytes, "-1")}
		if exists(filepath.Join(mem, "memory.memsw.limit_in_bytes")) {
			// Memory and swap together never go below memory alone:
			// raised first when memory grows, lowered after it shrinks.
			memsw := file{"memory.memsw.limit_in_bytes", bound(lim.MemoryBytes+swap, "-1")}
			cur, err := readLimit(filepath.Join(mem, memory.name))
			if err != nil {
				return err
			}
			if lim.MemoryBytes == 0 || (cur > 0 && lim.MemoryBytes > cur) {
				add(mem, memsw, memory)
			} else {
				add(mem, memory, memsw)
			}
		} else {
			add(mem, memory)
		}
		add(pids, file{"pids.max", bound(lim.Pids, "max")})
		// The period before the quota: the quota is checked against the
		// period in place.
		add(cpu, file{"cpu.cfs_period_us", period}, file{"cpu.cfs_quota_us", quota})
	} else {
		d := dirs[0]
		add(d, file{"memory.max", bound(lim.MemoryBytes, "max")})
		if exists(filepath.Join(d, "memory.swap.max")) {
			sw := "max"
			if lim.MemoryBytes > 0 {
				sw = strconv.FormatInt(swap, 10)
			}
			add(d, file{"memory.swap.max", sw})
		}
		if quota == "-1" {
			quota = "max"
		}
		add(d, file{"pids.max", bound(lim.Pids, "max")}, file{"cpu.max", quota + " " + period})
	}
	for i, f := range writes {
		if err := writeFile(filepath.Join(where[i], f.name), f.value); err != nil {
			return fmt.Errorf("limit the cgroup of pid %d: %w", pid, err)
		}
	}
	return nil
}

// unbounded is what a v1 limit file holds without a bound (or near it:
// the kernel rounds to its page size).
const unbounded = math.MaxInt64 / 2

func (l *limiter) Limits(pid int) (Limits, error) {
	dirs, err := l.dirs(pid)
	if err != nil {
		return Limits{}, err
	}
	var lim Limits
	var errs []error
	get := func(dst *int64, path string) {
		v, err := readLimit(path)
		*dst = v
		errs = append(errs, err)
	}
	var quota, period int64
	if l.version == V1 {
		mem, pids, cpu := dirs[0], dirs[1], dirs[2]
		get(&lim.MemoryBytes, filepath.Join(mem, "memory.limit_in_bytes"))
		if p := filepath.Join(mem, "memory.memsw.limit_in_bytes"); exists(p) && lim.MemoryBytes > 0 {
			var memsw int64
			get(&memsw, p)
			lim.SwapBytes = max(0, memsw-lim.MemoryBytes)
		}
		get(&lim.Pids, filepath.Join(pids, "pids.max"))
		get(&quota, filepath.Join(cpu, "cpu.cfs_quota_us"))
		get(&period, filepath.Join(cpu, "cpu.cfs_period_us"))
	} else {
		d := dirs[0]
		get(&lim.MemoryBytes, filepath.Join(d, "memory.max"))
		if p := filepath.Join(d, "memory.swap.max"); exists(p) && lim.MemoryBytes > 0 {
			get(&lim.SwapBytes, p)
		}
		get(&lim.Pids, filepath.Join(d, "pids.max"))
		b, err := os.ReadFile(filepath.Join(d, "cpu.max"))
		errs = append(errs, err)
		if q, p, ok := strings.Cut(strings.TrimSpace(string(b)), " "); ok && q != "max" {
			quota, _ = strconv.ParseInt(q, 10, 64)
			period, _ = strconv.ParseInt(p, 10, 64)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Limits{}, err
	}
	if quota > 0 && period > 0 {
		lim.CPUs = float64(quota) / float64(period)
	}
	return lim, nil
}

func (l *limiter) MemoryUsed(pid int) (int64, error) {
	dirs, err := l.dirs(pid)
	if err != nil {
		return 0, err
	}
	file := "memory.current"
	if l.version == V1 {
		file = "memory.usage_in_bytes"
	}
	return readLimit(filepath.Join(dirs[0], file))
}

// readLimit reads a limit file: 0 where it holds no bound ("max", -1,
// or v1's near-maximal value).
func readLimit(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	s := strings.TrimSpace(string(b))
	if s == "max" || s == "-1" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	if n >= unbounded {
		return 0, nil
	}
	return n, nil
}
