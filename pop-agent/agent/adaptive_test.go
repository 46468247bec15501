package agent

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/fogdeploy/fogdeploy/internal/config"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// Mode auto on a node, against a real (embedded) etcd: the agent restores
// a new app, records what each deploy cost, boots to measure booting, then
// keeps to the faster kind; a deployment's own mode, or its app's, is
// taken as given; a node that cannot boot restores.
func TestChooseModeAndRecordCost(t *testing.T) {
	st := statetest.Store(t)
	ctx := context.Background()
	web := deploy.App{Name: "web", Env: "e", Command: []string{"x"}, Ready: deploy.Readiness{Kind: deploy.ReadyOutput, Phrase: "up"}}
	if err := st.CreateApp(ctx, web, false); err != nil {
		t.Fatal(err)
	}
	c := config.Default()
	c.Node.Name = "n1"
	a := &agent{c: c, st: st, log: slog.New(slog.DiscardHandler), m: newMetrics(prometheus.NewRegistry()), node: state.Node{Name: "n1"}}
	dsr := state.Desired{ID: "web-1", App: "web", Node: "n1"}
	// A deploy that cost total: its phases until ready.
	ran := func(mode deploy.Mode, gen int, total time.Duration, first bool) deploy.Deployment {
		dep := deploy.Deployment{ID: "web-1", App: "web", Mode: mode, Gen: gen, Timings: layering.Timings{
			{Name: "clone", Duration: total / 4}, {Name: "map", Duration: total / 4}, {Name: "mount", Duration: total / 4},
			{Name: "container", Duration: total / 8}, {Name: "ready", Duration: total / 8}}}
		if first {
			dep.Timings = append(layering.Timings{{Name: "boot.ready", Duration: 10 * time.Second}, {Name: "boot.checkpoint", Duration: time.Second}}, dep.Timings...)
		}
		return dep
	}
	var got []string
	for i := range 7 {
		ch := a.choose(ctx, dsr, web)
		mode, reason, auto := ch.mode, ch.reason, ch.auto
		if !auto || !strings.HasPrefix(reason, "auto: ") || ch.engine != "" {
			t.Fatalf("deploy %d: choose = %+v; want a reason from mode auto and no engine choice", i, ch)
		}
		got = append(got, string(mode))
		cost := map[deploy.Mode]time.Duration{deploy.ModeBoot: 160 * time.Millisecond, deploy.ModeRestore: 640 * time.Millisecond}[mode]
		a.recordCost(ctx, ran(mode, 1, cost, i == 0), auto, false)
		if i == 6 && (mode != deploy.ModeBoot || reason != "auto: boot 0.16 s < restore 0.64 s (medians of 3 and 3 runs)") {
			t.Errorf("deploy 7: %s, %q; want a boot citing both medians", mode, reason)
		}
	}
	if s := strings.Join(got, " "); s != "restore restore restore boot boot boot boot" {
		t.Errorf("mode auto chose %s; want 3 restores (the first with the checkpoint's boot not counted), then boots", s)
	}
	if n := counter(t, a.m.auto.WithLabelValues(string(deploy.ModeRestore), "first")); n != 3 {
		t.Errorf("fogdeploy_auto_decisions_total{choice=restore,why=first} = %v; want 3", n)
	}
	if n := counter(t, a.m.auto.WithLabelValues(string(deploy.ModeBoot), "faster")); n != 1 {
		t.Errorf("fogdeploy_auto_decisions_total{choice=boot,why=faster} = %v; want 1", n)
	}
	costs, err := st.NodeCosts(ctx, "web", "n1")
	if err != nil || len(costs.Restore) != 3 || costs.Restore[0] != 640 || len(costs.Boot) != 4 || costs.Auto != 7 {
		t.Errorf("costs = %+v, %v; want 3 restores of 640 ms (not the first deploy's boot), 4 boots, 7 auto", costs, err)
	}

	// Given modes are not chosen, and their deploys count without
	// advancing mode auto's count.
	if ch := a.choose(ctx, state.Desired{ID: "web-2", App: "web", Mode: deploy.ModeRestore}, web); ch.mode != deploy.ModeRestore || ch.reason != "" || ch.auto {
		t.Errorf("mode restore: choose = %+v", ch)
	}
	a.recordCost(ctx, ran(deploy.ModeRestore, 1, 640*time.Millisecond, false), false, false)
	if costs, _ := st.NodeCosts(ctx, "web", "n1"); len(costs.Restore) != 4 || costs.Auto != 7 {
		t.Errorf("after a deploy of mode restore: %+v; want 4 restores, 7 auto", costs)
	}
	pinned := web
	pinned.Mode = deploy.ModeRestore
	if ch := a.choose(ctx, dsr, pinned); ch.mode != deploy.ModeRestore || ch.auto {
		t.Errorf("an app of mode restore: choose = %+v", ch)
	}
	if ch := a.choose(ctx, state.Desired{ID: "web-3", App: "web", Mode: deploy.ModeAuto}, pinned); ch.mode != deploy.ModeBoot || !ch.auto {
		t.Errorf("mode auto asked for, of an app of mode restore: choose = %+v; want auto's boot", ch)
	}
	a.node.Problems = map[string]string{"boot": "no boot image"}
	if ch := a.choose(ctx, dsr, web); ch.mode != deploy.ModeRestore || !strings.Contains(ch.reason, "cannot boot") {
		t.Errorf("a node that cannot boot: choose = %+v; want a restore", ch)
	}
}

func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
