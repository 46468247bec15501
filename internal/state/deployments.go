// The deployments: what was asked (Desired) and what its agent observes (Status).

package state

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// Desired is a deployment as requested.
type Desired struct {
	ID        string            `json:"id"`
	App       string            `json:"app"`
	Node      string            `json:"node"`
	Requester string            `json:"requester,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	// Client is the hook API client (of the agent's tokens file) that
	// created it: "operator" for the admin token, "" for fogctl and --dev.
	Client string `json:"client,omitempty"`
	// Mode is "auto" (boot or restore, whichever has been faster on the
	// node), "restore" (checkpointing first if needed), "boot" (normally,
	// without a checkpoint engine), "checkpoint" (a refresh), or "" (the
	// app's mode, else auto).
	Mode spec.Mode `json:"mode,omitempty"`
	// Placement says why the deployment went to Node (a free pool slot,
	// capacity, or --node).
	Placement string `json:"placement,omitempty"`
	// Suspend: its instance is to be suspended (by its node's agent), or
	// is (on no node, its status Suspended), until a resume places it.
	Suspend bool `json:"suspend,omitempty"`
	// Move is the migration under way (RequestMigrate), which the agents
	// carry on from its suspend to its resume whoever asked for it.
	Move *Move `json:"move,omitempty"`
	// Endpoint is the deployment's port on every node's front end for
	// each TCP port of its app ("6379/tcp": 20417), taken at its creation
	// from the PoP's range and kept while it exists.
	Endpoint map[string]int `json:"endpoint,omitempty"`
	// OnDemand: a connection to its app's shared endpoint made it (on the
	// node that took the connection); it has no endpoint of its own, and
	// is undeployed once idle for its app's frontend.idle_after.
	OnDemand bool      `json:"on_demand,omitempty"`
	Created  time.Time `json:"created"`
}

// Status is a deployment as its agent observes it.
type Status struct {
	spec.Instance
	// Hint says what to do about Error, and Cause classes it (one of the
	// Cause constants, or empty) for clients in other processes.
	Hint    string    `json:"hint,omitempty"`
	Cause   string    `json:"cause,omitempty"`
	Updated time.Time `json:"updated"`
}

// Deployment is a desired deployment with its status (zero if none yet).
type Deployment struct {
	Desired
	Status Status `json:"status"`
}

// CreateDeployment stores a desired deployment on d.Node as given, without
// placement or a capacity check (CreatePlaced is the checked path of
// fogctl deploy and the hook API); ErrExists if the ID is taken. It changes
// the node's placement key too, so that a concurrent CreatePlaced on the
// same node places again.
func (s *Store) CreateDeployment(ctx context.Context, d Desired) error {
	_, err := s.commitDeployment(ctx, d, false)
	return err
}

// Deployment returns one deployment.
func (s *Store) Deployment(ctx context.Context, id string) (Deployment, error) {
	d, _, err := s.deploymentAt(ctx, id)
	return d, err
}

// deploymentAt reads deployment id, its record and its status in one
// transaction, and returns the revision they were read at.
func (s *Store) deploymentAt(ctx context.Context, id string, more ...clientv3.Op) (Deployment, *clientv3.TxnResponse, error) {
	var d Deployment
	r, err := s.cli.Txn(ctx).Then(append([]clientv3.Op{clientv3.OpGet(deploymentKey(id)), clientv3.OpGet(statusKey(id))}, more...)...).Commit()
	if err != nil {
		return d, nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	kvs := r.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return d, r, hint.With(fmt.Errorf("deployment %s: %w", id, ErrNotFound), "`fogctl ps` lists the deployments")
	}
	if err := json.Unmarshal(kvs[0].Value, &d.Desired); err != nil {
		return d, r, fmt.Errorf("record %s: %w", kvs[0].Key, err)
	}
	if kvs := r.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		_ = json.Unmarshal(kvs[0].Value, &d.Status)
	}
	return d, r, nil
}

// DeploymentWithApp reads deployment id and its app in one transaction:
// what an agent needs to deploy it.
func (s *Store) DeploymentWithApp(ctx context.Context, id, app string) (Deployment, spec.App, error) {
	d, r, err := s.deploymentAt(ctx, id, clientv3.OpGet(appKey(app)))
	if err != nil {
		return d, spec.App{}, err
	}
	kvs := r.Responses[2].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return d, spec.App{}, appNotFound(app)
	}
	var a spec.App
	if err := json.Unmarshal(kvs[0].Value, &a); err != nil {
		return d, a, fmt.Errorf("record %s: %w", kvs[0].Key, err)
	}
	return d, a, nil
}

// Deployments lists every deployment with its status.
func (s *Store) Deployments(ctx context.Context) ([]Deployment, error) {
	ds, err := listJSON[Desired](ctx, s.cli, DeploymentsPrefix)
	if err != nil {
		return nil, err
	}
	byID, err := s.Statuses(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Deployment, len(ds))
	for i, d := range ds {
		out[i] = Deployment{Desired: d, Status: byID[d.ID]}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, nil
}

// Statuses returns every deployment status by deployment ID, including
// those of withdrawn deployments that their agents have not forgotten yet.
func (s *Store) Statuses(ctx context.Context) (map[string]Status, error) {
	sts, err := s.cli.Get(ctx, Prefix+"status/", clientv3.WithPrefix())
	if err != nil {
		return nil, wrapUnavailable(err)
	}
	byID := map[string]Status{}
	for _, kv := range sts.Kvs {
		var st Status
		if json.Unmarshal(kv.Value, &st) == nil {
			byID[strings.TrimPrefix(string(kv.Key), Prefix+"status/")] = st
		}
	}
	return byID, nil
}

// HasStatus reports whether deployment id still has a status: its agent
// has not finished undoing it.
func (s *Store) HasStatus(ctx context.Context, id string) (bool, error) {
	r, err := s.cli.Get(ctx, statusKey(id), clientv3.WithCountOnly())
	if err != nil {
		return false, wrapUnavailable(err)
	}
	return r.Count > 0, nil
}

// SetStatus writes a deployment's status, unless the deployment is gone
// (then it is not recreated).
func (s *Store) SetStatus(ctx context.Context, id string, st Status) error {
	st.Updated = time.Now().UTC()
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	_, err = s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(deploymentKey(id)), ">", 0)).
		Then(clientv3.OpPut(statusKey(id), string(b))).Commit()
	return wrapUnavailable(err)
}

// DeleteDeployment withdraws a desired deployment; its agent undeploys it
// and then removes its status (ForgetStatus).
//
// Its endpoint ports are freed with its record, in one transaction.
func (s *Store) DeleteDeployment(ctx context.Context, id string) error {
	for range placeAttempts {
		d, r, err := s.deploymentAt(ctx, id)
		if err != nil {
			return err
		}
		rev := r.Responses[0].GetResponseRange().Kvs[0].ModRevision
		tr, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(deploymentKey(id)), "=", rev)).
			Then(append([]clientv3.Op{clientv3.OpDelete(deploymentKey(id)), clientv3.OpDelete(handoffKey(id))}, freeEndpointOps(d.Desired)...)...).Commit()
		if err != nil {
			return wrapUnavailable(err)
		}
		if tr.Succeeded {
			s.Event(ctx, id, "undeploy requested", "")
			return nil
		}
	}
	return hint.With(fmt.Errorf("deployment %s: %w: it changed at each of %d attempts to withdraw it", id, ErrContended, placeAttempts), "undeploy it again")
}

// StaleStatuses returns the IDs of statuses written by node whose desired
// deployment is gone: what an agent killed while undeploying leaves.
func (s *Store) StaleStatuses(ctx context.Context, node string) ([]string, error) {
	sts, err := s.cli.Get(ctx, Prefix+"status/", clientv3.WithPrefix())
	if err != nil {
		return nil, wrapUnavailable(err)
	}
	var out []string
	for _, kv := range sts.Kvs {
		var st Status
		if json.Unmarshal(kv.Value, &st) != nil || st.Node != node {
			continue
		}
		id := strings.TrimPrefix(string(kv.Key), Prefix+"status/")
		r, err := s.cli.Get(ctx, deploymentKey(id), clientv3.WithCountOnly())
		if err != nil {
			return nil, wrapUnavailable(err)
		}
		if r.Count == 0 {
			out = append(out, id)
		}
	}
	return out, nil
}

// ForgetStatus removes the status of an undeployed deployment.
func (s *Store) ForgetStatus(ctx context.Context, id string) error {
	_, err := s.cli.Delete(ctx, statusKey(id))
	return wrapUnavailable(err)
}
