// Mode auto on this node: the choice between a boot and a restore from what they cost here
// (internal/adaptive), and the cost of each deploy recorded for the next choices.

package agent

import (
	"context"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/adaptive"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// chooseMode resolves the mode of a deployment: its own, else its app's,
// else auto. For auto it chooses a boot or a restore from what they cost
// this node (adaptive.Decide) and says why; auto reports that it did.
func (a *agent) chooseMode(ctx context.Context, dsr state.Desired, app deploy.App) (mode deploy.Mode, reason string, auto bool) {
	mode = dsr.Mode
	if mode == "" {
		mode = app.Mode
	}
	if mode != "" && mode != deploy.ModeAuto {
		return mode, "", false
	}
	cctx, cancel := context.WithTimeout(ctx, a.etcdTimeout())
	c, err := a.st.NodeCosts(cctx, app.Name, a.c.Node.Name)
	cancel()
	if err != nil {
		// As before there were costs: restore.
		a.log.Warn("mode auto: the costs of this node are unavailable; restoring", "deployment", dsr.ID, "app", app.Name, "err", err)
		c = adaptive.Costs{}
	}
	d := adaptive.Decide(c, a.node.Problems["boot"])
	a.m.auto.WithLabelValues(string(d.Mode), string(d.Why)).Inc()
	a.log.Info("mode auto", "deployment", dsr.ID, "app", app.Name, "mode", d.Mode, "reason", d.Reason)
	return d.Mode, d.Reason, true
}

// recordCost adds what a deploy that ended Running cost to the app's costs
// on this node: its critical path (clone to ready; not the boot and
// checkpoint of a first deploy). Failures are logged: they only cost the
// next choices a sample.
func (a *agent) recordCost(ctx context.Context, dep deploy.Deployment, auto bool) {
	if dep.Mode != deploy.ModeBoot && dep.Mode != deploy.ModeRestore {
		return
	}
	cost := adaptive.Cost(dep.Timings)
	cctx, cancel := context.WithTimeout(ctx, a.etcdTimeout())
	defer cancel()
	if err := a.st.AddCost(cctx, dep.App, a.c.Node.Name, dep.Mode, dep.Gen, cost, auto); err != nil {
		a.log.Warn("recording what the deploy cost", "deployment", dep.ID, "app", dep.App, "mode", dep.Mode, "cost", cost.Round(time.Millisecond), "err", err)
	}
}
