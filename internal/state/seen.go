// Whether this etcd knew a record at a revision: what gc asks before it takes an image for an orphan.

package state

import (
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Seen is what etcd says of a record at a revision.
type Seen int

const (
	// SeenHeld: the record existed at that revision (its removal since
	// is one etcd saw).
	SeenHeld Seen = iota
	// SeenNever: etcd's history at that revision has no such record: a
	// record made on an etcd that this one is not (one restored from an
	// older backup, which then moved past that revision).
	SeenNever
	// SeenAhead: etcd has not reached that revision yet.
	SeenAhead
	// SeenCompacted: etcd no longer keeps that revision's history.
	SeenCompacted
)

// DeploymentSeen says whether deployment id's record existed at revision
// rev of this etcd.
func (s *Store) DeploymentSeen(ctx context.Context, id string, rev int64) (Seen, error) {
	return s.seenAt(ctx, deploymentKey(id), rev)
}

// AppSeen says whether app's record existed at revision rev of this etcd.
func (s *Store) AppSeen(ctx context.Context, app string, rev int64) (Seen, error) {
	return s.seenAt(ctx, appKey(app), rev)
}

func (s *Store) seenAt(ctx context.Context, key string, rev int64) (Seen, error) {
	r, err := s.cli.Get(ctx, key, clientv3.WithRev(rev), clientv3.WithCountOnly())
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		return SeenCompacted, nil
	case errors.Is(err, rpctypes.ErrFutureRev):
		return SeenAhead, nil
	case err != nil:
		return 0, wrapUnavailable(err)
	case r.Count == 0:
		return SeenNever, nil
	}
	return SeenHeld, nil
}
