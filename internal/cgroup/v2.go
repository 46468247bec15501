package cgroup

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/fogdeploy/fogdeploy/internal/hint"
)

// cgroup v2 has the Weights scale itself: cpu.weight and io.weight 1..10000
// with 100 the default; io.bfq.weight 1..1000 with 100.

// v2 writes cpu.weight, cpu.idle and io.weight.
type v2 struct {
	proc      string
	m         mount
	knobsDesc string
	knobs     knobs
}

func newV2(p Paths, ms mounts) (Priority, error) {
	m, ok := ms.v2()
	if !ok {
		return nil, fmt.Errorf("no cgroup v2 hierarchy mounted: %w", ErrUnsupported)
	}
	c := &v2{proc: p.Proc, m: m}
	// The root cgroup has no weight files: read a child's.
	idle, io := false, ""
	if child := childWith(m.point, "cpu.weight"); child != "" {
		idle = exists(filepath.Join(child, "cpu.idle"))
		if k, ok := ioKnobOf(child, v2IO); ok {
			io = k.file
		}
	}
	c.knobsDesc = describe(V2, "cpu.weight", idle, io)
	return c, nil
}

func (c *v2) Version() Version { return V2 }
func (c *v2) Describe() string { return c.knobsDesc }

// childWith returns a child cgroup of dir that has the file, or "".
func childWith(dir, file string) string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return ""
	}
	for _, e := range entries {
		if d := filepath.Join(dir, e.Name()); e.IsDir() && exists(filepath.Join(d, file)) {
			return d
		}
	}
	return ""
}

func (c *v2) dir(pid int) (string, error) {
	cgs, err := procCgroups(c.proc, pid)
	if err != nil {
		return "", err
	}
	path, ok := cgs[""]
	if !ok {
		return "", fmt.Errorf("pid %d is in no cgroup v2 cgroup: %w", pid, ErrUnsupported)
	}
	if filepath.Clean("/"+path) == "/" {
		return "", rootRefused(pid, "v2")
	}
	dir, err := c.m.dir(path)
	if err != nil {
		return "", err
	}
	if !exists(filepath.Join(dir, "cpu.weight")) {
		return "", hint.With(fmt.Errorf("cgroup %s has no cpu.weight: %w", dir, ErrUnsupported),
			"enable the cpu controller in its parent's cgroup.subtree_control")
	}
	return dir, nil
}

func (c *v2) Set(pid int, w Weights) (Applied, error) {
	if err := w.Validate(); err != nil {
		return Applied{}, err
	}
	dir, err := c.dir(pid)
	if err != nil {
		return Applied{}, err
	}
	a, err := setCPU(&c.knobs, dir, "cpu.weight", strconv.Itoa(w.CPU), w)
	if err != nil {
		return a, err
	}
	a.IO, err = setIO(&c.knobs, dir, v2IO, w.IO)
	return a, err
}

func (c *v2) Get(pid int) (Weights, error) {
	dir, err := c.dir(pid)
	if err != nil {
		return Weights{}, err
	}
	cpu, err := readInt(filepath.Join(dir, "cpu.weight"))
	if err != nil {
		return Weights{}, err
	}
	w := Weights{CPU: cpu}
	if w.IO, err = getIO(dir, v2IO); err != nil {
		return Weights{}, err
	}
	return w, nil
}
