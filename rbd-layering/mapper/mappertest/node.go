package mappertest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/fakestore"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// NodeHarness adapts a mapper.Node to RunNodeSuite.
type NodeHarness struct {
	// New returns a mapper of store's images, whose pool is Pool.
	New func(t *testing.T, store *fakestore.Store) mapper.Node
}

// Pool is the pool name of the suite's images.
const Pool = "fake"

// RunNodeSuite runs what the deployer relies on against h, over the fake
// store's images: a formatted image keeps the files written through its
// mount, and so do its snapshots and their clones; a snapshot maps
// read-only; a mapping is listed, names its image's users, keeps the
// store from removing its image, and is gone after its release; bad calls fail with the package's sentinels and
// leave no mapping.
func RunNodeSuite(t *testing.T, h NodeHarness) {
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, *nodeEnv)
	}{
		{"FilesComeBack", testFilesComeBack},
		{"SnapshotsAndClonesCarryFiles", testSnapshotsCarryFiles},
		{"ListAndUsers", testListAndUsers},
		{"Refusals", testNodeRefusals},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := fakestore.New(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			e := &nodeEnv{t: t, store: s, m: h.New(t, s), dir: t.TempDir()}
			t.Cleanup(e.releaseAll)
			tc.fn(t, e)
		})
	}
}

type nodeEnv struct {
	t     *testing.T
	store *fakestore.Store
	m     mapper.Node
	dir   string
}

func (e *nodeEnv) image(name string) mapper.Image {
	e.t.Helper()
	if err := e.store.Create(e.t.Context(), name, 64<<20); err != nil {
		e.t.Fatal(err)
	}
	return mapper.Image{Pool: Pool, Name: name}
}

func (e *nodeEnv) mount(img mapper.Image, sub string, mo mapper.MountOptions, opts ...mapper.MapOption) *mapper.Mapping {
	e.t.Helper()
	mp, err := e.m.MapAndMount(e.t.Context(), img, filepath.Join(e.dir, sub), mo, opts...)
	if err != nil {
		e.t.Fatalf("map and mount %s: %v", img, err)
	}
	return mp
}

func (e *nodeEnv) release(mp *mapper.Mapping) {
	e.t.Helper()
	if err := e.m.Release(e.t.Context(), mp.ID); err != nil {
		e.t.Fatalf("release %s: %v", mp.ID, err)
	}
}

func (e *nodeEnv) releaseAll() {
	all, _ := e.m.List()
	for _, mp := range all {
		_ = e.m.Release(context.Background(), mp.ID)
	}
}

func (e *nodeEnv) write(mp *mapper.Mapping, name, body string) {
	e.t.Helper()
	p := filepath.Join(mp.Target, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

func (e *nodeEnv) expect(mp *mapper.Mapping, name, want string) {
	e.t.Helper()
	b, err := os.ReadFile(filepath.Join(mp.Target, name))
	if err != nil || string(b) != want {
		e.t.Errorf("%s in %s: %q, %v; want %q", name, mp.Image, b, err, want)
	}
}

func testFilesComeBack(t *testing.T, e *nodeEnv) {
	img := e.image("files")
	mp := e.mount(img, "a", mapper.MountOptions{Format: true})
	if mp.Target == "" {
		t.Fatalf("mapping %s names no target", mp.ID)
	}
	e.write(mp, "etc/greeting", "hello")
	if err := os.Symlink("greeting", filepath.Join(mp.Target, "etc", "link")); err != nil {
		t.Fatal(err)
	}
	target := mp.Target
	e.release(mp)
	if _, err := os.Stat(filepath.Join(target, "etc", "greeting")); err == nil {
		t.Errorf("%s still shows the image's files after its release", target)
	}
	again := e.mount(img, "b", mapper.MountOptions{})
	e.expect(again, "etc/greeting", "hello")
	e.expect(again, "etc/link", "hello")
	e.release(again)
}

func testSnapshotsCarryFiles(t *testing.T, e *nodeEnv) {
	ctx := t.Context()
	img := e.image("parent")
	mp := e.mount(img, "w", mapper.MountOptions{Format: true})
	e.write(mp, "data", "sealed")
	e.release(mp)
	ref := layering.SnapRef{Image: img.Name, Snap: "s1"}
	if err := e.store.Snapshot(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if err := e.store.Clone(ctx, ref, "child"); err != nil {
		t.Fatal(err)
	}
	child := e.mount(mapper.Image{Pool: Pool, Name: "child"}, "c", mapper.MountOptions{})
	e.expect(child, "data", "sealed")
	e.write(child, "data", "the clone's")
	e.release(child)

	snap := mapper.Image{Pool: Pool, Name: img.Name, Snap: ref.Snap}
	ro := e.mount(snap, "s", mapper.MountOptions{ReadOnly: true})
	if !ro.ReadOnly {
		t.Errorf("mapping of snapshot %s is not read-only", snap)
	}
	e.expect(ro, "data", "sealed")
	e.release(ro)
	if _, err := e.m.MapAndMount(ctx, snap, filepath.Join(e.dir, "f"), mapper.MountOptions{Format: true}); !errors.Is(err, mapper.ErrInvalid) {
		t.Errorf("formatting snapshot %s: %v; want ErrInvalid", snap, err)
	}
}

func testListAndUsers(t *testing.T, e *nodeEnv) {
	img := e.image("used")
	mp := e.mount(img, "u", mapper.MountOptions{Format: true}, mapper.WithID("slot-1"))
	if mp.ID != "slot-1" {
		t.Errorf("mapping ID %q; want slot-1", mp.ID)
	}
	all, err := e.m.List()
	if err != nil || len(all) != 1 || all[0].ID != "slot-1" || all[0].Target != mp.Target {
		t.Errorf("List = %+v, %v; want slot-1 mounted at %s", all, err, mp.Target)
	}
	if users, err := e.m.Users(img); err != nil || len(users) == 0 {
		t.Errorf("Users(%s) = %v, %v; want its mapping", img, users, err)
	}
	if ok, err := e.m.Mounted(mp.ID); err != nil || !ok {
		t.Errorf("Mounted(%s) = %v, %v; want true", mp.ID, ok, err)
	}
	if _, err := e.m.Map(t.Context(), img, mapper.WithID("slot-1")); !errors.Is(err, mapper.ErrBusy) {
		t.Errorf("a second mapping with ID slot-1: %v; want ErrBusy", err)
	}
	// A mapped image is in use: the store refuses to remove it, as RBD
	// refuses while the image's mapper watches it.
	if err := e.store.Remove(t.Context(), img.Name); !errors.Is(err, layering.ErrBusy) {
		t.Errorf("remove %s while mapped: %v; want ErrBusy", img, err)
	}
	e.release(mp)
	if users, err := e.m.Users(img); err != nil || len(users) != 0 {
		t.Errorf("Users(%s) after release = %v, %v; want none", img, users, err)
	}
	if ok, err := e.m.Mounted(mp.ID); err != nil || ok {
		t.Errorf("Mounted(%s) after release = %v, %v; want false", mp.ID, ok, err)
	}
	if err := e.m.Release(t.Context(), mp.ID); !errors.Is(err, mapper.ErrNotMapped) {
		t.Errorf("second release: %v; want ErrNotMapped", err)
	}
	// Released, it is free: a loop device the kernel detaches a moment
	// later is waited for as RemoveUnmapped waits for a slow unmap.
	if _, err := e.store.RemoveUnmapped(t.Context(), img.Name); err != nil {
		t.Errorf("remove %s after its release: %v", img, err)
	}
}

func testNodeRefusals(t *testing.T, e *nodeEnv) {
	ctx := t.Context()
	if _, err := e.m.Map(ctx, mapper.Image{Pool: Pool, Name: "missing"}); !errors.Is(err, mapper.ErrImageNotFound) {
		t.Errorf("map a missing image: %v; want ErrImageNotFound", err)
	}
	if _, err := e.m.Map(ctx, mapper.Image{Pool: Pool, Name: "a/b"}); !errors.Is(err, mapper.ErrInvalid) {
		t.Errorf("map a bad image name: %v; want ErrInvalid", err)
	}
	img := e.image("blank")
	if _, err := e.m.MapAndMount(ctx, img, filepath.Join(e.dir, "n"), mapper.MountOptions{}); err == nil {
		t.Errorf("mounting %s, which holds no filesystem, without Format succeeded", img)
	}
	if all, err := e.m.List(); err != nil || len(all) != 0 {
		t.Errorf("mappings left by refused calls: %+v, %v", all, err)
	}
}
