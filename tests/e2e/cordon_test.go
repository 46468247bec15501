//go:build !no_ceph

package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// TestCordonKeepsWorkOff: two agents with a warm pool of one redis slot
// each. `fogctl node cordon n1`: n1's agent drops its idle slot, every
// deploy goes to n2 (and answers), one pinned to n1 is refused, and what
// runs on n1 keeps running. `fogctl node uncordon n1`: its pool comes back
// and a deploy pinned there runs.
func TestCordonKeepsWorkOff(t *testing.T) {
	ctx, p, _, app := redisOnPoP(t, "e2e-cordon", engine.NameDMTCP, func(a *spec.App) {
		one := 1
		a.Pool = &one
	}, "n1", "n2")
	idleOn := func(node string) int {
		pools, err := p.st.Pools(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		for _, pl := range pools {
			if pl.App == app.Name {
				return pl.Idle
			}
		}
		return 0
	}
	waitIdle := func(node string, want int) {
		t.Helper()
		for start := time.Now(); idleOn(node) != want; time.Sleep(200 * time.Millisecond) {
			if time.Since(start) > 2*time.Minute {
				t.Fatalf("%s did not reach %d idle slot(s) of %s in 2 min (it has %d)", node, want, app.Name, idleOn(node))
			}
		}
	}
	deploy := func(args ...string) (state.Deployment, string, int) {
		out, errOut, code := p.fogctl(ctx, append([]string{"deploy", app.Name, "--wait", "-o", "json"}, args...)...)
		var d state.Deployment
		if code == 0 {
			if err := json.Unmarshal([]byte(out), &d); err != nil {
				t.Fatalf("fogctl deploy -o json: %v\n%s", err, out)
			}
		}
		return d, errOut, code
	}
	// The first deploy makes the generation; it stays running on n1.
	kept, errOut, code := deploy("--node", "n1")
	if code != 0 || kept.Status.Phase != spec.PhaseRunning {
		t.Fatalf("first deploy on n1 = exit %d, %+v\n%s", code, kept.Status, errOut)
	}
	waitIdle("n1", 1)
	waitIdle("n2", 1)

	if _, errOut, code := p.fogctl(ctx, "node", "cordon", "n1", "--reason", "maintenance"); code != 0 {
		t.Fatalf("fogctl node cordon n1 = exit %d\n%s", code, errOut)
	}
	waitIdle("n1", 0)
	for i := range 3 {
		d, errOut, code := deploy()
		if code != 0 || d.Status.Node != "n2" {
			t.Fatalf("deploy %d with n1 cordoned = exit %d, node %q\n%s", i, code, d.Status.Node, errOut)
		}
		if got := redisPing(ctx, t, d); got != "PONG" {
			t.Errorf("deploy %d on n2: PING = %q", i, got)
		}
	}
	if _, errOut, code := deploy("--node", "n1"); code == 0 || !strings.Contains(errOut, "node n1 is cordoned since") {
		t.Errorf("deploy pinned to cordoned n1 = exit %d\n%s; want refused", code, errOut)
	}
	if got := redisPing(ctx, t, kept); got != "PONG" {
		t.Errorf("the instance on n1 after the cordon: PING = %q; want it still answering", got)
	}
	out, _, _ := p.fogctl(ctx, "node", "ls")
	if !strings.Contains(out, "Ready,Cordoned") || !strings.Contains(out, "(maintenance)") {
		t.Errorf("fogctl node ls with n1 cordoned:\n%s", out)
	}

	if _, errOut, code := p.fogctl(ctx, "node", "uncordon", "n1"); code != 0 {
		t.Fatalf("fogctl node uncordon n1 = exit %d\n%s", code, errOut)
	}
	waitIdle("n1", 1)
	if d, errOut, code := deploy("--node", "n1"); code != 0 || d.Status.Node != "n1" || d.Status.Pool != "hit" {
		t.Errorf("deploy pinned to n1 after uncordon = exit %d, %+v\n%s; want a pool hit on n1", code, d.Status, errOut)
	}
}

// redisPing is what d's redis answers to PING (the error's text if none).
func redisPing(ctx context.Context, t *testing.T, d state.Deployment) string {
	t.Helper()
	got, err := testenv.RedisDo(ctx, nil, d.Status.Ports["6379/tcp"], "PING")
	if err != nil {
		return err.Error()
	}
	return got
}
