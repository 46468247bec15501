package state_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/adaptive"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Costs per app and node: recorded by the node's agent, concurrent records
// all kept, restore samples reset by a new generation, boot samples by a
// new spec, all of them forgotten with the app, and never recreated for
// an app that is gone.
func TestCosts(t *testing.T) {
	st := statetest.Store(t)
	ctx := context.Background()
	for _, a := range []string{"web", "web2"} {
		if err := st.CreateApp(ctx, app(a), false); err != nil {
			t.Fatal(err)
		}
	}
	if c, err := st.NodeCosts(ctx, "web", "n1"); err != nil || c.App != "web" || c.Node != "n1" || len(c.Boot)+len(c.Restore) != 0 {
		t.Fatalf("costs before any deploy = %+v, %v; want none", c, err)
	}
	add := func(app, node string, mode spec.Mode, gen int, ms int, auto bool) {
		t.Helper()
		if err := st.RecordCost(ctx, app, node, adaptive.Run{Mode: mode, Gen: gen, Cost: time.Duration(ms) * time.Millisecond, Auto: auto}); err != nil {
			t.Fatal(err)
		}
	}
	add("web", "n1", spec.ModeRestore, 1, 600, true)
	add("web", "n1", spec.ModeBoot, 0, 150, true)
	add("web", "n2", spec.ModeBoot, 0, 200, false)
	add("web2", "n1", spec.ModeBoot, 0, 999, false)
	// Concurrent deploys on one node: each record is kept.
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() { add("web", "n1", spec.ModeRestore, 1, 500+i, true) })
	}
	wg.Wait()
	cs, err := st.Costs(ctx, "web")
	if err != nil || len(cs) != 2 || cs[0].Node != "n1" || cs[1].Node != "n2" {
		t.Fatalf("Costs(web) = %+v, %v; want n1 and n2", cs, err)
	}
	if c := cs[0]; len(c.Restore) != 7 || len(c.Boot) != 1 || c.Boot[0] != 150 || c.Gen != 1 || c.Auto != 8 {
		t.Errorf("costs of web on n1 = %+v; want 7 restores of gen 1, 1 boot of 150 ms, 8 auto", c)
	}
	if d := adaptive.Decide(cs[0], adaptive.Situation{Generation: true, PoP: cs}); d.Mode != spec.ModeBoot || d.Why != adaptive.WhyFaster {
		t.Errorf("Decide after 7 restores and a faster boot = %+v; want a boot, the faster", d)
	}
	// A pool hit is kept apart from the restores.
	if err := st.RecordCost(ctx, "web", "n1", adaptive.Run{Mode: spec.ModeRestore, Gen: 1, Cost: 4 * time.Millisecond, Hit: true}); err != nil {
		t.Fatal(err)
	}
	if c, _ := st.NodeCosts(ctx, "web", "n1"); len(c.Hit) != 1 || len(c.Restore) != 7 {
		t.Errorf("costs of web on n1 after a hit = %+v; want 1 hit, 7 restores", c)
	}

	// A new generation: restore samples start afresh on every node; boots stay.
	if err := st.PutCheckpoint(ctx, spec.Generation{App: "web", Gen: 2}); err != nil {
		t.Fatal(err)
	}
	if c, _ := st.NodeCosts(ctx, "web", "n1"); len(c.Restore)+len(c.Hit) != 0 || c.Gen != 2 || len(c.Boot) != 1 {
		t.Errorf("costs of web on n1 after generation 2 = %+v; want no restores nor hits, gen 2, the boot kept", c)
	}
	// A restore of generation 1 that ends after generation 2 was sealed is
	// not counted.
	add("web", "n1", spec.ModeRestore, 1, 100, false)
	if c, _ := st.NodeCosts(ctx, "web", "n1"); len(c.Restore) != 0 {
		t.Errorf("a restore of the old generation was counted: %+v", c)
	}
	// A spec that changes what does not boot the process (pool size,
	// mode, resources): boots stay.
	same := app("web")
	pool := 3
	same.Pool, same.Mode, same.Resources = &pool, spec.ModeAuto, spec.Resources{CPUs: 0.5, Memory: "256M"}
	if err := st.CreateApp(ctx, same, true); err != nil {
		t.Fatal(err)
	}
	if cs, _ := st.Costs(ctx, "web"); len(cs) != 2 || len(cs[0].Boot) != 1 || len(cs[1].Boot) != 1 {
		t.Errorf("costs after a new pool size, mode and resources = %+v; want the boots kept", cs)
	}
	// A spec that boots another process: boots are measured afresh.
	other := app("web")
	other.Environment = []string{"MODEL=large"}
	if err := st.CreateApp(ctx, other, true); err != nil {
		t.Fatal(err)
	}
	if cs, _ := st.Costs(ctx, "web"); len(cs) != 2 || len(cs[0].Boot)+len(cs[1].Boot) != 0 || cs[0].Gen != 2 {
		t.Errorf("costs after a new spec = %+v; want no boots", cs)
	}

	// Removing the app forgets its costs, and only its own (not web2's).
	if err := st.DeleteApp(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	r, err := st.Client().Get(ctx, state.Prefix+"costs/", clientv3.WithPrefix())
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Key) != state.Prefix+"costs/web2/n1" {
		t.Errorf("cost keys after removing web = %v, %v; want web2's only", r.Kvs, err)
	}
	// An agent that records a deploy of the removed app writes nothing.
	add("web", "n1", spec.ModeBoot, 0, 150, true)
	if cs, err := st.Costs(ctx, "web"); err != nil || len(cs) != 0 {
		t.Errorf("costs of a removed app = %+v, %v; want none", cs, err)
	}
}
