// Mode auto on this node: the choice between a boot and a restore from what they cost here
// (internal/adaptive), and the cost of each deploy recorded for the next choices.

package agent

import (
	"context"
	"slices"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/adaptive"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// choice is how a deployment runs on this node.
type choice struct {
	mode   deploy.Mode
	reason string
	// auto: mode auto chose the mode.
	auto bool
	// engine is, for an app of engine auto, the engine whose generation
	// a restore takes ("": the newest, or none yet).
	engine string
}

// choose resolves the mode of a deployment: its own, else its app's, else
// auto. For auto it chooses a boot or a restore from what they cost this
// node (adaptive.Decide) and says why. For an app of engine auto it also
// chooses the engine (adaptive.ChooseEngine), and mode auto compares a
// boot with a restore of that engine.
func (a *agent) choose(ctx context.Context, dsr state.Desired, app deploy.App) choice {
	ch := choice{mode: dsr.Mode}
	if ch.mode == "" {
		ch.mode = app.Mode
	}
	engineAuto := app.Engine == deploy.EngineAuto && ch.mode != deploy.ModeBoot
	if ch.mode != "" && ch.mode != deploy.ModeAuto && !engineAuto {
		return ch
	}
	cctx, cancel := context.WithTimeout(ctx, a.etcdTimeout())
	c, err := a.st.NodeCosts(cctx, app.Name, a.c.Node.Name)
	cancel()
	if err != nil {
		// As before there were costs: restore.
		a.log.Warn("mode auto: the costs of this node are unavailable; restoring", "deployment", dsr.ID, "app", app.Name, "err", err)
		c = adaptive.Costs{}
	}
	var engReason string
	if engineAuto {
		var why adaptive.Why
		ch.engine, why, engReason = adaptive.ChooseEngine(c, a.restorableEngines(ctx, app.Name))
		if ch.engine != "" {
			a.m.autoEngine.WithLabelValues(ch.engine, string(why)).Inc()
			c = c.ForEngine(ch.engine)
		}
	}
	if ch.mode != "" && ch.mode != deploy.ModeAuto {
		ch.reason = engReason
		return ch
	}
	// The node could not boot apps when the agent started (no boot
	// image): look again, since an operator may have built it since.
	cannotBoot := a.node.Problems["boot"]
	if cannotBoot != "" && a.d != nil && a.d.CheckBoot(ctx) == nil {
		cannotBoot = ""
	}
	d := adaptive.Decide(c, cannotBoot)
	a.m.auto.WithLabelValues(string(d.Mode), string(d.Why)).Inc()
	ch.mode, ch.reason, ch.auto = d.Mode, d.Reason, true
	if d.Mode == deploy.ModeRestore && engReason != "" {
		ch.reason += "; " + engReason
	}
	a.log.Info("mode auto", "deployment", dsr.ID, "app", app.Name, "mode", ch.mode, "engine", ch.engine, "reason", ch.reason)
	return ch
}

// restorableEngines are the engines of which app has a generation this
// node can restore (its newest of each), in spec.Engines' order.
func (a *agent) restorableEngines(ctx context.Context, app string) []string {
	cctx, cancel := context.WithTimeout(ctx, a.etcdTimeout())
	gens, err := a.st.Checkpoints(cctx, app)
	cancel()
	if err != nil {
		return nil
	}
	newest := map[string]deploy.Generation{}
	for _, g := range gens {
		if g.Gen > newest[g.Engine].Gen {
			newest[g.Engine] = g
		}
	}
	var out []string
	for _, e := range spec.Engines {
		if g, ok := newest[e]; ok && slices.Contains(a.node.Engines, e) && a.d.Restorable(ctx, g) == nil {
			out = append(out, e)
		}
	}
	return out
}

// recordCost adds what a deploy that ended Running cost to the app's costs
// on this node: its critical path (clone to ready; not the boot and
// checkpoint of a first deploy). Failures are logged: they only cost the
// next choices a sample.
func (a *agent) recordCost(ctx context.Context, dep deploy.Deployment, auto, engineAuto bool) {
	if dep.Mode != deploy.ModeBoot && dep.Mode != deploy.ModeRestore {
		return
	}
	cost := adaptive.Cost(dep.Timings)
	cctx, cancel := context.WithTimeout(ctx, a.etcdTimeout())
	defer cancel()
	eng := ""
	if engineAuto {
		eng = dep.Engine
	}
	if err := a.st.AddCost(cctx, dep.App, a.c.Node.Name, dep.Mode, eng, dep.Gen, cost, auto); err != nil {
		a.log.Warn("recording what the deploy cost", "deployment", dep.ID, "app", dep.App, "mode", dep.Mode, "cost", cost.Round(time.Millisecond), "err", err)
	}
}
