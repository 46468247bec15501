// The PoP's endpoints: each deployment's ports on every node's front end, taken at its creation
// in the create's transaction and freed with its record, never changed while it exists.

package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// ErrNoEndpoint: no free port is left in the PoP's range of endpoints, or
// no deployment holds an endpoint port.
var ErrNoEndpoint = errors.New("no endpoint")

// PortRange is the PoP's range of endpoint ports (zero: endpoints off).
type PortRange struct {
	Lo, Hi int
}

// On reports whether the PoP gives deployments endpoints.
func (r PortRange) On() bool { return r.Lo > 0 && r.Hi >= r.Lo }

func (r PortRange) String() string { return fmt.Sprintf("%d-%d", r.Lo, r.Hi) }

// EndpointsPrefix holds one key per endpoint port taken (its value the
// deployment's ID).
const EndpointsPrefix = Prefix + "endpoints/"

func endpointKey(port int) string { return fmt.Sprintf("%s%05d", EndpointsPrefix, port) }

// Endpoint is one port of a deployment's endpoint, or of an app's shared
// one: what a front end routes.
type Endpoint struct {
	// Port is the PoP's port (on every node's front end).
	Port int `json:"port"`
	// Deployment is its deployment's ID ("" for an app's shared
	// endpoint), and Target the app's port it reaches ("6379/tcp").
	Deployment string `json:"deployment,omitempty"`
	App        string `json:"app"`
	Target     string `json:"target"`
	// Shared: the app's shared endpoint (frontend.on_demand), which
	// reaches the app's instance made on demand on the node that takes
	// the connection.
	Shared bool `json:"shared,omitempty"`
}

// appRecord is an app's record: its spec and, for an app served on
// demand, its shared endpoint's port for each TCP port of the app.
type appRecord struct {
	spec.App
	Endpoint map[string]int `json:"endpoint,omitempty"`
}

// sharedEndpointOps give rec, about to replace old (zero: none), its
// shared endpoint: the ports old had for the app's ports it keeps, new
// ones (none of taken) for the others; the ports it no longer needs are
// freed. Each port taken must be free when the writes commit.
func (s *Store) sharedEndpointOps(rec *appRecord, old appRecord, taken map[int]bool) ([]clientv3.Op, []clientv3.Cmp, error) {
	var ops []clientv3.Op
	var cmps []clientv3.Cmp
	keep := map[string]int{}
	var fresh []string
	if rec.Frontend.OnDemand {
		for _, name := range endpointNames(rec.App) {
			if p, ok := old.Endpoint[name]; ok {
				keep[name] = p
			} else {
				fresh = append(fresh, name)
			}
		}
	}
	for name, p := range old.Endpoint {
		if _, ok := keep[name]; !ok {
			ops = append(ops, clientv3.OpDelete(endpointKey(p)))
		}
	}
	got, err := takePorts(s.endpoints, fresh, taken)
	if err != nil {
		return nil, nil, err
	}
	for _, name := range fresh {
		p := got[name]
		keep[name] = p
		ops = append(ops, clientv3.OpPut(endpointKey(p), "app/"+rec.Name))
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(endpointKey(p)), "=", 0))
	}
	if len(keep) > 0 {
		rec.Endpoint = keep
	}
	return ops, cmps, nil
}

// endpointNames are the app's ports a deployment gets an endpoint port
// for: its TCP ports ("6379/tcp"), in order.
func endpointNames(a spec.App) []string {
	var names []string
	for _, p := range a.WithDefaults().Ports {
		if p.Proto == "tcp" {
			names = append(names, strconv.Itoa(p.Port)+"/tcp")
		}
	}
	return names
}

// takePorts picks a free port of r for each of names, none of taken: at
// random, so that a port just freed is seldom handed to the next
// deployment (a client holding the old endpoint would reach the new one).
func takePorts(r PortRange, names []string, taken map[int]bool) (map[string]int, error) {
	if len(names) == 0 {
		return nil, nil
	}
	out := map[string]int{}
	size := r.Hi - r.Lo + 1
	for _, name := range names {
		port := 0
		for range 32 {
			if p := r.Lo + rand.IntN(size); !taken[p] {
				port = p
				break
			}
		}
		for p := r.Lo; port == 0 && p <= r.Hi; p++ {
			if !taken[p] {
				port = p
			}
		}
		if port == 0 {
			return nil, hint.With(fmt.Errorf("%w: every port of pop.frontend.ports %s is taken", ErrNoEndpoint, r),
				"widen pop.frontend.ports on every node and fogctl, or undeploy what is no longer used")
		}
		taken[port] = true
		out[name] = port
	}
	return out, nil
}

// endpointOps are the writes and comparisons that take d's endpoint ports
// in d's create: each port's key must not exist.
func endpointOps(d Desired) ([]clientv3.Op, []clientv3.Cmp) {
	var ops []clientv3.Op
	var cmps []clientv3.Cmp
	for _, p := range sortedPorts(d.Endpoint) {
		ops = append(ops, clientv3.OpPut(endpointKey(p), d.ID))
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(endpointKey(p)), "=", 0))
	}
	return ops, cmps
}

// freeEndpointOps free d's endpoint ports, with its record.
func freeEndpointOps(d Desired) []clientv3.Op {
	var ops []clientv3.Op
	for _, p := range sortedPorts(d.Endpoint) {
		ops = append(ops, clientv3.OpDelete(endpointKey(p)))
	}
	return ops
}

func sortedPorts(m map[string]int) []int {
	ports := make([]int, 0, len(m))
	for _, p := range m {
		ports = append(ports, p)
	}
	sort.Ints(ports)
	return ports
}

// endpointFor gives d, about to be created, an endpoint port for each TCP
// port of its app, none of those taken (the keys of EndpointsPrefix as
// placement read them). The app is read from the view where it holds it.
func (s *Store) endpointFor(ctx context.Context, d *Desired, taken map[int]bool) error {
	if !s.endpoints.On() || d.OnDemand {
		return nil // one made on demand is reached at its app's shared endpoint
	}
	a, ok := s.watchedApp(d.App)
	if !ok {
		var err error
		if a, err = s.App(ctx, d.App); err != nil {
			return err
		}
	}
	t := make(map[int]bool, len(taken))
	for p := range taken {
		t[p] = true
	}
	ep, err := takePorts(s.endpoints, endpointNames(a), t)
	d.Endpoint = ep
	return err
}

// parseEndpointKey is the port of an endpoint key.
func parseEndpointKey(k string) (int, bool) {
	n, err := strconv.Atoi(strings.TrimPrefix(k, EndpointsPrefix))
	return n, err == nil && strings.HasPrefix(k, EndpointsPrefix)
}

// Endpoints lists the PoP's endpoints by port, read from etcd: the
// deployments' and the apps' shared ones.
func (s *Store) Endpoints(ctx context.Context) ([]Endpoint, error) {
	ds, err := listJSON[Desired](ctx, s.cli, DeploymentsPrefix)
	if err != nil {
		return nil, err
	}
	as, err := listJSON[appRecord](ctx, s.cli, AppsPrefix)
	if err != nil {
		return nil, err
	}
	var out []Endpoint
	for _, d := range ds {
		out = append(out, endpointsOf(d)...)
	}
	for _, a := range as {
		out = append(out, sharedEndpointsOf(a)...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Port < out[j].Port })
	return out, nil
}

func endpointsOf(d Desired) []Endpoint {
	var out []Endpoint
	for name, p := range d.Endpoint {
		out = append(out, Endpoint{Port: p, Deployment: d.ID, App: d.App, Target: name})
	}
	return out
}

func sharedEndpointsOf(a appRecord) []Endpoint {
	var out []Endpoint
	for name, p := range a.Endpoint {
		out = append(out, Endpoint{Port: p, App: a.Name, Target: name, Shared: true})
	}
	return out
}

// WatchedEndpoints is the PoP's endpoints as the agent's view holds them,
// by port, and a channel closed at their next change (or when the view is
// made again); ok is false while there is no view.
func (s *Store) WatchedEndpoints() (eps map[int]Endpoint, changed <-chan struct{}, ok bool) {
	c := s.watched.Load()
	if c == nil {
		return nil, nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.loaded {
		return nil, c.changed, false
	}
	eps = map[int]Endpoint{}
	for _, d := range c.deps {
		for _, e := range endpointsOf(d) {
			eps[e.Port] = e
		}
	}
	for _, a := range c.apps {
		for _, e := range sharedEndpointsOf(a) {
			eps[e.Port] = e
		}
	}
	return eps, c.changed, true
}

// WatchedOnDemand are the deployments made on demand for app (through its
// shared endpoint), as the view holds them, by ID; ok is false while
// there is no view.
func (s *Store) WatchedOnDemand(app string) (deps []Deployment, ok bool) {
	c := s.watched.Load()
	if c == nil {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.loaded {
		return nil, false
	}
	for _, k := range sortedKeys(c.deps) {
		if d := c.deps[k]; d.OnDemand && d.App == app {
			deps = append(deps, Deployment{Desired: d, Status: c.statuses[d.ID]})
		}
	}
	return deps, true
}

// WatchedDeployment is deployment id as the view holds it.
func (s *Store) WatchedDeployment(id string) (Deployment, bool) {
	c := s.watched.Load()
	if c == nil {
		return Deployment{}, false
	}
	d, held, _, loaded := c.deployment(id)
	return d, held && loaded
}

// WatchedNode is node name's record as the view holds it.
func (s *Store) WatchedNode(name string) (Node, bool) {
	c := s.watched.Load()
	if c == nil {
		return Node{}, false
	}
	c.mu.Lock()
	kv, ok := c.nodes[nodeInfoKey(name)]
	c.mu.Unlock()
	if !ok {
		return Node{}, false
	}
	var n Node
	return n, json.Unmarshal(kv.Value, &n) == nil
}

// watchedApp is app name as the view holds it.
func (s *Store) watchedApp(name string) (spec.App, bool) {
	c := s.watched.Load()
	if c == nil {
		return spec.App{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	a, ok := c.apps[appKey(name)]
	return a.App, ok && c.loaded
}

// FrontendAddresses are the addresses of the Ready nodes' front ends, in
// order: where a client reaches any endpoint of the PoP. They are read
// from the agent's view where it is loaded.
func (s *Store) FrontendAddresses(ctx context.Context) ([]string, error) {
	var nodes []Node
	if c := s.watched.Load(); c != nil {
		if v, ok := c.view(); ok {
			nodes = v.nodes
		}
	}
	if nodes == nil {
		var err error
		if nodes, err = s.Nodes(ctx); err != nil {
			return nil, err
		}
	}
	addrs := []string{}
	for _, n := range nodes {
		if n.Ready && n.Frontend != "" {
			addrs = append(addrs, n.Frontend)
		}
	}
	sort.Strings(addrs)
	return addrs, nil
}
