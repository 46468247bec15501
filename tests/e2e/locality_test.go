//go:build !no_ceph

package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// TestPlaceLocalCheckpoint: on a 4-node PoP without a warm pool, the node
// that produced an app's checkpoint keeps a copy of it, a node with
// agent.fetch sealed copies it as soon as it is sealed, and a deploy
// without --node goes to one of them and says why ("local"), fetching
// nothing; a deploy on another node fetches the checkpoint once, and that
// node holds it from then on (`fogctl pool ls` says LOCAL yes); removing
// the app removes every node's copy.
func TestPlaceLocalCheckpoint(t *testing.T) {
	// Restores only: where a checkpoint is is what this test places by
	// (mode auto would boot redis, whose boot is about as fast).
	ctx, p, _, app := redisOnPoP(t, "e2e-local", engine.NameDMTCP, func(a *spec.App) {
		zero := 0
		a.Pool, a.Mode = &zero, spec.ModeRestore
	}, "n1", "n2", "n3")
	env := p.env
	p.env = append(p.env, "FOGDEPLOY_FETCH=sealed")
	p.startAgent("n4", "")
	p.env = env
	deployed := func(args ...string) state.Deployment {
		t.Helper()
		out, errOut, code := p.fogctl(ctx, append([]string{"deploy", app.Name, "--wait", "-o", "json"}, args...)...)
		var d state.Deployment
		if err := json.Unmarshal([]byte(out), &d); code != 0 || err != nil {
			t.Fatalf("fogctl deploy %s %v = %d, %v\n%s%s", app.Name, args, code, err, out, errOut)
		}
		t.Logf("deploy %v on %s (%s): fetched %v, %s", args, d.Node, d.Placement, d.Status.Fetched, d.Status.Timings)
		return d
	}
	first := deployed("--mode", "restore", "--node", "n1")
	home := first.Node
	if first.Status.Fetched {
		t.Errorf("the first deploy fetched the checkpoint its node had just written")
	}
	// The node that checkpointed holds it, and says so.
	waitLocal := func(node string) {
		t.Helper()
		for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
			out, _, _ := p.fogctl(ctx, "pool", "ls", app.Name, "--node", node, "-o", "json")
			var pools []state.Pool
			_ = json.Unmarshal([]byte(out), &pools)
			if len(pools) == 1 && pools[0].Local && pools[0].Gen == 1 {
				return
			}
			if time.Since(start) > 60*time.Second {
				t.Fatalf("node %s does not report holding generation 1 of %s after 60 s: %s", node, app.Name, out)
			}
		}
	}
	waitLocal(home)
	waitLocal("n4") // agent.fetch sealed

	second := deployed()
	if (second.Node != home && second.Node != "n4") || !strings.HasPrefix(second.Placement, "local:") {
		t.Errorf("deploy without --node placed on %s because %q; want %s or n4, the nodes that hold the checkpoint", second.Node, second.Placement, home)
	}
	if second.Status.Fetched {
		t.Errorf("a restore on the node that holds the checkpoint fetched it")
	}
	other := "n2"
	third := deployed("--node", other)
	if !third.Status.Fetched || !hasPhase(third.Status.Timings, deploy.StepFetch) {
		t.Errorf("the first restore on %s: fetched %v, timings %s; want it to fetch the checkpoint", other, third.Status.Fetched, third.Status.Timings)
	}
	waitLocal(other)
	fourth := deployed("--node", other)
	if fourth.Status.Fetched {
		t.Errorf("the second restore on %s fetched the checkpoint again", other)
	}
	for _, d := range []state.Deployment{first, second, third, fourth} {
		if got, err := testenv.RedisDo(ctx, nil, d.Status.Ports["6379/tcp"], "PING"); err != nil || got != "PONG" {
			t.Errorf("%s on %s: PING = %q, %v", d.ID, d.Node, got, err)
		}
		if _, errOut, code := p.fogctl(ctx, "undeploy", "--wait", "--timeout", "60s", d.ID); code != 0 {
			t.Fatalf("fogctl undeploy %s = %d\n%s", d.ID, code, errOut)
		}
	}

	// Removing the app removes every node's copy of its checkpoints.
	if _, errOut, code := p.fogctl(ctx, "app", "rm", app.Name); code != 0 {
		t.Fatalf("fogctl app rm %s = %d\n%s", app.Name, code, errOut)
	}
	for start := time.Now(); ; time.Sleep(500 * time.Millisecond) {
		var left []string
		for _, n := range []string{"n1", "n2", "n3", "n4"} {
			if _, err := os.Stat(filepath.Join(p.dir, n, "deploy", "gens", app.Name)); err == nil {
				left = append(left, n)
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Since(start) > 60*time.Second {
			t.Fatalf("nodes %v still hold checkpoints of removed app %s after 60 s", left, app.Name)
		}
	}
}

func hasPhase(ts layering.Timings, step deploy.Step) bool {
	name := string(step)
	for _, p := range ts {
		if p.Name == name {
			return true
		}
	}
	return false
}
