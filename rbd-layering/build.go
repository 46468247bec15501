package layering

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/hint"
)

// BuildOptions modify Build.
type BuildOptions struct {
	// ContextDir is where COPY sources are read from.
	ContextDir string
	// Output receives what RUN steps print (nil discards it).
	Output   io.Writer
	Progress Progress
	// NoCache rebuilds every step.
	NoCache bool
}

// StepResult says what one step did.
type StepResult struct {
	Step     string        `json:"step"`
	Image    string        `json:"image,omitempty"`
	Cached   bool          `json:"cached"`
	Duration time.Duration `json:"duration_ns"`
}

// BuildResult is the outcome of Build.
type BuildResult struct {
	Env   Environment  `json:"env"`
	Steps []StepResult `json:"steps"`
}

// Build makes the environment name from a build file. Each step that
// changes the filesystem clones the previous snapshot into an image named
// after the step's cache key, mounts it, applies the step, and seals it
// with a protected snapshot; a step whose sealed image exists is reused.
// ENV and WORKDIR steps only change the configuration.
func (m *Manager) Build(ctx context.Context, name string, bf *BuildFile, opts BuildOptions) (res BuildResult, err error) {
	if err := ValidateName("environment name", name); err != nil {
		return res, err
	}
	if bf == nil || bf.From == "" {
		return res, fmt.Errorf("build file has no FROM: %w", ErrInvalid)
	}
	if opts.Output == nil {
		opts.Output = io.Discard
	}
	base, err := m.Get(ctx, bf.From)
	if err != nil {
		return res, fmt.Errorf("FROM %s: %w", bf.From, err)
	}
	// Check each RUN's network and the COPY sources before touching the
	// store.
	for _, st := range bf.Steps {
		if st.Kind == StepRun {
			if err := st.Network.check(m.cfg); err != nil {
				return res, fmt.Errorf("line %d: %s: %w", st.Line, st, err)
			}
		}
	}
	hashes, err := copyHashes(bf, opts.ContextDir)
	if err != nil {
		return res, err
	}
	cur, cfg := base.Ref, base.Config
	history := append([]string(nil), base.History...)
	total := len(bf.Steps)
	for i, st := range bf.Steps {
		started := time.Now()
		history = append(history, st.String())
		switch st.Kind {
		case StepEnv:
			cfg.Env = setEnv(cfg.Env, st.Args[0], st.Args[1])
			opts.Progress.say("step %d/%d: %s", i+1, total, st)
			res.Steps = append(res.Steps, StepResult{Step: st.String(), Duration: time.Since(started)})
			continue
		case StepWorkdir:
			cfg.WorkDir = st.Args[0]
			opts.Progress.say("step %d/%d: %s", i+1, total, st)
			res.Steps = append(res.Steps, StepResult{Step: st.String(), Duration: time.Since(started)})
			continue
		}
		key := cacheKey(cur, st, cfg, hashes[i])
		image := LayerPrefix + key
		cached, err := m.sealed(ctx, image, opts.Progress)
		if err != nil {
			return res, err
		}
		if cached && !opts.NoCache {
			opts.Progress.say("step %d/%d: %s (cached: %s)", i+1, total, st, image)
		} else {
			if cached { // --no-cache: a fresh image for this step
				image = LayerPrefix + cacheKey(cur, st, cfg, hashes[i]+randomID(4))
			}
			opts.Progress.say("step %d/%d: %s", i+1, total, st)
			if err := m.buildStep(ctx, name, cur, image, st, cfg, opts); err != nil {
				return res, fmt.Errorf("step %d/%d (line %d) %s: %w", i+1, total, st.Line, st, err)
			}
		}
		cur = SnapRef{Image: image, Snap: SealedSnap}
		res.Steps = append(res.Steps, StepResult{Step: st.String(), Image: image, Cached: cached && !opts.NoCache, Duration: time.Since(started)})
	}
	env := Environment{Name: name, Ref: cur, Config: cfg, Source: "build:" + bf.From, History: history, Created: time.Now().UTC()}
	if old, err := m.Get(ctx, name); err == nil && old.Ref == cur && sameConfig(old.Config, cfg) {
		env.Created = old.Created
	}
	if err := m.put(ctx, env); err != nil {
		return res, err
	}
	res.Env = env
	opts.Progress.say("environment %s is %s", name, cur)
	return res, nil
}

// copyHashes are the content hashes of the COPY steps' sources (by step;
// "" for other steps), read relative to the build context.
func copyHashes(bf *BuildFile, contextDir string) ([]string, error) {
	hashes := make([]string, len(bf.Steps))
	for i, st := range bf.Steps {
		if st.Kind != StepCopy {
			continue
		}
		src := filepath.Join(contextDir, st.Args[0])
		var err error
		if hashes[i], err = hashTree(src); err != nil {
			return nil, hint.With(fmt.Errorf("build file line %d: COPY source %s: %w: %w", st.Line, src, err, ErrInvalid), "COPY sources are read relative to the build context (--context)")
		}
	}
	return hashes, nil
}

// buildStep builds step st of environment name as image, over cur, once
// the clone chain's depth allows it (warning past the soft limit).
func (m *Manager) buildStep(ctx context.Context, name string, cur SnapRef, image string, st Step, cfg ImageConfig, opts BuildOptions) error {
	warn, err := m.CheckDepth(ctx, cur, name)
	if err != nil {
		return err
	}
	if warn != "" {
		m.log.Warn(warn, "env", name)
		opts.Progress.say("warning: %s", warn)
	}
	return m.buildLayer(ctx, cur, image, st, cfg, opts)
}

// sealed reports whether image exists with its sealed snapshot. An image
// without it is another build's step in the making, or what a build
// interrupted halfway left. The first (mapped, or made in the last
// unsealedSettle) is waited for, until it is sealed, or gone because that
// build failed; the other is removed, and the step is built again.
func (m *Manager) sealed(ctx context.Context, image string, progress Progress) (bool, error) {
	waiting := false
	for {
		info, err := m.b.Stat(ctx, image)
		if errors.Is(err, ErrNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if _, ok := info.Snapshot(SealedSnap); ok {
			return true, nil
		}
		if time.Since(info.Created) >= unsealedSettle {
			err := m.b.Remove(ctx, image)
			if err == nil || errors.Is(err, ErrNotFound) {
				m.log.Warn("removed the unsealed image of an interrupted build step", "image", image)
				return false, nil
			}
			if !errors.Is(err, ErrBusy) {
				return false, fmt.Errorf("remove unsealed %s: %w", image, err)
			}
		}
		if !waiting {
			progress.say("waiting for another build of this step (image %s)", image)
			waiting = true
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// unsealedSettle is how long an unsealed layer image is taken for a step
// in the making even when nothing maps it: a build clones a step's image
// before it maps it.
const unsealedSettle = 10 * time.Second

// buildLayer clones parent into image, applies the step in the mounted
// clone and seals it. On failure the clone is removed.
func (m *Manager) buildLayer(ctx context.Context, parent SnapRef, image string, st Step, cfg ImageConfig, opts BuildOptions) (err error) {
	if err := m.b.Clone(ctx, parent, image); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			if rerr := m.b.Remove(context.WithoutCancel(ctx), image); rerr != nil && !errors.Is(rerr, ErrNotFound) {
				err = errors.Join(err, fmt.Errorf("rollback: %w", rerr))
			}
		}
	}()
	m.tagImage(ctx, image, "layer", st.String())
	target, err := m.scratch(scratchBuild)
	if err != nil {
		return err
	}
	defer os.Remove(target)
	unmount, err := m.m.Mount(ctx, image, target, MountOptions{})
	if err != nil {
		return err
	}
	applyErr := m.apply(ctx, target, st, cfg, opts)
	if uerr := unmount(context.WithoutCancel(ctx)); uerr != nil {
		return errors.Join(applyErr, fmt.Errorf("unmount %s: %w", image, uerr))
	}
	if applyErr != nil {
		return applyErr
	}
	return m.b.Snapshot(ctx, SnapRef{Image: image, Snap: SealedSnap})
}

func (m *Manager) apply(ctx context.Context, root string, st Step, cfg ImageConfig, opts BuildOptions) error {
	switch st.Kind {
	case StepRun:
		return runStep(ctx, stepSpec{root: root, command: st.Args[0], cfg: cfg, network: st.Network, out: opts.Output})
	case StepCopy:
		return copyInto(ctx, filepath.Join(opts.ContextDir, st.Args[0]), root, st.Args[1])
	}
	return fmt.Errorf("step %s makes no layer: %w", st.Kind, ErrInvalid)
}

// cacheKey names a layer by its parent, its step, the configuration it
// runs with, and (COPY) the content it copies.
func cacheKey(parent SnapRef, st Step, cfg ImageConfig, content string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%q\n%s\n%s\n", parent, st.Kind, st.Args, strings.Join(cfg.Env, "\x00"), cfg.WorkDir)
	h.Write([]byte(content))
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// hashTree hashes the names, modes and contents below path.
func hashTree(path string) (string, error) {
	h := sha256.New()
	var files []string
	err := filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		files = append(files, p)
		return nil
	})
	if err != nil {
		return "", err
	}
	sort.Strings(files)
	for _, p := range files {
		fi, err := os.Lstat(p)
		if err != nil {
			return "", err
		}
		rel, _ := filepath.Rel(path, p)
		fmt.Fprintf(h, "%s %o %d\n", rel, fi.Mode(), fi.Size())
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return "", err
			}
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return "", err
			}
		} else if fi.Mode()&os.ModeSymlink != 0 {
			t, _ := os.Readlink(p)
			fmt.Fprintln(h, t)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func setEnv(env []string, k, v string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, k+"=") {
			out = append(out, kv)
		}
	}
	return append(out, k+"="+v)
}

func sameConfig(a, b ImageConfig) bool {
	return a.WorkDir == b.WorkDir && strings.Join(a.Env, "\x00") == strings.Join(b.Env, "\x00")
}

// Flatten gives an environment a chain of depth zero: it clones the
// environment's snapshot, flattens the clone, seals it, and points the
// name at it. The old chain stays for the clones that use it.
func (m *Manager) Flatten(ctx context.Context, name string, progress Progress) (env Environment, err error) {
	env, prev, err := m.get(ctx, name)
	if err != nil {
		return env, err
	}
	image := LayerPrefix + randomID(8)
	progress.say("cloning %s into %s", env.Ref, image)
	if err := m.b.Clone(ctx, env.Ref, image); err != nil {
		return env, err
	}
	defer func() {
		if err != nil {
			_ = m.b.Remove(context.WithoutCancel(ctx), image)
		}
	}()
	progress.say("flattening %s (copies every shared block)", image)
	if err := m.b.Flatten(ctx, image); err != nil {
		return env, err
	}
	m.tagImage(ctx, image, "layer", "FLATTEN "+env.Ref.String())
	ref := SnapRef{Image: image, Snap: SealedSnap}
	if err := m.b.Snapshot(ctx, ref); err != nil {
		return env, err
	}
	old := env.Ref
	env.Ref = ref
	env.History = append(env.History, "FLATTEN "+old.String())
	if err := m.swap(ctx, env, prev, "flattened"); err != nil {
		return env, err
	}
	return env, nil
}
