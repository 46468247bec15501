package agent

import (
	"context"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
	"github.com/fogdeploy/fogdeploy/rbd-layering/fakestore"
)

// The images a node makes for an owner carry the etcd revision its
// control plane had seen (the plane publishes it, newer revisions
// included); an image without an owner, or before any revision is known,
// gets none.
func TestStampedOwners(t *testing.T) {
	ctx := context.Background()
	fs, err := fakestore.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })
	st := statetest.Store(t)
	seen := &atomic.Int64{}
	s := stampStore{Backend: fs, seen: seen}
	meta := func(name string) map[string]string {
		t.Helper()
		info, err := fs.Stat(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return info.Meta
	}
	for _, name := range []string{"fdi-a-env", "fdi-b-env", "fdi-c-env"} {
		if err := fs.Create(ctx, name, 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SetMeta(ctx, "fdi-a-env", map[string]string{catalog.MetaDeployment: "a"}); err != nil {
		t.Fatal(err)
	}
	if m := meta("fdi-a-env"); m[catalog.MetaEtcd] != "" {
		t.Errorf("stamped %q before any revision was known", m[catalog.MetaEtcd])
	}
	pl := newPlane(filepath.Join(t.TempDir(), memoryFile), st, slog.New(slog.DiscardHandler))
	pl.publish(seen)
	if err := pl.adopt(ctx, "test"); err != nil {
		t.Fatal(err)
	}
	adopted := seen.Load()
	if adopted <= 0 {
		t.Fatalf("the plane published revision %d once it adopted etcd", adopted)
	}
	pl.seen(state.Header{ClusterID: pl.mem.ClusterID, Revision: adopted + 5})
	if got := seen.Load(); got != adopted+5 {
		t.Errorf("published revision %d after the node saw %d", got, adopted+5)
	}
	if err := s.SetMeta(ctx, "fdi-b-env", map[string]string{catalog.MetaDeployment: "b", catalog.MetaNode: "n1"}); err != nil {
		t.Fatal(err)
	}
	if m := meta("fdi-b-env"); m[catalog.MetaEtcd] == "" || m[catalog.MetaDeployment] != "b" {
		t.Errorf("an owner's image after the revision was known: %v; want its deployment and the revision", m)
	}
	if err := s.SetMeta(ctx, "fdi-c-env", map[string]string{catalog.MetaNode: "n1"}); err != nil {
		t.Fatal(err)
	}
	if m := meta("fdi-c-env"); m[catalog.MetaEtcd] != "" {
		t.Errorf("an image without an owner was stamped: %v", m)
	}
}
