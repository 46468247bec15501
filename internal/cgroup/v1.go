package cgroup

import (
	"fmt"
	"path/filepath"
	"strconv"
)

// cgroup v1 scales: cpu.shares 2..262144 with 1024 the default; blkio.weight
// 10..1000 with 500; blkio.bfq.weight 1..1000 with 100.
const (
	sharesDefault, sharesMin, sharesMax = 1024, 2, 262144
	blkioDefault, blkioMin, blkioMax    = 500, 10, 1000
	bfqDefault, bfqMin, bfqMax          = 100, 1, 1000
)

// v1 writes cpu.shares, cpu.idle and blkio weights.
type v1 struct {
	proc      string
	cpu, blk  mount
	hasBlkio  bool
	knobsDesc string
	cpuKnobs  knobs
	blkKnobs  knobs
}

func newV1(p Paths, ms mounts) (Priority, error) {
	cpu, ok := ms.v1("cpu")
	if !ok {
		return nil, fmt.Errorf("no cgroup v1 cpu controller mounted: %w", ErrUnsupported)
	}
	blk, hasBlkio := ms.v1("blkio")
	c := &v1{proc: p.Proc, cpu: cpu, blk: blk, hasBlkio: hasBlkio}
	io := ""
	if hasBlkio {
		if k, ok := ioKnobOf(blk.point, v1IO); ok {
			io = k.file
		}
	}
	c.knobsDesc = describe(V1, "cpu.shares", exists(filepath.Join(cpu.point, "cpu.idle")), io)
	return c, nil
}

func (c *v1) Version() Version { return V1 }
func (c *v1) Describe() string { return c.knobsDesc }

func (c *v1) dirs(pid int) (cpu, blk string, err error) {
	cgs, err := procCgroups(c.proc, pid)
	if err != nil {
		return "", "", err
	}
	path, ok := cgs["cpu"]
	if !ok {
		return "", "", fmt.Errorf("pid %d has no cgroup v1 cpu controller: %w", pid, ErrUnsupported)
	}
	if filepath.Clean("/"+path) == "/" {
		return "", "", rootRefused(pid, "cpu")
	}
	if cpu, err = c.cpu.dir(path); err != nil {
		return "", "", err
	}
	if p, ok := cgs["blkio"]; ok && c.hasBlkio && filepath.Clean("/"+p) != "/" {
		if blk, err = c.blk.dir(p); err != nil {
			return "", "", err
		}
	}
	return cpu, blk, nil
}

func (c *v1) Set(pid int, w Weights) (Applied, error) {
	if err := w.Validate(); err != nil {
		return Applied{}, err
	}
	cpu, blk, err := c.dirs(pid)
	if err != nil {
		return Applied{}, err
	}
	a, err := setCPU(&c.cpuKnobs, cpu, "cpu.shares", strconv.Itoa(scale(w.CPU, sharesDefault, sharesMin, sharesMax)), w)
	if err != nil {
		return a, err
	}
	if blk != "" {
		a.IO, err = setIO(&c.blkKnobs, blk, v1IO, w.IO)
	}
	return a, err
}

func (c *v1) Get(pid int) (Weights, error) {
	cpu, blk, err := c.dirs(pid)
	if err != nil {
		return Weights{}, err
	}
	shares, err := readInt(filepath.Join(cpu, "cpu.shares"))
	if err != nil {
		return Weights{}, err
	}
	w := Weights{CPU: unscale(shares, sharesDefault)}
	if blk != "" {
		if w.IO, err = getIO(blk, v1IO); err != nil {
			return Weights{}, err
		}
	}
	return w, nil
}
