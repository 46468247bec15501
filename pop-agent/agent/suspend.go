// Suspend and resume on this node (internal/deploy/suspend.go and resume.go do the work; internal/state
// records it): a suspend asked of a deployment running here, and a resume placed here. A
// suspension this node made but had not recorded in etcd when it stopped is recorded by the
// next resync (reconcile.go).

package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// suspend suspends deployment dsr, running on this node, and records its
// suspension in etcd (its node then none). A failure leaves it Failed, its
// app maybe stopped by the checkpoint.
// suspendGrace is how long an instance runs on once its agent has said
// Suspending, before its checkpoint: the front ends' views follow the
// status within milliseconds and stop giving it connections.
const suspendGrace = 50 * time.Millisecond

func (a *agent) suspend(ctx context.Context, dsr state.Desired) {
	rec, err := a.d.Records().Load(dsr.ID)
	switch {
	case err == nil && rec.Phase == spec.PhaseSuspended:
		a.recordSuspended(ctx, rec) // suspended before the agent stopped
		return
	case err != nil || rec.Phase != spec.PhaseRunning && rec.Phase != spec.PhaseSuspending:
		return // not here, or not running (a failed suspend stays Failed)
	}
	app, err := a.st.App(ctx, dsr.App)
	if err != nil {
		a.fail(ctx, dsr, nil, fmt.Errorf("suspend: %w", err))
		return
	}
	if dsr.Move != nil && rec.Phase == spec.PhaseRunning {
		a.awaitTarget(ctx, dsr)
	}
	// Suspending: one this agent began before it stopped goes on.
	st := state.Status{Instance: rec.Instance}
	st.Phase, st.Timings, st.Suspension = spec.PhaseSuspending, nil, nil
	live := a.newLiveStatus(ctx, dsr.ID, st)
	_ = a.setStatus(ctx, dsr.ID, st)
	if rec.Phase == spec.PhaseRunning {
		// The front ends hold new connections from the moment their
		// views say Suspending: those they gave it a moment before end
		// their requests before the checkpoint cuts them.
		select {
		case <-ctx.Done():
		case <-time.After(suspendGrace):
		}
	}
	start := time.Now()
	// For a migration, its checkpoint stays here, where its target reads
	// it, and goes into the cluster behind it.
	opts := deploy.SuspendOptions{Progress: live.progress, Handoff: dsr.Move != nil}
	var kept *state.Handoff
	if dsr.Move != nil {
		// Its target may read the checkpoint from the moment its files
		// are kept, while this node seals the rest (readEarly).
		opts.Kept = func(h deploy.Handoff, susp spec.Suspension) {
			rec := handoffRecord(a.c.Node.Name, h, susp)
			if err := a.st.PutHandoff(ctx, dsr.ID, rec); err != nil {
				a.log.Info("recording a hand-over before its suspension; its target reads it once the suspension is recorded", "deployment", dsr.ID, "err", err)
				return
			}
			kept = &rec
		}
	}
	susp, err := a.d.Suspensions().Suspend(ctx, dsr.ID, app, opts)
	live.stop()
	if err != nil {
		a.m.suspends.WithLabelValues("error").Inc()
		if kept != nil {
			if eerr := a.st.EndHandoff(ctx, dsr.ID, kept.Ckpt); eerr != nil {
				a.log.Warn("removing the record of a hand-over whose suspend failed; it goes with the deployment", "deployment", dsr.ID, "err", eerr)
			}
		}
		if rec, lerr := a.d.Records().Load(dsr.ID); lerr == nil && rec.Phase == spec.PhaseRunning {
			// It failed before its checkpoint: the instance runs on.
			a.log.Error("suspend failed; the instance runs on", "deployment", dsr.ID, "err", err)
			a.event(ctx, dsr.ID, "suspend failed", err.Error()+" (it runs on)")
			if cerr := a.st.CancelSuspend(ctx, dsr.ID); cerr != nil {
				a.log.Warn("withdrawing the suspend asked", "deployment", dsr.ID, "err", cerr)
			}
			_ = a.setStatus(ctx, dsr.ID, runningStatus(rec))
			return
		}
		s := live.status()
		a.fail(ctx, dsr, &s, fmt.Errorf("suspend: %w", err))
		return
	}
	a.m.suspends.WithLabelValues("ok").Inc()
	a.m.suspendDuration.Observe(time.Since(start).Seconds())
	rec, err = a.d.Records().Load(dsr.ID)
	if err != nil {
		a.log.Error("suspended, but its record is gone", "deployment", dsr.ID, "err", err)
		return
	}
	a.recordSuspended(ctx, rec)
	a.event(ctx, dsr.ID, "suspended", fmt.Sprintf("checkpoint of %d bytes and its file-system changes in %s, %s",
		susp.Bytes, susp.Env.Image, susp.Timings))
}

// handoffRecord is what etcd holds of hand-over h of suspension susp,
// kept on node: who serves it, with which secret, and what its target
// reads.
func handoffRecord(node string, h deploy.Handoff, susp spec.Suspension) state.Handoff {
	return state.Handoff{Node: node, Ckpt: h.Ckpt, Token: h.Token, Gen: h.Gen, Bytes: h.Bytes, Pages: remotePages(susp)}
}

// recordSuspended writes suspended record rec's suspension to etcd, then
// forgets the record; a deployment withdrawn meanwhile has its
// suspension's images removed.
func (a *agent) recordSuspended(ctx context.Context, rec deploy.Deployment) {
	if rec.Suspension == nil {
		return
	}
	if rec.Suspension.Pending != "" {
		// Its target reads the checkpoint here, with the hand-over's
		// secret; a hand-over that ended meanwhile is durable.
		h, err := a.d.Handoffs().Get(rec.ID)
		switch {
		case err == nil && !h.Durable:
			err = a.st.PutHandoff(ctx, rec.ID, handoffRecord(a.c.Node.Name, h, *rec.Suspension))
		case err == nil || errors.Is(err, deploy.ErrNoHandoff):
			rec.Suspension.Pending, err = "", nil
		}
		if err != nil {
			a.log.Warn("recording a hand-over; retried every reconcile interval", "deployment", rec.ID, "err", err)
			return
		}
	}
	err := a.st.RecordSuspended(ctx, rec.ID, *rec.Suspension)
	if errors.Is(err, state.ErrNotFound) {
		// Withdrawn. Resumed on another node before that (this agent
		// stopped before it forgot the record), the suspension's images
		// are that instance's, which removes them with its undeploy.
		other, ferr := a.st.ForgetSuspendedStatus(ctx, rec.ID, a.c.Node.Name)
		switch {
		case ferr != nil:
			a.log.Warn("forgetting the status of a withdrawn suspended deployment; retried every reconcile interval", "deployment", rec.ID, "err", ferr)
			return
		case other != "":
			a.log.Info("a withdrawn deployment suspended here was resumed on another node: its suspension is that node's", "deployment", rec.ID, "node", other)
		default:
			if rerr := a.d.Suspensions().RemoveSuspension(ctx, *rec.Suspension); rerr != nil {
				a.log.Warn("removing the suspension of a withdrawn deployment; gc removes what is left", "deployment", rec.ID, "err", rerr)
			}
		}
		if err := a.d.Suspensions().Forget(rec.ID); err != nil {
			a.log.Warn("forgetting a withdrawn suspended deployment's record", "deployment", rec.ID, "err", err)
		}
		return
	} else if err != nil {
		a.log.Warn("recording a suspension; retried every reconcile interval", "deployment", rec.ID, "err", err)
		return
	}
	if err := a.d.Suspensions().Forget(rec.ID); err != nil {
		a.log.Warn("forgetting a suspended deployment's record", "deployment", rec.ID, "err", err)
	}
	a.log.Info("deployment suspended", "deployment", rec.ID, "app", rec.App, "env", rec.Suspension.Env.String(),
		"ckpt", rec.Suspension.Ckpt.String(), "bytes", rec.Suspension.Bytes, "timings", rec.Suspension.Timings.String())
	if rec.Suspension.Pending != "" {
		a.followHandoff(ctx, rec.ID)
	}
	a.moveOn(ctx, rec.ID)
}

// moveOn takes the next step of deployment id's migration, if one is due
// (state.MoveOn): after this node suspended it, after a resume here
// failed, and at each resync while it waits Suspended, moved from here.
func (a *agent) moveOn(ctx context.Context, id string) {
	d, err := a.st.MoveOn(ctx, id)
	if err != nil {
		a.log.Warn("carrying a migration on; retried at the next resync", "deployment", id, "err", err)
		return
	}
	if d.Move != nil && d.Node != "" {
		a.log.Info("migration goes on", "deployment", id, "node", d.Node, "back", d.Move.Back)
	}
}

// carriesOn reports whether this node takes the next step of migration m
// at its resync: the source, whose suspend ends with it, and the target (or
// every node, where placement picks it), so that a migration whose source
// node was lost once its instance was Suspended still goes on.
func (a *agent) carriesOn(m state.Move) bool {
	me := a.c.Node.Name
	return m.From == me || m.To == me || m.To == ""
}

// resume restores suspended deployment dsr on this node. A resume that
// fails leaves it Suspended again, with why, its suspension intact.
func (a *agent) resume(ctx context.Context, dsr state.Desired, app spec.App, susp spec.Suspension) {
	st := state.Status{Instance: spec.Instance{Phase: spec.PhaseResuming, Node: a.c.Node.Name, Gen: susp.From.Gen, Engine: susp.Engine,
		Mode: spec.ModeRestore, Suspension: &susp}}
	live := a.newLiveStatus(ctx, dsr.ID, st)
	_ = a.setStatus(ctx, dsr.ID, st)
	start := time.Now()
	a.pool.inflight.Add(1)
	opts := deploy.Options{Progress: live.progress}
	if susp.Pending != "" {
		opts.Checkpoint = a.fetchHandoff(ctx, dsr.ID, susp)
	}
	dep, err := a.d.Resume(ctx, app, dsr.ID, susp, opts)
	a.pool.inflight.Add(-1)
	live.stop()
	if err != nil {
		a.m.resumes.WithLabelValues("error").Inc()
		err = a.explain(ctx, fmt.Errorf("resume on node %s: %w", a.c.Node.Name, err))
		if errors.Is(err, ErrLostInMigration) {
			// Nothing can resume it: what is left of it goes.
			if rerr := a.d.Suspensions().RemoveLost(ctx, susp); rerr != nil {
				a.log.Warn("removing what is left of an instance lost during its migration; gc removes it once the deployment is gone", "deployment", dsr.ID, "err", rerr)
			}
			s := live.status()
			s.Suspension = nil
			a.fail(ctx, dsr, &s, err)
			return
		}
		a.log.Error("resume failed; the deployment stays suspended", "deployment", dsr.ID, "err", err)
		serr := a.st.SetSuspended(ctx, dsr.ID, susp, err)
		if errors.Is(serr, state.ErrNotFound) {
			_ = a.d.Suspensions().RemoveSuspension(ctx, susp)
			_ = a.st.ForgetStatus(ctx, dsr.ID)
		}
		a.event(ctx, dsr.ID, "resume failed", err.Error())
		if serr == nil {
			a.moveOn(ctx, dsr.ID)
		}
		return
	}
	a.m.resumes.WithLabelValues("ok").Inc()
	a.m.resumeDuration.Observe(time.Since(start).Seconds())
	if err := a.setStatus(ctx, dsr.ID, runningStatus(dep)); err != nil {
		a.log.Warn("writing status", "err", err)
	}
	// Its callers know where it answers: what it needs no more goes (the
	// checkpoint's image once the restore has its pages, if it reads them
	// from it).
	if served := a.d.Checkpoints().Serving(susp.Ckpt.Image); served != nil {
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			select {
			case <-served:
				a.spawn(ctx, dsr.ID, func(ctx context.Context) { a.d.Suspensions().DropSuspension(ctx, dsr.ID, susp) })
			case <-ctx.Done():
			}
		}()
	} else {
		a.d.Suspensions().DropSuspension(ctx, dsr.ID, susp)
	}
	a.event(ctx, dsr.ID, "resumed", fmt.Sprintf("on node %s, %s", a.c.Node.Name, dep.Timings))
	a.log.Info("deployment resumed", "deployment", dsr.ID, "ports", dep.Ports, "timings", dep.Timings.String())
	// Withdrawn while it resumed? Then undo at once.
	wctx, cancel := context.WithTimeout(ctx, a.etcdTimeout())
	_, err = a.st.Deployment(wctx, dsr.ID)
	cancel()
	if errors.Is(err, state.ErrNotFound) {
		a.undeploy(ctx, dsr.ID)
	}
}
