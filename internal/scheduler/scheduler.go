// Package scheduler turns a deployment request into a placed deployment
// record in the PoP's state: the one path that `fogctl deploy`, `fogctl
// checkpoint refresh` and the agents' redeployment hook API share. It sits
// between the commands and the state (commands -> scheduler -> state), so
// that no command imports the agent.
package scheduler

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/placement"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// Request asks for one deployment of an app (the body of the hook API's
// POST /v1/deployments).
type Request struct {
	App    string            `json:"app"`
	Node   string            `json:"node,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	// Mode is "auto" (boot or restore, whichever has been faster on the
	// node), "restore" (checkpointing first if needed) or "boot" (normally,
	// without a checkpoint engine); "" is the app's mode, else auto.
	// "checkpoint" seals a new generation (fogctl checkpoint refresh).
	Mode spec.Mode `json:"mode,omitempty"`
	// Client is the hook API client that asks (state.Desired.Client);
	// never read from a request body.
	Client string `json:"-"`
	// OnDemand: a front end makes it for a connection to its app's shared
	// endpoint (state.Desired.OnDemand); never read from a request body.
	OnDemand bool `json:"-"`
}

// Create places and records a deployment. Placement (or the check of
// req.Node), the node's capacity check and the check that the app exists
// commit with the record, in one etcd transaction (state.Store.CreatePlaced).
func Create(ctx context.Context, st *state.Store, req Request, requester string) (state.Desired, error) {
	if req.Mode != spec.ModeCheckpoint {
		if err := spec.ValidateMode(req.Mode); err != nil {
			return state.Desired{}, err
		}
	}
	// The app's existence is checked in CreatePlaced's transaction; only a
	// checkpoint reads the app first, for its engine.
	var eligible func(state.Node) bool
	if req.Mode == spec.ModeCheckpoint {
		app, err := st.App(ctx, req.App)
		if err != nil {
			return state.Desired{}, err
		}
		// Only a node with the app's engine can make its checkpoint.
		eng := app.WithDefaults().Engine
		eligible = func(n state.Node) bool { return slices.Contains(n.Engines, eng) }
		if eng == spec.EngineAuto {
			eng = "checkpoint" // for the error below
			eligible = func(n state.Node) bool { return len(n.Engines) > 0 }
		}
		nodes, err := st.Nodes(ctx)
		if err != nil {
			return state.Desired{}, err
		}
		if !slices.ContainsFunc(nodes, eligible) {
			return state.Desired{}, hint.With(fmt.Errorf("app %s: %w: no node has the %s engine", req.App, placement.ErrNoNode, eng),
				"`fogctl node ls` shows each node's engines; install the engine on a node and restart its pop-agent")
		}
	}
	d := state.Desired{ID: spec.NewID(req.App), App: req.App, Node: req.Node, Requester: requester, Client: req.Client, Labels: req.Labels,
		Mode: req.Mode, OnDemand: req.OnDemand, Created: time.Now().UTC()}
	return st.CreatePlaced(ctx, d, eligible)
}

// Undeploy withdraws deployment id. Its node's agent undoes a deployment
// that runs; one that is Suspended runs nowhere, so its suspension's
// images are removed here (from store; nil leaves them to gc, which
// removes the images of a deployment that is gone) and its status goes.
func Undeploy(ctx context.Context, st *state.Store, store layering.Store, id string) error {
	susp, ok, err := st.DeleteSuspended(ctx, id)
	if err != nil {
		return err
	}
	if !ok {
		return st.DeleteDeployment(ctx, id)
	}
	if store != nil {
		if err := catalog.RemoveSuspension(ctx, store, susp); err != nil {
			return hint.With(fmt.Errorf("deployment %s is withdrawn; removing its suspension: %w", id, err),
				"`fogctl gc` removes what is left of it")
		}
	}
	return st.ForgetStatus(ctx, id)
}
