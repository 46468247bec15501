// The reconciler: watch the deployments of this node in etcd, compare them with what runs here, and
// spawn one operation per deployment at a time.

package agent

import (
	"context"
	"errors"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/state"
)

// reconcile handles the deployments of this node: the existing ones first,
// then every change, until ctx ends. It acts on a list or a watch event
// only once etcd is known to be the one this node knew (plane.check);
// while fenced, it checks again every reconcile interval and acts on
// nothing.
//
// The watch covers the apps' records too (state.AppsPrefix, in one
// ordered stream with the deployments'): apps is then the apps as of the
// event at hand, and a deployment created by that event is deployed with
// its app from there, without a read of the cluster first (dispatch).
func (a *agent) reconcile(ctx context.Context) {
	for {
		list, err := a.resyncWith(ctx, true)
		if err != nil {
			wait := 2 * time.Second
			if errors.Is(err, state.ErrFenced) {
				wait = a.c.Agent.ReconcileInterval // said at the change
			} else {
				a.log.Warn("listing deployments", "err", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
				continue
			}
		}
		wctx, stopWatch := context.WithCancel(ctx)
		changes := a.st.WatchDesired(wctx, list)
		tick := time.NewTicker(a.c.Agent.ReconcileInterval)
	watch:
		for {
			var batch state.DesiredChanges
			var ok bool
			select {
			case batch, ok = <-changes:
			case <-tick.C:
				// Periodically: retry what failed, catch what was missed.
				if _, err := a.resync(ctx); errors.Is(err, state.ErrFenced) {
					break watch
				} else if err != nil {
					a.log.Warn("reconciling", "err", err)
				}
				continue
			}
			if !ok {
				break
			}
			if batch.Err != nil {
				a.log.Warn("watch", "err", batch.Err)
				break
			}
			// An emptied etcd deletes every deployment at once: act on
			// no deployment's change before etcd is the one this node
			// knew. Listing again catches up with what is skipped.
			if err := a.plane.check(ctx); err != nil {
				if !errors.Is(err, state.ErrFenced) {
					a.log.Warn("checking etcd before acting on its changes; listing again", "err", err)
				}
				break
			}
			a.plane.seen(batch.Header)
			for _, c := range batch.Changes {
				a.follow(ctx, c)
			}
		}
		tick.Stop()
		stopWatch()
		if ctx.Err() != nil {
			return
		}
	}
}

// follow acts on one change of a deployment's record: deploys one placed
// here (with its app when the watch knew it at its creation), prepares
// the resume of one migrating here, undeploys one withdrawn from here (or
// whose record is unknown).
func (a *agent) follow(ctx context.Context, c state.DesiredChange) {
	dsr := c.Desired
	switch {
	case c.Invalid:
	case c.Deleted:
		if c.Known && dsr.Node != a.c.Node.Name {
			return
		}
		a.spawn(ctx, c.ID, func(ctx context.Context) { a.undeploy(ctx, c.ID) })
	case dsr.Node == a.c.Node.Name:
		a.spawn(ctx, c.ID, func(ctx context.Context) { a.deployKnown(ctx, dsr, c.App) })
	case a.preparesHere(dsr) && dsr.Move.Prepared != a.c.Node.Name:
		a.spawn(ctx, c.ID, func(ctx context.Context) { a.prepareResume(ctx, dsr) })
	}
}

// resync deploys what is desired here and missing, and undeploys what is
// here and no longer desired. It returns the etcd revision it saw, or,
// acting on nothing, an error wrapping state.ErrFenced when etcd is not
// the one this node knew (an emptied etcd lists no deployment).
func (a *agent) resync(ctx context.Context) (int64, error) {
	l, err := a.resyncWith(ctx, false)
	return l.Header.Revision, err
}

// resyncWith is resync, and, withApps, the apps as of the same revision;
// it returns what it listed.
func (a *agent) resyncWith(ctx context.Context, withApps bool) (state.DesiredList, error) {
	l, err := a.st.ListDesired(ctx, withApps)
	if err != nil {
		return l, err
	}
	// Checked after the list: the list is then no newer than what the
	// check saw.
	if err := a.plane.check(ctx); err != nil {
		return l, err
	}
	a.plane.seen(l.Header)
	recs := a.records()
	a.dropPrepared(ctx, l.Desired)
	want := map[string]bool{}
	for _, dsr := range l.Desired {
		if dsr.Node == "" && dsr.Move != nil && a.carriesOn(*dsr.Move) {
			// Suspended on its way: its next step (MoveOn does nothing
			// if none is due, and one node alone takes it).
			a.spawn(ctx, dsr.ID, func(ctx context.Context) { a.moveOn(ctx, dsr.ID) })
		}
		if dsr.Node != a.c.Node.Name {
			continue
		}
		want[dsr.ID] = true
		if rec, err := recs.Load(dsr.ID); err == nil && rec.Phase == spec.PhaseRunning {
			// Its instance may have died meanwhile (its container
			// exited, or went with a dockerd restarted without
			// live-restore). A driver that cannot tell is asked again
			// next time.
			if alive, err := recs.Alive(ctx, dsr.ID); err == nil && !alive {
				a.spawn(ctx, dsr.ID, func(ctx context.Context) { a.revive(ctx, dsr) })
				continue
			}
			// A deploy that ended while etcd was unavailable could not
			// say so.
			if dep, err := a.st.Deployment(ctx, dsr.ID); err == nil && dep.Status.Phase != spec.PhaseRunning {
				a.spawn(ctx, dsr.ID, func(ctx context.Context) { a.resetStatus(ctx, dsr.ID) })
			}
			continue
		}
		if dep, err := a.st.Deployment(ctx, dsr.ID); err == nil && dep.Status.Phase == spec.PhaseFailed {
			// A failed deploy whose undo could not finish (the cluster
			// did not answer) left its record: retry the undo. The
			// deployment stays Failed.
			if _, err := recs.Load(dsr.ID); err == nil {
				a.spawn(ctx, dsr.ID, func(ctx context.Context) { a.cleanFailed(ctx, dsr.ID) })
			}
			continue
		}
		a.spawn(ctx, dsr.ID, func(ctx context.Context) { a.deploy(ctx, dsr) })
	}
	here := a.settleHeld(ctx, recs, want)
	// What a build or import killed on this node left mapped (fogctl
	// releases it too, at its next start). No mapper in unit tests.
	if a.mapper != nil {
		if undone, err := a.mapper.ReleaseAbandoned(ctx); err != nil {
			a.log.Warn("releasing the mappings of processes that are gone", "err", err)
		} else {
			a.m.recovered.Add(float64(len(undone)))
		}
	}
	// Statuses of withdrawn deployments that are gone from this node (an
	// undeploy interrupted after its instance was removed).
	if stale, err := a.st.StaleStatuses(ctx, a.c.Node.Name); err == nil {
		for _, id := range stale {
			if !here[id] {
				_ = a.st.ForgetStatus(ctx, id)
			}
		}
	}
	return l, nil
}

// settleHeld undeploys what this node holds and etcd no longer wants here,
// and records the suspensions it made but had not recorded; it returns the
// IDs it holds.
func (a *agent) settleHeld(ctx context.Context, recs nodeRecords, want map[string]bool) map[string]bool {
	held, _ := recs.List()
	here := map[string]bool{}
	for _, rec := range held {
		here[rec.ID] = true
		if rec.Phase == spec.PhaseSuspended {
			// Its suspension is recorded in etcd, then its record goes.
			if a.recs == nil {
				a.spawn(ctx, rec.ID, func(ctx context.Context) { a.recordSuspended(ctx, rec) })
			}
			continue
		}
		if !want[rec.ID] && !a.measuring.running(rec.ID) {
			id := rec.ID
			a.spawn(ctx, id, func(ctx context.Context) { a.undeploy(ctx, id) })
		}
	}
	return here
}

// spawn runs fn for deployment id, one operation per ID at a time.
func (a *agent) spawn(ctx context.Context, id string, fn func(context.Context)) {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		defer a.busy.Lock(id)()
		fn(ctx)
	}()
}
