// The reconciler: watch the deployments of this node in etcd, compare them with what runs here, and
// spawn one operation per deployment at a time.

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"

	clientv3 "go.etcd.io/etcd/client/v3"

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
		rev, apps, err := a.resyncWith(ctx, true)
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
		wch := a.st.Client().Watch(wctx, state.AppsPrefix, clientv3.WithRange(clientv3.GetPrefixRangeEnd(state.DeploymentsPrefix)),
			clientv3.WithRev(rev+1), clientv3.WithPrevKV())
		tick := time.NewTicker(a.c.Agent.ReconcileInterval)
	watch:
		for {
			var wr clientv3.WatchResponse
			var ok bool
			select {
			case wr, ok = <-wch:
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
			if err := wr.Err(); err != nil {
				a.log.Warn("watch", "err", err)
				break
			}
			// An emptied etcd deletes every deployment at once: act on
			// no deployment's event before etcd is the one this node
			// knew. Listing again catches up with what is skipped.
			if slices.ContainsFunc(wr.Events, isDeployment) {
				if err := a.plane.check(ctx); err != nil {
					if !errors.Is(err, state.ErrFenced) {
						a.log.Warn("checking etcd before acting on its changes; listing again", "err", err)
					}
					break
				}
				a.plane.seen(state.HeaderOf(&wr.Header))
			}
			for _, ev := range wr.Events {
				if !isDeployment(ev) {
					apps.follow(ev)
					continue
				}
				id := strings.TrimPrefix(string(ev.Kv.Key), state.DeploymentsPrefix)
				switch ev.Type {
				case clientv3.EventTypePut:
					var dsr state.Desired
					if err := json.Unmarshal(ev.Kv.Value, &dsr); err == nil && dsr.Node == a.c.Node.Name {
						known := apps.created(ev, dsr.App)
						a.spawn(ctx, id, func(ctx context.Context) { a.deployKnown(ctx, dsr, known) })
					} else if err == nil && a.preparesHere(dsr) {
						a.spawn(ctx, id, func(ctx context.Context) { a.prepareResume(ctx, dsr) })
					}
				case clientv3.EventTypeDelete:
					if ev.PrevKv != nil {
						var dsr state.Desired
						if err := json.Unmarshal(ev.PrevKv.Value, &dsr); err == nil && dsr.Node != a.c.Node.Name {
							continue
						}
					}
					a.spawn(ctx, id, func(ctx context.Context) { a.undeploy(ctx, id) })
				}
			}
		}
		tick.Stop()
		stopWatch()
		if ctx.Err() != nil {
			return
		}
	}
}

// resync deploys what is desired here and missing, and undeploys what is
// here and no longer desired. It returns the etcd revision it saw, or,
// acting on nothing, an error wrapping state.ErrFenced when etcd is not
// the one this node knew (an emptied etcd lists no deployment).
func (a *agent) resync(ctx context.Context) (int64, error) {
	rev, _, err := a.resyncWith(ctx, false)
	return rev, err
}

// resyncWith is resync, and, withApps, the apps as of the same revision.
func (a *agent) resyncWith(ctx context.Context, withApps bool) (int64, appView, error) {
	ops := []clientv3.Op{clientv3.OpGet(state.DeploymentsPrefix, clientv3.WithPrefix())}
	if withApps {
		ops = append(ops, clientv3.OpGet(state.AppsPrefix, clientv3.WithPrefix()))
	}
	r, err := a.st.Client().Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return 0, nil, err
	}
	// Checked after the list: the list is then no newer than what the
	// check saw.
	if err := a.plane.check(ctx); err != nil {
		return 0, nil, err
	}
	a.plane.seen(state.HeaderOf(r.Header))
	var apps appView
	if withApps {
		apps = newAppView(r.Responses[1].GetResponseRange().Kvs)
	}
	kvs := r.Responses[0].GetResponseRange().Kvs
	recs := a.records()
	a.dropPrepared(ctx, kvs)
	want := map[string]bool{}
	for _, kv := range kvs {
		var dsr state.Desired
		if json.Unmarshal(kv.Value, &dsr) != nil {
			continue
		}
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
	return r.Header.Revision, apps, nil
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
