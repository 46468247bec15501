// Package envtest is the behaviour suite of the environment manager:
// import, layered build with cache, chains, clones and removal, observed
// the way a user would (files in a mounted clone, images in the pool).
// It runs against the fake store with the mapper's file backend in every
// `go test` (as root), and against real Ceph with the fuse backend when a
// cluster answers.
package envtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/mountinfo"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/fakestore"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// NewLayering returns a connected manager for one test.
type NewLayering func(t *testing.T) *Parts

// Parts are what the suite drives: a store, the node's mapper, and the
// environments' manager over them.
type Parts struct {
	Store   layering.Backend
	Mapper  *mapper.Mapper
	Manager *layering.Manager
}

// BusyboxRootfs makes a minimal root filesystem with a static busybox, or
// skips when the host has none.
func BusyboxRootfs(t *testing.T) string {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		testenv.Unavailable(t, testenv.Root, "busybox (static) not installed: apt-get install busybox-static")
	}
	dir := t.TempDir()
	for _, d := range []string{"bin", "etc", "tmp", "proc", "dev", "root"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, app := range []string{"sh", "cat", "echo", "mkdir", "ls", "cp", "rm", "touch", "sleep"} {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", app)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "etc/os-release"), []byte("NAME=fogtest\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// RunSuite runs the environment behaviour tests.
func RunSuite(t *testing.T, newL NewLayering) {
	t.Run("ImportBuildCloneChain", func(t *testing.T) { testImportBuild(t, newL(t)) })
	t.Run("ImportTar", func(t *testing.T) { testImportTar(t, newL(t)) })
	t.Run("BadInputLeavesPoolUnchanged", func(t *testing.T) { testBadInput(t, newL(t)) })
	t.Run("RemoveRefusesWhileCloned", func(t *testing.T) { testRemove(t, newL(t)) })
	t.Run("FailedStepLeavesNothing", func(t *testing.T) { testFailedStep(t, newL(t)) })
	t.Run("ExecLeavesNoProcess", func(t *testing.T) { testExecBackground(t, newL(t)) })
	t.Run("PruneUnsealedLayers", func(t *testing.T) { testPruneUnsealed(t, newL(t)) })
	t.Run("ConcurrentBuildsOfOneStep", func(t *testing.T) { testConcurrentBuilds(t, newL(t)) })
	t.Run("ConcurrentImportsOfOneName", func(t *testing.T) { testConcurrentImports(t, newL(t)) })
	t.Run("StepNamespaces", func(t *testing.T) { testStepNamespaces(t, newL(t)) })
	t.Run("BuildStepNamespaces", func(t *testing.T) { testBuildStepNamespaces(t, newL(t)) })
	t.Run("EnvironmentLinksNotFollowed", func(t *testing.T) { testEnvironmentLinks(t, newL(t)) })
}

// testConcurrentImports: of two imports of one name that both found the
// name free, one makes the environment and the other fails, saying so,
// and leaves no layer behind; a flatten of an environment removed while
// it ran does not bring it back.
func testConcurrentImports(t *testing.T, l *Parts) {
	ctx := context.Background()
	name := uniq("ci")
	removeEnvs(t, l, name)
	before := list(t, l)
	root := BusyboxRootfs(t)
	// Both wait, past the check that the name is free, until the other
	// is past it too.
	var arrived sync.WaitGroup
	arrived.Add(2)
	envs := make([]layering.Environment, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		var once sync.Once
		progress := func(string, ...any) { once.Do(func() { arrived.Done(); arrived.Wait() }) }
		wg.Go(func() {
			envs[i], errs[i] = l.Manager.Import(ctx, name, layering.Source{Dir: root}, layering.ImportOptions{Size: 64 << 20, Progress: progress})
		})
	}
	wg.Wait()
	won, lost := 0, 1
	if errs[0] != nil {
		won, lost = 1, 0
	}
	if errs[won] != nil || !errors.Is(errs[lost], layering.ErrExists) || hint.Of(errs[lost]) == "" {
		t.Fatalf("two imports of %s at once = %v, %v; want one environment and one ErrExists with a hint", name, errs[0], errs[1])
	}
	got, err := l.Manager.Get(ctx, name)
	if err != nil || got.Ref != envs[won].Ref {
		t.Fatalf("Get %s = %+v, %v; want the winner's %s", name, got.Ref, err, envs[won].Ref)
	}
	if added := slices.DeleteFunc(list(t, l), func(n string) bool { return slices.Contains(before, n) }); len(added) != 1 || added[0] != got.Ref.Image {
		t.Fatalf("images the imports left: %v; want only %s", added, got.Ref.Image)
	}

	// Of two flattens at once, the one that points the name last finds it
	// changed: it fails, saying so, and removes its image.
	before = list(t, l)
	var inner layering.Environment
	var innerErr error
	var once sync.Once
	_, err = l.Manager.Flatten(ctx, name, func(format string, _ ...any) {
		if strings.HasPrefix(format, "flattening") {
			once.Do(func() { inner, innerErr = l.Manager.Flatten(ctx, name, nil) })
		}
	})
	if innerErr != nil {
		t.Fatalf("the flatten that ran inside the other: %v", innerErr)
	}
	if !errors.Is(err, layering.ErrConflict) || hint.Of(err) == "" {
		t.Fatalf("a flatten whose environment changed meanwhile = %v; want ErrConflict with a hint", err)
	}
	if got, err := l.Manager.Get(ctx, name); err != nil || got.Ref != inner.Ref {
		t.Fatalf("Get %s = %+v, %v; want the first flatten's %s", name, got.Ref, err, inner.Ref)
	}
	if added := slices.DeleteFunc(list(t, l), func(n string) bool { return slices.Contains(before, n) }); len(added) != 1 || added[0] != inner.Ref.Image {
		t.Fatalf("images the flattens left: %v; want only %s", added, inner.Ref.Image)
	}
}

// testConcurrentBuilds: two builds of the same step at once make one
// layer: the second waits for the first's (it says so) and takes it as
// cached, instead of taking it for an interrupted build's.
func testConcurrentBuilds(t *testing.T, l *Parts) {
	ctx := context.Background()
	base, a, b := uniq("cb"), uniq("cba"), uniq("cbb")
	removeEnvs(t, l, base, a, b)
	importBusybox(t, l, base)
	pre := list(t, l)
	file := "FROM " + base + "\nRUN echo " + a + " > /step && sleep 2\n"
	build := func(name string, progress layering.Progress) (layering.BuildResult, error) {
		bf, err := layering.ParseBuildFile(strings.NewReader(file))
		must(t, err)
		return l.Manager.Build(ctx, name, bf, layering.BuildOptions{Progress: progress})
	}
	first := make(chan error, 1)
	var firstRes layering.BuildResult
	go func() {
		var err error
		firstRes, err = build(a, nil)
		first <- err
	}()
	// Its step holds the clone mounted in the work directory: a test that
	// fails meanwhile waits for it before anything is removed.
	var firstErr error
	waited := false
	wait := func() error {
		if !waited {
			firstErr, waited = <-first, true
		}
		return firstErr
	}
	t.Cleanup(func() { _ = wait() })
	// The second starts once the first's step is under way (its image
	// exists).
	deadline := time.Now().Add(30 * time.Second)
	for !slices.ContainsFunc(list(t, l), func(n string) bool { return strings.HasPrefix(n, layering.LayerPrefix) && !slices.Contains(pre, n) }) {
		if time.Now().After(deadline) {
			t.Fatal("the first build made no layer image in 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	var said []string
	res, err := build(b, func(format string, args ...any) { said = append(said, fmt.Sprintf(format, args...)) })
	if err != nil {
		t.Fatalf("the second build of the same step, while the first runs: %v", err)
	}
	must(t, wait())
	if len(res.Steps) != 1 || len(firstRes.Steps) != 1 || res.Steps[0].Image != firstRes.Steps[0].Image || !res.Steps[0].Cached {
		t.Fatalf("steps: first %+v, second %+v; want one layer, the second's cached", firstRes.Steps, res.Steps)
	}
	if !slices.ContainsFunc(said, func(s string) bool { return strings.Contains(s, "waiting for another build of this step") }) {
		t.Errorf("the second build said %q; want that it waited for the first", said)
	}
}

// testPruneUnsealed: the layers a killed import (an image without
// snapshot) and a killed build step (a clone of its parent, unsealed) left
// are removed by Prune once older than its UnsealedMinAge, except while
// mapped; then the parent environment can be removed.
func testPruneUnsealed(t *testing.T, l *Parts) {
	ctx := context.Background()
	base := uniq("pu")
	removeEnvs(t, l, base)
	env := importBusybox(t, l, base)
	imported, step := layering.LayerPrefix+uniq("killed-import"), layering.LayerPrefix+uniq("killed-step")
	must(t, l.Store.Create(ctx, imported, 4<<20))
	must(t, l.Store.Clone(ctx, env.Ref, step))
	t.Cleanup(func() {
		for _, img := range []string{imported, step} {
			_ = l.Store.Remove(context.Background(), img)
		}
	})
	if removed, err := l.Manager.Prune(ctx, layering.PruneOptions{UnsealedMinAge: time.Hour}); err != nil || slices.Contains(removed, imported) || slices.Contains(removed, step) {
		t.Fatalf("Prune sparing unsealed layers younger than 1h = %v, %v; want neither %s nor %s", removed, err, imported, step)
	}
	unmount, err := l.Manager.Mounter().Mount(ctx, step, t.TempDir(), layering.MountOptions{})
	must(t, err)
	removed, err := l.Manager.Prune(ctx, layering.PruneOptions{})
	must(t, err)
	if !slices.Contains(removed, imported) || slices.Contains(removed, step) || !slices.Contains(list(t, l), step) {
		t.Fatalf("Prune with the step's layer mapped removed %v; want %s and not %s", removed, imported, step)
	}
	must(t, unmount(ctx))
	if removed, err = l.Manager.Prune(ctx, layering.PruneOptions{}); err != nil || !slices.Contains(removed, step) {
		t.Fatalf("Prune once the step's layer is unmapped = %v, %v; want %s removed", removed, err, step)
	}
	if _, err := l.Manager.Remove(ctx, base); err != nil {
		t.Fatalf("Remove %s once the killed step's layer is pruned: %v", base, err)
	}
}

func uniq(base string) string { return fmt.Sprintf("t%06x-%s", rand.Uint32()&0xffffff, base) }

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// list returns the pool's images of the kinds the environment manager
// makes (other packages' tests may share the pool meanwhile).
func list(t *testing.T, l *Parts) []string {
	t.Helper()
	names, err := l.Store.List(context.Background())
	must(t, err)
	return slices.DeleteFunc(names, func(n string) bool {
		return !strings.HasPrefix(n, layering.LayerPrefix) && !strings.HasPrefix(n, "fdi-") && !strings.HasPrefix(n, layering.ExecPrefix)
	})
}

// importBusybox imports the busybox root filesystem as environment name.
func importBusybox(t *testing.T, l *Parts, name string) layering.Environment {
	t.Helper()
	env, err := l.Manager.Import(context.Background(), name, layering.Source{Dir: BusyboxRootfs(t)}, layering.ImportOptions{Size: 64 << 20})
	must(t, err)
	return env
}

// removeEnvs removes environments (newest first) at the end of a test.
func removeEnvs(t *testing.T, l *Parts, names ...string) {
	t.Cleanup(func() {
		for i := len(names) - 1; i >= 0; i-- {
			if _, err := l.Manager.Remove(context.Background(), names[i]); err != nil && !errors.Is(err, layering.ErrNotFound) {
				t.Errorf("cleanup: remove %s: %v", names[i], err)
			}
		}
		if _, err := l.Manager.Prune(context.Background(), layering.PruneOptions{UnsealedMinAge: layering.DefaultUnsealedMinAge}); err != nil {
			t.Errorf("cleanup: prune: %v", err)
		}
	})
}

// mountClone clones ref into a fresh image, mounts it, and returns the
// mountpoint; cleanup unmounts and removes the clone.
func mountClone(t *testing.T, l *Parts, ref layering.SnapRef) (string, string) {
	t.Helper()
	ctx := context.Background()
	child := "fdi-" + uniq("clone")
	must(t, l.Store.Clone(ctx, ref, child))
	target := t.TempDir()
	unmount, err := l.Manager.Mounter().Mount(ctx, child, target, layering.MountOptions{})
	if err != nil {
		_ = l.Store.Remove(ctx, child)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unmount(ctx); err != nil {
			t.Errorf("unmount clone: %v", err)
		}
		if err := l.Store.Remove(ctx, child); err != nil {
			t.Errorf("remove clone: %v", err)
		}
	})
	return target, child
}

func testImportBuild(t *testing.T, l *Parts) {
	ctx := context.Background()
	base, app := uniq("base"), uniq("app")
	removeEnvs(t, l, base, app)
	rootfs := BusyboxRootfs(t)
	env, err := l.Manager.Import(ctx, base, layering.Source{Dir: rootfs}, layering.ImportOptions{Size: 64 << 20})
	must(t, err)

	bctx := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(bctx, "site"), 0o755))
	must(t, os.WriteFile(filepath.Join(bctx, "site/index.html"), []byte("hello fog\n"), 0o644))
	bf, err := layering.ParseBuildFile(strings.NewReader(fmt.Sprintf("FROM %s\nENV GREETING=hi\nRUN echo \"$GREETING from run\" > /etc/step1\nCOPY site /srv/www/\n", base)))
	must(t, err)
	var progress []string
	say := func(f string, a ...any) { progress = append(progress, fmt.Sprintf(f, a...)) }
	res, err := l.Manager.Build(ctx, app, bf, layering.BuildOptions{ContextDir: bctx, Progress: say})
	must(t, err)
	if len(res.Steps) != 3 || res.Steps[1].Cached || res.Steps[2].Cached {
		t.Fatalf("first build steps = %+v, want 3 uncached", res.Steps)
	}

	info, err := l.Manager.Inspect(ctx, app)
	must(t, err)
	if info.Depth != 2 || len(info.Chain) != 3 || info.Chain[2] != env.Ref {
		t.Fatalf("chain of %s = %v (depth %d), want 3 snapshots ending at %s", app, info.Chain, info.Depth, env.Ref)
	}
	if !slices.Contains(info.Config.Env, "GREETING=hi") {
		t.Errorf("config env = %v", info.Config.Env)
	}
	// The parent's children include the first layer: the chain is real in the store.
	kids, err := l.Store.Children(ctx, env.Ref)
	must(t, err)
	if !slices.Contains(kids, info.Chain[1].Image) {
		t.Fatalf("children of %s = %v, missing %s", env.Ref, kids, info.Chain[1].Image)
	}

	// A clone of the final snapshot shows the files of every step.
	root, _ := mountClone(t, l, info.Ref)
	for file, want := range map[string]string{"etc/os-release": "NAME=fogtest\n", "etc/step1": "hi from run\n", "srv/www/index.html": "hello fog\n"} {
		got, err := os.ReadFile(filepath.Join(root, file))
		if err != nil || string(got) != want {
			t.Errorf("clone file %s = %q, %v; want %q", file, got, err, want)
		}
	}
	// Writes into the clone leave the parent unchanged.
	must(t, os.WriteFile(filepath.Join(root, "etc/step1"), []byte("changed\n"), 0o644))
	root2, _ := mountClone(t, l, info.Ref)
	if got, _ := os.ReadFile(filepath.Join(root2, "etc/step1")); string(got) != "hi from run\n" {
		t.Errorf("a second clone reads %q after a write into the first, want the snapshot's content", got)
	}

	// Rebuilding reuses every step, says so, and creates no image.
	before := list(t, l)
	progress = nil
	res2, err := l.Manager.Build(ctx, app, bf, layering.BuildOptions{ContextDir: bctx, Progress: say})
	must(t, err)
	for _, s := range res2.Steps {
		if s.Image != "" && !s.Cached {
			t.Errorf("rebuild: step %q not cached", s.Step)
		}
	}
	if res2.Env.Ref != info.Ref {
		t.Errorf("rebuild points at %s, want %s", res2.Env.Ref, info.Ref)
	}
	if after := list(t, l); !slices.Equal(before, after) {
		t.Errorf("rebuild changed the pool: %v -> %v", before, after)
	}
	if !strings.Contains(strings.Join(progress, "\n"), "cached") {
		t.Errorf("rebuild progress does not say cached: %v", progress)
	}

	// A changed COPY source invalidates only that step.
	must(t, os.WriteFile(filepath.Join(bctx, "site/index.html"), []byte("v2\n"), 0o644))
	res3, err := l.Manager.Build(ctx, app, bf, layering.BuildOptions{ContextDir: bctx})
	must(t, err)
	if !res3.Steps[1].Cached || res3.Steps[2].Cached {
		t.Errorf("after editing the COPY source: steps %+v, want RUN cached and COPY rebuilt", res3.Steps)
	}

	ls, err := l.Manager.List(ctx)
	must(t, err)
	names := []string{}
	for _, e := range ls {
		names = append(names, e.Name)
	}
	if !slices.Contains(names, base) || !slices.Contains(names, app) {
		t.Errorf("List() = %v, want %s and %s", names, base, app)
	}
}

func testBadInput(t *testing.T, l *Parts) {
	ctx := context.Background()
	before := list(t, l)
	base := uniq("bad")
	cases := []struct {
		name string
		run  func() error
		want string
	}{
		{"nonexistent parent", func() error {
			bf, _ := layering.ParseBuildFile(strings.NewReader("FROM no-such-env\nRUN true\n"))
			_, err := l.Manager.Build(ctx, base, bf, layering.BuildOptions{})
			return err
		}, "no-such-env"},
		{"name with slash", func() error {
			_, err := l.Manager.Import(ctx, "a/b", layering.Source{Dir: t.TempDir()}, layering.ImportOptions{})
			return err
		}, "environment name"},
		{"name with space", func() error {
			_, err := l.Manager.Import(ctx, "a b", layering.Source{Dir: t.TempDir()}, layering.ImportOptions{})
			return err
		}, "environment name"},
		{"negative size", func() error {
			_, err := l.Manager.Import(ctx, base, layering.Source{Dir: t.TempDir()}, layering.ImportOptions{Size: -1})
			return err
		}, "negative"},
		{"missing rootfs", func() error {
			_, err := l.Manager.Import(ctx, base, layering.Source{Dir: "/nonexistent/rootfs"}, layering.ImportOptions{})
			return err
		}, "/nonexistent/rootfs"},
		{"rootfs too large for size", func() error {
			dir := t.TempDir()
			must(t, os.WriteFile(filepath.Join(dir, "big"), bytes.Repeat([]byte{1}, 12<<20), 0o644))
			_, err := l.Manager.Import(ctx, base, layering.Source{Dir: dir}, layering.ImportOptions{Size: 8 << 20})
			return err
		}, "do not fit"},
		{"garbage tar", func() error {
			_, err := l.Manager.Import(ctx, base, layering.Source{Tar: strings.NewReader("this is not a tar")}, layering.ImportOptions{})
			return err
		}, "tar"},
	}
	for _, c := range cases {
		err := c.run()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want one mentioning %q", c.name, err, c.want)
		}
	}
	if after := list(t, l); !slices.Equal(before, after) {
		t.Errorf("bad input changed the pool: %v -> %v", before, after)
	}
	if _, err := l.Manager.Get(ctx, base); !errors.Is(err, layering.ErrNotFound) {
		t.Errorf("bad input left environment %s: %v", base, err)
	}
}

func testRemove(t *testing.T, l *Parts) {
	ctx := context.Background()
	base := uniq("rm")
	removeEnvs(t, l, base)
	env := importBusybox(t, l, base)
	child := "fdi-" + uniq("inst")
	must(t, l.Store.Clone(ctx, env.Ref, child))
	_, err := l.Manager.Remove(ctx, base)
	if !errors.Is(err, layering.ErrHasChildren) || !strings.Contains(err.Error(), child) || hint.Of(err) == "" {
		t.Fatalf("Remove with a clone = %v, want ErrHasChildren naming %s with a hint", err, child)
	}
	if _, err := l.Manager.Get(ctx, base); err != nil {
		t.Fatalf("refused Remove lost the environment: %v", err)
	}
	must(t, l.Store.Remove(ctx, child))
	removed, err := l.Manager.Remove(ctx, base)
	must(t, err)
	if !slices.Contains(removed, env.Ref.Image) || slices.Contains(list(t, l), env.Ref.Image) {
		t.Fatalf("Remove returned %v; pool still holds %s: %v", removed, env.Ref.Image, slices.Contains(list(t, l), env.Ref.Image))
	}
}

func testFailedStep(t *testing.T, l *Parts) {
	ctx := context.Background()
	base, app := uniq("fs"), uniq("fsapp")
	removeEnvs(t, l, base)
	importBusybox(t, l, base)
	before := list(t, l)
	bf, _ := layering.ParseBuildFile(strings.NewReader("FROM " + base + "\nRUN echo about to fail; exit 3\n"))
	_, err := l.Manager.Build(ctx, app, bf, layering.BuildOptions{})
	if !errors.Is(err, layering.ErrBuildStep) || !strings.Contains(err.Error(), "about to fail") {
		t.Fatalf("failing RUN = %v, want ErrBuildStep with the step's output", err)
	}
	if after := list(t, l); !slices.Equal(before, after) {
		t.Errorf("failed step left images: %v -> %v", before, after)
	}
	if ms, _ := l.Mapper.List(); len(ms) != 0 {
		t.Errorf("failed step left mappings: %+v", ms)
	}
}

// testExecBackground runs commands that leave a process behind: Exec and a
// build's RUN must still end, unmount and remove their clone, and the
// process must be gone.
func testExecBackground(t *testing.T, l *Parts) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	base := uniq("bg")
	removeEnvs(t, l, base)
	importBusybox(t, l, base)
	before := list(t, l)
	marker := sleeperName()
	for _, cmd := range []string{
		"sleep 600 >/dev/null 2>&1 </dev/null & echo started",
		"sleep 601 & echo started", // holds the output pipe open too
	} {
		cmd = "cp /bin/busybox /tmp/" + marker + " && cd /tmp && " + strings.Replace(cmd, "sleep", "./"+marker+" sleep", 1)
		var out bytes.Buffer
		start := time.Now()
		if _, err := l.Manager.Exec(ctx, base, cmd, &out); err != nil || !strings.Contains(out.String(), "started") {
			t.Fatalf("exec %q: %v (output %q)", cmd, err, out.String())
		}
		if d := time.Since(start); d > 30*time.Second {
			t.Errorf("exec %q took %v: it waited for the background process", cmd, d)
		}
		if ms, _ := l.Mapper.List(); len(ms) != 0 {
			t.Errorf("exec %q left mappings: %+v", cmd, ms)
		}
		if after := list(t, l); !slices.Equal(before, after) {
			t.Errorf("exec %q left images: %v -> %v", cmd, before, after)
		}
		if pids := processesNamed(t, marker); len(pids) > 0 {
			t.Errorf("exec %q left its background process running: pids %v", cmd, pids)
		}
	}
	bf, _ := layering.ParseBuildFile(strings.NewReader("FROM " + base + "\nRUN cp /bin/busybox /tmp/" + marker + " && /tmp/" + marker + " sleep 602 &\n"))
	app := uniq("bgapp")
	removeEnvs(t, l, app)
	if _, err := l.Manager.Build(ctx, app, bf, layering.BuildOptions{}); err != nil {
		t.Fatalf("build with a background RUN: %v", err)
	}
	if ms, _ := l.Mapper.List(); len(ms) != 0 {
		t.Errorf("build left mappings: %+v", ms)
	}
	if pids := processesNamed(t, marker); len(pids) > 0 {
		t.Errorf("build left its RUN's background process running: pids %v", pids)
	}
}

// processesNamed lists the PIDs whose command name is name.
func processesNamed(t *testing.T, name string) []string {
	t.Helper()
	dirs, err := os.ReadDir("/proc")
	must(t, err)
	var pids []string
	for _, d := range dirs {
		comm, err := os.ReadFile(filepath.Join("/proc", d.Name(), "comm"))
		if err == nil && strings.TrimSpace(string(comm)) == name[:min(len(name), 15)] {
			pids = append(pids, d.Name())
		}
	}
	return pids
}

func testImportTar(t *testing.T, l *Parts) {
	ctx := context.Background()
	name := uniq("tar")
	removeEnvs(t, l, name)
	tarball, err := exec.Command("tar", "-C", BusyboxRootfs(t), "-c", ".").Output()
	must(t, err)
	_, err = l.Manager.Import(ctx, name, layering.Source{Tar: bytes.NewReader(tarball)}, layering.ImportOptions{Size: 64 << 20})
	must(t, err)
	var out bytes.Buffer
	if _, err := l.Manager.Exec(ctx, name, "cat /etc/os-release", &out); err != nil || out.String() != "NAME=fogtest\n" {
		t.Fatalf("exec in the tar-imported environment: %q, %v", out.String(), err)
	}
	for _, n := range list(t, l) {
		if strings.HasPrefix(n, layering.ExecPrefix) {
			t.Errorf("exec left its clone %s", n)
		}
	}
}

// FakeLayering returns a manager over the file-backed fake store, whose
// images the mapper's file backend attaches through loop devices (root).
func FakeLayering(t *testing.T) *Parts {
	t.Helper()
	return FakeLayeringWith(t, func(*layering.ManagerConfig) {})
}

// FakeLayeringWith is FakeLayering with a changed manager config.
func FakeLayeringWith(t *testing.T, change func(*layering.ManagerConfig)) *Parts {
	t.Helper()
	testenv.NeedRoot(t)
	dir := t.TempDir()
	UnmountLeft(t, dir)
	lc := layering.DefaultManagerConfig(dir + "/work")
	lc.HostNetwork = true // the suite tries --network=host too
	change(&lc)
	fs, err := fakestore.New(dir + "/store")
	if err != nil {
		t.Fatal(err)
	}
	mc := mapper.Config{Backend: mapper.BackendFile, StateDir: dir + "/mapper", FilePath: func(img mapper.Image) (string, error) {
		p := fs.Path(img.Name)
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%w: %w", mapper.ErrImageNotFound, err)
		}
		return p, nil
	}}
	p, err := NewParts(context.Background(), fs, FakePool, mc, lc)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// FakePool is the pool name of FakeLayering's images.
const FakePool = "fake"

// NewParts makes the mapper of mc and a manager over store and it, for
// the images of pool.
func NewParts(ctx context.Context, store layering.Backend, pool string, mc mapper.Config, lc layering.ManagerConfig) (*Parts, error) {
	mp, err := mapper.New(ctx, mc, nil)
	if err != nil {
		return nil, err
	}
	if _, err := mp.ReleaseAbandoned(ctx); err != nil {
		return nil, err
	}
	mgr, err := layering.NewManager(store, mapper.Mounter{M: mp, Pool: pool}, lc, nil)
	if err != nil {
		return nil, err
	}
	return &Parts{Store: store, Mapper: mp, Manager: mgr}, nil
}

// UnmountLeft makes the end of test t, before the removal of dir (a
// t.TempDir made just before), fail the test and lazily unmount whatever
// is still mounted under dir: that removal must never walk into a mount
// (an image's files are its data).
func UnmountLeft(t *testing.T, dir string) {
	t.Cleanup(func() {
		mounts, _ := mountinfo.Under(dir)
		for _, mnt := range slices.Backward(mounts) {
			t.Errorf("cleanup: %s is still mounted; lazily unmounting it", mnt)
			_ = exec.Command("umount", "-l", mnt).Run()
		}
	})
}
