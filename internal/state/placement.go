package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/placement"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// ErrContended: CreatePlaced lost the race for its node to concurrent
// deploys placeAttempts times in a row. Deploying again can work.
var ErrContended = errors.New("placement contended")

// placeAttempts bounds how many times CreatePlaced reads, places and
// commits when concurrent deploys keep taking the node it chose.
const placeAttempts = 16

// candidates are nodes as the policy knows them, for one more instance of
// app: their deployments counted from deps, what they hold of app from
// loc.
func candidates(nodes []Node, deps []Deployment, app string, loc map[string]placement.Locality) []placement.Node {
	out := make([]placement.Node, 0, len(nodes))
	for _, n := range nodes {
		c := placement.Node{Name: n.Name, Capacity: n.Capacity, Ready: n.Ready, Fenced: n.Fence(), Locality: loc[n.Name]}
		if n.Cordon != nil {
			c.Cordoned = n.Cordon.Describe()
		}
		for _, d := range deps {
			if d.Node == n.Name {
				c.Held++
				if d.App == app {
					c.Same++
				}
			}
		}
		out = append(out, c)
	}
	return out
}

// placementKey changes (its value: the last deployment recorded on node)
// in every transaction that records a deployment on node, so that a
// transaction can require that none was recorded there since it read.
func placementKey(node string) string { return Prefix + "placement/" + node }

// placementView is what a placement reads, all at one etcd revision.
type placementView struct {
	nodes []Node
	deps  []Deployment
	// infoRev and placedRev are the mod revisions of each node's info
	// and placement keys (absent: 0).
	infoRev, placedRev map[string]int64
	// pools are the warm pools the agents report.
	pools []Pool
	// taken are the endpoint ports deployments hold.
	taken map[int]bool
}

// placementOps are the reads of a placement, in one transaction.
func placementOps() []clientv3.Op {
	return []clientv3.Op{
		clientv3.OpGet(Prefix+"nodes/", clientv3.WithPrefix()),
		clientv3.OpGet(DeploymentsPrefix, clientv3.WithPrefix()),
		clientv3.OpGet(Prefix+"placement/", clientv3.WithPrefix()),
		clientv3.OpGet(PoolsPrefix, clientv3.WithPrefix()),
		clientv3.OpGet(EndpointsPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly()),
	}
}

func (s *Store) readPlacement(ctx context.Context) (placementView, error) {
	v := placementView{infoRev: map[string]int64{}, placedRev: map[string]int64{}, taken: map[int]bool{}}
	r, err := s.cli.Txn(ctx).Then(placementOps()...).Commit()
	if err != nil {
		return v, wrapUnavailable(err)
	}
	nr := (*clientv3.GetResponse)(r.Responses[0].GetResponseRange())
	if v.nodes, err = parseNodes(nr); err != nil {
		return v, err
	}
	v.addInfoRevs(nr)
	for _, kv := range r.Responses[1].GetResponseRange().Kvs {
		var d Desired
		if err := json.Unmarshal(kv.Value, &d); err != nil {
			return v, fmt.Errorf("record %s: %w", kv.Key, err)
		}
		v.deps = append(v.deps, Deployment{Desired: d})
	}
	for _, kv := range r.Responses[2].GetResponseRange().Kvs {
		v.placedRev[strings.TrimPrefix(string(kv.Key), Prefix+"placement/")] = kv.ModRevision
	}
	for _, kv := range r.Responses[3].GetResponseRange().Kvs {
		var p Pool
		if err := json.Unmarshal(kv.Value, &p); err == nil {
			v.pools = append(v.pools, p)
		}
	}
	for _, kv := range r.Responses[4].GetResponseRange().Kvs {
		if p, ok := parseEndpointKey(string(kv.Key)); ok {
			v.taken[p] = true
		}
	}
	return v, nil
}

// placedOn is what a placement on node read and its commit requires to be
// unchanged: no deployment recorded there since, the node neither
// registered again nor lost its lease, and (unless cordoned is allowed)
// not cordoned meanwhile: a retry reads the cordon and skips it.
func (v placementView) placedOn(node string, cordoned bool) []clientv3.Cmp {
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(placementKey(node)), "=", v.placedRev[node]),
		clientv3.Compare(clientv3.ModRevision(nodeInfoKey(node)), "=", v.infoRev[node]),
		clientv3.Compare(clientv3.CreateRevision(nodeAliveKey(node)), ">", 0),
	}
	if !cordoned {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(nodeCordonKey(node)), "=", 0))
	}
	return cmps
}

// addInfoRevs records the mod revision of each node's info key in nr.
func (v *placementView) addInfoRevs(nr *clientv3.GetResponse) {
	for _, kv := range nr.Kvs {
		if name, ok := strings.CutSuffix(strings.TrimPrefix(string(kv.Key), Prefix+"nodes/"), "/info"); ok {
			v.infoRev[name] = kv.ModRevision
		}
	}
}

// CreatePlaced records the desired deployment d on d.Node, or, when
// d.Node is "", on the node Place picks among the nodes that eligible
// accepts (nil: all), and returns d with its node. The node must be
// registered, Ready and not full (Choose); ErrExists if the ID is taken,
// ErrNotFound if d.App is not (or no longer) an app.
//
// The read, the placement and the write are one optimistic transaction:
// the write commits only if no deployment was recorded on the chosen node,
// and the node neither registered again nor lost its lease, since the
// read. The read is the watched view (Watch) when the store keeps
// one: the create then costs its commit alone; a refusal from the view is
// checked against a read of etcd. A create that lost that race reads and places again, up to
// placeAttempts times (then ErrContended), so that concurrent creates
// never put more deployments on a node than its capacity.
func (s *Store) CreatePlaced(ctx context.Context, d Desired, eligible func(Node) bool) (Desired, error) {
	for attempt := range placeAttempts {
		if attempt > 0 {
			// Jitter, so that the losers of a race do not all meet again.
			t := time.NewTimer(time.Duration(rand.Int64N(int64(attempt) * int64(5*time.Millisecond))))
			select {
			case <-ctx.Done():
				t.Stop()
				return Desired{}, fmt.Errorf("deployment of app %s: %w", d.App, ctx.Err())
			case <-t.C:
			}
		}
		if err := ctx.Err(); err != nil {
			return Desired{}, fmt.Errorf("deployment of app %s: %w", d.App, err)
		}
		// The first attempt places from the watched view, if there is one.
		v, cached := s.cachedPlacement(attempt)
		var err error
		if !cached {
			if v, err = s.readPlacement(ctx); err != nil {
				return Desired{}, err
			}
		}
		pl, err := s.place(v, d, eligible)
		if err != nil && cached {
			// The view may be behind: a refusal reads etcd first.
			if v, err = s.readPlacement(ctx); err != nil {
				return Desired{}, err
			}
			pl, err = s.place(v, d, eligible)
		}
		if err != nil {
			// An unknown app is the first thing to say.
			if _, aerr := s.App(ctx, d.App); aerr != nil {
				return Desired{}, aerr
			}
			return Desired{}, err
		}
		node := pl.Node
		placed := d
		placed.Node, placed.Placement = node, pl.Reason
		if err := s.endpointFor(ctx, &placed, v.taken); err != nil {
			return Desired{}, err
		}
		ok, err := s.commitDeployment(ctx, placed, true, v.placedOn(node, false)...)
		if err != nil {
			return Desired{}, err
		}
		if ok {
			return placed, nil
		}
	}
	return Desired{}, hint.With(fmt.Errorf("deployment of app %s: %w: %d attempts in a row lost their node to concurrent deploys", d.App, ErrContended, placeAttempts),
		"deploy again")
}

// cachedPlacement is the watched view for a create's first attempt.
func (s *Store) cachedPlacement(attempt int) (placementView, bool) {
	c := s.watched.Load()
	if c == nil || attempt > 0 {
		return placementView{}, false
	}
	return c.view()
}

// place chooses d's node in v among the nodes eligible accepts (nil: all),
// by the store's policy.
func (s *Store) place(v placementView, d Desired, eligible func(Node) bool) (placement.Decision, error) {
	nodes := v.nodes
	if eligible != nil {
		nodes = nil
		for _, n := range v.nodes {
			if eligible(n) {
				nodes = append(nodes, n)
			}
		}
	}
	return placement.Choose(s.policy, d.App, d.Node, candidates(nodes, v.deps, d.App, Localities(v.pools, d.App)), nodeNotFound)
}

// commitDeployment writes d, its Pending status and d's placement key if
// its ID is free, its app exists (if withApp: checked in the same
// transaction, so that no read before it is needed and no deployment of a
// deleted app is recorded) and cmps hold. ok is false when a cmp failed;
// ErrExists when the ID is taken; ErrNotFound when the app is not.
func (s *Store) commitDeployment(ctx context.Context, d Desired, withApp bool, cmps ...clientv3.Cmp) (ok bool, err error) {
	b, err := json.Marshal(d)
	if err != nil {
		return false, err
	}
	st, _ := json.Marshal(Status{Updated: time.Now().UTC(), Instance: spec.Instance{Phase: spec.PhasePending, Node: d.Node}})
	ops := []clientv3.Op{clientv3.OpPut(deploymentKey(d.ID), string(b)), clientv3.OpPut(statusKey(d.ID), string(st))}
	if d.Node != "" {
		ops = append(ops, clientv3.OpPut(placementKey(d.Node), d.ID))
	}
	own := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(deploymentKey(d.ID)), "=", 0)}
	if withApp {
		own = append(own, clientv3.Compare(clientv3.CreateRevision(appKey(d.App)), ">", 0))
	}
	epOps, epCmps := endpointOps(d)
	ops = append(ops, epOps...)
	cmps = append(append(own, cmps...), epCmps...)
	commit := func(ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
		return s.cli.Txn(ctx).If(cmps...).Then(ops...).
			Else(clientv3.OpGet(deploymentKey(d.ID), clientv3.WithCountOnly()), clientv3.OpGet(appKey(d.App), clientv3.WithCountOnly())).Commit()
	}
	// Its event is written with it: one round trip for the caller. Without
	// a lease for it (etcd unavailable for a grant, or emptied since), the
	// deployment is recorded without its event.
	ev, err := s.eventOp(ctx, d.ID, "requested", fmt.Sprintf("app %s on node %s", d.App, d.Node))
	withEvent := err == nil
	var r *clientv3.TxnResponse
	if withEvent {
		r, err = commit(append(ops, ev)...)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			s.events.drop()
			withEvent = false
		}
	}
	if !withEvent {
		r, err = commit(ops...)
	}
	if err != nil {
		return false, wrapUnavailable(err)
	}
	if !r.Succeeded {
		if r.Responses[0].GetResponseRange().Count > 0 {
			return false, fmt.Errorf("deployment %s: %w", d.ID, ErrExists)
		}
		if withApp && r.Responses[1].GetResponseRange().Count == 0 {
			return false, appNotFound(d.App)
		}
		return false, nil
	}
	return true, nil
}
