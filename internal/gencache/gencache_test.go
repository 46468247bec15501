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
