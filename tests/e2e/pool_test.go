//go:build !no_ceph

package e2e

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/scheduler"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// TestPoolPoP: an app with `pool: 2` on a 3-node PoP. Once its generation
// is sealed every node keeps 2 idle slots; deploys without --node go to a
// node with an idle slot and say so, wait for no clone, map, mount or
// container step, and answer with the checkpoint's state; the pool is full
// again shortly after; killing an agent while it refills leaks nothing,
// and its restart provisions the pool anew; `fogctl pool ls` and `fogctl
// node ls` show it; pool 0 releases every slot.
func TestPoolPoP(t *testing.T) {
	ctx, p, _, app := redisOnPoP(t, "e2e-pool", engine.NameDMTCP, func(a *spec.App) { two := 2; a.Pool = &two }, "n1", "n2", "n3")
	st := p.st
	// The first deploy produces the generation (no pool can exist before).
	first, err := scheduler.Create(ctx, st, scheduler.Request{App: app.Name, Mode: spec.ModeRestore}, "e2e")
	if err != nil {
		t.Fatal(err)
	}
	p.waitAll(ctx, app.Name, 1)
	nodes := []string{"n1", "n2", "n3"}
	// waitPoolsOf waits until every node's pool holds size idle slots of
	// generation gen and the pools have counted at least hits hits.
	waitPoolsOf := func(why string, hits, gen, size int) []state.Pool {
		t.Helper()
		start := time.Now()
		for ctx.Err() == nil {
			pools, err := st.Pools(ctx, "")
			if err != nil {
				t.Fatal(err)
			}
			full, counted := 0, 0
			for _, pl := range pools {
				if pl.App == app.Name && pl.Idle == size && pl.Gen == gen {
					full++
				}
				if pl.App == app.Name {
					counted += pl.Hits
				}
			}
			if full == len(nodes) && counted >= hits {
				t.Logf("pools full %s in %s", why, time.Since(start).Round(time.Millisecond))
				return pools
			}
			if time.Since(start) > 90*time.Second {
				t.Fatalf("pools not full %s after 90 s: %+v", why, pools)
			}
			time.Sleep(100 * time.Millisecond)
		}
		return nil
	}
	waitPools := func(why string, hits int) []state.Pool { return waitPoolsOf(why, hits, 1, 2) }
	waitPools("after the first checkpoint", 0)

	out, errOut, code := p.fogctl(ctx, "pool", "ls", app.Name, "-o", "json")
	var listed []state.Pool
	if err := json.Unmarshal([]byte(out), &listed); code != 0 || err != nil || len(listed) != 3 {
		t.Errorf("fogctl pool ls -o json = %d, %v, %d pools; want 3\n%s%s", code, err, len(listed), out, errOut)
	}
	// The agents restore their slots ahead (agent.pool_ahead: true).
	for _, pl := range listed {
		if pl.Ahead != pl.Idle {
			t.Errorf("pool of %s on %s: %d of %d idle slots restored ahead; want all", pl.App, pl.Node, pl.Ahead, pl.Idle)
		}
	}
	if out, _, _ := p.fogctl(ctx, "node", "ls"); !strings.Contains(out, "POOL") || !strings.Contains(out, "refill priority: cgroup") {
		t.Errorf("fogctl node ls shows no pool or refill priority:\n%s", out)
	}

	// Deploys without --node take pool slots.
	var ids []string
	for i := range 3 {
		out, errOut, code := p.fogctl(ctx, "deploy", app.Name, "--wait", "-o", "json")
		var d state.Deployment
		if err := json.Unmarshal([]byte(out), &d); code != 0 || err != nil {
			t.Fatalf("deploy %d = %d, %v\n%s", i+1, code, err, errOut)
		}
		ids = append(ids, d.ID)
		t.Logf("deploy %d on %s (%s): %s", i+1, d.Node, d.Placement, d.Status.Timings)
		if !strings.HasPrefix(d.Placement, "pool:") {
			t.Errorf("deploy %d placed on %s because %q; want a node with an idle pool slot", i+1, d.Node, d.Placement)
		}
		if d.Status.Pool != spec.PoolHit || d.Status.Slot == "" || !d.Status.Ahead {
			t.Errorf("deploy %d: pool %q slot %q ahead %v; want a hit of a slot restored ahead", i+1, d.Status.Pool, d.Status.Slot, d.Status.Ahead)
		}
		if slices.ContainsFunc(d.Status.Timings, func(ph layering.Phase) bool { return ph.Name == string(deploy.StepStart) }) {
			t.Errorf("deploy %d (a slot restored ahead) restarted its app: %s", i+1, d.Status.Timings)
		}
		for _, ph := range d.Status.Timings {
			if slices.Contains(deploy.ProvisionSteps, deploy.Step(ph.Name)) {
				t.Errorf("deploy %d (a pool hit) waited for %s: %s", i+1, ph.Name, d.Status.Timings)
			}
		}
		if got, err := testenv.RedisDo(ctx, nil, d.Status.Ports["6379/tcp"], "PING"); err != nil || got != "PONG" {
			t.Errorf("deploy %d: PING = %q, %v", i+1, got, err)
		}
	}
	pools := waitPools("after 3 hits", 3)
	hits := 0
	for _, pl := range pools {
		if pl.App == app.Name {
			hits += pl.Hits
		}
	}
	if hits != 3 {
		t.Errorf("pools report %d hits; want 3: %+v", hits, pools)
	}

	// Kill n1 while it refills after a hit; its restart leaks nothing and
	// fills the pool again.
	d, err := scheduler.Create(ctx, st, scheduler.Request{App: app.Name, Node: "n1"}, "e2e")
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, d.ID)
	refilling := false
	for ctx.Err() == nil {
		pl, _ := st.Pools(ctx, "n1")
		for _, x := range pl {
			if x.App == app.Name && x.Provisioning > 0 {
				refilling = true
			}
		}
		if refilling {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	p.stopAgent("n1", syscall.SIGKILL)
	t.Logf("n1 killed while refilling: %v", refilling)
	p.startAgent("n1", "")
	p.waitAll(ctx, app.Name, 1+len(ids))
	waitPools("after n1 was killed while it refilled", 0)

	// A refresh seals generation 2: every pool follows it.
	if _, errOut, code := p.fogctl(ctx, "checkpoint", "refresh", app.Name); code != 0 {
		t.Fatalf("fogctl checkpoint refresh %s = %d\n%s", app.Name, code, errOut)
	}
	waitPoolsOf("with generation 2 after the refresh", 0, 2, 2)

	// Pool 0: every slot goes.
	if _, errOut, code := p.fogctl(ctx, "app", "pool", app.Name, "0"); code != 0 {
		t.Fatalf("fogctl app pool %s 0 = %d\n%s", app.Name, code, errOut)
	}
	if _, errOut, code := p.fogctl(ctx, "app", "pool", app.Name, "65"); code == 0 || !strings.Contains(errOut, "pool") {
		t.Errorf("fogctl app pool %s 65 = %d; want an error naming pool\n%s", app.Name, code, errOut)
	}
	for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
		pools, _ := st.Pools(ctx, "")
		idle := 0
		for _, pl := range pools {
			if pl.App == app.Name {
				idle += pl.Idle + pl.Provisioning
			}
		}
		if idle == 0 {
			break
		}
		if time.Since(start) > 60*time.Second {
			t.Fatalf("pool slots still there 60 s after pool 0: %+v", pools)
		}
	}

	// Removing the app removes its pools: with one slot per node again,
	// every deployment withdrawn, then the app.
	if _, errOut, code := p.fogctl(ctx, "app", "pool", app.Name, "1"); code != 0 {
		t.Fatalf("fogctl app pool %s 1 = %d\n%s", app.Name, code, errOut)
	}
	waitPoolsOf("of one slot", 0, 2, 1)

	// An undeployed instance goes back to its node's pool in its
	// container, beyond the pool's size (kept for agent.recycle_keep).
	out, errOut, code = p.fogctl(ctx, "deploy", app.Name, "--node", "n2", "--wait", "-o", "json")
	var hit state.Deployment
	if err := json.Unmarshal([]byte(out), &hit); code != 0 || err != nil || hit.Status.Pool != spec.PoolHit {
		t.Fatalf("deploy on n2 = %d, %v, pool %q; want a hit\n%s", code, err, hit.Status.Pool, errOut)
	}
	waitPoolsOf("after a hit on n2", 0, 2, 1)
	if _, errOut, code := p.fogctl(ctx, "undeploy", "--wait", "--timeout", "60s", hit.ID); code != 0 {
		t.Fatalf("fogctl undeploy %s = %d\n%s", hit.ID, code, errOut)
	}
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		pl, err := st.Pools(ctx, "n2")
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(pl, func(x state.Pool) bool { return x.App == app.Name })
		if i >= 0 && pl[i].Idle == 2 && slices.Contains(pl[i].Slots, hit.Status.Slot) {
			t.Logf("undeployed %s: its slot %s is idle again on n2", hit.ID, hit.Status.Slot)
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("n2's pool after undeploying %s: %+v; want its slot %s idle beside the refilled one", hit.ID, pl, hit.Status.Slot)
		}
	}
	for _, id := range append(ids, first.ID) {
		if _, errOut, code := p.fogctl(ctx, "undeploy", "--wait", "--timeout", "60s", id); code != 0 {
			t.Fatalf("fogctl undeploy %s = %d\n%s", id, code, errOut)
		}
	}
	if _, errOut, code := p.fogctl(ctx, "app", "rm", app.Name); code != 0 {
		t.Fatalf("fogctl app rm %s = %d\n%s", app.Name, code, errOut)
	} else {
		t.Logf("fogctl app rm %s:\n%s", app.Name, errOut)
	}
	for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
		pools, err := st.Pools(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		left := 0
		for _, pl := range pools {
			if pl.App == app.Name {
				left++
			}
		}
		if left == 0 {
			break
		}
		if time.Since(start) > 60*time.Second {
			t.Fatalf("pools of removed app %s still there after 60 s: %+v", app.Name, pools)
		}
	}
	// Its generations go with it: what the pool slots still used when the
	// app was removed, fogctl gc removes once the slots are released.
	for start := time.Now(); ; time.Sleep(500 * time.Millisecond) {
		if out, errOut, code := p.fogctl(ctx, "gc", "--min-age", "0s"); code != 0 {
			t.Fatalf("fogctl gc = %d\n%s", code, errOut)
		} else if strings.Contains(out, app.Name) {
			t.Logf("fogctl gc:\n%s", out)
		}
		out, errOut, code := p.fogctl(ctx, "checkpoint", "ls", app.Name, "-o", "json")
		if code != 0 {
			t.Fatalf("fogctl checkpoint ls %s = %d\n%s", app.Name, code, errOut)
		}
		if o := strings.TrimSpace(out); o == "[]" || o == "null" {
			break
		}
		if time.Since(start) > 60*time.Second {
			t.Fatalf("generations of removed app %s still there 60 s after its pools went: %s", app.Name, out)
		}
	}
}

// TestPoolRecycleCRIUPoP: an agent recycles a CRIU instance as it does a
// DMTCP one. With `pool: 1` on one node, a deploy takes the slot restored
// ahead (and the agent refills the pool); its undeploy gives the instance
// back to the pool in its own slot and container, restored ahead again
// beside the refilled one; the next two deploys take both slots, answer,
// and neither has the key the user before wrote.
func TestPoolRecycleCRIUPoP(t *testing.T) {
	ctx, p, _, app := redisOnPoP(t, "e2e-recycle", engine.NameCRIU, func(a *spec.App) { one := 1; a.Pool = &one }, "n1")
	st := p.st
	// The first deploy produces the generation.
	first, err := scheduler.Create(ctx, st, scheduler.Request{App: app.Name, Mode: spec.ModeRestore}, "e2e")
	if err != nil {
		t.Fatal(err)
	}
	p.waitAll(ctx, app.Name, 1)
	// waitIdle waits until n1's pool holds n idle slots, all restored
	// ahead, and returns them.
	waitIdle := func(why string, n int) []string {
		t.Helper()
		for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
			pl, err := st.Pools(ctx, "n1")
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(pl, func(x state.Pool) bool { return x.App == app.Name })
			if i >= 0 && pl[i].Idle == n && pl[i].Ahead == n && len(pl[i].Slots) == n {
				return pl[i].Slots
			}
			if time.Since(start) > 90*time.Second {
				t.Fatalf("n1's pool %s: %+v; want %d idle slots restored ahead", why, pl, n)
			}
		}
	}
	deployHit := func(why string) state.Deployment {
		t.Helper()
		// --mode restore: mode auto would boot one deploy in a few to
		// measure booting.
		out, errOut, code := p.fogctl(ctx, "deploy", app.Name, "--mode", "restore", "--wait", "-o", "json")
		var hit state.Deployment
		if err := json.Unmarshal([]byte(out), &hit); code != 0 || err != nil || hit.Status.Pool != spec.PoolHit {
			t.Fatalf("deploy %s = %d, %v, pool %q; want a hit\n%s\n%s", why, code, err, hit.Status.Pool, out, errOut)
		}
		if got, err := testenv.RedisDo(ctx, nil, hit.Status.Ports["6379/tcp"], "PING"); err != nil || got != "PONG" {
			t.Fatalf("deployment %s (%s): PING = %q, %v", hit.ID, why, got, err)
		}
		return hit
	}
	undeploy := func(id string) {
		t.Helper()
		if _, errOut, code := p.fogctl(ctx, "undeploy", "--wait", "--timeout", "60s", id); code != 0 {
			t.Fatalf("fogctl undeploy %s = %d\n%s", id, code, errOut)
		}
	}
	slot := waitIdle("after the first checkpoint", 1)[0]
	hit := deployHit("into the pool's slot")
	if hit.Status.Slot != slot {
		t.Fatalf("deployment %s took slot %q; want the idle one, %s", hit.ID, hit.Status.Slot, slot)
	}
	key := "user-" + hit.ID
	if _, err := testenv.RedisDo(ctx, nil, hit.Status.Ports["6379/tcp"], "SET", key, "1"); err != nil {
		t.Fatal(err)
	}
	undeploy(hit.ID)
	if idle := waitIdle("after undeploying "+hit.ID, 2); !slices.Contains(idle, slot) {
		t.Fatalf("n1's idle slots after undeploying %s: %v; want its own slot %s among them, recycled", hit.ID, idle, slot)
	}
	t.Logf("%s undeployed: its slot %s is idle again, restored ahead, beside the refilled one", hit.ID, slot)
	var took []string
	for i := range 2 {
		h := deployHit("after the recycle " + strconv.Itoa(i+1))
		took = append(took, h.Status.Slot)
		if got, err := testenv.RedisDo(ctx, nil, h.Status.Ports["6379/tcp"], "EXISTS", key); err != nil || got != "0" {
			t.Errorf("deployment %s in slot %s: EXISTS %s = %q, %v; want 0 (the deployment before wrote it)", h.ID, h.Status.Slot, key, got, err)
		}
		defer undeploy(h.ID)
	}
	if !slices.Contains(took, slot) {
		t.Errorf("the two deploys after the recycle took slots %v; want the recycled %s among them", took, slot)
	}
	defer undeploy(first.ID)
}
