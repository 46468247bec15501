package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// restartScript is written by the coordinator into its --ckptdir as the
// last step of a checkpoint: its presence next to the images marks a
// generation as complete.
const restartScript = "dmtcp_restart_script.sh"

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

func (g generation) complete() bool {
	if len(g.images) == 0 {
		return false
	}
	_, err := os.Lstat(filepath.Join(g.dir, restartScript))
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
	entries, err := os.ReadDir(g.dir)
	if err != nil {
		return g, err
	}
	for _, e := range entries {
		if name := e.Name(); strings.HasPrefix(name, "ckpt_") && strings.HasSuffix(name, ".dmtcp") && !e.IsDir() {
			g.images = append(g.images, filepath.Join(g.dir, name))
		}
	}
	sort.Strings(g.images)
	return g, nil
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
			return g, fmt.Errorf("generation %s is incomplete (no %s or no ckpt_*.dmtcp): %w", g.dir, restartScript, errNoCheckpoint)
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
