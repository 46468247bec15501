// What the reconciler does for one deployment: deploy (restore, produce the first checkpoint, or
// boot), checkpoint refresh, revive, undeploy, and the status written back.

package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/adaptive"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

func (a *agent) deploy(ctx context.Context, dsr state.Desired) { a.deployKnown(ctx, dsr, nil) }

// deployKnown is deploy of a deployment the reconcile watch saw created,
// with its app as of that event (known; nil: read it from the cluster).
func (a *agent) deployKnown(ctx context.Context, dsr state.Desired, known *spec.App) {
	app, ok := a.dispatch(ctx, dsr, known)
	if !ok {
		return
	}
	log := a.log.With("deployment", dsr.ID, "app", dsr.App)
	ch := a.choose(ctx, dsr, app)
	st := state.Status{Instance: spec.Instance{Phase: spec.PhaseCreating, Node: a.c.Node.Name}}
	if ch.auto {
		// Say what mode auto chose, and why, from the start.
		st.Mode = ch.mode
		if ch.mode == spec.ModeBoot {
			st.BootReason = ch.reason
		} else {
			st.Reason = ch.reason
		}
	}
	live := a.newLiveStatus(ctx, dsr.ID, st)
	start := time.Now()
	a.makeRoom(ctx, app.Name)
	a.pool.inflight.Add(1)
	dep, err := a.d.Deploy(ctx, app, deploy.Options{
		ID:         dsr.ID,
		Mode:       ch.mode,
		Reason:     ch.reason,
		IfBusy:     a.c.Agent.IfBusy,
		IfNoEngine: a.c.Agent.IfNoEngine,
		Engine:     ch.engine,
		Progress:   live.progress,
		LockCheckpoint: func(ctx context.Context, wait bool) (func(), error) {
			unlock, err := a.st.LockCheckpoint(ctx, a.session(), app.Name, wait)
			if err != nil {
				return nil, err
			}
			live.boot(true)
			return func() { live.boot(false); unlock() }, nil
		},
		Sealed: func(ctx context.Context, g spec.Generation) error {
			a.m.checkpoints.Inc()
			a.event(ctx, dsr.ID, "checkpointed", fmt.Sprintf("app %s generation %d (%d bytes)", g.App, g.Gen, g.Bytes))
			err := a.st.PutCheckpoint(ctx, g)
			a.retain(ctx, g.App)
			a.pool.refillSoon() // the pool follows the new generation
			return err
		},
	})
	a.pool.inflight.Add(-1)
	live.stop()
	if err != nil {
		if _, lerr := a.d.Records().Load(dsr.ID); lerr == nil {
			// The deployer's own undo did not finish.
			if cerr := a.clean(ctx, dsr.ID); cerr != nil {
				log.Warn("what the failed deploy left stays until the cluster answers; retried every reconcile interval", "err", cerr)
			}
		}
		st := live.status()
		if step := failedStep(st.Timings); step != "" {
			err = fmt.Errorf("step %s: %w", step, err)
		}
		a.fail(ctx, dsr, &st, err)
		return
	}
	a.running(ctx, log, dsr, app, dep, ch, start)
}

// dispatch handles what deployment dsr asks of this node other than a new
// instance (nothing, a suspend, a resume, a checkpoint refresh, a failure)
// and returns its app and true when a deploy is what it asks.
func (a *agent) dispatch(ctx context.Context, dsr state.Desired, known *spec.App) (spec.App, bool) {
	if dsr.Suspend {
		a.suspend(ctx, dsr)
		return spec.App{}, false
	}
	rec, lerr := a.d.Records().Load(dsr.ID)
	if lerr == nil && rec.Phase == spec.PhaseRunning {
		return spec.App{}, false // already here (a repeated event)
	}
	// One read of the cluster: the deployment as it is now, and its app;
	// none for a deployment seen created with its app (known): it is
	// then as it was created, Pending (withdrawn since, its deploy is
	// undone as it ends: running).
	var cur state.Deployment
	var app spec.App
	var err error
	if known != nil {
		cur, app = state.Deployment{Desired: dsr, Status: state.Status{Instance: spec.Instance{Phase: spec.PhasePending}}}, *known
	} else {
		cur, app, err = a.st.DeploymentWithApp(ctx, dsr.ID, dsr.App)
	}
	switch {
	case err != nil && cur.ID == "":
		// Withdrawn meanwhile, or etcd unavailable (the next resync
		// deploys it).
	case err != nil:
		a.fail(ctx, dsr, nil, err) // its app is gone
	case lerr != nil && cur.Status.Phase == spec.PhaseRunning && cur.Status.Node == a.c.Node.Name:
		// Running here by its status, but this node holds nothing of it:
		// its instance went with a previous run of the agent (the host
		// driver's end with it) and was undone at recovery. Deployed
		// again, under the same ID.
		a.log.Info("deploying again: its instance went with the agent's previous run", "deployment", dsr.ID)
		return app, true
	case state.Settled(cur.Status.Phase):
	case cur.Status.Suspension != nil:
		a.resume(ctx, dsr, app, *cur.Status.Suspension)
	case dsr.Mode == spec.ModeCheckpoint:
		a.refresh(ctx, dsr, app)
	default:
		return app, true
	}
	return spec.App{}, false
}

// running records a deploy that succeeded: its status, the metrics, the
// pool's follow-up, its event and its cost for mode auto; a deployment
// withdrawn meanwhile is undone at once.
func (a *agent) running(ctx context.Context, log *slog.Logger, dsr state.Desired, app spec.App, dep deploy.Deployment, ch choice, start time.Time) {
	if ch.why == adaptive.WhyPoolSlot && dep.Pool != spec.PoolHit {
		// Another deploy took the slot between the choice and the claim.
		dep.Reason = "auto: pool slot: the slot that waited was taken by another deploy meanwhile; restored without one"
	}
	done := string(dep.Mode) // restore or boot
	if dep.Booted {
		done = "checkpoint" // produced the first checkpoint, then restored
	}
	a.m.deploys.WithLabelValues(done, "ok").Inc()
	a.m.duration.WithLabelValues(done).Observe(time.Since(start).Seconds())
	if err := a.setStatus(ctx, dsr.ID, runningStatus(dep)); err != nil {
		log.Warn("writing status", "err", err)
	}
	if dep.Mode == spec.ModeRestore {
		a.poolDeployed(ctx, app, dep)
	}
	what := fmt.Sprintf("restored gen %d", dep.Gen)
	if dep.Pool == spec.PoolHit {
		what += " in warm-pool slot " + dep.Slot
	}
	if dep.Reason != "" {
		what += " (" + dep.Reason + ")"
	}
	if dep.Mode == spec.ModeBoot {
		what = "booted without a checkpoint (" + dep.BootReason + ")"
	}
	a.event(ctx, dsr.ID, "running", fmt.Sprintf("%s, %s", what, dep.Timings))
	log.Info("deployment running", "mode", dep.Mode, "gen", dep.Gen, "booted", dep.Booted, "ports", dep.Ports, "timings", dep.Timings.String())
	a.recordCost(ctx, dep, ch.auto, app.Engine == spec.EngineAuto)
	// Withdrawn while we deployed? Then undo at once (without etcd, resync
	// does when it answers again).
	wctx, cancel := context.WithTimeout(ctx, a.etcdTimeout())
	_, err := a.st.Deployment(wctx, dsr.ID)
	cancel()
	if errors.Is(err, state.ErrNotFound) {
		a.undeploy(ctx, dsr.ID)
	}
}

// liveStatusDelay is how long a deploy runs before its status shows
// its progress: a pool hit or a fast restore writes one status, Running.
const liveStatusDelay = 50 * time.Millisecond

// liveStatus is a deploying deployment's status as its stages report
// them, named boot.* while the deploy boots the app to make its first
// checkpoint. It is written to etcd once the deploy has run for
// liveStatusDelay, then at each timing as it comes, until stop. Its
// writer writes in the background, the latest status each time (a
// stage never waits for etcd, whose writes a disk busy with a large
// checkpoint can make slow); stop waits for a write under way, so that
// none lands after the status the deploy's end writes.
type liveStatus struct {
	a   *agent
	ctx context.Context
	id  string

	mu      sync.Mutex
	st      state.Status
	booting bool
	shown   bool // written since the delay
	stopped bool
	timer   *time.Timer
	// kick wakes the writer (one pending wake is enough: it writes the
	// latest status); done is closed once the writer is gone.
	kick chan struct{}
	done chan struct{}
}

func (a *agent) newLiveStatus(ctx context.Context, id string, st state.Status) *liveStatus {
	l := &liveStatus{a: a, ctx: ctx, id: id, st: st, kick: make(chan struct{}, 1), done: make(chan struct{})}
	go l.writer()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.timer = time.AfterFunc(liveStatusDelay, l.show)
	return l
}

// writer writes the status each time it is woken, until stop.
func (l *liveStatus) writer() {
	defer close(l.done)
	for {
		select {
		case _, ok := <-l.kick:
			if !ok {
				return
			}
		case <-l.ctx.Done():
			return
		}
		l.mu.Lock()
		if l.stopped {
			l.mu.Unlock()
			return
		}
		st := l.snapshot()
		l.mu.Unlock()
		_ = l.a.setStatus(l.ctx, l.id, st)
	}
}

// show writes the status, and each change from now on.
func (l *liveStatus) show() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return
	}
	l.shown = true
	l.write()
}

// write has the writer write the status if it is shown; l.mu is held.
func (l *liveStatus) write() {
	if l.shown && !l.stopped {
		select {
		case l.kick <- struct{}{}:
		default: // a write is pending: it takes this change too
		}
	}
}

// stop ends the writes, once a write under way is done: the deploy's end
// writes its own status.
func (l *liveStatus) stop() {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		<-l.done
		return
	}
	l.stopped = true
	l.timer.Stop()
	close(l.kick)
	l.mu.Unlock()
	<-l.done
}

func (l *liveStatus) progress(phase string, took time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	name := phase
	if l.booting {
		name = spec.BootTiming(phase)
	}
	l.st.Timings = append(l.st.Timings, layering.Phase{Name: name, Duration: took})
	l.write()
}

// boot says whether the stages now report are the first checkpoint's
// boot (the phase then stays Booting).
func (l *liveStatus) boot(on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.booting = on
	if on {
		l.st.Phase = spec.PhaseBooting
		l.write()
	}
}

func (l *liveStatus) status() state.Status {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.snapshot()
}

// snapshot is a copy of the status, its timings its own; l.mu is held.
func (l *liveStatus) snapshot() state.Status {
	st := l.st
	st.Timings = slices.Clone(l.st.Timings)
	return st
}

func (a *agent) setStatus(ctx context.Context, id string, st state.Status) error {
	ctx, cancel := context.WithTimeout(ctx, a.etcdTimeout())
	defer cancel()
	return a.st.SetStatus(ctx, id, st)
}

func (a *agent) event(ctx context.Context, id, reason, msg string) {
	ctx, cancel := context.WithTimeout(ctx, a.etcdTimeout())
	defer cancel()
	a.st.Event(ctx, id, reason, msg)
}

// runningStatus is the status of a Running deployment record.
func runningStatus(dep deploy.Deployment) state.Status {
	st := state.Status{Instance: dep.Instance}
	st.Phase, st.Error = spec.PhaseRunning, ""
	return st
}

// refresh produces a new checkpoint generation of app under the PoP-wide
// checkpoint lock (waiting for it), records it, and ends the deployment
// Checkpointed; no instance is left running.
func (a *agent) refresh(ctx context.Context, dsr state.Desired, app spec.App) {
	st := state.Status{Instance: spec.Instance{Phase: spec.PhaseBooting, Node: a.c.Node.Name, Mode: spec.ModeCheckpoint}}
	_ = a.setStatus(ctx, dsr.ID, st)
	unlock, err := a.st.LockCheckpoint(ctx, a.session(), app.Name, true)
	if err != nil {
		a.fail(ctx, dsr, &st, err)
		return
	}
	defer unlock()
	start := time.Now()
	// One generation, or one per engine for an app of engine auto.
	gens, err := a.d.CheckpointAll(ctx, app, deploy.CheckpointOptions{Progress: func(phase string, took time.Duration) {
		st.Timings = append(st.Timings, layering.Phase{Name: phase, Duration: took})
		_ = a.setStatus(ctx, dsr.ID, st)
	}})
	if err != nil {
		a.fail(ctx, dsr, &st, err)
		return
	}
	a.m.checkpoints.Add(float64(len(gens)))
	a.m.deploys.WithLabelValues(string(spec.ModeCheckpoint), "ok").Inc()
	a.m.duration.WithLabelValues(string(spec.ModeCheckpoint)).Observe(time.Since(start).Seconds())
	for _, g := range gens {
		if err := a.st.PutCheckpoint(ctx, g); err != nil {
			a.fail(ctx, dsr, &st, fmt.Errorf("generation %d of %s is sealed in the pool but not recorded: %w", g.Gen, g.App, err))
			return
		}
	}
	g := gens[len(gens)-1]
	a.retain(ctx, g.App)
	st.Phase, st.Gen = spec.PhaseCheckpointed, g.Gen
	_ = a.setStatus(ctx, dsr.ID, st)
	a.event(ctx, dsr.ID, "checkpointed", fmt.Sprintf("app %s generation %d (%d bytes), refreshed", g.App, g.Gen, g.Bytes))
	a.log.Info("checkpoint refreshed", "deployment", dsr.ID, "app", app.Name, "gen", g.Gen, "timings", g.Timings.String())
}

func (a *agent) fail(ctx context.Context, dsr state.Desired, st *state.Status, err error) {
	err = a.explain(ctx, err)
	a.m.deploys.WithLabelValues("", "error").Inc()
	h := hintOf(err)
	a.log.Error("deployment failed", "deployment", dsr.ID, "app", dsr.App, "err", err, "hint", h)
	s := state.Status{Instance: spec.Instance{Node: a.c.Node.Name}}
	if st != nil {
		s = *st
	}
	s.Phase, s.Error, s.Hint, s.Cause = spec.PhaseFailed, err.Error(), h, state.CauseOf(err)
	_ = a.setStatus(ctx, dsr.ID, s)
	a.event(ctx, dsr.ID, "failed", err.Error())
}

// clean removes what a failed or withdrawn deployment left on this node.
// When the first try fails (an instance or a mount blocked on a cluster
// that stopped serving its images), the deployment's mappings are cut off,
// which ends whatever waits on them, and it tries again. The images stay
// in the pool while the cluster does not answer; the reconcile loop
// retries then.
func (a *agent) clean(ctx context.Context, id string) error {
	recs := a.records()
	err := recs.Undeploy(ctx, id)
	if err == nil || errors.Is(err, spec.ErrNotFound) {
		return nil
	}
	if cerr := recs.CutOff(ctx, id); errors.Is(cerr, spec.ErrNotFound) {
		return err
	} else if cerr != nil {
		a.log.Warn("cutting off the mappings of a deployment", "deployment", id, "err", cerr)
	}
	if err := recs.Undeploy(ctx, id); err != nil && !errors.Is(err, spec.ErrNotFound) {
		return err
	}
	return nil
}

// cleanFailed retries removing what a failed deployment left; it stays
// Failed (with its error) until withdrawn.
func (a *agent) cleanFailed(ctx context.Context, id string) {
	if _, err := a.records().Load(id); err != nil {
		return
	}
	if err := a.clean(ctx, id); err != nil {
		a.log.Debug("what a failed deployment left is still there", "deployment", id, "err", err)
		return
	}
	a.log.Info("removed what a failed deployment left", "deployment", id)
	a.event(ctx, id, "cleaned", "what the failed deploy left on the node and in the pool is removed")
}

// resetStatus writes the status of a Running deployment from its record,
// when etcd says otherwise (its deploy ended while etcd was unavailable).
func (a *agent) resetStatus(ctx context.Context, id string) {
	rec, err := a.records().Load(id)
	if err != nil || rec.Phase != spec.PhaseRunning {
		return
	}
	if dep, err := a.st.Deployment(ctx, id); err != nil || dep.Status.Phase == spec.PhaseRunning {
		return
	}
	if err := a.setStatus(ctx, id, runningStatus(rec)); err != nil {
		a.log.Warn("writing status", "deployment", id, "err", err)
		return
	}
	a.log.Info("status written again: the deployment runs", "deployment", id)
	a.event(ctx, id, "running", "status written again after etcd was unavailable")
}

// revive deploys a Running deployment again whose instance is gone (its
// container exited, or was removed with a dockerd restarted without
// live-restore): what is left of it is removed, and it is restored (or
// booted) anew under the same ID.
func (a *agent) revive(ctx context.Context, dsr state.Desired) {
	if alive, err := a.records().Alive(ctx, dsr.ID); err != nil || alive {
		return // it runs, or was undone meanwhile
	}
	if _, err := a.st.Deployment(ctx, dsr.ID); err != nil {
		return // withdrawn meanwhile, or etcd unavailable: next time
	}
	a.log.Warn("instance gone: deploying it again", "deployment", dsr.ID, "app", dsr.App)
	a.event(ctx, dsr.ID, "instance lost", "its instance stopped running; deploying it again")
	if err := a.clean(ctx, dsr.ID); err != nil {
		a.log.Warn("removing what is left of a lost instance", "deployment", dsr.ID, "err", err)
		return
	}
	if err := a.setStatus(ctx, dsr.ID, state.Status{Instance: spec.Instance{Phase: spec.PhaseCreating, Node: a.c.Node.Name}}); err != nil {
		return
	}
	a.deploy(ctx, dsr)
}

// undeploy removes deployment id's instance from this node (or gives it
// back to the warm pool), only on the word of the etcd this node knew: an
// emptied or older etcd lacks every deployment (plane.go).
func (a *agent) undeploy(ctx context.Context, id string) {
	if err := a.plane.check(ctx); err != nil {
		a.log.Warn("not undeploying: etcd cannot say it is withdrawn", "deployment", id, "err", err)
		return
	}
	if a.recycle(ctx, id) {
		_ = a.st.ForgetStatus(ctx, id)
		a.event(ctx, id, "undeployed", "its instance went back to the warm pool")
		a.log.Info("undeployed; instance recycled into the warm pool", "deployment", id)
		return
	}
	err := a.clean(ctx, id)
	if err != nil {
		a.log.Error("undeploy failed", "deployment", id, "err", err)
		a.event(ctx, id, "undeploy failed", err.Error())
		return
	}
	_ = a.st.ForgetStatus(ctx, id)
	a.event(ctx, id, "undeployed", "")
	a.log.Info("undeployed", "deployment", id)
}
