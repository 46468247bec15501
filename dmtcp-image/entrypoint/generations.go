package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/dmtcpctl"
)

// generation is one checkpoint directory, <ckpt>/<n>.
type generation struct {
	n       int
	dir     string
	images  []string  // ckpt_*.dmtcp, absolute, sorted
	started time.Time // when the checkpoint that writes it began
}

func (g generation) startedAt() time.Time {
	if g.started.IsZero() {
		return time.Now()
	}
	return g.started
}

// complete reports whether the generation holds a whole DMTCP image.
func (g generation) complete() bool {
	_, err := dmtcpctl.Complete(g.dir, len(g.images))
	return err == nil
}

func (g generation) bytes() int64 {
	var n int64
	for _, img := range g.images {
		if st, err := os.Stat(img); err == nil {
			n += st.Size()
		}
	}
	return n
}

// readGeneration lists the images of <ckpt>/<n>.
func readGeneration(ckpt string, n int) (generation, error) {
	g := generation{n: n, dir: filepath.Join(ckpt, strconv.Itoa(n))}
	var err error
	g.images, err = dmtcpctl.Images(g.dir)
	return g, err
}

// generations returns the numbered generations under ckpt, oldest first.
func generations(ckpt string) ([]generation, error) {
	entries, err := os.ReadDir(ckpt)
	if err != nil {
		return nil, fmt.Errorf("read checkpoint dir: %w", err)
	}
	var gens []generation
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil || n <= 0 || !e.IsDir() {
			continue
		}
		g, err := readGeneration(ckpt, n)
		if err != nil {
			return nil, err
		}
		gens = append(gens, g)
	}
	sort.Slice(gens, func(i, j int) bool { return gens[i].n < gens[j].n })
	return gens, nil
}

// pickRestore returns generation from (or the newest complete one if from
// is 0).
func pickRestore(ckpt string, gens []generation, from int) (generation, error) {
	for i := len(gens) - 1; i >= 0; i-- {
		g := gens[i]
		if from != 0 && g.n != from {
			continue
		}
		if g.complete() {
			return g, nil
		}
		if from != 0 {
			return g, fmt.Errorf("generation %s is incomplete (no %s or no ckpt_*.dmtcp): %w", g.dir, dmtcpctl.RestartScript, errNoCheckpoint)
		}
	}
	if from != 0 {
		return generation{}, fmt.Errorf("generation %d not found in %s: %w", from, ckpt, errNoCheckpoint)
	}
	return generation{}, fmt.Errorf("%s: %w; launch the app first and checkpoint it", ckpt, errNoCheckpoint)
}

// nextGeneration is one past the newest generation, complete or not, so
// that a new checkpoint always goes into an empty directory.
func nextGeneration(gens []generation) int {
	if len(gens) == 0 {
		return 1
	}
	return gens[len(gens)-1].n + 1
}
