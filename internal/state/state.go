// Package state keeps a PoP's shared state in etcd: apps, nodes (with a
// lease each), deployments (desired and observed), checkpoint generations
// and events. fogctl and the hook API write desired deployments; each
// pop-agent watches those of its node and writes their status back.
//
// Keys (docs/state.md):
//
//	/fogdeploy/pop                        PoP (JSON): the PoP's identity, made once
//	/fogdeploy/apps/<app>                 App spec (JSON)
//	/fogdeploy/nodes/<node>/info          Node (JSON)
//	/fogdeploy/nodes/<node>/alive         "1", bound to the agent's lease
//	/fogdeploy/deployments/<id>           Desired (JSON)
//	/fogdeploy/status/<id>                Status (JSON)
//	/fogdeploy/placement/<node>           last deployment ID recorded on node
//	/fogdeploy/checkpoints/<app>/<gen>    spec.Generation (JSON)
//	/fogdeploy/costs/<app>/<node>         adaptive.Costs (JSON): what deploys cost there
//	/fogdeploy/events/<unix-nano>-<id>    Event (JSON), leased for a day
//	/fogdeploy/locks/checkpoint/<app>     etcd mutex of the first deploy
package state

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/adaptive"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/placement"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// Prefix is the root of every key.
const Prefix = "/fogdeploy/"

// Errors, wrapped with their cause.
var (
	ErrNotFound    = errors.New("not found")
	ErrExists      = errors.New("already exists")
	ErrInUse       = errors.New("in use")
	ErrUnavailable = errors.New("etcd unavailable")
)

// Config says how to reach etcd.
type Config struct {
	Endpoints   []string      `yaml:"endpoints"`
	DialTimeout time.Duration `yaml:"dial_timeout"`
	// CAFile, CertFile and KeyFile enable TLS.
	CAFile   string `yaml:"ca_file"`
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// Requests, if set, is called with the method of each request the
	// store makes of etcd (e.g. "/etcdserverpb.KV/Txn"; watches, opened
	// on one stream, are not requests): what an agent counts in its metrics.
	Requests func(method string) `yaml:"-"`
	// EndpointPorts is the PoP's range of endpoint ports
	// (pop.frontend.ports; zero: deployments get no endpoint).
	EndpointPorts PortRange `yaml:"-"`
	// Policy places deployments (pop.placement; nil: the PoP's default,
	// placement.LocalityFirst).
	Policy placement.Policy `yaml:"-"`
}

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	if len(c.Endpoints) == 0 {
		errs = append(errs, errors.New("etcd.endpoints is empty: give host:port of at least one etcd member (the dev one: 127.0.0.1:23790)"))
	}
	for _, e := range c.Endpoints {
		if strings.TrimSpace(e) == "" || strings.ContainsAny(e, " \t") {
			errs = append(errs, fmt.Errorf("etcd.endpoints: %q is not host:port or a URL", e))
		}
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		errs = append(errs, errors.New("etcd.cert_file and etcd.key_file: give both or neither"))
	}
	return errors.Join(errs...)
}

// Store is the PoP state in etcd.
type Store struct {
	cli    *clientv3.Client
	events eventLease
	// watched is the view Watch keeps (nil: none).
	watched atomic.Pointer[watchCache]
	// endpoints is the range creates take endpoint ports from.
	endpoints PortRange
	// policy places deployments (placement.LocalityFirst unless told).
	policy placement.Policy
}

// Open connects to etcd and checks that it answers.
func Open(ctx context.Context, c Config) (*Store, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 5 * time.Second
	}
	// The client's own log (a snapshot's progress, its retries) is not the
	// caller's: errors come back as errors.
	cc := clientv3.Config{Endpoints: c.Endpoints, DialTimeout: c.DialTimeout, Logger: zap.NewNop()}
	if c.Requests != nil {
		count := c.Requests
		cc.DialOptions = append(cc.DialOptions, grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, conn *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				count(method)
				return invoke(ctx, method, req, reply, conn, opts...)
			}))
	}
	if c.CAFile != "" || c.CertFile != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.CAFile != "" {
			pem, err := os.ReadFile(c.CAFile)
			if err != nil {
				return nil, fmt.Errorf("etcd.ca_file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("etcd.ca_file %s holds no PEM certificate", c.CAFile)
			}
			tc.RootCAs = pool
		}
		if c.CertFile != "" {
			cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("etcd client certificate: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		cc.TLS = tc
	}
	cli, err := clientv3.New(cc)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	sctx, cancel := context.WithTimeout(ctx, c.DialTimeout)
	defer cancel()
	if _, err := cli.Status(sctx, c.Endpoints[0]); err != nil {
		cli.Close()
		return nil, hint.With(fmt.Errorf("etcd at %s: %w (%w)", strings.Join(c.Endpoints, ","), ErrUnavailable, err),
			"start the dev etcd with `make dev-up`, or set etcd.endpoints (FOGDEPLOY_ETCD_ENDPOINTS)")
	}
	policy := c.Policy
	if policy == nil {
		policy = placement.LocalityFirst{}
	}
	return &Store{cli: cli, endpoints: c.EndpointPorts, policy: policy}, nil
}

// Close releases the connection.
func (s *Store) Close() error { return s.cli.Close() }

// Client returns the etcd client (for sessions and watches).
func (s *Store) Client() *clientv3.Client { return s.cli }

func appKey(n string) string               { return AppsPrefix + n }
func nodeInfoKey(n string) string          { return Prefix + "nodes/" + n + "/info" }
func nodeAliveKey(n string) string         { return Prefix + "nodes/" + n + "/alive" }
func nodeCordonKey(n string) string        { return Prefix + "nodes/" + n + "/cordon" }
func deploymentKey(id string) string       { return Prefix + "deployments/" + id }
func statusKey(id string) string           { return Prefix + "status/" + id }
func checkpointKey(a string, g int) string { return fmt.Sprintf("%scheckpoints/%s/%08d", Prefix, a, g) }

// DeploymentsPrefix is the prefix of the deployments' records.
const DeploymentsPrefix = Prefix + "deployments/"

// AppsPrefix is the prefix of the apps' records. It sorts before
// DeploymentsPrefix, and the agents watch the keys from one to the other
// (apps, checkpoints, costs, deployments) as one ordered stream, so that
// a deployment's event comes after every change of its app before it.
const AppsPrefix = Prefix + "apps/"

func getJSON(ctx context.Context, cli *clientv3.Client, key string, v any) error {
	r, err := cli.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if len(r.Kvs) == 0 {
		return ErrNotFound
	}
	return json.Unmarshal(r.Kvs[0].Value, v)
}

func listJSON[T any](ctx context.Context, cli *clientv3.Client, prefix string) ([]T, error) {
	r, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	out := make([]T, 0, len(r.Kvs))
	for _, kv := range r.Kvs {
		var v T
		if err := json.Unmarshal(kv.Value, &v); err != nil {
			return nil, fmt.Errorf("record %s: %w", kv.Key, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// CreateApp stores a new app; ErrExists if the name is taken (unless
// replace).
func (s *Store) CreateApp(ctx context.Context, a spec.App, replace bool) error {
	a = a.WithDefaults()
	if err := a.Validate(); err != nil {
		return err
	}
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	// The first app of a PoP records the PoP's identity, if no agent did.
	if _, _, err := s.EnsurePoP(ctx); err != nil {
		return err
	}
	if replace {
		var old spec.App
		oldErr := getJSON(ctx, s.cli, appKey(a.Name), &old)
		if oldErr != nil && !errors.Is(oldErr, ErrNotFound) {
			return oldErr
		}
		if _, err = s.cli.Put(ctx, appKey(a.Name), string(b)); err != nil {
			return wrapUnavailable(err)
		}
		if oldErr == nil && sameBoot(old, a) {
			return nil // its pool size, mode, labels or resources: boots cost as before
		}
		// Another process boots another way: measure boots afresh.
		if err := s.resetCosts(ctx, a.Name, func(c *adaptive.Costs) { c.Boot = nil }); err != nil {
			return fmt.Errorf("app %s is replaced, but its boot costs are not reset: %w", a.Name, err)
		}
		return nil
	}
	r, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(appKey(a.Name)), "=", 0)).
		Then(clientv3.OpPut(appKey(a.Name), string(b))).Commit()
	if err != nil {
		return wrapUnavailable(err)
	}
	if !r.Succeeded {
		return hint.With(fmt.Errorf("app %s: %w", a.Name, ErrExists), "use --replace to change its spec")
	}
	return nil
}

// App returns an app.
func (s *Store) App(ctx context.Context, name string) (spec.App, error) {
	var a spec.App
	if err := getJSON(ctx, s.cli, appKey(name), &a); err != nil {
		if errors.Is(err, ErrNotFound) {
			return a, appNotFound(name)
		}
		return a, err
	}
	return a, nil
}

func appNotFound(name string) error {
	return hint.With(fmt.Errorf("app %s: %w", name, ErrNotFound), "`fogctl app ls` lists the apps; `fogctl app create` adds one")
}

// Apps lists the apps by name.
func (s *Store) Apps(ctx context.Context) ([]spec.App, error) {
	return listJSON[spec.App](ctx, s.cli, AppsPrefix)
}

// DeleteApp removes an app, and what its deploys cost on each node;
// ErrInUse while it has deployments.
func (s *Store) DeleteApp(ctx context.Context, name string) error {
	if _, err := s.App(ctx, name); err != nil {
		return err
	}
	deps, err := s.Deployments(ctx)
	if err != nil {
		return err
	}
	var ids []string
	for _, d := range deps {
		if d.App == name {
			ids = append(ids, d.ID)
		}
	}
	if len(ids) > 0 {
		return hint.With(fmt.Errorf("app %s has %d deployment(s) (%s): %w", name, len(ids), strings.Join(ids, ", "), ErrInUse),
			"undeploy them first with `fogctl undeploy ID`")
	}
	_, err = s.cli.Txn(ctx).Then(clientv3.OpDelete(appKey(name)), clientv3.OpDelete(costsPrefix(name), clientv3.WithPrefix())).Commit()
	return wrapUnavailable(err)
}

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
	Created  time.Time      `json:"created"`
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
			Then(append([]clientv3.Op{clientv3.OpDelete(deploymentKey(id))}, freeEndpointOps(d.Desired)...)...).Commit()
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

func wrapUnavailable(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}
