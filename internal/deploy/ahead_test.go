package deploy_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/cgroup"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

func TestPoolAheadDMTCPContainer(t *testing.T) { testPoolAhead(t, engine.NameDMTCP) }
func TestPoolAheadCRIUContainer(t *testing.T)  { testPoolAhead(t, engine.NameCRIU) }

// testPoolAhead is what a slot restored ahead promises: its app is
// restored before any request and waits at the background CPU weight; a
// deploy that takes it only raises it, with no engine restart, and gets
// the checkpoint's state and the normal weight; a slot restored ahead and
// released leaves nothing.
func testPoolAhead(t *testing.T, eng engine.Name) {
	f, ctx, app := redisFixture(t, "container", eng, "ahead")
	if f.Container.Priority == nil {
		testenv.Unavailable(t, testenv.Root, "this machine's cgroups cannot be reweighted")
	}
	poolAhead(ctx, t, f, app)
}

// TestPoolAheadUnit is testPoolAhead on the fakes, without root or a
// service.
func TestPoolAheadUnit(t *testing.T) {
	for _, eng := range spec.Engines {
		t.Run(string(eng), func(t *testing.T) {
			u, ctx, app := unitRedis(t, eng)
			poolAhead(ctx, t, u, app)
		})
	}
}

func poolAhead(ctx context.Context, t *testing.T, n deploytest.Node, app spec.App) {
	d := n.Deployer()
	first, err := d.Deploy(ctx, app, deploy.Options{Prepare: func(ctx context.Context, tg deploy.Target) error {
		_, err := testenv.RedisDo(ctx, nil, tg.Ports["6379/tcp"], "SET", "greeting", "from the checkpoint")
		return err
	}})
	if err != nil {
		t.Fatalf("first deploy: %v", err)
	}
	if err := d.Undeploy(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	g, err := d.Checkpoints().Latest(ctx, app.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Pool().CanStartAhead(g); err != nil {
		t.Fatalf("CanStartAhead: %v", err)
	}

	// A slot still being provisioned, or unknown, is refused.
	if _, err := d.Pool().StartAhead(ctx, g, "no-such-slot"); err == nil {
		t.Errorf("StartAhead of an unknown slot succeeded")
	}
	s, err := d.Pool().ProvisionPoolSlot(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	s, err = d.Pool().StartAhead(ctx, g, s.ID)
	if err != nil {
		t.Fatalf("StartAhead: %v", err)
	}
	t.Logf("slot %s restored ahead: %s", s.ID, s.Timings)
	if !s.Ahead || s.Phase != deploy.SlotIdle || !hasPhase(s.Timings, deploy.StepReady) {
		t.Fatalf("slot after StartAhead: ahead %v, phase %s, timings %s; want an idle slot restored ahead", s.Ahead, s.Phase, s.Timings)
	}
	if _, err := d.Pool().StartAhead(ctx, g, s.ID); !errors.Is(err, deploy.ErrNotAhead) {
		t.Errorf("StartAhead twice = %v; want ErrNotAhead", err)
	}
	if w := n.Weight(ctx, t, s.Handle.Ref); w != cgroup.Background.CPU {
		t.Errorf("the waiting slot's CPU weight = %d; want %d", w, cgroup.Background.CPU)
	}
	// Its app runs already, with the checkpoint's state.
	if got, err := testenv.RedisDo(ctx, nil, s.Ports["6379/tcp"], "GET", "greeting"); err != nil || got != "from the checkpoint" {
		t.Errorf("the slot restored ahead: GET greeting = %q, %v", got, err)
	}

	var phases []string
	dep, err := d.Deploy(ctx, app, deploy.Options{Progress: func(p string, _ time.Duration) { phases = append(phases, p) }})
	if err != nil {
		t.Fatalf("deploy: %v", err)
	}
	t.Logf("pool hit of a slot restored ahead: %s (total %s)", dep.Timings, dep.Total().Round(time.Millisecond))
	if dep.Pool != spec.PoolHit || !dep.Ahead || dep.Slot != s.ID {
		t.Errorf("deploy: pool %q, ahead %v, slot %s; want a hit of %s restored ahead", dep.Pool, dep.Ahead, dep.Slot, s.ID)
	}
	for _, step := range append(slices.Clone(deploy.ProvisionSteps), deploy.StepStart) {
		if hasPhase(dep.Timings, step) || slices.Contains(phases, string(step)) {
			t.Errorf("the hit waited for %q: %s", step, dep.Timings)
		}
	}
	for _, step := range []deploy.Step{deploy.StepRaise, deploy.StepReady, deploy.StepBind} {
		if !hasPhase(dep.Timings, step) {
			t.Errorf("the hit's timings %s lack %q", dep.Timings, step)
		}
	}
	if dep.EngineReadyMS != 0 {
		t.Errorf("the hit reports the engine's restart (%v ms) though it ran before the request", dep.EngineReadyMS)
	}
	if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, dep), "GET", "greeting"); err != nil || got != "from the checkpoint" {
		t.Errorf("GET greeting = %q, %v", got, err)
	}
	// The instance knows the deployment it serves, not the slot it was
	// restored ahead in.
	if id, ok := n.Identity(ctx, t, dep, app.User); ok && (id.Instance != dep.ID || id.Slot != s.ID) {
		t.Errorf("%s after the hit = %+v; want deployment %s in slot %s", spec.IdentityFile, id, dep.ID, s.ID)
	}
	// The hit wrote it on the node's own file system, not through the
	// instance's clone.
	if b, err := os.ReadFile(filepath.Join(dep.Handle.EnvPath, spec.IdentityFile)); err == nil && strings.Contains(string(b), dep.ID) {
		t.Errorf("the hit wrote the identity through the instance's clone: %s", b)
	}
	if w := n.Weight(ctx, t, dep.Handle.Ref); w != cgroup.Normal.CPU {
		t.Errorf("the bound instance's CPU weight = %d; want %d", w, cgroup.Normal.CPU)
	}
	// Recycled, the instance is restored ahead again in its container:
	// the next user gets the checkpoint's state, not the key the one
	// before wrote.
	{
		if _, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, dep), "SET", "mine", "first user"); err != nil {
			t.Fatal(err)
		}
		rs, err := d.Pool().Recycle(ctx, dep.ID)
		if err != nil {
			t.Fatalf("Recycle: %v", err)
		}
		if _, err := d.Pool().StartAhead(ctx, g, rs.ID); err != nil {
			t.Fatalf("StartAhead of the recycled slot: %v", err)
		}
		if dep, err = d.Deploy(ctx, app, deploy.Options{}); err != nil {
			t.Fatalf("deploy after recycling: %v", err)
		}
		if dep.Slot != rs.ID || !dep.Ahead {
			t.Errorf("deploy after recycling: slot %s ahead %v; want the recycled slot %s, restored ahead", dep.Slot, dep.Ahead, rs.ID)
		}
		addr := deploytest.RedisAddr(t, dep)
		if got, err := testenv.RedisDo(ctx, nil, addr, "GET", "greeting"); err != nil || got != "from the checkpoint" {
			t.Errorf("after recycling: GET greeting = %q, %v", got, err)
		}
		if got, err := testenv.RedisDo(ctx, nil, addr, "EXISTS", "mine"); err != nil || got != "0" {
			t.Errorf("after recycling: EXISTS mine = %q, %v; want 0 (the user before wrote it)", got, err)
		}
	}
	if err := d.Undeploy(ctx, dep.ID); err != nil {
		t.Fatal(err)
	}

	// A deploy that finds no idle slot while one is being restored ahead
	// waits for it (raising it) instead of provisioning its own.
	s, err = d.Pool().ProvisionPoolSlot(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	deploy.PauseAhead(d, 300*time.Millisecond)
	ahead := make(chan error, 1)
	go func() { _, err := d.Pool().StartAhead(ctx, g, s.ID); ahead <- err }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if ls, err := d.Pool().LoadSlot(s.ID); err == nil && ls.Phase == deploy.SlotStarting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot %s never was being restored ahead", s.ID)
		}
	}
	dep, err = d.Deploy(ctx, app, deploy.Options{})
	deploy.PauseAhead(d, 0)
	if aerr := <-ahead; aerr != nil {
		t.Fatalf("StartAhead with a deploy waiting: %v", aerr)
	}
	if err != nil {
		t.Fatalf("deploy while the slot is restored ahead: %v", err)
	}
	t.Logf("deploy that waited for a slot restored ahead: %s", dep.Timings)
	if dep.Pool != spec.PoolHit || !dep.Ahead || dep.Slot != s.ID || !hasPhase(dep.Timings, deploy.StepAwait) {
		t.Errorf("deploy while slot %s was restored ahead: pool %q, ahead %v, slot %s, timings %s; want a hit of it that waited (%s)",
			s.ID, dep.Pool, dep.Ahead, dep.Slot, dep.Timings, deploy.StepAwait)
	}
	for _, step := range deploy.ProvisionSteps {
		if hasPhase(dep.Timings, step) {
			t.Errorf("the deploy that waited provisioned a slot of its own (%q): %s", step, dep.Timings)
		}
	}
	if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, dep), "GET", "greeting"); err != nil || got != "from the checkpoint" {
		t.Errorf("after waiting for the slot: GET greeting = %q, %v", got, err)
	}
	if w := n.Weight(ctx, t, dep.Handle.Ref); w != cgroup.Normal.CPU {
		t.Errorf("the instance that waited: CPU weight %d; want %d", w, cgroup.Normal.CPU)
	}
	if err := d.Undeploy(ctx, dep.ID); err != nil {
		t.Fatal(err)
	}

	// A slot restored ahead and released leaves nothing.
	s, err = d.Pool().ProvisionPoolSlot(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Pool().StartAhead(ctx, g, s.ID); err != nil {
		t.Fatal(err)
	}
	if ids, err := d.Pool().DropPool(ctx, app.Name, nil); err != nil || len(ids) != 1 {
		t.Fatalf("DropPool = %v, %v; want the one slot", ids, err)
	}
	n.AssertNothingLeft(t, app.Name, true)
}
