package state

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// Settled reports whether a deployment's phase is one its agent leaves as
// it is: Running, Failed, Checkpointed (a refresh's end) or Suspended.
func Settled(p spec.Phase) bool {
	return p == spec.PhaseRunning || p == spec.PhaseFailed || p == spec.PhaseCheckpointed || p == spec.PhaseSuspended
}

// Follow calls seen with deployment id as it is, then with each change of
// its status and of its desired record, until seen returns true; it
// returns the last. It ends early with ctx's error, or with ErrNotFound
// once the deployment is withdrawn.
//
// Where the store keeps the agent's view (Watch), Follow follows it: no
// read of etcd and no watch per follower (one read only for a deployment
// the view does not hold yet). Otherwise it reads the deployment and
// follows it with watches of its own (read again at least every 2 s and
// after a deletion).
func (s *Store) Follow(ctx context.Context, id string, seen func(Deployment) bool) (Deployment, error) {
	if c := s.watched.Load(); c != nil {
		if d, err, ok := c.track(ctx, id, seen, s.deploymentRev); ok {
			return d, err
		}
	}
	for {
		d, r, err := s.deploymentAt(ctx, id)
		if err != nil || seen(d) {
			return d, err
		}
		wctx, stop := context.WithCancel(ctx)
		from := clientv3.WithRev(r.Header.Revision + 1)
		d, done, err := s.followStatus(ctx, s.cli.Watch(wctx, statusKey(id), from), s.cli.Watch(wctx, deploymentKey(id), from), d, seen)
		stop()
		if done {
			return d, err
		}
	}
}

// deploymentRev reads deployment id and the revision of the read.
func (s *Store) deploymentRev(ctx context.Context, id string) (Deployment, int64, error) {
	d, r, err := s.deploymentAt(ctx, id)
	if r == nil {
		return d, 0, err
	}
	return d, r.Header.Revision, err
}

// track is Follow on the view: ok false once the view is not (or no
// longer) loaded, for the caller to read etcd instead. A deployment the
// view does not hold is read once (read), as it may be younger than the
// view: it is then withdrawn once the view reaches that read's revision
// without it.
func (c *watchCache) track(ctx context.Context, id string, seen func(Deployment) bool,
	read func(context.Context, string) (Deployment, int64, error)) (d Deployment, err error, ok bool) {
	ch := c.subscribe(id)
	defer c.unsubscribe(id, ch)
	var readAt int64 // the revision of a read of etcd, once made
	for {
		cur, held, rev, loaded := c.deployment(id)
		switch {
		case !loaded:
			return d, nil, false
		case held:
			if d = cur; seen(d) {
				return d, nil, true
			}
		case readAt == 0:
			rd, r, err := read(ctx, id)
			if err != nil {
				return rd, err, true
			}
			if d, readAt = rd, r; seen(d) {
				return d, nil, true
			}
		case rev >= readAt:
			return d, hint.With(fmt.Errorf("deployment %s: %w", id, ErrNotFound), "`fogctl ps` lists the deployments"), true
		}
		select {
		case <-ctx.Done():
			return d, ctx.Err(), true
		case <-ch:
		}
	}
}

// deployment is deployment id as the view holds it (held false: it holds
// no record of it), and the view's revision.
func (c *watchCache) deployment(id string) (d Deployment, held bool, rev int64, loaded bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.loaded {
		return d, false, 0, false
	}
	d.Desired, held = c.deps[deploymentKey(id)]
	d.Status = c.statuses[id]
	return d, held, c.rev, true
}

// subscribe registers a follower of deployment id, told of its changes.
func (c *watchCache) subscribe(id string) chan struct{} {
	ch := make(chan struct{}, 1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.subs[id] == nil {
		c.subs[id] = map[chan struct{}]struct{}{}
	}
	c.subs[id][ch] = struct{}{}
	return ch
}

func (c *watchCache) unsubscribe(id string, ch chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.subs[id], ch)
	if len(c.subs[id]) == 0 {
		delete(c.subs, id)
	}
}

// followStatus applies the changes of the status (wch) and of the desired
// record (dch) to d until seen returns true (done), or until d must be
// read again (not done): a deletion, a watch that ended, or 2 s without a
// change.
func (s *Store) followStatus(ctx context.Context, wch, dch clientv3.WatchChan, d Deployment, seen func(Deployment) bool) (Deployment, bool, error) {
	for {
		var wr clientv3.WatchResponse
		ok, isStatus := false, true
		select {
		case <-ctx.Done():
			return d, true, ctx.Err()
		case wr, ok = <-wch:
		case wr, ok = <-dch:
			isStatus = false
		case <-time.After(2 * time.Second):
			return d, false, nil
		}
		if !ok {
			return d, ctx.Err() != nil, ctx.Err()
		}
		if wr.Err() != nil {
			return d, false, nil
		}
		for _, ev := range wr.Events {
			if ev.Type != clientv3.EventTypePut {
				return d, false, nil
			}
			if !isStatus {
				var dsr Desired
				if json.Unmarshal(ev.Kv.Value, &dsr) != nil {
					return d, false, nil
				}
				d.Desired = dsr
			} else {
				var st Status
				if json.Unmarshal(ev.Kv.Value, &st) != nil {
					return d, false, nil
				}
				d.Status = st
			}
			if seen(d) {
				return d, true, nil
			}
		}
	}
}
