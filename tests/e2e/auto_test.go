//go:build !no_ceph

package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/adaptive"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// TestAutoModeSettlesOnFaster: one agent with DMTCP deploys redis again and
// again in mode auto, one at a time, through `fogctl deploy --wait`. A
// redis restore from a node's copy costs about what its boot does here
// (0.5 s), so the app's post_restore sleeps 0.4 s: booting is then clearly
// the faster. The agent
// restores first (the first deploy produces the checkpoint), boots to
// measure booting once it has 3 restores, then settles on booting with a
// status reason citing both medians; the 10th choice restores to measure
// restoring again. `fogctl app costs` shows the numbers, the agent's
// metrics count the choices, and --mode restore still restores.
func TestAutoModeSettlesOnFaster(t *testing.T) {
	ctx, p, _, app := redisOnPoP(t, "e2e-auto", engine.NameDMTCP, func(a *deploy.App) {
		a.PostRestore = []string{"sh", "-c", "sleep 0.4"}
	}, "n1")
	// deploy runs one deploy to Running, checks that it serves, withdraws
	// it, and returns its status.
	deployOnce := func(args ...string) state.Status {
		t.Helper()
		out, errOut, code := p.fogctl(ctx, append([]string{"deploy", app.Name, "--wait", "-o", "json"}, args...)...)
		var d state.Deployment
		if err := json.Unmarshal([]byte(out), &d); code != 0 || err != nil || d.Status.Phase != deploy.PhaseRunning {
			t.Fatalf("fogctl deploy %s = exit %d, %v\n%s%s", app.Name, code, err, out, errOut)
		}
		if got, err := testenv.RedisDo(ctx, nil, d.Status.Ports["6379/tcp"], "PING"); err != nil || got != "PONG" {
			t.Errorf("%s (%s): PING = %q, %v", d.ID, d.Status.Mode, got, err)
		}
		if _, errOut, code := p.fogctl(ctx, "undeploy", d.ID, "--wait"); code != 0 {
			t.Fatalf("fogctl undeploy %s = exit %d\n%s", d.ID, code, errOut)
		}
		return d.Status
	}
	faster := regexp.MustCompile(`^auto: boot \d+\.\d\d s [<=] restore \d+\.\d\d s \(medians of \d+ and \d+ runs\)$`)
	var table []string
	settled := 0
	for i := 1; i <= 11; i++ {
		st := deployOnce()
		reason := st.Reason
		if st.Mode == deploy.ModeBoot {
			reason = st.BootReason
		}
		row := string(st.Mode) + ": " + reason + " (" + adaptive.Cost(st.Timings).Round(time.Millisecond).String() + ")"
		table = append(table, row)
		t.Logf("deploy %2d: %s", i, row)
		switch {
		case i <= 3:
			if st.Mode != deploy.ModeRestore || !strings.HasPrefix(reason, "auto: restore first ("+strconv.Itoa(i-1)+" of 3") || st.Booted != (i == 1) {
				t.Errorf("deploy %d: %s, booted %v; want a restore first (the first one producing the checkpoint)", i, row, st.Booted)
			}
		case i == 4:
			if st.Mode != deploy.ModeBoot || !strings.HasPrefix(reason, "auto: boot to measure it (none measured on this node yet; restore ") {
				t.Errorf("deploy 4: %s; want a boot, to measure it", row)
			}
		case i == 10 && settled > 0:
			if st.Mode != deploy.ModeRestore || !strings.HasPrefix(reason, "auto: restore to measure it again (every 10th choice") {
				t.Errorf("deploy 10: %s; want a restore, to measure it again", row)
			}
		case faster.MatchString(reason) && st.Mode == deploy.ModeBoot:
			settled++
		case settled > 0:
			t.Errorf("deploy %d: %s; want a boot citing both medians once settled", i, row)
		}
	}
	if settled < 2 {
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
		len(costs[0].BootMS) < 3 || len(costs[0].RestoreMS) < 3 || costs[0].BootMedianMS >= costs[0].RestoreMedianMS || costs[0].Next.Mode != string(deploy.ModeBoot) {
		t.Errorf("fogctl app costs -o json = exit %d, %v, %+v; want n1's medians, boot the lower, boot next\n%s%s", code, err, costs, out, errOut)
	}
	if out, _, code := p.fogctl(ctx, "app", "costs", app.Name); code != 0 || !strings.Contains(out, "auto: boot ") {
		t.Errorf("fogctl app costs = exit %d:\n%s", code, out)
	}
	resp, err := http.Get("http://" + p.apis["n1"] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{`fogdeploy_auto_decisions_total{choice="restore",why="first"} 3`, `fogdeploy_auto_decisions_total{choice="boot",why="faster"}`,
		"\nfogdeploy_ceph_stalls_total 0\n"} {
		if !strings.Contains(string(metrics), m) {
			t.Errorf("/metrics has no %s", m)
		}
	}
	// A deployment of mode restore restores, whatever the numbers say.
	if st := deployOnce("--mode", string(deploy.ModeRestore)); st.Mode != deploy.ModeRestore || st.Reason != "" {
		t.Errorf("--mode restore: mode %q, reason %q; want a restore, as requested", st.Mode, st.Reason)
	}
}
