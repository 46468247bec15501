//go:build !no_ceph

package e2e

import (
	"context"
	"encoding/json"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// TestSparePoP: two agents with agent.spare_slots 1 and an app with no
// warm pool. Each node keeps one idle spare slot per engine; a restore on
// either node (the second one without the checkpoint yet) takes its spare:
// its phases show no clone, map, mount or container, and it answers; the
// node makes a new spare meanwhile; the metrics count it; the agents'
// shutdown releases their spares and leaves nothing.
func TestSparePoP(t *testing.T) {
	f := deploytest.NewFixture(t, "container")
	if _, _, err := f.D.Drivers().CheckEngine(context.Background(), engine.NameDMTCP); err != nil {
		testenv.Unavailable(t, testenv.DMTCP, err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	app := deploytest.RedisApp("e2e-spare-"+strconv.FormatInt(time.Now().UnixNano()%1e6, 36), f.Env, engine.NameDMTCP)
	// ours are the spares the PoP's agents made, as their logs name them:
	// read before the agents stop and their logs go.
	var ours map[string]bool
	t.Cleanup(func() {
		// Runs after startPoP's (registered later), which stops the
		// agents: their spares are gone by now. Only the spares these
		// agents made count (their logs name each one): another PoP's
		// agents on this dockerd keep spares of their own.
		if ours == nil {
			return
		}
		sts, err := f.RT.List(context.Background(), map[string]string{runtime.LabelApp: spec.SpareApp})
		if err != nil {
			t.Fatal(err)
		}
		var left []string
		for _, st := range sts {
			if ours[st.Deployment] {
				left = append(left, st.Name)
			}
		}
		if len(ours) == 0 || len(left) > 0 {
			t.Errorf("after the agents stopped: %d spares named in their logs, containers left %v; want some spares and none left", len(ours), left)
		}
		lo := f.Leftovers(t, spec.SpareApp)
		var images []string
		for _, im := range lo.Images {
			if id, ok := strings.CutSuffix(strings.TrimPrefix(im, catalog.InstancePrefix), "-env"); ok && ours[id] {
				images = append(images, im)
			}
		}
		if len(images) > 0 {
			t.Errorf("spare images left: %v", images)
		}
	})
	p := startPoP(ctx, t, f, app.Name, "fogdeploy/dmtcp:deploytest", "")
	t.Cleanup(func() {
		ours = p.logged(regexp.MustCompile(`\b` + regexp.QuoteMeta(spec.SpareApp) + `-s[0-9a-f]{8}\b`))
	})
	p.env = append(p.env, "FOGDEPLOY_SPARE_SLOTS=1")
	nodes := []string{"n1", "n2"}
	for _, n := range nodes {
		p.startAgent(n, "")
	}
	if err := p.st.CreateApp(ctx, app, false); err != nil {
		t.Fatal(err)
	}
	idle := func(node string) float64 {
		return metricCount(t, p.apis[node], `fogdeploy_spare_slots_idle{engine="dmtcp"}`)
	}
	waitSpares := func(why string) {
		t.Helper()
		start := time.Now()
		for _, n := range nodes {
			for idle(n) != 1 {
				if time.Since(start) > 90*time.Second {
					t.Fatalf("%s: node %s has %v idle DMTCP spares after 90 s; want 1", why, n, idle(n))
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
		t.Logf("spares ready %s in %s", why, time.Since(start).Round(time.Millisecond))
	}
	waitSpares("at start")
	// fogctl pool ls lists them as the pool of "spare" on each node.
	var out, errOut string
	var code int
	for start := time.Now(); time.Since(start) < 30*time.Second; time.Sleep(200 * time.Millisecond) {
		out, errOut, code = p.fogctl(ctx, "pool", "ls", spec.SpareApp, "-o", "json")
		var listed []state.Pool
		if err := json.Unmarshal([]byte(out), &listed); code == 0 && err == nil && len(listed) == len(nodes) && listed[0].Idle >= 1 && listed[1].Idle >= 1 {
			break
		}
	}
	var listed []state.Pool
	if err := json.Unmarshal([]byte(out), &listed); code != 0 || err != nil || len(listed) != len(nodes) || listed[0].Idle < 1 || listed[1].Idle < 1 {
		t.Errorf("fogctl pool ls spare -o json = %d, %v, %+v; want one pool of idle spares per node\n%s", code, err, listed, errOut)
	}

	// The first deploy boots and checkpoints (no generation yet).
	out, errOut, code = p.fogctl(ctx, "deploy", app.Name, "--node", "n1", "--mode", "restore", "--wait", "-o", "json")
	var first state.Deployment
	if err := json.Unmarshal([]byte(out), &first); code != 0 || err != nil || !first.Status.Booted {
		t.Fatalf("first deploy = %d, %v, booted %v\n%s", code, err, first.Status.Booted, errOut)
	}
	waitSpares("after the first checkpoint")

	for _, n := range nodes {
		out, errOut, code := p.fogctl(ctx, "deploy", app.Name, "--node", n, "--mode", "restore", "--wait", "-o", "json")
		var d state.Deployment
		if err := json.Unmarshal([]byte(out), &d); code != 0 || err != nil {
			t.Fatalf("deploy on %s = %d, %v\n%s", n, code, err, errOut)
		}
		t.Logf("restore on %s: pool %s, %s", n, d.Status.Pool, d.Status.Timings)
		if d.Status.Pool != spec.PoolSpare || d.Status.Mode != spec.ModeRestore {
			t.Errorf("restore on %s: pool %q mode %q; want a restore into a spare slot", n, d.Status.Pool, d.Status.Mode)
		}
		for _, ph := range d.Status.Timings {
			if slices.Contains([]deploy.Step{deploy.StepClone, deploy.StepMap, deploy.StepMount, deploy.StepContainer}, deploy.Step(ph.Name)) {
				t.Errorf("restore on %s into a spare waited for %s: %s", n, ph.Name, d.Status.Timings)
			}
		}
		if got, err := testenv.RedisDo(ctx, nil, d.Status.Ports["6379/tcp"], "PING"); err != nil || got != "PONG" {
			t.Errorf("restore on %s: PING = %q, %v", n, got, err)
		}
		// On n1 the first deploy's restore took one too.
		if got := metricCount(t, p.apis[n], `fogdeploy_spare_slots_taken_total{engine="dmtcp"}`); got < 1 {
			t.Errorf("node %s counts %v restores into spares; want at least 1", n, got)
		}
		// Elsewhere the restore fetched the checkpoint: its bytes are
		// counted by where they came from.
		if n != "n1" {
			if got := metricCount(t, p.apis[n], `fogdeploy_checkpoint_fetch_bytes_total{from="cluster"}`); !d.Status.Fetched || got <= 0 {
				t.Errorf("restore on %s: fetched %v, %v bytes counted from the cluster; want a fetch counted", n, d.Status.Fetched, got)
			}
		}
		waitSpares("after a restore on " + n + " took one")
	}
}
