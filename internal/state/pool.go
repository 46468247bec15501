package state

import (
	"context"
	"encoding/json"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/fogdeploy/fogdeploy/internal/placement"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// PoolsPrefix holds each node's warm pool per app: pools/<node>/<app>.
const PoolsPrefix = Prefix + "pools/"

// Pool is the warm pool of one app on one node, as its agent reports it.
// The key lives with the agent's lease: a node whose agent is gone has no
// pool.
type Pool struct {
	Node string `json:"node"`
	App  string `json:"app"`
	// Gen is the generation its slots restore.
	Gen int `json:"gen"`
	// Size is how many idle slots the agent keeps; Idle how many it has,
	// Provisioning how many it is making.
	Size         int `json:"size"`
	Idle         int `json:"idle"`
	Provisioning int `json:"provisioning,omitempty"`
	// Ahead is how many of the idle slots were restored ahead and wait
	// at the background weight (a hit only raises them).
	Ahead int `json:"ahead,omitempty"`
	// Slots are the idle slots' IDs.
	Slots []string `json:"slots,omitempty"`
	// Hits and Misses count the restores of the app on the node that
	// found an idle slot, and that did not, since the agent started.
	Hits   int `json:"hits"`
	Misses int `json:"misses"`
	// Local: the node holds generation Gen's checkpoint (its restores
	// fetch nothing).
	Local bool `json:"local,omitempty"`
	// LastRefill is how long the last slot took to provision.
	LastRefillMS float64   `json:"last_refill_ms,omitempty"`
	Updated      time.Time `json:"updated"`
}

func poolKey(node, app string) string { return PoolsPrefix + node + "/" + app }

// PutPool publishes p under the agent's session lease.
func (s *Store) PutPool(ctx context.Context, sess *concurrency.Session, p Pool) error {
	p.Updated = time.Now().UTC()
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	_, err = s.cli.Put(ctx, poolKey(p.Node, p.App), string(b), clientv3.WithLease(sess.Lease()))
	return wrapUnavailable(err)
}

// DeletePool withdraws the pool of app on node.
func (s *Store) DeletePool(ctx context.Context, node, app string) error {
	_, err := s.cli.Delete(ctx, poolKey(node, app))
	return wrapUnavailable(err)
}

// Pools lists the warm pools of the PoP, of node when it is not "".
func (s *Store) Pools(ctx context.Context, node string) ([]Pool, error) {
	p := PoolsPrefix
	if node != "" {
		p += node + "/"
	}
	return listJSON[Pool](ctx, s.cli, p)
}

// Localities maps each node to what it holds of app, and to whether it
// has an idle spare slot (the pool of spec.SpareApp).
func Localities(pools []Pool, app string) map[string]placement.Locality {
	out := map[string]placement.Locality{}
	for _, p := range pools {
		if p.App != app && (p.App != spec.SpareApp || p.Idle == 0) {
			continue
		}
		l := out[p.Node]
		if p.App == spec.SpareApp {
			l.Spare = true
		} else {
			l.Idle += p.Idle
			l.Local = l.Local || p.Local
		}
		out[p.Node] = l
	}
	return out
}
