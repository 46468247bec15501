// A migration's target prepares the resume (internal/deploy/prepare.go) while the source suspends
// the instance: it sees the migration asked in its watch, and makes the instance that will resume
// it; the resume, placed here once the instance is Suspended, takes it.

package agent

import (
	"context"
	"errors"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// preparesHere reports whether deployment dsr is being suspended to move
// to this node: asked here (Move.To), or likely placed here (Move.Likely).
func (a *agent) preparesHere(dsr state.Desired) bool {
	me, m := a.c.Node.Name, dsr.Move
	return dsr.Suspend && m != nil && !m.Back && dsr.Node != "" && dsr.Node != me && m.From != me &&
		(m.To == me || m.To == "" && m.Likely == me)
}

// prepareResume prepares, on this node, the resume of deployment dsr,
// which its node is suspending to move it here. A failure only logs: the
// resume then makes its instance itself.
func (a *agent) prepareResume(ctx context.Context, dsr state.Desired) {
	err := a.prepare(ctx, dsr)
	switch {
	case err == nil:
		a.m.prepared.WithLabelValues("prepared").Inc()
	case errors.Is(err, deploy.ErrNotPreparable):
		a.log.Debug("the resume of a migration cannot be prepared here", "deployment", dsr.ID, "err", err)
	default:
		a.m.prepared.WithLabelValues("failed").Inc()
		a.log.Warn("preparing the resume of a migration; its resume makes its instance itself", "deployment", dsr.ID, "err", err)
	}
}

func (a *agent) prepare(ctx context.Context, dsr state.Desired) error {
	dep, app, err := a.st.DeploymentWithApp(ctx, dsr.ID, dsr.App)
	if err != nil {
		return err
	}
	if !a.preparesHere(dep.Desired) || dep.Status.Suspension != nil || dep.Status.Gen == 0 {
		return nil // moved on meanwhile, or not a restore of a generation
	}
	a.pool.inflight.Add(1)
	defer a.pool.inflight.Add(-1)
	_, err = a.d.Suspensions().PrepareResume(ctx, app, dsr.ID, dep.Status.Gen)
	return err
}

// dropPrepared releases the resumes prepared here that no migration
// needs any more (list: every deployment's desired record): its deployment
// is gone, or no longer moving here.
func (a *agent) dropPrepared(ctx context.Context, list []state.Desired) {
	if a.d == nil { // a plane test's agent, without a deployer
		return
	}
	ids := a.d.Suspensions().Prepared()
	if len(ids) == 0 {
		return
	}
	desired := map[string]state.Desired{}
	for _, dsr := range list {
		desired[dsr.ID] = dsr
	}
	for _, id := range ids {
		dsr, ok := desired[id]
		if ok && dsr.Move != nil && (dsr.Node == a.c.Node.Name || a.preparesHere(dsr)) {
			continue
		}
		a.spawn(ctx, id, func(ctx context.Context) {
			// A resume that took it meanwhile left nothing Prepared.
			if err := a.d.Suspensions().DropPrepared(ctx, id); err != nil {
				a.log.Warn("releasing a resume prepared for a migration that went elsewhere", "deployment", id, "err", err)
				return
			}
			a.m.prepared.WithLabelValues("dropped").Inc()
			a.log.Info("released the resume prepared for a migration that went elsewhere", "deployment", id)
		})
	}
}
