// The view of the PoP an agent keeps current with one etcd watch: a create places from it and
// writes once, instead of reading every deployment of the PoP first, and a long poll follows a
// deployment's status in it, with no read of etcd and no watch of its own.

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

// The keys the view holds lie in one range (deployments, events,
// hand-overs, locks, nodes, placement, pools, the PoP's record, statuses), so that one watch
// delivers their changes in revision order and the view is always that of
// one revision.
const (
	watchFrom = AppsPrefix
	watchEnd  = Prefix + "status0" // just after the statuses' keys
)

// watchCache is the keys placement reads and the deployments' statuses,
// as of one revision, and the long polls waiting for a deployment's
// change.
type watchCache struct {
	mu       sync.Mutex
	loaded   bool
	rev      int64
	nodes    map[string]*mvccpb.KeyValue
	deps     map[string]Desired
	placed   map[string]int64
	pools    map[string]Pool
	statuses map[string]Status
	// apps are the apps' specs (a create's endpoint needs its app's
	// ports), and endpoints the endpoint ports taken.
	apps      map[string]appRecord
	endpoints map[int]bool
	// handoffs are the migrations' hand-overs, by deployment ID (a
	// prepared target waits for its own in the view: AwaitHandoff).
	handoffs map[string]Handoff
	// changed is closed, and made anew, at each change of a deployment's
	// record or status or a node's, and when the view is loaded or
	// unloaded.
	changed chan struct{}
	// subs are the followers of each deployment ID, told of each change
	// of its record or status, and all of them of an unload.
	subs map[string]map[chan struct{}]struct{}
}

// Watch keeps, until ctx ends, the view of the PoP that CreatePlaced
// places from and Follow follows, current by watching etcd: a create costs
// one transaction (its commit, which compares what it read) instead of a
// read of every deployment and a commit, and a long poll costs no read at
// all. A commit that finds the view behind, and a placement that finds no
// node, read etcd as before. A watch that fails (etcd unavailable,
// compacted) is made anew; meanwhile creates and followers read etcd.
func (s *Store) Watch(ctx context.Context, log *slog.Logger) {
	c := &watchCache{subs: map[string]map[chan struct{}]struct{}{}, changed: make(chan struct{})}
	s.watched.Store(c)
	go func() {
		for ctx.Err() == nil {
			err := c.follow(ctx, s.cli)
			if ctx.Err() != nil {
				return
			}
			log.Warn("the PoP's view: watch ended; creates and long polls read etcd until it is made again", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
}

// Watching reports whether the store keeps the view (Watch) and it is
// loaded: creates place and long polls follow without reading etcd.
func (s *Store) Watching() bool {
	c := s.watched.Load()
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.loaded
}

// follow loads the view and applies each change until the watch ends.
func (c *watchCache) follow(ctx context.Context, cli *clientv3.Client) error {
	defer c.unload()
	r, err := cli.Txn(ctx).Then(append(placementOps(), clientv3.OpGet(Prefix+"status/", clientv3.WithPrefix()),
		clientv3.OpGet(AppsPrefix, clientv3.WithPrefix()), clientv3.OpGet(handoffsPrefix, clientv3.WithPrefix()))...).Commit()
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

func (c *watchCache) load(r *clientv3.TxnResponse) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nodes, c.deps = map[string]*mvccpb.KeyValue{}, map[string]Desired{}
	c.placed, c.pools = map[string]int64{}, map[string]Pool{}
	c.statuses, c.apps, c.endpoints = map[string]Status{}, map[string]appRecord{}, map[int]bool{}
	c.handoffs = map[string]Handoff{}
	for _, resp := range r.Responses {
		for _, kv := range resp.GetResponseRange().Kvs {
			c.put(kv)
		}
	}
	c.rev, c.loaded = r.Header.Revision, true
	c.tell()
}

// tell closes changed and makes it anew; c.mu is held.
func (c *watchCache) tell() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// unload marks the view as gone and wakes every follower, who then reads
// etcd.
func (c *watchCache) unload() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.loaded = false
	c.tell()
	for _, chs := range c.subs {
		for ch := range chs {
			wake(ch)
		}
	}
}

func (c *watchCache) apply(evs []*clientv3.Event, rev int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	changed := false
	for _, ev := range evs {
		k := string(ev.Kv.Key)
		if strings.HasPrefix(k, DeploymentsPrefix) || strings.HasPrefix(k, Prefix+"nodes/") || strings.HasPrefix(k, Prefix+"status/") {
			changed = true
		}
		if ev.Type == clientv3.EventTypeDelete {
			c.remove(k)
		} else {
			c.put(ev.Kv)
		}
		if id, ok := followedID(k); ok {
			for ch := range c.subs[id] {
				wake(ch)
			}
		}
	}
	c.rev = rev
	if changed {
		c.tell()
	}
}

// followedID is the deployment whose record, status or hand-over key k
// is.
func followedID(k string) (string, bool) {
	if id, ok := strings.CutPrefix(k, DeploymentsPrefix); ok {
		return id, true
	}
	if id, ok := strings.CutPrefix(k, handoffsPrefix); ok {
		return id, true
	}
	return strings.CutPrefix(k, Prefix+"status/")
}

// wake tells a follower that what it follows changed; a follower already
// told reads the latest anyway.
func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// put records kv; c.mu is held. A record that does not parse is left
// out (a read of etcd refuses it).
func (c *watchCache) put(kv *mvccpb.KeyValue) {
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
	case strings.HasPrefix(k, Prefix+"status/"):
		var st Status
		if json.Unmarshal(kv.Value, &st) == nil {
			c.statuses[strings.TrimPrefix(k, Prefix+"status/")] = st
		}
	case strings.HasPrefix(k, AppsPrefix):
		var a appRecord
		if json.Unmarshal(kv.Value, &a) == nil {
			c.apps[k] = a
		}
	case strings.HasPrefix(k, EndpointsPrefix):
		if p, ok := parseEndpointKey(k); ok {
			c.endpoints[p] = true
		}
	case strings.HasPrefix(k, handoffsPrefix):
		var h Handoff
		if json.Unmarshal(kv.Value, &h) == nil {
			c.handoffs[strings.TrimPrefix(k, handoffsPrefix)] = h
		}
	}
}

func (c *watchCache) remove(k string) {
	delete(c.nodes, k)
	delete(c.deps, k)
	delete(c.placed, strings.TrimPrefix(k, Prefix+"placement/"))
	delete(c.pools, k)
	delete(c.statuses, strings.TrimPrefix(k, Prefix+"status/"))
	delete(c.apps, k)
	delete(c.handoffs, strings.TrimPrefix(k, handoffsPrefix))
	if p, ok := parseEndpointKey(k); ok {
		delete(c.endpoints, p)
	}
}

// view is the cached view, or false while there is none.
func (c *watchCache) view() (placementView, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.loaded {
		return placementView{}, false
	}
	v := placementView{infoRev: map[string]int64{}, placedRev: map[string]int64{}, taken: map[int]bool{}}
	for p := range c.endpoints {
		v.taken[p] = true
	}
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
