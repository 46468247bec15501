// Apps served on demand (frontend.on_demand): a connection to an app's shared endpoint reaches
// the app's instance made on demand on the node that took it, made by that connection when
// there is none; idle instances are undeployed (idle.go).

package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/fogdeploy/fogdeploy/internal/frontend"
	"github.com/fogdeploy/fogdeploy/internal/placement"
	"github.com/fogdeploy/fogdeploy/internal/scheduler"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// onDemandClient is the client recorded for the deployments a front end
// makes (state.Desired.Client): none of the hook API's clients sees them
// unless it is an admin.
const onDemandClient = "frontend"

// onDemand is what a node's router knows of the instances it makes on
// demand beyond the view: the one it is making for each app (so that the
// connections arriving meanwhile wait for it instead of each making one),
// and the one it made last (which the view may not show yet).
type onDemand struct {
	mu     sync.Mutex
	making map[string]*making
	made   map[string]string
}

// making is an instance being made on demand: done is closed once id (or
// err) is known.
type making struct {
	done chan struct{}
	id   string
	err  error
}

// runningOnDemandHere is the app's instance made on demand that runs on
// node and takes connections, or "".
func runningOnDemandHere(st *state.Store, app, node string) string {
	deps, _ := st.WatchedOnDemand(app)
	for _, d := range deps {
		if takesConnections(d) && d.Status.Node == node {
			return d.ID
		}
	}
	return ""
}

// routeShared routes a connection to app ep.App's shared endpoint: to the
// app's instance made on demand on this node, which it makes if there is
// none (held until it runs); to one on another node only where this node
// cannot make one (full, fenced, or its bound of wakes reached).
func (r *router) routeShared(ctx context.Context, ep state.Endpoint, port int) (frontend.Target, error) {
	var t frontend.Target
	for {
		id, made, err := r.localOnDemand(ctx, ep, port)
		t.Made = t.Made || made
		if err != nil {
			if id = r.remoteOnDemand(ep.App); id == "" {
				return t, err
			}
			r.log.Info("front end: this node makes no instance on demand; forwarding to another node's", "app", ep.App, "deployment", id, "why", err)
		}
		t.Deployment = id
		if d, ok := r.st.WatchedDeployment(id); made || !ok || !takesConnections(d) {
			t.Held = true
		}
		d, err := r.st.Follow(ctx, id, func(d state.Deployment) bool {
			return d.Status.Phase == spec.PhaseFailed || takesConnections(d)
		})
		if errors.Is(err, state.ErrNotFound) {
			// Undeployed meanwhile (idle): the next one serves.
			r.forget(ep.App, id)
			t.Held = true
			continue
		}
		if err != nil {
			t.Held = true
			return t, fmt.Errorf("%w: app %s's instance %s made on demand: %w", frontend.ErrNoRoute, ep.App, id, err)
		}
		if d.Status.Phase == spec.PhaseFailed {
			// A failed one goes, so that the next connection makes
			// another (within the node's bound of wakes).
			r.forget(ep.App, id)
			if err := r.st.DeleteDeployment(ctx, id); err != nil && !errors.Is(err, state.ErrNotFound) {
				r.log.Warn("front end: undeploying a failed instance made on demand", "deployment", id, "err", err)
			}
			return t, fmt.Errorf("%w: app %s's instance %s made on demand failed: %s", frontend.ErrNoRoute, ep.App, id, d.Status.Error)
		}
		addr, err := r.address(d, ep, port)
		t.Addr = addr
		return t, err
	}
}

// localOnDemand is the app's instance made on demand on this node (made
// true: this connection made it), waiting while another connection makes
// it.
func (r *router) localOnDemand(ctx context.Context, ep state.Endpoint, port int) (id string, made bool, err error) {
	r.od.mu.Lock()
	if r.od.making == nil {
		r.od.making, r.od.made = map[string]*making{}, map[string]string{}
	}
	if id = r.ownOnDemand(ep.App); id != "" {
		r.od.mu.Unlock()
		return id, false, nil
	}
	m, busy := r.od.making[ep.App]
	if !busy {
		m = &making{done: make(chan struct{})}
		r.od.making[ep.App] = m
	}
	r.od.mu.Unlock()
	if busy {
		select {
		case <-ctx.Done():
			return "", false, fmt.Errorf("%w: app %s: %w", frontend.ErrNoRoute, ep.App, ctx.Err())
		case <-m.done:
			return m.id, false, m.err
		}
	}
	m.id, m.err = r.makeOnDemand(ctx, ep, port)
	r.od.mu.Lock()
	delete(r.od.making, ep.App)
	if m.err == nil {
		r.od.made[ep.App] = m.id
	}
	r.od.mu.Unlock()
	close(m.done)
	return m.id, m.err == nil, m.err
}

// ownOnDemand is the app's instance made on demand for this node, as the
// view holds it (or as this router made it, before the view shows it);
// r.od.mu is held.
func (r *router) ownOnDemand(app string) string {
	deps, _ := r.st.WatchedOnDemand(app)
	for _, d := range deps {
		if d.Node == r.node && !d.Suspend && d.Status.Phase != spec.PhaseFailed {
			return d.ID
		}
	}
	if id, ok := r.od.made[app]; ok {
		if _, seen := r.st.WatchedDeployment(id); !seen {
			return id // too young for the view (Follow reads it)
		}
		delete(r.od.made, app) // the view holds it, and it is not ours to serve
	}
	return ""
}

// remoteOnDemand is a Running instance of app made on demand on another
// node, or "".
func (r *router) remoteOnDemand(app string) string {
	deps, _ := r.st.WatchedOnDemand(app)
	for _, d := range deps {
		if takesConnections(d) && d.Status.Node != r.node {
			return d.ID
		}
	}
	return ""
}

func (r *router) forget(app, id string) {
	r.od.mu.Lock()
	defer r.od.mu.Unlock()
	if r.od.made[app] == id {
		delete(r.od.made, app)
	}
}

// makeOnDemand creates the app's instance on this node, as a hook client
// would (a slot restored ahead, or a spare, where the node has one).
func (r *router) makeOnDemand(ctx context.Context, ep state.Endpoint, port int) (string, error) {
	if err := r.mayWrite(); err != nil {
		return "", fmt.Errorf("%w: app %s has no instance on node %s, which cannot make one: %w", frontend.ErrNoRoute, ep.App, r.node, err)
	}
	if r.wakes == nil || !r.wakes.Allow() {
		return "", fmt.Errorf("%w: %w: app %s has no instance on node %s, and this node made or woke as many as agent.frontend.wakes_per_second allows",
			frontend.ErrNoRoute, frontend.ErrWakeLimit, ep.App, r.node)
	}
	d, err := scheduler.Create(ctx, r.st, scheduler.Request{App: ep.App, Node: r.node, Client: onDemandClient, OnDemand: true}, "frontend:"+r.node)
	if err != nil {
		if errors.Is(err, placement.ErrFull) || errors.Is(err, placement.ErrNoNode) {
			return "", fmt.Errorf("%w: app %s: node %s cannot take an instance: %w", frontend.ErrNoRoute, ep.App, r.node, err)
		}
		return "", fmt.Errorf("%w: making app %s's instance on demand: %w", frontend.ErrNoRoute, ep.App, err)
	}
	r.st.Event(ctx, d.ID, "on demand", fmt.Sprintf("made by a connection to app %s's shared endpoint port %d on node %s", ep.App, port, r.node))
	r.log.Info("front end: made an instance on demand", "app", ep.App, "deployment", d.ID, "port", port)
	return d.ID, nil
}
