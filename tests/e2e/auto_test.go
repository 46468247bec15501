//go:build !no_ceph

package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/adaptive"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// deployOnce runs one deploy of app to Running through `fogctl deploy
// --wait` (more args appended), checks that it serves, withdraws it, and
// returns its status.
func deployOnce(ctx context.Context, t *testing.T, p *pop, app string, args ...string) state.Status {
	t.Helper()
	out, errOut, code := p.fogctl(ctx, append([]string{"deploy", app, "--wait", "-o", "json"}, args...)...)
	var d state.Deployment
	if err := json.Unmarshal([]byte(out), &d); code != 0 || err != nil || d.Status.Phase != spec.PhaseRunning {
		t.Fatalf("fogctl deploy %s = exit %d, %v\n%s%s", app, code, err, out, errOut)
	}
	if got, err := testenv.RedisDo(ctx, nil, d.Status.Ports["6379/tcp"], "PING"); err != nil || got != "PONG" {
		t.Errorf("%s (%s): PING = %q, %v", d.ID, d.Status.Mode, got, err)
	}
	if _, errOut, code := p.fogctl(ctx, "undeploy", d.ID, "--wait"); code != 0 {
		t.Fatalf("fogctl undeploy %s = exit %d\n%s", d.ID, code, errOut)
	}
	return d.Status
}

// reasonOf is the reason mode auto gave in a status.
func reasonOf(st state.Status) string {
	if st.Mode == spec.ModeBoot {
		return st.BootReason
	}
	return st.Reason
}

// TestAutoModeSettlesOnFaster: one agent with DMTCP deploys redis again and
// again in mode auto, one at a time, through `fogctl deploy --wait`. The
// first deploy makes the generation (its boot until ready is a boot
// sample, its restore a restore sample); the node's restores are then
// recorded as slow (the policy's measurements are given, not timed: how
// fast each path is on this machine is the bench's), and every later
// deploy boots, citing both medians. `fogctl app costs` shows the
// numbers, the agent's metrics count the choices, and --mode restore
// still restores.
func TestAutoModeSettlesOnFaster(t *testing.T) {
	ctx, p, _, app := redisOnPoP(t, "e2e-auto", engine.NameDMTCP, nil, "n1")
	faster := regexp.MustCompile(`^auto: boot \d+\.\d\d s, median of \d+ runs? [<=] restore \d+\.\d\d s, median of \d+ runs?(; restore measured again in the background \(within 1\.5x\))?$`)
	var table []string
	settled := 0
	for i := 1; i <= 8; i++ {
		if i == 2 {
			// The node's restores, as measured slow: 30 s each, the whole
			// window of samples.
			gens, err := p.st.Checkpoints(ctx, app.Name)
			if err != nil || len(gens) != 1 {
				t.Fatalf("generations after the first deploy = %v, %v", gens, err)
			}
			for range adaptive.MaxSamples {
				if err := p.st.RecordCost(ctx, app.Name, "n1", adaptive.Run{Mode: spec.ModeRestore, Gen: gens[0].Gen, Cost: 30 * time.Second}); err != nil {
					t.Fatal(err)
				}
			}
		}
		st := deployOnce(ctx, t, p, app.Name)
		reason := reasonOf(st)
		row := string(st.Mode) + ": " + reason + " (" + adaptive.Cost(st.Timings).Round(time.Millisecond).String() + ")"
		table = append(table, row)
		t.Logf("deploy %2d: %s", i, row)
		switch {
		case i == 1:
			if st.Mode != spec.ModeRestore || !strings.HasPrefix(reason, "auto: no generation of the app") || !st.Booted {
				t.Errorf("deploy 1: %s, booted %v; want a restore that makes the generation", row, st.Booted)
			}
		case st.Mode == spec.ModeBoot && faster.MatchString(reason):
			settled++
		default:
			t.Errorf("deploy %d: %s; want a boot citing both medians", i, row)
		}
	}
	if settled < 7 {
		t.Errorf("mode auto did not settle on booting redis (boots citing both medians: %d):\n%s", settled, strings.Join(table, "\n"))
	}

	// The numbers behind it.
	out, errOut, code := p.fogctl(ctx, "app", "costs", app.Name, "-o", "json")
	var costs []struct {
		Node            string
		BootMS          []int64 `json:"boot_ms"`
		RestoreMS       []int64 `json:"restore_ms"`
		BootMedianMS    float64 `json:"boot_median_ms"`
		RestoreMedianMS float64 `json:"restore_median_ms"`
		Next            struct{ Mode string }
	}
	if err := json.Unmarshal([]byte(out), &costs); code != 0 || err != nil || len(costs) != 1 || costs[0].Node != "n1" ||
		len(costs[0].BootMS) < 8 || len(costs[0].RestoreMS) < 1 || costs[0].BootMedianMS >= costs[0].RestoreMedianMS || costs[0].Next.Mode != string(spec.ModeBoot) {
		t.Errorf("fogctl app costs -o json = exit %d, %v, %+v; want n1's medians (8 boots: the first deploy's and 7), boot the lower, boot next\n%s%s", code, err, costs, out, errOut)
	}
	if out, _, code := p.fogctl(ctx, "app", "costs", app.Name); code != 0 || !strings.Contains(out, "auto: boot ") {
		t.Errorf("fogctl app costs = exit %d:\n%s", code, out)
	}
	metrics := scrape(t, p.apis["n1"])
	for _, m := range []string{`fogdeploy_auto_decisions_total{choice="restore",why="no_generation"} 1`, `fogdeploy_auto_decisions_total{choice="boot",why="faster"} 7`,
		"\nfogdeploy_ceph_stalls_total 0\n"} {
		if !strings.Contains(metrics, m) {
			t.Errorf("/metrics has no %s", m)
		}
	}
	// A deployment of mode restore restores, whatever the numbers say.
	if st := deployOnce(ctx, t, p, app.Name, "--mode", string(spec.ModeRestore)); st.Mode != spec.ModeRestore || st.Reason != "" {
		t.Errorf("--mode restore: mode %q, reason %q; want a restore, as requested", st.Mode, st.Reason)
	}

	// Restores as fast as boots, within 1.5x (as if measured so): the 10th
	// choice of mode auto boots the user's deploy and measures a restore in
	// the background, whose instance nobody is given and which is removed.
	gens, err := p.st.Checkpoints(ctx, app.Name)
	if err != nil || len(gens) != 1 {
		t.Fatalf("generations = %v, %v", gens, err)
	}
	c, err := p.st.NodeCosts(ctx, app.Name, "n1")
	if err != nil {
		t.Fatal(err)
	}
	closeCost := c.Boot.Median() * 6 / 5
	for range adaptive.MaxSamples {
		if err := p.st.RecordCost(ctx, app.Name, "n1", adaptive.Run{Mode: spec.ModeRestore, Gen: gens[0].Gen, Cost: closeCost}); err != nil {
			t.Fatal(err)
		}
	}
	// Earlier choices may have asked for measurements too (boot and
	// restore within 1.5x on a slow machine): count from here.
	before := metricCount(t, p.apis["n1"], `fogdeploy_auto_measurements_total{mode="restore",outcome="ok"}`)
	measured := false
	for i := 0; i < adaptive.ExploreEvery && !measured; i++ {
		st := deployOnce(ctx, t, p, app.Name)
		t.Logf("with close medians: %s: %s", st.Mode, reasonOf(st))
		measured = strings.HasSuffix(reasonOf(st), "; restore measured again in the background (within 1.5x)")
	}
	if !measured {
		t.Fatalf("no choice asked for a restore measured in the background in %d deploys", adaptive.ExploreEvery)
	}
	for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
		if metricCount(t, p.apis["n1"], `fogdeploy_auto_measurements_total{mode="restore",outcome="ok"}`) > before {
			break
		}
		if time.Since(start) > time.Minute {
			t.Fatalf("no restore measured in the background after 1 min (%v before the close medians):\n%s", before, grepLines(scrape(t, p.apis["n1"]), "fogdeploy_auto"))
		}
	}
	if after, _ := p.st.NodeCosts(ctx, app.Name, "n1"); slices.Equal(after.Restore, c.Restore) || after.Restore[len(after.Restore)-1] == closeCost.Milliseconds() {
		t.Errorf("restores after the measurement = %v; want the measured one last", after.Restore)
	}
	// Its instance is gone (the cleanup checks the node and the pool too).
	out, _, _ = p.fogctl(ctx, "ps", "-o", "json")
	var deps []state.Deployment
	if err := json.Unmarshal([]byte(out), &deps); err != nil || len(deps) != 0 {
		t.Errorf("deployments after the measurement: %s, %v; want none", out, err)
	}
}

// scrape returns the agent's /metrics page at api.
func scrape(t *testing.T, api string) string {
	t.Helper()
	resp, err := http.Get("http://" + api + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// metricCount is the value of the series named exactly series (name and
// labels) on the agent's /metrics page at api, 0 when it is absent.
func metricCount(t *testing.T, api, series string) float64 {
	t.Helper()
	for _, l := range strings.Split(scrape(t, api), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("metric %s: %q: %v", series, l, err)
			}
			return f
		}
	}
	return 0
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestAutoModeNeverBootsOnRequest: redis behind a 5 s boot (a slow app's
// start), with a pool of one, on one agent in mode auto. The first deploy
// makes the generation; then 11 deploys in a row, each undeployed: every
// one that finds a slot waiting is a hit, none boots (a restore is 10x
// faster than the boot measured on the first deploy), and nothing is
// measured in the background. Changing the pool size keeps the boot
// samples; with the generation removed, the next deploy makes a new one
// instead of booting to measure.
func TestAutoModeNeverBootsOnRequest(t *testing.T) {
	ctx, p, _, app := redisOnPoP(t, "e2e-autoslow", engine.NameDMTCP, func(a *spec.App) {
		a.Command = []string{"sh", "-c", "sleep 5; exec " + strings.Join(a.Command, " ")}
		one := 1
		a.Pool = &one
	}, "n1")
	waitIdle := func(want int) { // want 0: none; else at least want
		t.Helper()
		for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
			pools, err := p.st.Pools(ctx, "n1")
			if err != nil {
				t.Fatal(err)
			}
			for _, pl := range pools {
				// A recycled instance may stay beside the slot a while
				// (agent.recycle_keep): at least want, restored ahead.
				if pl.App == app.Name && (want == 0 && pl.Idle == 0 || want > 0 && pl.Idle >= want && pl.Ahead >= want) {
					return
				}
			}
			if time.Since(start) > 2*time.Minute {
				t.Fatalf("the pool of %s on n1 did not reach %d idle slots in 2 min: %+v", app.Name, want, pools)
			}
		}
	}
	first := deployOnce(ctx, t, p, app.Name)
	if first.Mode != spec.ModeRestore || !first.Booted || !strings.HasPrefix(first.Reason, "auto: no generation of the app") {
		t.Fatalf("first deploy: %s, booted %v, %q; want the generation made", first.Mode, first.Booted, first.Reason)
	}
	if boot := adaptive.BootCost(first.Timings); boot < 5*time.Second {
		t.Errorf("the first deploy's boot until ready took %s; want at least the app's 5 s", boot)
	}
	hits := 0
	for i := 2; i <= 12; i++ {
		waited := i%4 != 0 // every 4th deploy comes while the slot may still be refilling
		if waited {
			waitIdle(1)
		}
		st := deployOnce(ctx, t, p, app.Name)
		reason := reasonOf(st)
		t.Logf("deploy %2d: %s (%s), pool %q, %s", i, st.Mode, reason, st.Pool, adaptive.Cost(st.Timings).Round(time.Millisecond))
		switch {
		case st.Mode == spec.ModeBoot:
			t.Errorf("deploy %d booted on a request: %q", i, reason)
		case waited && (st.Pool != spec.PoolHit || !strings.HasPrefix(reason, "auto: pool slot")):
			t.Errorf("deploy %d: pool %q, %q; want a hit of the slot that waited", i, st.Pool, reason)
		case st.Pool == spec.PoolHit:
			hits++
		}
		if strings.Contains(reason, "background") {
			t.Errorf("deploy %d asked for a measurement with a 10x gap: %q", i, reason)
		}
	}
	t.Logf("%d hits in 11 deploys", hits)
	costs, err := p.st.NodeCosts(ctx, app.Name, "n1")
	if err != nil || len(costs.Boot) != 1 || len(costs.Hit) < 8 {
		t.Fatalf("costs on n1 = %+v, %v; want the first deploy's boot, and the hits", costs, err)
	}

	// A new pool size keeps the boots.
	if _, errOut, code := p.fogctl(ctx, "app", "pool", app.Name, "0"); code != 0 {
		t.Fatalf("fogctl app pool %s 0 = exit %d\n%s", app.Name, code, errOut)
	}
	if c, _ := p.st.NodeCosts(ctx, app.Name, "n1"); len(c.Boot) != 1 {
		t.Errorf("boot samples after a new pool size = %v; want the one kept", c.Boot)
	}
	// Its generation removed, the next deploy makes one.
	waitIdle(0)
	gens, err := p.st.Checkpoints(ctx, app.Name)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gens {
		if _, errOut, code := p.fogctl(ctx, "checkpoint", "rm", app.Name, strconv.Itoa(g.Gen), "--wait", "2m"); code != 0 {
			t.Fatalf("fogctl checkpoint rm %s %d = exit %d\n%s", app.Name, g.Gen, code, errOut)
		}
	}
	st := deployOnce(ctx, t, p, app.Name)
	if st.Mode != spec.ModeRestore || !st.Booted || !strings.HasPrefix(st.Reason, "auto: no generation of the app") {
		t.Errorf("deploy after the generations were removed: %s, booted %v, %q; want a new generation made", st.Mode, st.Booted, reasonOf(st))
	}
	if gens, _ := p.st.Checkpoints(ctx, app.Name); len(gens) != 1 {
		t.Errorf("generations after that deploy: %d; want 1", len(gens))
	}
}
