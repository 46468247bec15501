package state

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// Settled reports whether a deployment's phase is one its agent leaves as
// it is: Running, Failed, or Checkpointed (a refresh's end).
func Settled(p spec.Phase) bool {
	return p == spec.PhaseRunning || p == spec.PhaseFailed || p == spec.PhaseCheckpointed
}

// Follow reads deployment id, then again at each change of its status (an
// etcd watch, and at least every 2 s), and calls seen with each read until
// seen returns true; it returns the last read. It ends early with ctx's
// error, or the read's (ErrNotFound once the deployment is withdrawn).
func (s *Store) Follow(ctx context.Context, id string, seen func(Deployment) bool) (Deployment, error) {
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	wch := s.cli.Watch(wctx, statusKey(id))
	for {
		d, err := s.Deployment(ctx, id)
		if err != nil || seen(d) {
			return d, err
		}
		select {
		case <-ctx.Done():
			return d, ctx.Err()
		case wr, ok := <-wch:
			if !ok {
				return d, ctx.Err()
			}
			if err := wr.Err(); err != nil {
				// A compacted or cancelled watch: read again, and watch
				// anew from now on.
				wch = s.cli.Watch(wctx, statusKey(id), clientv3.WithRev(wr.Header.Revision+1))
			}
		case <-time.After(2 * time.Second):
		}
	}
}
