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
	"strings"
	"sync/atomic"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/placement"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
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

func wrapUnavailable(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}
