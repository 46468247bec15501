package gc_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/gc"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
	"github.com/fogdeploy/fogdeploy/rbd-layering/fakestore"
)

// gc plans nothing against an etcd that may not be the PoP's: an empty
// one (no PoP record) while the pool holds the images of deployments and
// checkpoints (each would look orphaned once agents register again), or
// one that a registered node is fenced from. An empty pool, or a PoP
// record and no fenced node, plans as usual.
func TestGCRefusesWithoutThePoP(t *testing.T) {
	ctx := context.Background()
	s, err := fakestore.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	st := statetest.Store(t)
	cfg := gc.Config{Store: s, State: st, Keep: 1}
	if _, err := gc.Plan(ctx, cfg); err != nil {
		t.Fatalf("a new PoP on an empty pool: %v", err)
	}
	// What a PoP's nodes made, then etcd is emptied (never written here);
	// its agents are back, registered anew.
	for _, name := range []string{catalog.GenImage("web", 1, "env"), catalog.GenImage("web", 1, "ckpt"), catalog.InstancePrefix + "web-1-env"} {
		if err := s.Create(ctx, name, 1<<20); err != nil {
			t.Fatal(err)
		}
		if err := s.SetMeta(ctx, name, map[string]string{catalog.MetaNode: "n1", catalog.MetaDeployment: "web-1"}); err != nil {
			t.Fatal(err)
		}
	}
	sess, err := st.Register(ctx, state.Node{Name: "n1", Capacity: 4}, 30)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	plan, err := gc.Plan(ctx, cfg)
	if !errors.Is(err, state.ErrFenced) || !strings.Contains(err.Error(), "etcd has no PoP record") ||
		!strings.Contains(err.Error(), "3 image(s)") || !strings.Contains(hint.Of(err), "restore etcd") {
		t.Fatalf("plan on an emptied etcd = %v, %v (hint %q); want refused, saying why and what to do", plan, err, hint.Of(err))
	}
	// A node fenced from this etcd: refused even with a PoP record.
	if _, _, err := st.EnsurePoP(ctx); err != nil {
		t.Fatal(err)
	}
	fence := "control plane fenced: etcd has no PoP record (/fogdeploy/pop), while this node remembers PoP 01ab"
	if err := st.UpdateNode(ctx, state.Node{Name: "n1", Capacity: 4, Problems: map[string]string{state.ProblemControlPlane: fence}}, sess); err != nil {
		t.Fatal(err)
	}
	if _, err := gc.Plan(ctx, cfg); !errors.Is(err, state.ErrFenced) || !strings.Contains(err.Error(), "node(s) n1") ||
		!strings.Contains(err.Error(), "remembers PoP 01ab") || !strings.Contains(hint.Of(err), "--adopt-pop") {
		t.Errorf("plan with a fenced node = %v (hint %q); want refused, naming the node and why", err, hint.Of(err))
	}
	// The node adopts this etcd: gc plans again (the clone's deployment
	// is gone: an orphan, once older than MinAge).
	if err := st.UpdateNode(ctx, state.Node{Name: "n1", Capacity: 4}, sess); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	plan, err = gc.Plan(ctx, cfg)
	if err != nil || len(plan) == 0 {
		t.Errorf("plan once the PoP is recorded and no node is fenced = %+v, %v; want the orphans", plan, err)
	}
}
