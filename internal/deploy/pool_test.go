package deploy_test

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/cgroup"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

func TestPoolHitDMTCPContainer(t *testing.T) { testPoolHit(t, "container", engine.NameDMTCP) }
func TestPoolHitCRIU(t *testing.T)           { testPoolHit(t, "host", engine.NameCRIU) }
func TestPoolHitCRIUContainer(t *testing.T)  { testPoolHit(t, "container", engine.NameCRIU) }

// testPoolHit is what a warm pool promises: a restore that finds an idle
// slot of the app's generation runs only start, ready and bind, answers
// with the checkpoint's state, and leaves the slot's resources to the
// deployment; without a slot it provisions its own; released or dropped
// slots leave nothing.
func testPoolHit(t *testing.T, driver string, eng engine.Name) {
	f, ctx, app := redisFixture(t, driver, eng, "pool")
	poolHit(ctx, t, f, app, driver)
}

// TestPoolHitUnit is testPoolHit on the fakes, under either engine,
// without root or a service.
func TestPoolHitUnit(t *testing.T) {
	for _, eng := range spec.Engines {
		t.Run(string(eng), func(t *testing.T) {
			u, ctx, app := unitRedis(t, eng)
			poolHit(ctx, t, u, app, "container")
		})
	}
}

func poolHit(ctx context.Context, t *testing.T, n deploytest.Node, app spec.App, driver string) {
	d := n.Deployer()

	first, err := d.Deploy(ctx, app, deploy.Options{Prepare: func(ctx context.Context, tg deploy.Target) error {
		_, err := testenv.RedisDo(ctx, nil, tg.Ports["6379/tcp"], "SET", "greeting", "from the checkpoint")
		return err
	}})
	if err != nil {
		t.Fatalf("first deploy: %v", err)
	}
	if first.Pool != spec.PoolMiss {
		t.Errorf("first deploy: pool %q; want %q (the pool was empty)", first.Pool, spec.PoolMiss)
	}
	g, err := d.Checkpoints().Latest(ctx, app.Name)
	if err != nil {
		t.Fatal(err)
	}

	var pooled []deploy.Slot
	for range 2 {
		s, err := d.Pool().ProvisionPoolSlot(ctx, g)
		if err != nil {
			t.Fatalf("provision a pool slot: %v", err)
		}
		pooled = append(pooled, s)
	}
	slots, err := d.Pool().PoolSlots()
	if err != nil {
		t.Fatal(err)
	}
	if len(slots) != 2 || slots[0].Phase != deploy.SlotIdle || slots[1].Phase != deploy.SlotIdle {
		t.Fatalf("pool slots = %+v; want 2 idle", slots)
	}
	for _, step := range deploy.ProvisionSteps {
		if !hasPhase(slots[0].Timings, step) {
			t.Errorf("slot %s timings %s lack %q", slots[0].ID, slots[0].Timings, step)
		}
	}
	// An idle slot's app does not run yet: nothing answers on its port.
	if addr := slots[0].Ports["6379/tcp"]; driver == "container" {
		if addr == "" {
			t.Errorf("idle slot %s publishes no port: %+v", slots[0].ID, slots[0].Ports)
		} else if got, err := testenv.RedisDo(ctx, nil, addr, "PING"); err == nil {
			t.Errorf("idle slot %s answered PING with %q before any deploy", slots[0].ID, got)
		}
	}

	// A waiting slot's container has the lowest CPU weight; a bound one,
	// the normal weight (TestPoolPoP checks the same through the agent).
	weight := func(ref string) int { t.Helper(); return n.Weight(ctx, t, ref) }
	if driver == "container" {
		if w := weight(slots[0].Handle.Ref); w != -1 && w != cgroup.Background.CPU {
			t.Errorf("idle slot %s has CPU weight %d; want %d (background)", slots[0].ID, w, cgroup.Background.CPU)
		}
	}

	check := func(dep deploy.Deployment) {
		t.Helper()
		got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, dep), "GET", "greeting")
		if err != nil || got != "from the checkpoint" {
			t.Errorf("%s: GET greeting = %q, %v", dep.ID, got, err)
		}
	}
	var deps []deploy.Deployment
	for i, want := range pooled {
		var phases []string
		dep, err := d.Deploy(ctx, app, deploy.Options{Progress: func(p string, _ time.Duration) { phases = append(phases, p) }})
		if err != nil {
			t.Fatalf("deploy %d: %v", i+1, err)
		}
		deps = append(deps, dep)
		t.Logf("pool hit %d: %s (total %s)", i+1, dep.Timings, dep.Total().Round(time.Millisecond))
		// What the deploy did before its slot's stages counts too.
		if len(dep.Timings) == 0 || dep.Timings[0].Name != string(deploy.StepResolve) || len(phases) == 0 || phases[0] != string(deploy.StepResolve) {
			t.Errorf("pool hit %d: timings %s (progress %v); want %q first", i+1, dep.Timings, phases, deploy.StepResolve)
		}
		if dep.Pool != spec.PoolHit || dep.Slot != want.ID {
			t.Errorf("deploy %d: pool %q slot %s; want a hit of the oldest idle slot %s", i+1, dep.Pool, dep.Slot, want.ID)
		}
		for _, step := range deploy.ProvisionSteps {
			if hasPhase(dep.Timings, step) || slices.Contains(phases, string(step)) {
				t.Errorf("pool hit %d waited for %q: %s", i+1, step, dep.Timings)
			}
		}
		for _, step := range []deploy.Step{deploy.StepStart, deploy.StepReady, deploy.StepBind} {
			if !hasPhase(dep.Timings, step) {
				t.Errorf("pool hit %d timings %s lack %q", i+1, dep.Timings, step)
			}
		}
		// The deployment owns the slot's resources now.
		if !slices.Equal(dep.Images, want.Images) || dep.Handle == nil || dep.Handle.Ref != want.Handle.Ref {
			t.Errorf("deploy %d owns %v (handle %+v); want the slot's %v (%s)", i+1, dep.Images, dep.Handle, want.Images, want.Handle.Ref)
		}
		if _, err := d.Pool().LoadSlot(want.ID); err == nil {
			t.Errorf("slot %s still has a record after deployment %s bound it", want.ID, dep.ID)
		}
		check(dep)
		if driver == "container" {
			if w := weight(dep.Handle.Ref); w != -1 && w != cgroup.Normal.CPU {
				t.Errorf("deploy %d: bound slot's CPU weight %d; want %d (normal)", i+1, w, cgroup.Normal.CPU)
			}
		}
	}
	// The pool is empty: the next restore provisions its own slot.
	miss, err := d.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	deps = append(deps, miss)
	t.Logf("deploy on an empty pool: %s", miss.Timings)
	if miss.Pool != spec.PoolMiss || !hasPhase(miss.Timings, deploy.StepClone) || !hasPhase(miss.Timings, deploy.StepBind) {
		t.Errorf("deploy on an empty pool: pool %q, timings %s; want a miss that provisions and binds", miss.Pool, miss.Timings)
	}
	check(miss)

	// A slot filled before a newer generation was sealed is not taken:
	// the deploy restores the newer one.
	old, err := d.Pool().ProvisionPoolSlot(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Checkpoint(ctx, app, deploy.CheckpointOptions{}); err != nil {
		t.Fatalf("a second generation: %v", err)
	}
	newer, err := d.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	deps = append(deps, newer)
	if newer.Gen == g.Gen || newer.Slot == old.ID || newer.Pool != spec.PoolMiss {
		t.Errorf("deploy after generation %d was sealed: generation %d, slot %s (%s); want the newer generation, not slot %s of %d",
			g.Gen+1, newer.Gen, newer.Slot, newer.Pool, old.ID, g.Gen)
	}
	if _, err := d.Pool().DropPool(ctx, app.Name, nil); err != nil {
		t.Fatal(err)
	}

	// Dropping and releasing idle slots leaves nothing of them.
	for range 2 {
		if _, err := d.Pool().ProvisionPoolSlot(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	dropped, err := d.Pool().DropPool(ctx, app.Name, func(s deploy.Slot) bool { return s.Gen == g.Gen })
	if err != nil || len(dropped) != 2 {
		t.Errorf("DropPool = %v, %v; want both idle slots", dropped, err)
	}
	for _, dep := range deps {
		if err := d.Undeploy(ctx, dep.ID); err != nil {
			t.Errorf("undeploy %s: %v", dep.ID, err)
		}
	}
	if err := d.Undeploy(ctx, first.ID); err != nil {
		t.Errorf("undeploy %s: %v", first.ID, err)
	}
	n.AssertNothingLeft(t, app.Name, true)
}

// TestPoolRecoverSlots: what a killed agent left in the slot records is
// finished at its next start: an idle slot, a slot claimed by a
// deployment that never got its record, and a bind cut short between the
// deployment's record and the slot's removal.
func TestPoolRecoverSlots(t *testing.T) {
	f, ctx, app := redisFixture(t, "container", engine.NameDMTCP, "poolrec")
	recoverSlots(ctx, t, f, app)
}

// TestPoolRecoverSlotsUnit is TestPoolRecoverSlots on the fakes.
func TestPoolRecoverSlotsUnit(t *testing.T) {
	u, ctx, app := unitRedis(t, engine.NameDMTCP)
	recoverSlots(ctx, t, u, app)
}

func recoverSlots(ctx context.Context, t *testing.T, n deploytest.Node, app spec.App) {
	d := n.Deployer()
	first, err := d.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g, err := d.Checkpoints().Latest(ctx, app.Name)
	if err != nil {
		t.Fatal(err)
	}
	idle, err := d.Pool().ProvisionPoolSlot(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := d.Pool().ProvisionPoolSlot(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	// A claim whose deployment never wrote its record.
	claimed.Phase, claimed.Deployment = deploy.SlotClaimed, "ghost-1"
	writeSlot(t, n, claimed)
	dep, err := d.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if dep.Slot != idle.ID || dep.Pool != spec.PoolHit {
		t.Fatalf("deploy took slot %s (%s); want a hit of the oldest idle slot %s", dep.Slot, dep.Pool, idle.ID)
	}
	// A bind cut short: the deployment's record owns the slot's resources,
	// and the slot's record is still there.
	bound := idle
	bound.Phase, bound.Deployment = deploy.SlotClaimed, dep.ID
	writeSlot(t, n, bound)

	// A new process over the same state, as an agent restarted.
	d2 := n.Reopen(t)
	released, err := d2.Pool().RecoverSlots(ctx)
	if err != nil {
		t.Fatalf("RecoverSlots: %v", err)
	}
	if !slices.Contains(released, claimed.ID) || slices.Contains(released, bound.ID) {
		t.Errorf("RecoverSlots released %v; want %s (claimed by a deployment without a record) and not %s (bound)", released, claimed.ID, bound.ID)
	}
	if s, err := d2.Pool().Slots(); err != nil || len(s) != 0 {
		t.Errorf("slot records after recovery: %+v, %v; want none", s, err)
	}
	// The bound deployment still runs and still owns what it had.
	if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, dep), "PING"); err != nil || got != "PONG" {
		t.Errorf("deployment %s after recovery: PING = %q, %v", dep.ID, got, err)
	}
	for _, id := range []string{first.ID, dep.ID} {
		if err := d2.Undeploy(ctx, id); err != nil {
			t.Errorf("undeploy %s: %v", id, err)
		}
	}
	n.AssertNothingLeft(t, app.Name, true)
}

func writeSlot(t *testing.T, n deploytest.Node, s deploy.Slot) {
	t.Helper()
	writeJSON(t, n.SlotRecord(s.ID), s)
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func hasPhase(t layering.Timings, step deploy.Step) bool {
	return slices.ContainsFunc(t, func(p layering.Phase) bool { return p.Name == string(step) })
}
