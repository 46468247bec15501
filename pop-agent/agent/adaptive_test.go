package agent

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/fogdeploy/fogdeploy/internal/config"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// fakeAutoNode is the deployer as mode auto asks it: a slot of the app
// waits or not; every generation is restorable; the node can boot.
type fakeAutoNode struct{ waiting *spec.Generation }

func (f *fakeAutoNode) WaitingSlot(app spec.App, eng engine.Name) (spec.Generation, bool) {
	if f.waiting == nil || f.waiting.App != app.Name {
		return spec.Generation{}, false
	}
	return *f.waiting, true
}
func (f *fakeAutoNode) Restorable(context.Context, spec.Generation) error { return nil }
func (f *fakeAutoNode) CheckBoot(context.Context) error                   { return nil }

// Mode auto on a node, against a real (embedded) etcd: a new app makes its
// generation (its boot counted as a boot sample); with a slot waiting the
// deploy takes it; with none, the faster of boot and restore, each
// recorded; a boot never runs to measure; the boots survive a new pool
// size; a deployment's own mode, or its app's, is taken as given; a node
// that cannot boot restores.
func TestChooseModeAndRecordCost(t *testing.T) {
	st := statetest.Store(t)
	ctx := context.Background()
	web := spec.App{Name: "web", Env: "e", Command: []string{"x"}, Ready: spec.Readiness{Kind: spec.ReadyOutput, Phrase: "up"}}
	if err := st.CreateApp(ctx, web, false); err != nil {
		t.Fatal(err)
	}
	c := config.Default()
	c.Node.Name = "n1"
	fake := &fakeAutoNode{}
	a := &agent{c: c, st: st, log: slog.New(slog.DiscardHandler), m: newMetrics(prometheus.NewRegistry()), node: state.Node{Name: "n1", Engines: []engine.Name{"dmtcp"}},
		auto: fake}
	dsr := state.Desired{ID: "web-1", App: "web", Node: "n1"}
	// A deploy that cost total: its phases until ready.
	ran := func(mode spec.Mode, gen int, total time.Duration, first bool) deploy.Deployment {
		dep := deploy.Deployment{ID: "web-1", App: "web", Instance: spec.Instance{Mode: mode, Gen: gen, Booted: first, Timings: layering.Timings{
			{Name: "clone", Duration: total / 4}, {Name: "map", Duration: total / 4}, {Name: "mount", Duration: total / 4},
			{Name: "container", Duration: total / 8}, {Name: "ready", Duration: total / 8}}}}
		if first {
			dep.Timings = append(layering.Timings{{Name: "boot.clone", Duration: time.Second}, {Name: "boot.ready", Duration: 4 * time.Second},
				{Name: "boot.checkpoint", Duration: time.Second}}, dep.Timings...)
		}
		return dep
	}
	// No generation: the deploy makes it.
	ch := a.choose(ctx, dsr, web)
	if ch.mode != spec.ModeRestore || !ch.auto || !strings.HasPrefix(ch.reason, "auto: no generation of the app") {
		t.Fatalf("a new app: choose = %+v; want a restore that makes its generation", ch)
	}
	a.recordCost(ctx, ran(spec.ModeRestore, 1, 400*time.Millisecond, true), true, false)
	if err := st.PutCheckpoint(ctx, spec.Generation{App: "web", Gen: 1, Engine: "dmtcp", Spec: web}); err != nil {
		t.Fatal(err)
	}
	costs, err := st.NodeCosts(ctx, "web", "n1")
	if err != nil || len(costs.Boot) != 1 || costs.Boot[0] != 5000 || len(costs.Restore) != 1 || costs.Restore[0] != 400 {
		t.Errorf("costs after the first deploy = %+v, %v; want its boot (5 s, until ready) and its restore (0.4 s)", costs, err)
	}
	// 5 s against 0.4 s: restores, and no boot ever, nothing measured
	// (12x apart); a slot waiting is taken.
	var got []string
	for i := range 6 {
		fake.waiting = nil
		if i%2 == 1 {
			fake.waiting = &spec.Generation{App: "web", Gen: 1, Engine: "dmtcp"}
		}
		ch := a.choose(ctx, dsr, web)
		if !ch.auto || !strings.HasPrefix(ch.reason, "auto: ") || ch.engine != "" {
			t.Fatalf("deploy %d: choose = %+v; want a reason from mode auto and no engine choice", i, ch)
		}
		dep := ran(ch.mode, 1, 400*time.Millisecond, false)
		what := string(ch.mode)
		if strings.HasPrefix(ch.reason, "auto: pool slot") {
			what, dep.Pool = "hit", spec.PoolHit
			dep.Timings = layering.Timings{{Name: "ready", Duration: 5 * time.Millisecond}}
		}
		got = append(got, what)
		a.recordCost(ctx, dep, ch.auto, false)
	}
	if s := strings.Join(got, " "); s != "restore hit restore hit restore hit" {
		t.Errorf("mode auto chose %s; want restores, and hits where a slot waited", s)
	}
	if a.measuring.apps["web"] != "" {
		t.Errorf("a measurement was asked for with a 12x gap")
	}
	if n := counter(t, a.m.auto.WithLabelValues(string(spec.ModeRestore), "pool_slot")); n != 3 {
		t.Errorf("fogdeploy_auto_decisions_total{choice=restore,why=pool_slot} = %v; want 3", n)
	}
	if n := counter(t, a.m.auto.WithLabelValues(string(spec.ModeRestore), "no_generation")); n != 1 {
		t.Errorf("fogdeploy_auto_decisions_total{choice=restore,why=no_generation} = %v; want 1", n)
	}
	costs, _ = st.NodeCosts(ctx, "web", "n1")
	if len(costs.Restore) != 4 || len(costs.Hit) != 3 || costs.Hit[0] != 5 || len(costs.Boot) != 1 || costs.Auto != 7 {
		t.Errorf("costs = %+v; want 4 restores, 3 hits of 5 ms, the one boot, 7 auto", costs)
	}
	// A new pool size keeps the boots; the choice stays a restore.
	fake.waiting = nil
	pool := 2
	resized := web
	resized.Pool = &pool
	if err := st.CreateApp(ctx, resized, true); err != nil {
		t.Fatal(err)
	}
	if costs, _ := st.NodeCosts(ctx, "web", "n1"); len(costs.Boot) != 1 {
		t.Errorf("boots after a new pool size = %v; want the one kept", costs.Boot)
	}
	if ch := a.choose(ctx, dsr, resized); ch.mode != spec.ModeRestore || !strings.Contains(ch.reason, "< boot 5.00 s") {
		t.Errorf("after a new pool size: choose = %+v; want a restore citing the boot", ch)
	}

	// Given modes are not chosen, and their deploys count without
	// advancing mode auto's count.
	if ch := a.choose(ctx, state.Desired{ID: "web-2", App: "web", Mode: spec.ModeRestore}, web); ch.mode != spec.ModeRestore || ch.reason != "" || ch.auto {
		t.Errorf("mode restore: choose = %+v", ch)
	}
	a.recordCost(ctx, ran(spec.ModeBoot, 0, 4800*time.Millisecond, false), false, false)
	if costs, _ := st.NodeCosts(ctx, "web", "n1"); len(costs.Boot) != 2 || costs.Auto != 7 {
		t.Errorf("after a deploy of mode boot: %+v; want 2 boots, 7 auto", costs)
	}
	pinned := web
	pinned.Mode = spec.ModeRestore
	if ch := a.choose(ctx, dsr, pinned); ch.mode != spec.ModeRestore || ch.auto {
		t.Errorf("an app of mode restore: choose = %+v", ch)
	}
	if ch := a.choose(ctx, state.Desired{ID: "web-3", App: "web", Mode: spec.ModeAuto}, pinned); ch.mode != spec.ModeRestore || !ch.auto {
		t.Errorf("mode auto asked for, of an app of mode restore: choose = %+v; want auto's restore", ch)
	}
	a.node.Problems = map[string]string{"boot": "no boot image"}
	a.auto = &cannotBoot{fake}
	if ch := a.choose(ctx, dsr, web); ch.mode != spec.ModeRestore || !strings.Contains(ch.reason, "cannot boot") {
		t.Errorf("a node that cannot boot: choose = %+v; want a restore", ch)
	}
}

// cannotBoot is a node without a boot image.
type cannotBoot struct{ *fakeAutoNode }

func (cannotBoot) CheckBoot(context.Context) error { return errors.New("no boot image") }

func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
