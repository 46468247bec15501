package state

import (
	"context"
	"encoding/json"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// Settled reports whether a deployment's phase is one its agent leaves as
// it is: Running, Failed, Checkpointed (a refresh's end) or Suspended.
func Settled(p spec.Phase) bool {
	return p == spec.PhaseRunning || p == spec.PhaseFailed || p == spec.PhaseCheckpointed || p == spec.PhaseSuspended
}

// Follow reads deployment id, then follows each change of its status and
// of its desired record (etcd watches from the revision read, each change
// applied as it comes; read again at least every 2 s and after a
// deletion), and calls seen with
// each until seen returns true; it returns the last. It ends early with
// ctx's error, or the read's (ErrNotFound once the deployment is withdrawn).
func (s *Store) Follow(ctx context.Context, id string, seen func(Deployment) bool) (Deployment, error) {
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
