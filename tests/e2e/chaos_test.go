//go:build !no_ceph

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"

	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/scheduler"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// TestChaosBoot kills the agent (SIGKILL) right after each stage of a boot
// deploy (provision: clone, map, mount, container; then start) and at several moments of an undeploy, 4 rounds in a row, on a
// node without a checkpoint engine (so it runs in CI). After each kill the
// restarted agent must bring the deployment to Running (or gone); at the
// end nothing may be left.
func TestChaosBoot(t *testing.T) {
	f := deploytest.NewBootFixture(t)
	app := deploytest.BusyboxHTTPApp("chaos-web-"+strconv.FormatInt(time.Now().UnixNano()%1e6, 36), f.Env)
	chaos(t, f, app, "fogdeploy/dmtcp:absent", []string{"clone", "map", "mount", "container", "start"}, 4)
}

// TestChaosCheckpoint does the same with DMTCP: kills after each step of
// the first deploy's boot and checkpoint (boot.clone … boot.stage, the
// copy of the checkpoint the node keeps), of the restore that follows,
// and during undeploys. One round (14 kills) in CI; FOGDEPLOY_CHAOS_ROUNDS
// asks for more.
func TestChaosCheckpoint(t *testing.T) {
	f := deploytest.NewFixture(t, "container")
	if _, _, err := f.D.Drivers().CheckEngine(context.Background(), engine.NameDMTCP); err != nil {
		testenv.Unavailable(t, testenv.DMTCP, err.Error())
	}
	app := deploytest.RedisApp("chaos-redis-"+strconv.FormatInt(time.Now().UnixNano()%1e6, 36), f.Env, engine.NameDMTCP)
	chaos(t, f, app, "fogdeploy/dmtcp:deploytest", []string{"boot.clone", "boot.map", "boot.mount", "boot.container",
		"boot.start", "boot.ready", "boot.checkpoint", "boot.stage", "clone", "map", "mount", "fetch", "container", "start"}, chaosRounds(t, 1))
}

// leaks counts what deployments of app can leave: RBD images named after
// it, rbd-fuse processes, loop devices and mounts of the PoP's state dirs,
// its containers, the PoP's deployment, status and lock keys in etcd, and
// the nodes' copies of its checkpoints, whole or cut short.
type leaks struct {
	Images, Fuse, Loops, Mounts, Containers, Keys, Copies int
}

func countLeaks(ctx context.Context, t *testing.T, p *pop, f *deploytest.Fixture, app string) leaks {
	t.Helper()
	var l leaks
	names, err := f.L.Store.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if (strings.HasPrefix(n, catalog.InstancePrefix+app+"-") && !catalog.IsLowerName(n)) || strings.HasPrefix(n, catalog.GenPrefix+app+"-") {
			l.Images++
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, c := range procs {
		b, _ := os.ReadFile(c)
		if strings.HasPrefix(string(b), "rbd-fuse\x00") && strings.Contains(string(b), p.dir) && !deploytest.OfLower(string(b)) {
			l.Fuse++
		}
	}
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, bf := range loops {
		b, _ := os.ReadFile(bf)
		if strings.HasPrefix(string(b), p.dir) && !deploytest.OfLower(string(b)) {
			l.Loops++
		}
	}
	for _, m := range deploytest.MountsUnder(t, p.dir) {
		if !deploytest.OfLower(m) {
			l.Mounts++
		}
	}
	copies, _ := filepath.Glob(filepath.Join(p.dir, "*", "deploy", "gens", app, "*"))
	l.Copies = len(copies)
	sts, err := f.RT.List(ctx, map[string]string{runtime.LabelApp: app})
	if err != nil {
		t.Fatal(err)
	}
	l.Containers = len(sts)
	for _, pre := range []string{"deployments/", "status/", "locks/"} {
		l.Keys += int(statetest.Count(ctx, t, p.st, pre))
	}
	return l
}

// chaosRounds is FOGDEPLOY_CHAOS_ROUNDS, else def.
func chaosRounds(t *testing.T, def int) int {
	v := os.Getenv("FOGDEPLOY_CHAOS_ROUNDS")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("FOGDEPLOY_CHAOS_ROUNDS %q: give a number of rounds, 1 or more", v)
	}
	return n
}

// chaos runs rounds of: deploy, kill after each of steps; then undeploy,
// kill at a few moments. One agent, n1, is killed and restarted each time.
func chaos(t *testing.T, f *deploytest.Fixture, app spec.App, dmtcpImage string, steps []string, rounds int) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	p := startPoP(ctx, t, f, app.Name, dmtcpImage, "", "n1")
	st := p.st
	before := countLeaks(ctx, t, p, f, app.Name)
	if err := st.CreateApp(ctx, app, false); err != nil {
		t.Fatal(err)
	}
	kills := 0
	restart := func() {
		p.stopAgent("n1", syscall.SIGKILL)
		kills++
		p.startAgent("n1", "")
	}
	// waitPhase returns once the status of id shows phase done (the agent
	// is then in the next step), or the deployment reached Running.
	waitPhase := func(id, phase string) bool {
		for ctx.Err() == nil {
			d, err := st.Deployment(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			for _, ph := range d.Status.Timings {
				if ph.Name == phase {
					return true
				}
			}
			if d.Status.Phase == spec.PhaseRunning || d.Status.Phase == spec.PhaseFailed {
				return false
			}
			time.Sleep(2 * time.Millisecond)
		}
		return false
	}
	var running []string
	for round := range rounds {
		for _, step := range steps {
			if strings.HasPrefix(step, "boot.") {
				// The first deploy produces the checkpoint: start cold.
				for _, id := range running {
					_ = st.DeleteDeployment(ctx, id)
				}
				for _, id := range running {
					waitGone(ctx, t, st, id)
				}
				running = nil
				f.RemoveGenerations(t, app.Name)
				gens, _ := st.Checkpoints(ctx, app.Name)
				for _, g := range gens {
					_ = st.DeleteCheckpoint(ctx, g.App, g.Gen)
				}
			}
			// Mode restore, not auto: once it has measured both, mode
			// auto would boot redis, and the steps of the restore would
			// go unkilled.
			d, err := scheduler.Create(ctx, st, scheduler.Request{App: app.Name, Mode: spec.ModeRestore}, "e2e")
			if err != nil {
				nodes, _ := st.Nodes(ctx)
				for _, kv := range statetest.List(ctx, t, st, "nodes/") {
					t.Logf("%s lease %x: %s", kv.Key, kv.Lease, kv.Value)
				}
				t.Fatalf("%v (nodes %+v)", err, nodes)
			}
			hit := waitPhase(d.ID, step)
			if !hit {
				t.Errorf("round %d: %s was Running before the agent could be killed after %s", round, d.ID, step)
			}
			restart()
			running = append(running, d.ID)
			deps := p.waitAll(ctx, app.Name, len(running))
			for _, dep := range deps {
				if dep.ID == d.ID && dep.Status.Phase != spec.PhaseRunning {
					t.Errorf("round %d, killed after %s: %s is %s", round, step, d.ID, dep.Status.Phase)
				}
			}
			t.Logf("round %d: killed after %-16s (in that step: %v); %s Running again", round, step, hit, d.ID)
		}
		// Undeploys killed at several moments.
		for i, delay := range []time.Duration{0, 20 * time.Millisecond, 80 * time.Millisecond, 250 * time.Millisecond} {
			if len(running) == 0 {
				break
			}
			id := running[0]
			running = running[1:]
			if err := st.DeleteDeployment(ctx, id); err != nil {
				t.Fatal(err)
			}
			time.Sleep(delay)
			restart()
			p.waitAll(ctx, app.Name, len(running))
			waitGone(ctx, t, st, id)
			t.Logf("round %d: undeploy %d of %s killed after %s; gone", round, i, id, delay)
		}
	}
	// At least one kill per step of each round (the undeploys' besides).
	if want := rounds * len(steps); kills < want {
		t.Errorf("only %d kills; want %d or more (one per step of each round)", kills, want)
	}
	for _, id := range running {
		_ = st.DeleteDeployment(ctx, id)
	}
	p.waitAll(ctx, app.Name, 0)
	for _, id := range running {
		waitGone(ctx, t, st, id)
	}
	f.RemoveGenerations(t, app.Name)
	gens, _ := st.Checkpoints(ctx, app.Name)
	for _, g := range gens {
		_ = st.DeleteCheckpoint(ctx, g.App, g.Gen)
	}
	// The node drops its copies of removed generations at its next
	// refill (agent.reconcile_interval).
	after := countLeaks(ctx, t, p, f, app.Name)
	for start := time.Now(); after != before && time.Since(start) < 30*time.Second; after = countLeaks(ctx, t, p, f, app.Name) {
		time.Sleep(500 * time.Millisecond)
	}
	if after != before {
		t.Errorf("after %d kills: %+v; at the start: %+v", kills, after, before)
	}
	t.Logf("%d kills; leaks counted %+v, as at the start", kills, after)
}

// waitGone waits until the status of a withdrawn deployment is gone.
func waitGone(ctx context.Context, t *testing.T, st *state.Store, id string) {
	t.Helper()
	for i := 0; ; i++ {
		if n, err := statetest.CountNow(ctx, st, "status/"+id); err == nil && n == 0 {
			return
		}
		if i > 600 {
			t.Fatal(fmt.Errorf("status of withdrawn %s still there after 60 s", id))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
