package gencache_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/gencache"
)

// writeGen is a Fill that writes size bytes of a generation's image.
func writeGen(size int, fills *atomic.Int32) gencache.Fill {
	return func(ctx context.Context, dst string) error {
		fills.Add(1)
		time.Sleep(20 * time.Millisecond)
		if err := os.Mkdir(filepath.Join(dst, "sub"), 0o700); err != nil {
			return err
		}
		if err := os.Symlink("ckpt.img", filepath.Join(dst, "latest")); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, "ckpt.img"), make([]byte, size), 0o640)
	}
}

func TestGetFillsOnceAndShares(t *testing.T) {
	c, err := gencache.New(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	var fills atomic.Int32
	k := gencache.Key{App: "redis", Gen: 3}
	var wg sync.WaitGroup
	dirs := make([]string, 5)
	fetched := make([]bool, 5)
	for i := range dirs {
		wg.Go(func() {
			e, f, err := c.Get(context.Background(), k, writeGen(1000, &fills))
			if err != nil {
				t.Error(err)
			}
			dirs[i], fetched[i] = e.Dir, f
		})
	}
	wg.Wait()
	if fills.Load() != 1 {
		t.Fatalf("5 concurrent Gets filled %d times; want once", fills.Load())
	}
	n := 0
	for i, d := range dirs {
		if d != dirs[0] {
			t.Errorf("Get %d returned %s, Get 0 %s; want one directory", i, d, dirs[0])
		}
		if fetched[i] {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d Gets say they fetched; want 1", n)
	}
	st, err := os.Stat(filepath.Join(dirs[0], "ckpt.img"))
	if err != nil || st.Size() != 1000 || st.Mode().Perm() != 0o640 {
		t.Fatalf("cached image = %v, %v; want 1000 bytes, mode 0640", st, err)
	}
	if l, err := os.Readlink(filepath.Join(dirs[0], "latest")); err != nil || l != "ckpt.img" {
		t.Errorf("link = %q, %v", l, err)
	}
	e, err := c.Lookup(k)
	if err != nil || e.Bytes != 1000 {
		t.Errorf("Lookup = %+v, %v; want 1000 bytes", e, err)
	}
	if _, err := c.Lookup(gencache.Key{App: "redis", Gen: 4}); !errors.Is(err, gencache.ErrNotCached) {
		t.Errorf("Lookup of another generation = %v; want ErrNotCached", err)
	}
}

func TestFailedFillLeavesNothing(t *testing.T) {
	root := t.TempDir()
	c, _ := gencache.New(root, 0)
	k := gencache.Key{App: "web", Gen: 1}
	_, _, err := c.Get(context.Background(), k, func(ctx context.Context, dst string) error {
		_ = os.WriteFile(filepath.Join(dst, "half"), []byte("x"), 0o600)
		return errors.New("OSD down")
	})
	if err == nil {
		t.Fatal("a failed fill returned no error")
	}
	if es, _ := c.List(); len(es) != 0 {
		t.Errorf("entries after a failed fill: %+v", es)
	}
	if _, err := os.Stat(filepath.Join(root, "web", "1")); !os.IsNotExist(err) {
		t.Errorf("the failed fill's directory is still there: %v", err)
	}
	if _, _, err := c.Get(context.Background(), k, nil); !errors.Is(err, gencache.ErrNotCached) {
		t.Errorf("Get without a fill = %v; want ErrNotCached", err)
	}
}

func TestTrimKeepsBudgetLRUAndInUse(t *testing.T) {
	c, _ := gencache.New(t.TempDir(), 2500)
	var fills atomic.Int32
	ctx := context.Background()
	for gen := 1; gen <= 3; gen++ {
		if _, _, err := c.Get(ctx, gencache.Key{App: "a", Gen: gen}, writeGen(1000, &fills)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(15 * time.Millisecond)
	}
	// Gen 1 is used again: gen 2 is now the least recently used.
	if _, err := c.Lookup(gencache.Key{App: "a", Gen: 1}); err != nil {
		t.Fatal(err)
	}
	inUse := func(k gencache.Key) bool { return k.Gen == 2 }
	dropped, err := c.Trim(nil, inUse)
	if err != nil {
		t.Fatal(err)
	}
	if len(dropped) != 1 || dropped[0].Gen != 3 {
		t.Fatalf("Trim over budget with gen 2 in use dropped %+v; want gen 3 (the least recently used not in use)", dropped)
	}
	if n, _ := c.Bytes(); n != 2000 {
		t.Errorf("bytes after Trim = %d; want 2000", n)
	}
	// Generations no longer needed go whatever the budget.
	dropped, _ = c.Trim(func(k gencache.Key) bool { return k.Gen == 2 }, nil)
	if len(dropped) != 1 || dropped[0].Gen != 1 {
		t.Errorf("Trim keeping gen 2 dropped %+v; want gen 1", dropped)
	}
	if es, _ := c.List(); len(es) != 1 || es[0].Gen != 2 {
		t.Errorf("left %+v; want gen 2", es)
	}
}

func TestRecoverRemovesCutFills(t *testing.T) {
	root := t.TempDir()
	c, _ := gencache.New(root, 0)
	var fills atomic.Int32
	if _, _, err := c.Get(context.Background(), gencache.Key{App: "a", Gen: 1}, writeGen(10, &fills)); err != nil {
		t.Fatal(err)
	}
	// A fill killed before its marker, and a marker whose directory went.
	_ = os.MkdirAll(filepath.Join(root, "a", "2", "sub"), 0o755)
	_ = os.WriteFile(filepath.Join(root, "b.done"), nil, 0o644)
	_ = os.MkdirAll(filepath.Join(root, "b"), 0o755)
	_ = os.WriteFile(filepath.Join(root, "b", "5.done"), []byte("7\n"), 0o644)
	removed, err := c.Recover()
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 2 {
		t.Errorf("Recover removed %v; want the cut fill and the lone marker", removed)
	}
	if es, _ := c.List(); len(es) != 1 || es[0].Gen != 1 {
		t.Errorf("entries after Recover = %+v; want a/1 only", es)
	}
}

func TestBadKeysAndBudget(t *testing.T) {
	if _, err := gencache.New(t.TempDir(), -1); err == nil {
		t.Error("a negative budget was accepted")
	}
	c, _ := gencache.New(t.TempDir(), 0)
	for _, k := range []gencache.Key{{App: "", Gen: 1}, {App: "a", Gen: 0}, {App: "../x", Gen: 1}, {App: "..", Gen: 2}} {
		if _, _, err := c.Get(context.Background(), k, nil); err == nil {
			t.Errorf("key %+v was accepted", k)
		}
	}
}

func TestAdoptAndStamps(t *testing.T) {
	root := t.TempDir()
	c, _ := gencache.New(filepath.Join(root, "cache"), 0)
	created := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	k := gencache.KeyOf("redis", 1, created)
	staged := filepath.Join(root, "slot", "stage")
	_ = os.MkdirAll(staged, 0o755)
	_ = os.WriteFile(filepath.Join(staged, "ckpt.img"), make([]byte, 300), 0o600)
	e, err := c.Adopt(k, staged)
	if err != nil || e.Bytes != 300 {
		t.Fatalf("Adopt = %+v, %v; want 300 bytes", e, err)
	}
	if _, err := os.Stat(staged); !os.IsNotExist(err) {
		t.Errorf("the adopted directory is still at its old place: %v", err)
	}
	// Generation 1 removed and made again: another stamp, another entry.
	again := gencache.KeyOf("redis", 1, created.Add(time.Hour))
	if _, err := c.Lookup(again); !errors.Is(err, gencache.ErrNotCached) {
		t.Errorf("Lookup of a newer generation 1 = %v; want ErrNotCached", err)
	}
	if es, _ := c.List(); len(es) != 1 || es[0].Key != k {
		t.Errorf("List = %+v; want %v", es, k)
	}
}

// TestUnflushedAcrossRestart: a fill is readable at once, before it is
// flushed; Settle flushes it and it holds across a restart of the machine,
// while one that was not flushed before the restart is not trusted: Get
// fills it again and Recover removes it.
func TestUnflushedAcrossRestart(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	c, err := gencache.New(root, 0)
	if err != nil {
		t.Fatal(err)
	}
	var fills atomic.Int32
	k1, k2 := gencache.Key{App: "a", Gen: 1}, gencache.Key{App: "a", Gen: 2}
	for _, k := range []gencache.Key{k1, k2} {
		if e, fetched, err := c.Get(ctx, k, writeGen(4096, &fills)); err != nil || !fetched || e.Bytes != 4096 || !e.Unflushed {
			t.Fatalf("Get %s = %+v, %v, %v; want a fill of 4096 bytes, not flushed yet", k, e, fetched, err)
		}
	}
	// Flush a/1 only, as the agent's background pass does.
	if err := c.Remove(k2); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Settle(ctx); err != nil || n != 1 {
		t.Fatalf("Settle = %d, %v; want the one entry flushed", n, err)
	}
	if n, err := c.Settle(ctx); err != nil || n != 0 {
		t.Errorf("Settle again = %d, %v; want nothing left to flush", n, err)
	}
	if e, err := c.Lookup(k1); err != nil || e.Unflushed || e.Bytes != 4096 {
		t.Errorf("the entry after Settle: %+v, %v; want it flushed, 4096 bytes", e, err)
	}
	if _, _, err := c.Get(ctx, k2, writeGen(4096, &fills)); err != nil {
		t.Fatal(err)
	}
	// The machine restarts: an entry not flushed names another boot.
	marker := filepath.Join(root, "a", "2.done")
	if err := os.WriteFile(marker, []byte("4096 0f0e0d0c-boot-before\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err = gencache.New(root, 0)
	if err != nil {
		t.Fatal(err)
	}
	if e, err := c.Lookup(k1); err != nil || e.Bytes != 4096 {
		t.Errorf("the flushed entry after a restart: %+v, %v; want it held", e, err)
	}
	if _, err := c.Lookup(k2); !errors.Is(err, gencache.ErrNotCached) {
		t.Errorf("the entry not flushed before a restart: %v; want ErrNotCached", err)
	}
	removed, err := c.Recover()
	if err != nil || len(removed) != 2 {
		t.Errorf("Recover removed %v, %v; want the unflushed entry's directory and marker", removed, err)
	}
	if _, err := os.Stat(filepath.Join(root, "a", "2")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the unflushed entry's files after Recover: %v; want them gone", err)
	}
	before := fills.Load()
	if _, fetched, err := c.Get(ctx, k2, writeGen(4096, &fills)); err != nil || !fetched || fills.Load() != before+1 {
		t.Errorf("Get of the dropped entry: fetched %v, %v; want it filled again", fetched, err)
	}
}

// TestBeginGivesTheDirectoryBeforeTheFill: Begin names the entry's
// directory while its fill still runs (a caller binds it meanwhile), the
// files written there are the entry's once wait returns, a held entry is
// named at once, and a fill that fails leaves no directory.
func TestBeginGivesTheDirectoryBeforeTheFill(t *testing.T) {
	ctx := context.Background()
	c, _ := gencache.New(t.TempDir(), 0)
	release := make(chan struct{})
	slow := func(ctx context.Context, dst string) error {
		<-release
		return os.WriteFile(filepath.Join(dst, "ckpt.img"), []byte("pages"), 0o640)
	}
	k := gencache.Key{App: "a", Gen: 1}
	dir, wait, err := c.Begin(ctx, k, slow)
	if err != nil {
		t.Fatal(err)
	}
	// Bound before the fill ends, as a container binds it.
	d, err := os.Open(dir)
	if err != nil {
		t.Fatalf("the directory Begin named, during the fill: %v", err)
	}
	defer d.Close()
	close(release)
	e, fetched, err := wait()
	if err != nil || !fetched || e.Dir != dir {
		t.Fatalf("wait = %+v, %v, %v; want the filled entry in %s", e, fetched, err, dir)
	}
	names, err := d.Readdirnames(-1)
	if err != nil || len(names) != 1 || names[0] != "ckpt.img" {
		t.Errorf("the directory opened during the fill holds %v, %v; want the entry's file", names, err)
	}
	if dir2, wait2, err := c.Begin(ctx, k, nil); err != nil || dir2 != dir {
		t.Errorf("Begin of a held entry = %q, %v; want %q at once", dir2, err, dir)
	} else if _, fetched, err := wait2(); err != nil || fetched {
		t.Errorf("wait of a held entry: fetched %v, %v; want no fill", fetched, err)
	}
	bad := gencache.Key{App: "a", Gen: 2}
	dir, wait, err = c.Begin(ctx, bad, func(context.Context, string) error { return errors.New("cluster gone") })
	if err == nil {
		_, _, err = wait()
	}
	if err == nil {
		t.Fatal("a failed fill: no error")
	}
	if dir != "" {
		if _, serr := os.Stat(dir); !errors.Is(serr, os.ErrNotExist) {
			t.Errorf("a failed fill left its directory %s: %v", dir, serr)
		}
	}
}

// A partial copy (a checkpoint whose pages come later, from elsewhere)
// serves the restore it was filled for, and no other: the next Get fills
// it anew, and Recover removes one a crash left.
func TestPartialServesItsFillOnly(t *testing.T) {
	dir := t.TempDir()
	c, err := gencache.New(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	var fills atomic.Int32
	k := gencache.Key{App: "redis", Gen: 4}
	partial := func(ctx context.Context, dst string) error {
		if err := writeGen(4096, &fills)(ctx, dst); err != nil {
			return err
		}
		return gencache.MarkPartial(dst)
	}
	e, fetched, err := c.Get(context.Background(), k, partial)
	if err != nil || !fetched {
		t.Fatalf("Get with a partial fill = %v, fetched %v; want its entry for its own restore", err, fetched)
	}
	if _, err := c.Lookup(k); !errors.Is(err, gencache.ErrNotCached) {
		t.Fatalf("Lookup of a partial copy = %v; want ErrNotCached", err)
	}
	if _, fetched, err := c.Get(context.Background(), k, writeGen(4096, &fills)); err != nil || !fetched || fills.Load() != 2 {
		t.Fatalf("Get after a partial copy: fetched %v, %v, %d fills; want it filled anew", fetched, err, fills.Load())
	}
	if _, err := os.Stat(filepath.Join(e.Dir, gencache.PartialFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the copy filled anew is still marked partial: %v", err)
	}
	if _, _, err := c.Get(context.Background(), gencache.Key{App: "redis", Gen: 5}, partial); err != nil {
		t.Fatal(err)
	}
	removed, err := c.Recover()
	if err != nil || len(removed) == 0 || filepath.Base(removed[0]) != "5" {
		t.Fatalf("Recover = %v, %v; want the partial copy removed", removed, err)
	}
	if _, err := c.Lookup(gencache.Key{App: "redis", Gen: 5}); !errors.Is(err, gencache.ErrNotCached) {
		t.Fatalf("after Recover, the partial copy: %v", err)
	}
	if _, err := c.Lookup(k); err != nil {
		t.Fatalf("after Recover, the whole copy: %v", err)
	}
}
