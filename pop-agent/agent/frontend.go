// The node's front end: the PoP's endpoints, routed from the agent's view of the PoP.

package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/fogdeploy/fogdeploy/internal/config"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/frontend"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// router is the node's frontend.Router: an endpoint port leads to the
// deployment that holds it, followed in the agent's view (no read of etcd
// per connection). A Running deployment is dialed where it answers on this
// node, or through its node's front end; one that moves (from the moment
// its agent says Suspending), resumes or is created waits; a Suspended one is woken (resumed where placement puts
// it) by the first connection, unless the agent is fenced.
type router struct {
	st   *state.Store
	node string
	// eps is the PoP's endpoints by port, as the front end's loop last
	// saw them.
	eps atomic.Pointer[map[int]state.Endpoint]
	// mayWrite says why the agent may not write into etcd (fenced), or nil.
	mayWrite func() error
	// wakes bounds the wakes this node asks, and the instances it makes
	// on demand (nil: none at all).
	wakes *rate.Limiter
	od    onDemand
	log   *slog.Logger
}

// Route implements frontend.Router.
func (r *router) Route(ctx context.Context, port int) (frontend.Target, error) {
	var ep state.Endpoint
	if eps := r.eps.Load(); eps != nil {
		ep = (*eps)[port]
	}
	if ep.Shared {
		return r.routeShared(ctx, ep, port)
	}
	t := frontend.Target{Deployment: ep.Deployment}
	if ep.Deployment == "" {
		return t, fmt.Errorf("%w: no deployment holds endpoint port %d", frontend.ErrNoRoute, port)
	}
	asked := false
	for {
		// One its agent is suspending (a suspend, a migration or a
		// drain) takes no new connection, which would be cut at the
		// checkpoint: it waits for where it runs next.
		d, err := r.st.Follow(ctx, ep.Deployment, func(d state.Deployment) bool {
			switch d.Status.Phase {
			case spec.PhaseRunning:
				return true
			case spec.PhaseFailed:
				return true
			case spec.PhaseSuspended:
				// A migration's suspend goes on to its resume by itself.
				return !asked && d.Move == nil
			}
			return false
		})
		if err != nil {
			t.Held = true
			return t, fmt.Errorf("%w: deployment %s: %w", frontend.ErrNoRoute, ep.Deployment, err)
		}
		switch d.Status.Phase {
		case spec.PhaseRunning:
			addr, err := r.address(d, ep, port)
			t.Addr = addr
			return t, err
		case spec.PhaseFailed:
			return t, fmt.Errorf("%w: deployment %s failed: %s", frontend.ErrNoRoute, ep.Deployment, d.Status.Error)
		}
		// Suspended: this connection wakes it.
		asked, t.Held = true, true
		if err := r.wake(ctx, ep, port); err != nil {
			return t, err
		}
		t.Woke = true
	}
}

// takesConnections reports whether deployment d's instance takes new
// connections: it runs, and its agent has not begun to suspend it. A
// suspend asked (or a migration's, while its target prepares the resume)
// leaves it Running and answering; its agent says Suspending a moment
// before the checkpoint (suspendGrace), and the front ends then hold new
// connections until it runs again, on its new node.
func takesConnections(d state.Deployment) bool { return d.Status.Phase == spec.PhaseRunning }

// address is where a connection to Running deployment d goes: its own
// address on this node, or its node's front end.
func (r *router) address(d state.Deployment, ep state.Endpoint, port int) (string, error) {
	if d.Status.Node == r.node {
		if a := d.Status.Ports[ep.Target]; a != "" {
			return a, nil
		}
		return "", fmt.Errorf("%w: deployment %s publishes no %s", frontend.ErrNoRoute, d.ID, ep.Target)
	}
	n, ok := r.st.WatchedNode(d.Status.Node)
	if !ok || n.Frontend == "" {
		return "", fmt.Errorf("%w: deployment %s runs on node %s, which has no front end (agent.frontend.listen)", frontend.ErrNoRoute, d.ID, d.Status.Node)
	}
	return net.JoinHostPort(n.Frontend, strconv.Itoa(port)), nil
}

// wake asks that suspended deployment ep be resumed; a resume asked
// meanwhile by another connection (or node) is no error.
func (r *router) wake(ctx context.Context, ep state.Endpoint, port int) error {
	if err := r.mayWrite(); err != nil {
		return fmt.Errorf("%w: deployment %s is Suspended and this node cannot wake it: %w", frontend.ErrNoRoute, ep.Deployment, err)
	}
	if r.wakes == nil || !r.wakes.Allow() {
		return fmt.Errorf("%w: %w: deployment %s is Suspended, and this node woke as many as agent.frontend.wakes_per_second allows",
			frontend.ErrNoRoute, frontend.ErrWakeLimit, ep.Deployment)
	}
	d, err := r.st.RequestResume(ctx, ep.Deployment, "", nil)
	if errors.Is(err, state.ErrConflict) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: waking deployment %s: %w", frontend.ErrNoRoute, ep.Deployment, err)
	}
	r.st.Event(ctx, ep.Deployment, "woken", fmt.Sprintf("by a connection to endpoint port %d on node %s; resumed on node %s", port, r.node, d.Node))
	r.log.Info("front end: woke a suspended deployment", "deployment", ep.Deployment, "port", port, "on", d.Node)
	return nil
}

// frontendSetup is the node's front end as configured: listen "" is none
// (pop.frontend.ports or agent.frontend.listen off).
type frontendSetup struct {
	listen string
	// wakes is agent.frontend.wakes_per_second.
	wakes float64
	// kernel forwards what runs here in the kernel (nil: the listener
	// forwards everything).
	kernel frontend.Kernel
	cfg    frontend.Config
}

// newRouter is the node's router, its wakes bounded as configured.
func (a *agent) newRouter() *router {
	r := &router{st: a.st, node: a.c.Node.Name, mayWrite: a.plane.err, log: a.log}
	if w := a.frontend.wakes; w > 0 {
		r.wakes = rate.NewLimiter(rate.Limit(w), max(1, int(2*w)))
	}
	return r
}

// openFrontend checks the front end's configuration against the node:
// the PoP's range of endpoint ports must lie outside the ports the kernel
// hands out to outgoing connections. advertise is the agent's API address.
func openFrontend(c config.Config, advertise string, reg prometheus.Registerer, log *slog.Logger) (frontendSetup, error) {
	lo, hi, on, err := c.PoP.Frontend.Range()
	listen := c.Agent.Frontend.ListenAddress(advertise)
	if err != nil || !on || listen == "" {
		return frontendSetup{}, err
	}
	if err := frontend.CheckRange(lo, hi); err != nil {
		return frontendSetup{}, err
	}
	fs := frontendSetup{listen: listen, wakes: c.Agent.Frontend.WakesPerSecond, cfg: frontend.Config{Listen: listen,
		HoldTimeout: c.Agent.Frontend.HoldTimeout, MaxHeld: c.Agent.Frontend.MaxHeld, Metrics: frontend.NewMetrics(reg), Log: log}}
	if c.Agent.Frontend.Kernel.IsOn() {
		k, err := frontend.NewNFTables(listen)
		if err == nil {
			// A killed agent's routes go before this one makes or
			// recycles a container: a route to a container that is gone
			// could reach another tenant's that takes its address.
			err = k.Set(map[int]netip.AddrPort{})
		}
		if err != nil {
			log.Info("front end: every connection goes through the front end's process", "why", err)
		} else {
			fs.kernel = k
		}
	}
	return fs, nil
}

// runFrontend keeps the front end listening on every endpoint port of the
// PoP, as the agent's view changes, until ctx ends; it then closes it.
func (a *agent) runFrontend(ctx context.Context, fe *frontend.Frontend, r *router) {
	defer fe.Close()
	kr := newKernelRoutes(a)
	defer kr.close()
	failing := map[int]bool{}
	retry := time.NewTicker(5 * time.Second)
	defer retry.Stop()
	for {
		eps, changed, ok := a.st.WatchedEndpoints()
		if ok {
			r.eps.Store(&eps)
			ports := make([]int, 0, len(eps))
			for p := range eps {
				ports = append(ports, p)
			}
			slices.Sort(ports)
			now := map[int]bool{}
			for _, e := range fe.Sync(ports) {
				now[e.Port] = true
				if !failing[e.Port] {
					a.log.Error("front end: an endpoint is unreachable on this node", "port", e.Port, "deployment", eps[e.Port].Deployment, "err", e.Err,
						"hint", "free the port, or give pop.frontend.ports a range no other process uses (on every node and fogctl)")
				}
			}
			failing = now
			kr.set(ctx, eps)
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-retry.C:
		}
	}
}

// kernelRoutes keeps the kernel's routes of the node's front end: one per
// endpoint whose deployment runs on this node and takes connections (not
// being suspended), to its instance's own address. Every other
// endpoint reaches the front end's listener.
type kernelRoutes struct {
	a *agent
	k frontend.Kernel
	// targets caches each deployment's addresses, by the status they
	// were read for.
	targets map[string]kernelTargets
}

type kernelTargets struct {
	updated time.Time
	t       map[string]netip.AddrPort
}

func newKernelRoutes(a *agent) *kernelRoutes {
	return &kernelRoutes{a: a, k: a.frontend.kernel, targets: map[string]kernelTargets{}}
}

// set makes the kernel's routes those of eps as the view holds them now.
func (kr *kernelRoutes) set(ctx context.Context, eps map[int]state.Endpoint) {
	if kr.k == nil || kr.a.d == nil {
		return
	}
	routes := map[int]netip.AddrPort{}
	seen := map[string]bool{}
	for port, ep := range eps {
		if ep.Shared {
			// An app's shared endpoint: to its instance made on
			// demand here, once it runs.
			if ep.Deployment = runningOnDemandHere(kr.a.st, ep.App, kr.a.c.Node.Name); ep.Deployment == "" {
				continue
			}
		}
		d, ok := kr.a.st.WatchedDeployment(ep.Deployment)
		if !ok || !takesConnections(d) || d.Status.Node != kr.a.c.Node.Name {
			continue
		}
		seen[ep.Deployment] = true
		t, ok := kr.targets[ep.Deployment]
		if !ok || !t.updated.Equal(d.Status.Updated) {
			m, err := kr.a.d.Records().Targets(ctx, ep.Deployment)
			if err != nil && !errors.Is(err, deploy.ErrNoTargets) {
				kr.a.log.Info("front end: no kernel route; its connections go through the front end's process", "deployment", ep.Deployment, "err", err)
			}
			t = kernelTargets{updated: d.Status.Updated, t: m}
			kr.targets[ep.Deployment] = t
		}
		if to, ok := t.t[ep.Target]; ok {
			routes[port] = to
		}
	}
	for id := range kr.targets {
		if !seen[id] {
			delete(kr.targets, id)
		}
	}
	if err := kr.k.Set(routes); err != nil {
		kr.a.log.Warn("front end: the kernel's routes could not be set; every connection goes through the front end's process", "err", err)
		_ = kr.k.Close()
		kr.k = nil
		return
	}
	if kr.a.frontend.cfg.Metrics != nil {
		kr.a.frontend.cfg.Metrics.KernelRoutes(len(routes))
	}
}

func (kr *kernelRoutes) close() {
	if kr.k != nil {
		if err := kr.k.Close(); err != nil {
			kr.a.log.Warn("front end: removing the kernel's routes", "err", err)
		}
	}
}
