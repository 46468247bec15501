package catalog_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/fakestore"
)

// TestGenImageNames: a generation's image names round-trip, and no other
// name parses as one (an app whose name ends in a number included).
func TestGenImageNames(t *testing.T) {
	for _, c := range []struct {
		app  string
		gen  int
		kind string
	}{{"redis", 1, "env"}, {"web-2", 12, "ckpt"}, {"a-1-b", 3, "env"}} {
		name := catalog.GenImage(c.app, c.gen, c.kind)
		app, gen, kind, ok := catalog.ParseGenImage(name)
		if !ok || app != c.app || gen != c.gen || kind != c.kind {
			t.Errorf("ParseGenImage(%s) = %s %d %s %v; want %s %d %s", name, app, gen, kind, ok, c.app, c.gen, c.kind)
		}
	}
	for _, name := range []string{"fdc-redis-0-env", "fdc-redis-1-disk", "fdi-redis-1-env", "fdc-redis-env", "fdc--1-ckpt", "fdc-redis-01-env", "fdc-redis-x-ckpt"} {
		if app, gen, kind, ok := catalog.ParseGenImage(name); ok {
			t.Errorf("ParseGenImage(%s) = %s %d %s; want no generation", name, app, gen, kind)
		}
	}
	lower := catalog.LowerImage("redis", 4, "node1")
	if !catalog.IsLowerName(lower) || catalog.IsLowerName(catalog.InstancePrefix+"redis-s1234abcd-env") || lower == catalog.LowerImage("redis", 4, "node2") {
		t.Errorf("LowerImage = %s: want a name IsLowerName knows, distinct per node, and no instance clone taken for one", lower)
	}
}

// seal makes generation gen of app in store as a deploy seals it: both
// images, their sealed snapshots, the record on the checkpoint image.
func seal(ctx context.Context, t *testing.T, store layering.Store, app string, gen int) {
	t.Helper()
	for _, kind := range []string{"env", "ckpt"} {
		img := catalog.GenImage(app, gen, kind)
		if err := store.Create(ctx, img, 1<<20); err != nil {
			t.Fatal(err)
		}
		if err := store.Snapshot(ctx, layering.SnapRef{Image: img, Snap: layering.SealedSnap}); err != nil {
			t.Fatal(err)
		}
	}
	rec, _ := json.Marshal(spec.Generation{App: app, Gen: gen, Engine: "dmtcp"})
	if err := store.SetMeta(ctx, catalog.GenImage(app, gen, "ckpt"), map[string]string{catalog.MetaGeneration: string(rec)}); err != nil {
		t.Fatal(err)
	}
}

// TestGenerationsAndRemoval, on the file-backed store (held to the
// store's suite): only sealed generations are listed, oldest first; a
// generation an instance clone uses is not removed; one that only a
// node's copy holds is retired first (listed as such, ErrHeldByNodes),
// and removed once the copy is gone; removing it again says it is gone.
func TestGenerationsAndRemoval(t *testing.T) {
	ctx := context.Background()
	store, err := fakestore.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	seal(ctx, t, store, "redis", 2)
	seal(ctx, t, store, "redis", 1)
	seal(ctx, t, store, "redis-2", 1)                                                      // another app whose name extends this one's
	if err := store.Create(ctx, catalog.GenImage("redis", 3, "ckpt"), 1<<20); err != nil { // being made
		t.Fatal(err)
	}
	gens, err := catalog.Generations(ctx, store, "redis")
	if err != nil || len(gens) != 2 || gens[0].Gen != 1 || gens[1].Gen != 2 {
		t.Fatalf("Generations = %+v, %v; want 1 and 2 (3 is not sealed, redis-2 is another app)", gens, err)
	}
	if nums, err := catalog.GenNumbers(ctx, store, "redis"); err != nil || !slices.Equal(nums, []int{1, 2, 3}) {
		t.Errorf("GenNumbers = %v, %v; want 1 2 3", nums, err)
	}

	env1 := layering.SnapRef{Image: catalog.GenImage("redis", 1, "env"), Snap: layering.SealedSnap}
	if err := store.Clone(ctx, env1, catalog.InstancePrefix+"redis-d1-env"); err != nil {
		t.Fatal(err)
	}
	if err := catalog.RemoveGeneration(ctx, store, "redis", 1); !errors.Is(err, layering.ErrHasChildren) || errors.Is(err, catalog.ErrHeldByNodes) {
		t.Fatalf("RemoveGeneration while an instance uses it = %v; want ErrHasChildren", err)
	}
	if err := store.Remove(ctx, catalog.InstancePrefix+"redis-d1-env"); err != nil {
		t.Fatal(err)
	}

	lower := catalog.LowerImage("redis", 1, "node1")
	if err := store.Clone(ctx, env1, lower); err != nil {
		t.Fatal(err)
	}
	if err := catalog.RemoveGeneration(ctx, store, "redis", 1); !errors.Is(err, catalog.ErrHeldByNodes) {
		t.Fatalf("RemoveGeneration while a node's copy holds it = %v; want ErrHeldByNodes", err)
	}
	if g, ok, err := catalog.ReadGen(ctx, store, "redis", 1); err != nil || !ok || !g.Retired {
		t.Fatalf("ReadGen after the first removal = %+v, %v, %v; want it retired", g, ok, err)
	}
	if err := store.Remove(ctx, lower); err != nil {
		t.Fatal(err)
	}
	if err := catalog.RemoveGeneration(ctx, store, "redis", 1); err != nil {
		t.Fatalf("RemoveGeneration once the copy is gone: %v", err)
	}
	if err := catalog.RemoveGeneration(ctx, store, "redis", 1); !errors.Is(err, layering.ErrNotFound) {
		t.Errorf("RemoveGeneration of a removed generation = %v; want ErrNotFound", err)
	}
	if gens, err := catalog.Generations(ctx, store, "redis"); err != nil || len(gens) != 1 || gens[0].Gen != 2 {
		t.Errorf("Generations after the removal = %+v, %v; want 2 only", gens, err)
	}
}
