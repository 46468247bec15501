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

// Follow reads deployment id, then follows each change of its status
// (an etcd watch from the revision read, each change applied as it comes;
// read again at least every 2 s and after a deletion), and calls seen with
// each until seen returns true; it returns the last. It ends early with
// ctx's error, or the read's (ErrNotFound once the deployment is withdrawn).
func (s *Store) Follow(ctx context.Context, id string, seen func(Deployment) bool) (Deployment, error) {
	for {
		d, r, err := s.deploymentAt(ctx, id)
		if err != nil || seen(d) {
			return d, err
		}
		wctx, stop := context.WithCancel(ctx)
		wch := s.cli.Watch(wctx, statusKey(id), clientv3.WithRev(r.Header.Revision+1))
		d, done, err := s.followStatus(ctx, wch, d, seen)
		stop()
		if done {
			return d, err
		}
	}
}

// followStatus applies the status changes of wch to d until seen returns
// true (done), or until d must be read again (not done): a deletion, a
// watch that ended, or 2 s without a change.
func (s *Store) followStatus(ctx context.Context, wch clientv3.WatchChan, d Deployment, seen func(Deployment) bool) (Deployment, bool, error) {
	for {
		select {
		case <-ctx.Done():
			return d, true, ctx.Err()
		case wr, ok := <-wch:
			if !ok {
				return d, ctx.Err() != nil, ctx.Err()
			}
			if wr.Err() != nil {
				return d, false, nil
			}
			for _, ev := range wr.Events {
				var st Status
				if ev.Type != clientv3.EventTypePut || json.Unmarshal(ev.Kv.Value, &st) != nil {
					return d, false, nil
				}
				d.Status = st
				if seen(d) {
					return d, true, nil
				}
			}
		case <-time.After(2 * time.Second):
			return d, false, nil
		}
	}
}
