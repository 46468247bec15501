// A migration's target prepares the resume (internal/deploy/prepare.go) before the source suspends
// the instance: it sees the migration asked in its watch, makes the instance that will resume it
// and says so (state.MarkPrepared); the source, which lets the instance run on until then (at most
// prepareWait), checkpoints it, and the resume, placed here once it is Suspended, takes it.

package agent

import (
	"context"
	"errors"
	"time"

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
	// Prepared or not, the source need wait no more.
	if merr := a.st.MarkPrepared(ctx, dsr.ID, a.c.Node.Name); merr != nil {
		a.log.Warn("saying a migration's resume is prepared; its source checkpoints after at most "+prepareWait.String(), "deployment", dsr.ID, "err", merr)
	}
	switch {
	case err == nil:
		a.m.prepared.WithLabelValues("prepared").Inc()
		// Not under the deployment's lock, which its resume takes.
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			a.readEarly(ctx, dsr)
		}()
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

// prepareWait bounds how long a migration's source lets its instance run
// on, before the checkpoint that stops it, until the target has prepared
// the resume (a target whose agent does not say so, or a slow one).
const prepareWait = 3 * time.Second

// awaitTarget lets the instance of deployment dsr, whose migration its
// source is about to checkpoint, run on until the target has prepared the
// resume (Move.Prepared), the move went on otherwise, or prepareWait has
// passed: the resume then finds its container made, and the app answers
// nothing only for the checkpoint, its hand-over and the restore.
func (a *agent) awaitTarget(ctx context.Context, dsr state.Desired) {
	m := dsr.Move
	target := m.Target()
	if target == "" || m.Back || m.Prepared == target {
		return
	}
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, prepareWait)
	defer cancel()
	_, err := a.st.Follow(wctx, dsr.ID, func(d state.Deployment) bool {
		return !d.Suspend || d.Move == nil || d.Move.Back || d.Move.Target() != target || d.Move.Prepared == target
	})
	waited := time.Since(start)
	a.m.targetWait.Observe(waited.Seconds())
	if err != nil {
		a.log.Info("the migration's target has not said its resume is prepared; checkpointing now", "deployment", dsr.ID, "target", target,
			"waited", waited.Round(time.Millisecond), "err", err)
		return
	}
	a.log.Debug("the migration's target has prepared its resume", "deployment", dsr.ID, "target", target, "waited", waited.Round(time.Millisecond))
}

// earlyWait bounds how long a prepared target waits for its source to
// keep the checkpoint (its instance's run until then, and the checkpoint).
const earlyWait = 60 * time.Second

// readEarly reads the checkpoint of deployment dsr, whose resume this node
// prepared, from its source as soon as the source has kept it, into the
// prepared instance, while the source releases the instance and seals
// the rest of the suspension: the resume, once the suspension is
// recorded, then waits for none of it. A checkpoint whose memory the
// resume fetches later (a post-copy) is read by the resume itself. Any
// failure leaves the read to the resume. It waits for the source's record
// in the agent's view of etcd (no read of etcd, no delay).
func (a *agent) readEarly(ctx context.Context, dsr state.Desired) {
	wctx, cancel := context.WithTimeout(ctx, earlyWait)
	defer cancel()
	h, err := a.st.AwaitHandoff(wctx, dsr.ID, func(h state.Handoff) bool { return h.Node == dsr.Move.From && h.Gen > 0 },
		func(d state.Deployment) bool {
			// Moved on (the resume reads it then): no longer this node's
			// migration, or its suspension recorded.
			return d.Suspend && d.Move != nil && !d.Move.Back && d.Move.Target() == a.c.Node.Name && d.Status.Suspension == nil
		})
	if err != nil {
		return
	}
	if h.Pages {
		return
	}
	a.d.Suspensions().ReadEarly(ctx, dsr.ID, h.Gen, h.Bytes, func(ctx context.Context, dst string) error {
		_, err := a.readHandoff(ctx, dsr.ID, h, dst, h.Bytes, false)
		result := "read"
		if err != nil {
			result = "failed"
		}
		a.m.handoff.early.WithLabelValues(result).Inc()
		return err
	})
}
