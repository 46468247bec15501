// Package cgroup changes the CPU and I/O weight of the cgroup a process
// runs in, on cgroup v1 and on cgroup v2.
//
// The warm pool creates its slots at the lowest weight, so that refilling
// it never slows the instances that serve users, and raises a slot to the
// normal weight when a deployment binds it (paper 004 pre-creates cgroups
// for the same reason: what a deploying user waits for must not include
// them). The weight of a whole container changes at once: its processes
// share one cgroup.
package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/mountinfo"
)

// Version is a cgroup hierarchy version.
type Version string

// Versions.
const (
	V1 Version = "v1"
	V2 Version = "v2"
)

// Weights are relative CPU and I/O weights on cgroup v2's scale: 1 to
// 10000, 100 being the default every process gets.
type Weights struct {
	CPU int `json:"cpu"`
	IO  int `json:"io"`
}

// Weight bounds.
const (
	MinWeight     = 1
	MaxWeight     = 10000
	DefaultWeight = 100
)

// Background is the weight of work nobody waits for (the I/O weight is the
// lowest every hierarchy can represent: cgroup v1's blkio.weight starts at a
// 50th of its default); Normal the default weight.
var (
	Background = Weights{CPU: MinWeight, IO: 10}
	Normal     = Weights{CPU: DefaultWeight, IO: DefaultWeight}
)

// Validate reports a weight out of range.
func (w Weights) Validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"cpu", w.CPU}, {"io", w.IO}} {
		if f.v < MinWeight || f.v > MaxWeight {
			return hint.With(fmt.Errorf("%s weight %d: %w", f.name, f.v, ErrInvalidWeight),
				fmt.Sprintf("give a weight from %d to %d (%d is the default)", MinWeight, MaxWeight, DefaultWeight))
		}
	}
	return nil
}

// Applied says which knobs Set changed: the CPU weight, the CPU idle
// policy (cpu.idle, Linux 5.15 and later) and the I/O weight (missing where
// the block layer has no weight files).
type Applied struct {
	CPU  bool `json:"cpu"`
	Idle bool `json:"idle"`
	IO   bool `json:"io"`
}

// Errors.
var (
	ErrUnsupported   = errors.New("cgroup controller unsupported")
	ErrNoProcess     = errors.New("no such process")
	ErrInvalidWeight = errors.New("invalid weight")
)

// Priority reads and changes the weights of a process's cgroup.
type Priority interface {
	// Version is the hierarchy the weights are written to.
	Version() Version
	// Set gives pid's cgroup the weights and reports which knobs it
	// changed. It refuses a process of the root cgroup (ErrUnsupported):
	// that would reweight the whole machine.
	Set(pid int, w Weights) (Applied, error)
	// Get reads the weights of pid's cgroup; IO is 0 where there is no
	// I/O weight.
	Get(pid int) (Weights, error)
	// Describe says, for operators, which knobs this node has.
	Describe() string
}

// Paths are where the kernel's views are read; zero fields take the host's.
type Paths struct {
	// Proc is the proc file system (default /proc).
	Proc string
	// Mountinfo lists the mounted hierarchies (default
	// /proc/self/mountinfo).
	Mountinfo string
}

func (p Paths) withDefaults() Paths {
	if p.Proc == "" {
		p.Proc = "/proc"
	}
	if p.Mountinfo == "" {
		p.Mountinfo = filepath.Join(p.Proc, "self", "mountinfo")
	}
	return p
}

// Detect returns the Priority of this node: cgroup v1 when its cpu
// controller is mounted there (hybrid hosts keep it in v1), else cgroup v2
// when its root delegates the cpu controller.
func Detect(p Paths) (Priority, error) {
	p = p.withDefaults()
	mounts, err := readMounts(p.Mountinfo)
	if err != nil {
		return nil, err
	}
	if _, ok := mounts.v1("cpu"); ok {
		return newV1(p, mounts)
	}
	if m, ok := mounts.v2(); ok && hasController(m.point, "cpu") {
		return newV2(p, mounts)
	}
	return nil, hint.With(fmt.Errorf("no cpu controller in %s: %w", p.Mountinfo, ErrUnsupported),
		"mount the cgroup v1 cpu controller, or enable cpu in cgroup v2's root cgroup.subtree_control")
}

// NewV1 returns the cgroup v1 Priority.
func NewV1(p Paths) (Priority, error) {
	p = p.withDefaults()
	mounts, err := readMounts(p.Mountinfo)
	if err != nil {
		return nil, err
	}
	return newV1(p, mounts)
}

// NewV2 returns the cgroup v2 Priority.
func NewV2(p Paths) (Priority, error) {
	p = p.withDefaults()
	mounts, err := readMounts(p.Mountinfo)
	if err != nil {
		return nil, err
	}
	return newV2(p, mounts)
}

// mount is one mounted hierarchy.
type mount struct {
	root, point string
	v2          bool
	controllers []string // v1 only
}

type mounts []mount

func readMounts(path string) (mounts, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the mounted cgroup hierarchies: %w", err)
	}
	var ms mounts
	for line := range strings.SplitSeq(string(b), "\n") {
		// id parent maj:min root point options [optional...] - fstype source superoptions
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 1 {
			continue
		}
		m := mount{root: mountinfo.Unescape(f[3]), point: mountinfo.Unescape(f[4])}
		switch g[0] {
		case "cgroup2":
			m.v2 = true
		case "cgroup":
			if len(g) >= 3 {
				m.controllers = strings.Split(g[2], ",")
			}
		default:
			continue
		}
		ms = append(ms, m)
	}
	return ms, nil
}

func (ms mounts) v1(controller string) (mount, bool) {
	for _, m := range ms {
		if !m.v2 {
			for _, c := range m.controllers {
				if c == controller {
					return m, true
				}
			}
		}
	}
	return mount{}, false
}

func (ms mounts) v2() (mount, bool) {
	for _, m := range ms {
		if m.v2 {
			return m, true
		}
	}
	return mount{}, false
}

// dir is the directory of cgroup path (as /proc/<pid>/cgroup names it) in
// the hierarchy mounted at m.
func (m mount) dir(path string) (string, error) {
	rel := path
	if m.root != "/" {
		r, ok := strings.CutPrefix(path, m.root)
		if !ok || (r != "" && !strings.HasPrefix(r, "/")) {
			return "", fmt.Errorf("cgroup %s is outside the hierarchy mounted at %s (root %s): %w", path, m.point, m.root, ErrUnsupported)
		}
		rel = r
	}
	return filepath.Join(m.point, filepath.Clean("/"+rel)), nil
}

func hasController(dir, name string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return false
	}
	for _, c := range strings.Fields(string(b)) {
		if c == name {
			return true
		}
	}
	return false
}

// procCgroups reads /proc/<pid>/cgroup: hierarchy controllers → path
// ("" is cgroup v2's line).
func procCgroups(proc string, pid int) (map[string]string, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
	}
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "cgroup"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
	}
	if err != nil {
		return nil, fmt.Errorf("read the cgroups of pid %d: %w", pid, err)
	}
	out := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 {
			for _, c := range strings.Split(parts[1], ",") {
				out[c] = parts[2]
			}
		}
	}
	return out, nil
}

// rootRefused is Set's error for a process of the root cgroup.
func rootRefused(pid int, controller string) error {
	return hint.With(fmt.Errorf("pid %d is in the root %s cgroup: %w", pid, controller, ErrUnsupported),
		"reweighting it would reweight the whole machine; run the process in a container or a child cgroup")
}

// writeFile writes one value to a control file, which must exist.
func writeFile(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err == nil {
		_, err = f.WriteString(value)
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		return fmt.Errorf("write %q to %s: %w", value, path, err)
	}
	return nil
}

func readInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	s := strings.TrimSpace(string(b))
	s = strings.TrimPrefix(s, "default ") // io.weight, io.bfq.weight
	if first, _, ok := strings.Cut(s, "\n"); ok {
		s = first
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	return n, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// scale maps a weight from [MinWeight, MaxWeight] with DefaultWeight at
// def, clamped to [lo, hi].
func scale(w, def, lo, hi int) int {
	return min(max(w*def/DefaultWeight, lo), hi)
}

// unscale is scale's inverse, rounded and clamped to [MinWeight, MaxWeight].
func unscale(v, def int) int {
	return min(max((v*DefaultWeight+def/2)/def, MinWeight), MaxWeight)
}

// setCPU writes a cgroup's CPU weight file and, where the kernel has it,
// cpu.idle. An idle cgroup refuses a weight (EINVAL), so leaving idle comes
// first and entering it last.
func setCPU(k *knobs, dir, weightFile, weight string, w Weights) (a Applied, err error) {
	if idleValue(w) == "0" {
		if a.Idle, err = k.write(dir, "cpu.idle", "0"); err != nil {
			return a, err
		}
	}
	if err := writeFile(filepath.Join(dir, weightFile), weight); err != nil {
		return a, err
	}
	a.CPU = true
	if idleValue(w) == "1" {
		if a.Idle, err = k.write(dir, "cpu.idle", "1"); err != nil {
			return a, err
		}
	}
	return a, nil
}

// knobs remembers which optional control files (cpu.idle, the I/O weight
// files) the cgroups of one hierarchy have, so that a reweight, on a pool
// hit's critical path, writes them without looking for them first: the
// kernel gives the cgroups of a hierarchy the same files. One not seen yet
// is looked for each time (a scheduler loaded later adds its files), and
// one that a cgroup lacks after all is forgotten (cgroup v2 gives a cgroup
// the files of the controllers its parent enables).
type knobs struct {
	mu   sync.Mutex
	seen map[string]bool
}

// known says whether file was seen in a cgroup of the hierarchy.
func (k *knobs) known(file string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.seen[file]
}

func (k *knobs) mark(file string, seen bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.seen == nil {
		k.seen = map[string]bool{}
	}
	k.seen[file] = seen
}

// write writes value to the control file of cgroup dir, if the cgroup has
// it; applied is false where it has not.
func (k *knobs) write(dir, file, value string) (applied bool, err error) {
	known := k.known(file)
	if !known {
		if !exists(filepath.Join(dir, file)) {
			return false, nil
		}
		k.mark(file, true)
	}
	err = writeFile(filepath.Join(dir, file), value)
	if known && errors.Is(err, os.ErrNotExist) && exists(dir) {
		k.mark(file, false)
		return k.write(dir, file, value)
	}
	return err == nil, err
}

// idleValue is cpu.idle's value for w: the lowest CPU weight also takes
// the idle scheduling policy, which yields to every other task.
func idleValue(w Weights) string {
	if w.CPU <= MinWeight {
		return "1"
	}
	return "0"
}

// describe lists a node's knobs for operators.
func describe(v Version, cpu string, idle bool, io string) string {
	knobs := []string{cpu}
	if idle {
		knobs = append(knobs, "cpu.idle")
	}
	if io != "" {
		knobs = append(knobs, io)
		return fmt.Sprintf("cgroup %s: %s", v, strings.Join(knobs, ", "))
	}
	return fmt.Sprintf("cgroup %s: %s; no I/O weight (the block layer has no weight files)", v, strings.Join(knobs, ", "))
}
