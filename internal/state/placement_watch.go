// The placement view an agent keeps current by watching: a create then places from memory and
// writes once, instead of reading every deployment of the PoP first.

package state

import (
	"context"
	"encoding/json"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The keys placement reads lie in one range (nodes, deployments,
// placement, pools, and the events and locks between them), so that one
// watch delivers their changes in revision order and the view is always
// that of one revision.
const (
	watchFrom = DeploymentsPrefix
	watchEnd  = Prefix + "pools0" // just after PoolsPrefix's keys
)

// placementCache is the keys placement reads, as of one revision.
type placementCache struct {
	mu     sync.Mutex
	loaded bool
	rev    int64
	nodes  map[string]*mvccpb.KeyValue
	deps   map[string]Desired
	placed map[string]int64
	pools  map[string]Pool
}

// WatchPlacement keeps, until ctx ends, the view that CreatePlaced places
// from current by watching etcd, so that a create costs one transaction
// (its commit, which compares what it read) instead of a read of every
// deployment and a commit. A commit that finds the view behind, and a
// placement that finds no node, read etcd as before. A watch that fails
// (etcd unavailable, compacted) is made anew; meanwhile creates read etcd.
func (s *Store) WatchPlacement(ctx context.Context, log *slog.Logger) {
	c := &placementCache{}
	s.placement.Store(c)
	go func() {
		for ctx.Err() == nil {
			err := c.follow(ctx, s.cli)
			if ctx.Err() != nil {
				return
			}
			log.Warn("placement view: watch ended; creates read etcd until it is made again", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
}

// follow loads the view and applies each change until the watch ends.
func (c *placementCache) follow(ctx context.Context, cli *clientv3.Client) error {
	defer c.unload()
	r, err := cli.Txn(ctx).Then(placementOps()...).Commit()
	if err != nil {
		return err
	}
	c.load(r)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := cli.Watch(wctx, watchFrom, clientv3.WithRange(watchEnd), clientv3.WithRev(r.Header.Revision+1))
	for wr := range wch {
		if err := wr.Err(); err != nil {
			return err
		}
		c.apply(wr.Events, wr.Header.Revision)
	}
	return ctx.Err()
}

func (c *placementCache) load(r *clientv3.TxnResponse) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nodes, c.deps = map[string]*mvccpb.KeyValue{}, map[string]Desired{}
	c.placed, c.pools = map[string]int64{}, map[string]Pool{}
	for _, resp := range r.Responses {
		for _, kv := range resp.GetResponseRange().Kvs {
			c.put(kv)
		}
	}
	c.rev, c.loaded = r.Header.Revision, true
}

func (c *placementCache) unload() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.loaded = false
}

func (c *placementCache) apply(evs []*clientv3.Event, rev int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ev := range evs {
		if ev.Type == clientv3.EventTypeDelete {
			c.remove(string(ev.Kv.Key))
			continue
		}
		c.put(ev.Kv)
	}
	c.rev = rev
}

// put records kv; c.mu is held. A record that does not parse is left
// out (a read of etcd refuses it).
func (c *placementCache) put(kv *mvccpb.KeyValue) {
	k := string(kv.Key)
	switch {
	case strings.HasPrefix(k, Prefix+"nodes/"):
		c.nodes[k] = kv
	case strings.HasPrefix(k, DeploymentsPrefix):
		var d Desired
		if json.Unmarshal(kv.Value, &d) == nil {
			c.deps[k] = d
		}
	case strings.HasPrefix(k, Prefix+"placement/"):
		c.placed[strings.TrimPrefix(k, Prefix+"placement/")] = kv.ModRevision
	case strings.HasPrefix(k, PoolsPrefix):
		var p Pool
		if json.Unmarshal(kv.Value, &p) == nil {
			c.pools[k] = p
		}
	}
}

func (c *placementCache) remove(k string) {
	delete(c.nodes, k)
	delete(c.deps, k)
	delete(c.placed, strings.TrimPrefix(k, Prefix+"placement/"))
	delete(c.pools, k)
}

// view is the cached view, or false while there is none.
func (c *placementCache) view() (placementView, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.loaded {
		return placementView{}, false
	}
	v := placementView{infoRev: map[string]int64{}, placedRev: map[string]int64{}}
	// In key order, as a read of etcd lists them.
	nr := &clientv3.GetResponse{}
	for _, k := range sortedKeys(c.nodes) {
		nr.Kvs = append(nr.Kvs, c.nodes[k])
	}
	nodes, err := parseNodes(nr)
	if err != nil {
		return placementView{}, false
	}
	v.nodes = nodes
	v.addInfoRevs(nr)
	for _, k := range sortedKeys(c.deps) {
		v.deps = append(v.deps, Deployment{Desired: c.deps[k]})
	}
	for n, rev := range c.placed {
		v.placedRev[n] = rev
	}
	for _, k := range sortedKeys(c.pools) {
		v.pools = append(v.pools, c.pools[k])
	}
	return v, true
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
