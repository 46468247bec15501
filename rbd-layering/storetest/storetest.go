// Package storetest is the behaviour suite that every layering.Backend must
// pass: the file-backed fake in every `go test`, and the go-ceph store
// against a real cluster whenever one is reachable.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// NewBackend returns a backend for one test. Images it creates are removed
// by the suite; the constructor registers its own cleanup with t.
type NewBackend func(t *testing.T) layering.Backend

const mib = 1 << 20

// RunSuite runs every behaviour test against backends made by newB.
func RunSuite(t *testing.T, newB NewBackend) {
	tests := []struct {
		name string
		fn   func(t *testing.T, b layering.Backend, p string)
	}{
		{"CreateStatList", testCreateStatList},
		{"WriteReadSparse", testWriteRead},
		{"SnapshotCloneCopyOnWrite", testCopyOnWrite},
		{"ChildrenAndRemoveRefusal", testChildren},
		{"Flatten", testFlatten},
		{"Metadata", testMeta},
		{"Seal", testSeal},
		{"Catalog", testCatalog},
		{"CatalogSwap", testCatalogSwap},
		{"Errors", testErrors},
		{"RemoveUnmapped", testRemoveUnmapped},
		{"ObjectSize", testObjectSize},
		{"Blank", testBlank},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newB(t)
			prefix := fmt.Sprintf("fdtest-%08x-", rand.Uint32())
			t.Cleanup(func() { cleanup(t, b, prefix) })
			tc.fn(t, b, prefix)
		})
	}
}

// cleanup removes every image of the test, children first.
func cleanup(t *testing.T, b layering.Backend, prefix string) {
	ctx := context.Background()
	for range 5 {
		names, err := b.List(ctx)
		if err != nil {
			t.Logf("cleanup: %v", err)
			return
		}
		left := 0
		for _, n := range names {
			if len(n) >= len(prefix) && n[:len(prefix)] == prefix {
				if err := b.Remove(ctx, n); err != nil {
					left++
				}
			}
		}
		if left == 0 {
			return
		}
	}
	t.Errorf("cleanup: images with prefix %s left behind", prefix)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, b layering.Backend, name string, off int64, n int) []byte {
	t.Helper()
	p := make([]byte, n)
	if _, err := b.ReadAt(context.Background(), name, p, off); err != nil {
		t.Fatalf("read %s: %v", name, err)
	}
	return p
}

func testCreateStatList(t *testing.T, b layering.Backend, p string) {
	ctx := context.Background()
	must(t, b.Create(ctx, p+"a", 16*mib))
	info, err := b.Stat(ctx, p+"a")
	must(t, err)
	if info.Size != 16*mib || info.Parent != nil || len(info.Snapshots) != 0 || info.Used != 0 {
		t.Fatalf("stat of a new image = %+v, want size 16 MiB, no parent, no snapshots, 0 used", info)
	}
	names, err := b.List(ctx)
	must(t, err)
	if !contains(names, p+"a") {
		t.Fatalf("List() = %v, missing %s", names, p+"a")
	}
	if err := b.Create(ctx, p+"a", mib); !errors.Is(err, layering.ErrExists) {
		t.Fatalf("second Create = %v, want ErrExists", err)
	}
	must(t, b.Remove(ctx, p+"a"))
	names, _ = b.List(ctx)
	if contains(names, p+"a") {
		t.Fatalf("image still listed after Remove")
	}
}

func testWriteRead(t *testing.T, b layering.Backend, p string) {
	ctx := context.Background()
	must(t, b.Create(ctx, p+"w", 8*mib))
	src := make([]byte, 8*mib)
	copy(src[3*mib:], bytes.Repeat([]byte("fog"), 1000))
	must(t, b.Write(ctx, p+"w", bytes.NewReader(src), int64(len(src))))
	if got := read(t, b, p+"w", 3*mib, 3000); !bytes.Equal(got, src[3*mib:3*mib+3000]) {
		t.Fatalf("read back differs")
	}
	info, err := b.Stat(ctx, p+"w")
	must(t, err)
	if info.Used < 3000 || info.Used > 4*mib {
		t.Fatalf("Used = %d after writing one 1 MiB chunk, want between 3000 B and 4 MiB (zero chunks are skipped)", info.Used)
	}
}

func testCopyOnWrite(t *testing.T, b layering.Backend, p string) {
	ctx := context.Background()
	must(t, b.Create(ctx, p+"base", 4*mib))
	must(t, b.Write(ctx, p+"base", bytes.NewReader(bytes.Repeat([]byte{'A'}, mib)), mib))
	ref := layering.SnapRef{Image: p + "base", Snap: layering.SealedSnap}
	must(t, b.Snapshot(ctx, ref))
	info, err := b.Stat(ctx, p+"base")
	must(t, err)
	if len(info.Snapshots) != 1 || !info.Snapshots[0].Protected || info.Snapshots[0].Name != ref.Snap {
		t.Fatalf("snapshots = %+v, want one protected %q", info.Snapshots, ref.Snap)
	}
	must(t, b.Clone(ctx, ref, p+"child"))
	ci, err := b.Stat(ctx, p+"child")
	must(t, err)
	if ci.Parent == nil || *ci.Parent != ref {
		t.Fatalf("child parent = %v, want %v", ci.Parent, ref)
	}
	if ci.Used != 0 {
		t.Fatalf("a fresh clone uses %d bytes, want 0 (copy-on-write)", ci.Used)
	}
	if got := read(t, b, p+"child", 0, 16); !bytes.Equal(got, bytes.Repeat([]byte{'A'}, 16)) {
		t.Fatalf("clone reads %q, want the parent's data", got)
	}
	must(t, b.Write(ctx, p+"child", bytes.NewReader(bytes.Repeat([]byte{'B'}, mib)), mib))
	if got := read(t, b, p+"child", 0, 4); string(got) != "BBBB" {
		t.Fatalf("clone reads %q after its write", got)
	}
	if got := read(t, b, ref.String(), 0, 4); string(got) != "AAAA" {
		t.Fatalf("parent snapshot reads %q after a write into the clone, want AAAA", got)
	}
	ci, _ = b.Stat(ctx, p+"child")
	if ci.Used == 0 {
		t.Fatalf("clone Used = 0 after a write")
	}
}

func testChildren(t *testing.T, b layering.Backend, p string) {
	ctx := context.Background()
	must(t, b.Create(ctx, p+"par", 4*mib))
	ref := layering.SnapRef{Image: p + "par", Snap: "s1"}
	must(t, b.Snapshot(ctx, ref))
	must(t, b.Clone(ctx, ref, p+"c1"))
	must(t, b.Clone(ctx, ref, p+"c2"))
	kids, err := b.Children(ctx, ref)
	must(t, err)
	if len(kids) != 2 || kids[0] != p+"c1" || kids[1] != p+"c2" {
		t.Fatalf("Children = %v, want [%sc1 %sc2]", kids, p, p)
	}
	if err := b.Remove(ctx, p+"par"); !errors.Is(err, layering.ErrHasChildren) {
		t.Fatalf("Remove of a parent with clones = %v, want ErrHasChildren", err)
	}
	if err := b.RemoveSnapshot(ctx, ref); !errors.Is(err, layering.ErrHasChildren) {
		t.Fatalf("RemoveSnapshot with clones = %v, want ErrHasChildren", err)
	}
	must(t, b.Remove(ctx, p+"c1"))
	must(t, b.Remove(ctx, p+"c2"))
	must(t, b.RemoveSnapshot(ctx, ref))
	info, err := b.Stat(ctx, p+"par")
	must(t, err)
	if len(info.Snapshots) != 0 {
		t.Fatalf("snapshots after RemoveSnapshot = %v", info.Snapshots)
	}
	must(t, b.Remove(ctx, p+"par"))
}

func testFlatten(t *testing.T, b layering.Backend, p string) {
	ctx := context.Background()
	must(t, b.Create(ctx, p+"fp", 4*mib))
	must(t, b.Write(ctx, p+"fp", bytes.NewReader(bytes.Repeat([]byte{'F'}, mib)), mib))
	ref := layering.SnapRef{Image: p + "fp", Snap: "s"}
	must(t, b.Snapshot(ctx, ref))
	must(t, b.Clone(ctx, ref, p+"fc"))
	must(t, b.Flatten(ctx, p+"fc"))
	info, err := b.Stat(ctx, p+"fc")
	must(t, err)
	if info.Parent != nil {
		t.Fatalf("parent after Flatten = %v, want none", info.Parent)
	}
	if kids, _ := b.Children(ctx, ref); len(kids) != 0 {
		t.Fatalf("parent still lists children %v after Flatten", kids)
	}
	if got := read(t, b, p+"fc", 0, 4); string(got) != "FFFF" {
		t.Fatalf("flattened image reads %q, want the parent's data", got)
	}
	must(t, b.Remove(ctx, p+"fp")) // the parent is free now
}

func testMeta(t *testing.T, b layering.Backend, p string) {
	ctx := context.Background()
	must(t, b.Create(ctx, p+"m", mib))
	must(t, b.SetMeta(ctx, p+"m", map[string]string{"fogdeploy.kind": "env", "fogdeploy.node": "n1"}))
	info, err := b.Stat(ctx, p+"m")
	must(t, err)
	if info.Meta["fogdeploy.kind"] != "env" || info.Meta["fogdeploy.node"] != "n1" {
		t.Fatalf("meta = %v", info.Meta)
	}
	// One call sets one key, deletes another, and deleting a key that is
	// not there is no error.
	must(t, b.SetMeta(ctx, p+"m", map[string]string{"fogdeploy.kind": "", "fogdeploy.node": "n2", "fogdeploy.none": ""}))
	info, _ = b.Stat(ctx, p+"m")
	if _, ok := info.Meta["fogdeploy.kind"]; ok || info.Meta["fogdeploy.node"] != "n2" {
		t.Fatalf("meta after deleting kind and setting node = %v", info.Meta)
	}
	// Meta reads the same keys as Stat.
	md, err := b.Meta(ctx, p+"m")
	must(t, err)
	if len(md) != len(info.Meta) || md["fogdeploy.node"] != "n2" {
		t.Fatalf("Meta = %v, Stat's Meta = %v", md, info.Meta)
	}
	if _, err := b.Meta(ctx, p+"absent"); !errors.Is(err, layering.ErrNotFound) {
		t.Fatalf("Meta of a missing image = %v, want ErrNotFound", err)
	}
	if err := b.SetMeta(ctx, p+"absent", map[string]string{"k": "v"}); !errors.Is(err, layering.ErrNotFound) {
		t.Fatalf("SetMeta on a missing image = %v, want ErrNotFound", err)
	}
}

// testSeal: Seal sets the keys and makes the protected snapshot a clone
// reads the image's content from, as SetMeta and Snapshot would; a second
// Seal of the same snapshot is ErrExists and still sets its keys.
func testSeal(t *testing.T, b layering.Backend, p string) {
	ctx := context.Background()
	must(t, b.Create(ctx, p+"w", mib))
	must(t, b.Write(ctx, p+"w", bytes.NewReader(bytes.Repeat([]byte{7}, 4096)), 4096))
	must(t, b.SetMeta(ctx, p+"w", map[string]string{"fogdeploy.slot": "s1"}))
	ref := layering.SnapRef{Image: p + "w", Snap: layering.SealedSnap}
	must(t, b.Seal(ctx, ref, map[string]string{"fogdeploy.slot": "", "fogdeploy.node": "n1"}))
	info, err := b.Stat(ctx, p+"w")
	must(t, err)
	if !isSealed(info) {
		t.Fatalf("after Seal: snapshots %+v, want %s protected", info.Snapshots, layering.SealedSnap)
	}
	if _, ok := info.Meta["fogdeploy.slot"]; ok || info.Meta["fogdeploy.node"] != "n1" {
		t.Fatalf("after Seal: meta %v, want slot deleted and node n1", info.Meta)
	}
	must(t, b.Clone(ctx, ref, p+"c"))
	if got := read(t, b, p+"c", 0, 4096); !bytes.Equal(got, bytes.Repeat([]byte{7}, 4096)) {
		t.Fatalf("a clone of the sealed snapshot reads %v..., want the image's bytes", got[:8])
	}
	if err := b.Seal(ctx, ref, map[string]string{"fogdeploy.node": "n2"}); !errors.Is(err, layering.ErrExists) {
		t.Fatalf("Seal of a sealed snapshot = %v, want ErrExists", err)
	}
	if md, _ := b.Meta(ctx, p+"w"); md["fogdeploy.node"] != "n2" {
		t.Fatalf("meta after a second Seal = %v, want node n2", md)
	}
	if err := b.Seal(ctx, layering.SnapRef{Image: p + "absent", Snap: "s"}, nil); !errors.Is(err, layering.ErrNotFound) {
		t.Fatalf("Seal of a missing image = %v, want ErrNotFound", err)
	}
	if err := b.Seal(ctx, layering.SnapRef{Image: p + "w"}, nil); !errors.Is(err, layering.ErrInvalid) {
		t.Fatalf("Seal without a snapshot name = %v, want ErrInvalid", err)
	}
}

func testCatalog(t *testing.T, b layering.Backend, p string) {
	ctx := context.Background()
	must(t, b.SetTag(ctx, p+"tag", []byte(`{"v":1}`)))
	t.Cleanup(func() { _ = b.DeleteTag(context.Background(), p+"tag") })
	got, err := b.Tag(ctx, p+"tag")
	must(t, err)
	if string(got) != `{"v":1}` {
		t.Fatalf("Tag = %s", got)
	}
	must(t, b.SetTag(ctx, p+"tag", []byte(`{"v":2}`)))
	all, err := b.Tags(ctx)
	must(t, err)
	if string(all[p+"tag"]) != `{"v":2}` {
		t.Fatalf("Tags()[%s] = %s, want the replaced record", p+"tag", all[p+"tag"])
	}
	must(t, b.DeleteTag(ctx, p+"tag"))
	if _, err := b.Tag(ctx, p+"tag"); !errors.Is(err, layering.ErrNotFound) {
		t.Fatalf("Tag after delete = %v, want ErrNotFound", err)
	}
	must(t, b.DeleteTag(ctx, p+"tag")) // idempotent
}

// testCatalogSwap: SwapTag writes only over the record it expects, and of
// commands that race for one name exactly one wins.
func testCatalogSwap(t *testing.T, b layering.Backend, p string) {
	ctx := context.Background()
	name := p + "swap"
	t.Cleanup(func() { _ = b.DeleteTag(context.Background(), name) })
	if err := b.SwapTag(ctx, name, []byte(`{"v":0}`), []byte(`{"v":1}`)); !errors.Is(err, layering.ErrNotFound) {
		t.Fatalf("SwapTag of an absent name expecting a record = %v, want ErrNotFound", err)
	}
	must(t, b.SwapTag(ctx, name, nil, []byte(`{"v":1}`)))
	if err := b.SwapTag(ctx, name, nil, []byte(`{"v":9}`)); !errors.Is(err, layering.ErrExists) {
		t.Fatalf("SwapTag creating a name that exists = %v, want ErrExists", err)
	}
	if err := b.SwapTag(ctx, name, []byte(`{"v":0}`), []byte(`{"v":9}`)); !errors.Is(err, layering.ErrConflict) {
		t.Fatalf("SwapTag expecting another record = %v, want ErrConflict", err)
	}
	must(t, b.SwapTag(ctx, name, []byte(`{"v":1}`), []byte(`{"v":2}`)))
	if got, err := b.Tag(ctx, name); err != nil || string(got) != `{"v":2}` {
		t.Fatalf("Tag after the swaps = %s, %v; want {\"v\":2}", got, err)
	}

	// Eight writers at once: for a new name, and over one record.
	for _, prev := range [][]byte{nil, []byte(`{"v":2}`)} {
		if prev == nil {
			must(t, b.DeleteTag(ctx, name))
		} else {
			must(t, b.SetTag(ctx, name, prev))
		}
		errs := make([]error, 8)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Go(func() { errs[i] = b.SwapTag(ctx, name, prev, fmt.Appendf(nil, `{"w":%d}`, i)) })
		}
		wg.Wait()
		won := -1
		for i, err := range errs {
			switch {
			case err == nil && won >= 0:
				t.Fatalf("expecting %s: writers %d and %d both won: %v", prev, won, i, errs)
			case err == nil:
				won = i
			case prev == nil && !errors.Is(err, layering.ErrExists), prev != nil && !errors.Is(err, layering.ErrConflict):
				t.Fatalf("expecting %s: writer %d: %v", prev, i, err)
			}
		}
		if won < 0 {
			t.Fatalf("expecting %s: no writer won: %v", prev, errs)
		}
		if got, _ := b.Tag(ctx, name); string(got) != fmt.Sprintf(`{"w":%d}`, won) {
			t.Fatalf("expecting %s: the record is %s, not the winner's (%d)", prev, got, won)
		}
	}
}

func testErrors(t *testing.T, b layering.Backend, p string) {
	ctx := context.Background()
	if _, err := b.Stat(ctx, p+"nope"); !errors.Is(err, layering.ErrNotFound) {
		t.Errorf("Stat(missing) = %v, want ErrNotFound", err)
	}
	if err := b.Remove(ctx, p+"nope"); !errors.Is(err, layering.ErrNotFound) {
		t.Errorf("Remove(missing) = %v, want ErrNotFound", err)
	}
	if err := b.Clone(ctx, layering.SnapRef{Image: p + "nope", Snap: "s"}, p+"x"); !errors.Is(err, layering.ErrNotFound) {
		t.Errorf("Clone(missing parent) = %v, want ErrNotFound", err)
	}
	if err := b.Create(ctx, p+"neg", -1); !errors.Is(err, layering.ErrInvalid) {
		t.Errorf("Create(size -1) = %v, want ErrInvalid", err)
	}
	must(t, b.Create(ctx, p+"s", mib))
	if err := b.Clone(ctx, layering.SnapRef{Image: p + "s", Snap: "nosnap"}, p+"x"); !errors.Is(err, layering.ErrNotFound) {
		t.Errorf("Clone(missing snapshot) = %v, want ErrNotFound", err)
	}
	names, _ := b.List(ctx)
	if contains(names, p+"x") || contains(names, p+"neg") {
		t.Errorf("failed calls left images behind: %v", names)
	}
}

// testRemoveUnmapped: on an image nobody watches RemoveUnmapped is
// Remove, and it refuses what Remove refuses without retrying until its
// bound.
func testRemoveUnmapped(t *testing.T, b layering.Backend, p string) {
	ctx := context.Background()
	must(t, b.Create(ctx, p+"u", 4*mib))
	must(t, b.Snapshot(ctx, layering.SnapRef{Image: p + "u", Snap: "s1"}))
	ev, err := b.RemoveUnmapped(ctx, p+"u")
	must(t, err)
	if len(ev) != 0 {
		t.Errorf("RemoveUnmapped of an image nobody watches evicted %v", ev)
	}
	if _, err := b.Stat(ctx, p+"u"); !errors.Is(err, layering.ErrNotFound) {
		t.Fatalf("Stat after RemoveUnmapped = %v, want ErrNotFound", err)
	}
	start := time.Now()
	if _, err := b.RemoveUnmapped(ctx, p+"u"); !errors.Is(err, layering.ErrNotFound) {
		t.Errorf("RemoveUnmapped(missing) = %v, want ErrNotFound", err)
	}
	ref := layering.SnapRef{Image: p + "par", Snap: "s"}
	must(t, b.Create(ctx, ref.Image, 4*mib))
	must(t, b.Snapshot(ctx, ref))
	must(t, b.Clone(ctx, ref, p+"kid"))
	if _, err := b.RemoveUnmapped(ctx, ref.Image); !errors.Is(err, layering.ErrHasChildren) {
		t.Errorf("RemoveUnmapped of a parent with clones = %v, want ErrHasChildren", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("refusals took %s: RemoveUnmapped retries only while the image is busy", el)
	}
}

// Watchers make an image busy the two ways a node can, for
// RunWatcherSuite.
type Watchers struct {
	// Live maps name on this node (a client that keeps it open and
	// answers) and returns a func that checks that the mapping still
	// serves I/O (that it was not evicted) and releases it.
	Live func(t *testing.T, b layering.Backend, name string) (release func())
	// Dead leaves name watched by a client that is gone: one killed while
	// it had the image open, whose watch the cluster keeps for a while.
	Dead func(t *testing.T, b layering.Backend, name string)
}

// RunWatcherSuite checks Remove and RemoveUnmapped on images that a live
// and a dead client watch: Remove refuses both with ErrBusy;
// RemoveUnmapped evicts the dead one and removes the image promptly (well
// within the 30 s a cluster keeps such a watch), and never evicts the live
// one.
func RunWatcherSuite(t *testing.T, newB NewBackend, w Watchers) {
	t.Run("DeadWatcherEvicted", func(t *testing.T) {
		b := newB(t)
		prefix := fmt.Sprintf("fdtest-%08x-", rand.Uint32())
		t.Cleanup(func() { cleanup(t, b, prefix) })
		ctx := context.Background()
		name := prefix + "dead"
		must(t, b.Create(ctx, name, 64*mib))
		w.Dead(t, b, name)
		if err := b.Remove(ctx, name); !errors.Is(err, layering.ErrBusy) {
			t.Fatalf("Remove of an image a killed client had open = %v, want ErrBusy (the watch outlives the client)", err)
		}
		start := time.Now()
		ev, err := b.RemoveUnmapped(ctx, name)
		took := time.Since(start)
		if err != nil {
			t.Fatalf("RemoveUnmapped after %s: %v (evicted %v)", took, err, ev)
		}
		if len(ev) == 0 {
			t.Errorf("RemoveUnmapped removed an image with a dead watcher and reports no eviction")
		}
		if took > 15*time.Second {
			t.Errorf("RemoveUnmapped took %s; want well under the 30 s watch timeout", took)
		}
		if _, err := b.Stat(ctx, name); !errors.Is(err, layering.ErrNotFound) {
			t.Fatalf("Stat after RemoveUnmapped = %v, want ErrNotFound", err)
		}
		t.Logf("dead watcher evicted (%v) and image removed in %s", ev, took.Round(time.Millisecond))
	})
	t.Run("LiveWatcherKept", func(t *testing.T) {
		b := newB(t)
		prefix := fmt.Sprintf("fdtest-%08x-", rand.Uint32())
		t.Cleanup(func() { cleanup(t, b, prefix) })
		ctx := context.Background()
		name := prefix + "live"
		must(t, b.Create(ctx, name, 64*mib))
		release := w.Live(t, b, name)
		defer func() {
			if release != nil {
				release()
			}
		}()
		if err := b.Remove(ctx, name); !errors.Is(err, layering.ErrBusy) {
			t.Fatalf("Remove of a mapped image = %v, want ErrBusy", err)
		}
		start := time.Now()
		ev, err := b.RemoveUnmapped(ctx, name)
		if !errors.Is(err, layering.ErrBusy) || len(ev) != 0 {
			t.Fatalf("RemoveUnmapped of a mapped image = %v, evicted %v; want ErrBusy and no eviction", err, ev)
		}
		if took := time.Since(start); took > 20*time.Second {
			t.Errorf("RemoveUnmapped gave up on a live watcher after %s; want it to tell at once", took)
		}
		if _, err := b.Stat(ctx, name); err != nil {
			t.Fatalf("Stat of a mapped image after a refused RemoveUnmapped: %v", err)
		}
		release()
		release = nil
		must(t, b.Remove(ctx, name))
	})
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func testObjectSize(t *testing.T, b layering.Backend, p string) {
	ctx := context.Background()
	must(t, b.Create(ctx, p+"d", 8*mib))
	must(t, b.Create(ctx, p+"s", 8*mib, layering.WithObjectSize(64<<10)))
	for name, want := range map[string]int64{p + "d": 4 * mib, p + "s": 64 << 10} {
		info, err := b.Stat(ctx, name)
		must(t, err)
		if info.ObjectSize != want {
			t.Fatalf("object size of %s = %d, want %d", name, info.ObjectSize, want)
		}
	}
	must(t, b.Snapshot(ctx, layering.SnapRef{Image: p + "s", Snap: "s"}))
	must(t, b.Clone(ctx, layering.SnapRef{Image: p + "s", Snap: "s"}, p+"c"))
	if info, err := b.Stat(ctx, p+"c"); err != nil || info.ObjectSize != 64<<10 {
		t.Fatalf("clone of a 64 KiB-object image: %+v, %v; want its parent's object size", info, err)
	}
	for _, bad := range []int64{1000, 2 << 10, 64 << 20, 3 << 16} {
		err := b.Create(ctx, p+"bad", 8*mib, layering.WithObjectSize(bad))
		if !errors.Is(err, layering.ErrInvalid) {
			t.Fatalf("Create with object size %d = %v, want ErrInvalid", bad, err)
		}
	}
	if names, _ := b.List(ctx); contains(names, p+"bad") {
		t.Fatal("a refused Create left its image")
	}
}

// testBlank: concurrent callers get one sealed blank image, of small
// objects, holding an ext4 filesystem and little else.
func testBlank(t *testing.T, b layering.Backend, _ string) {
	ctx := context.Background()
	size := int64(64*mib + (rand.Int64N(1<<10)+1)*4096)
	name := layering.BlankImage(size)
	t.Cleanup(func() {
		for _, c := range mustChildren(t, b, layering.SnapRef{Image: name, Snap: layering.SealedSnap}) {
			_ = b.Remove(ctx, c)
		}
		_ = b.Remove(ctx, name)
	})
	refs := make([]layering.SnapRef, 3)
	errs := make([]error, 3)
	done := make(chan int)
	for i := range refs {
		go func() { refs[i], errs[i] = layering.Blank(ctx, b, size, t.TempDir()); done <- i }()
	}
	for range refs {
		<-done
	}
	for i := range refs {
		if errs[i] != nil || refs[i] != (layering.SnapRef{Image: name, Snap: layering.SealedSnap}) {
			t.Fatalf("Blank #%d = %v, %v; want %s@%s", i, refs[i], errs[i], name, layering.SealedSnap)
		}
	}
	info, err := b.Stat(ctx, name)
	must(t, err)
	if info.Size != size || info.ObjectSize != layering.BlankObjectSize || !isSealed(info) {
		t.Fatalf("blank image = %+v; want %d bytes, %d-byte objects, sealed", info, size, layering.BlankObjectSize)
	}
	if info.Used > 2*mib {
		t.Fatalf("blank image of %d MiB uses %d bytes; want its filesystem's metadata only", size/mib, info.Used)
	}
	if !layering.IsBlankName(name) || layering.IsBlankName(name+"x") {
		t.Fatalf("IsBlankName(%q) does not recognize it alone", name)
	}
	must(t, b.Clone(ctx, refs[0], name+"-child"))
	magic := read(t, b, name+"-child", 1080, 2)
	if magic[0] != 0x53 || magic[1] != 0xef {
		t.Fatalf("clone of the blank image has no ext4 superblock (magic %x)", magic)
	}
	if _, err := layering.Blank(ctx, b, 0, t.TempDir()); !errors.Is(err, layering.ErrInvalid) {
		t.Fatalf("Blank of 0 bytes = %v, want ErrInvalid", err)
	}
}

func isSealed(info layering.ImageInfo) bool {
	s, ok := info.Snapshot(layering.SealedSnap)
	return ok && s.Protected
}

func mustChildren(t *testing.T, b layering.Backend, ref layering.SnapRef) []string {
	c, err := b.Children(context.Background(), ref)
	if err != nil {
		return nil
	}
	return c
}
