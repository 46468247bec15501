//go:build !no_ceph

package e2e

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// TestEngineAutoSettlesOnFaster: redis with `engine: auto` on one agent
// that has DMTCP (container) and CRIU (host). Its first deploy checkpoints
// it with both engines (two generations), then restores; later deploys
// measure each engine's restores 3 times, then take the engine that
// restores it faster on the node, saying so in the status; every restore
// answers with the key written before the checkpoint.
func TestEngineAutoSettlesOnFaster(t *testing.T) {
	// Mode restore: the engines' choice only.
	ctx, p, _, app := redisOnPoP(t, "e2e-engine", spec.EngineAuto, func(a *spec.App) { a.Mode = spec.ModeRestore }, "n1")
	faster := regexp.MustCompile(`^engine (dmtcp|criu): restores (dmtcp|criu) \d+\.\d\d s < (dmtcp|criu) \d+\.\d\d s \(medians\)$`)
	var last state.Status
	counts := map[engine.Name]int{}
	for i := 1; i <= 8; i++ {
		out, errOut, code := p.fogctl(ctx, "deploy", app.Name, "--wait", "-o", "json")
		var d state.Deployment
		if err := json.Unmarshal([]byte(out), &d); code != 0 || err != nil || d.Status.Phase != spec.PhaseRunning {
			t.Fatalf("deploy %d = exit %d, %v\n%s%s", i, code, err, out, errOut)
		}
		st := d.Status
		t.Logf("deploy %d: %s (%s): %s", i, st.Engine, st.Reason, st.Timings)
		if got, err := testenv.RedisDo(ctx, nil, st.Ports["6379/tcp"], "PING"); err != nil || got != "PONG" {
			t.Errorf("deploy %d (%s): PING = %q, %v", i, st.Engine, got, err)
		}
		counts[st.Engine]++
		switch {
		case i == 1:
			if !st.Booted || st.Engine != engine.NameDMTCP {
				t.Errorf("deploy 1: booted %v, engine %q; want the checkpoints made, then a restore of DMTCP's", st.Booted, st.Engine)
			}
		case i <= 6:
			if !strings.Contains(st.Reason, "measuring its restores") {
				t.Errorf("deploy %d: %s, %q; want an engine measured", i, st.Engine, st.Reason)
			}
		default:
			if !faster.MatchString(st.Reason) {
				t.Errorf("deploy %d: %s, %q; want the faster engine, citing both medians", i, st.Engine, st.Reason)
			}
		}
		last = st
		if _, errOut, code := p.fogctl(ctx, "undeploy", d.ID, "--wait"); code != 0 {
			t.Fatalf("fogctl undeploy %s = exit %d\n%s", d.ID, code, errOut)
		}
	}
	if counts[engine.NameDMTCP] < 3 || counts[engine.NameCRIU] < 3 {
		t.Errorf("restores per engine = %v; want each measured at least 3 times", counts)
	}
	if m := faster.FindStringSubmatch(last.Reason); m == nil || m[1] != string(last.Engine) || m[2] != string(last.Engine) {
		t.Errorf("the last deploy restored %s because %q; want the faster engine first in its reason", last.Engine, last.Reason)
	}
	// One generation per engine.
	out, errOut, code := p.fogctl(ctx, "checkpoint", "ls", app.Name, "-o", "json")
	var gens []spec.Generation
	if err := json.Unmarshal([]byte(out), &gens); code != 0 || err != nil || len(gens) != 2 ||
		gens[0].Engine == gens[1].Engine {
		t.Errorf("fogctl checkpoint ls = exit %d, %v, %d generations; want one of each engine\n%s%s", code, err, len(gens), out, errOut)
	}
}
