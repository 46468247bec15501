// The PoP's nodes: what each agent registers under its lease.

package state

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Node is a registered node.
type Node struct {
	Name string `json:"name"`
	// API is the address of the agent's HTTP API (hooks, logs):
	// https://host:port over TLS, host:port for plain HTTP (an agent on a
	// loopback address without a certificate).
	API string `json:"api"`
	// Frontend is the address of the node's front end, which accepts
	// connections to every endpoint port of the PoP ("": none).
	Frontend string `json:"frontend,omitempty"`
	// Capacity is how many instances the node takes.
	Capacity int           `json:"capacity"`
	Mapper   string        `json:"mapper"`
	Engines  []engine.Name `json:"engines"`
	// Fingerprint is arch, kernel, glibc and engine versions.
	Fingerprint map[string]string `json:"fingerprint,omitempty"`
	// Problems says, per engine ("dmtcp", "criu") or "boot", why the node
	// cannot run it (e.g. no DMTCP image), with a hint.
	Problems map[string]string `json:"problems,omitempty"`
	// Priority says how the node lowers the priority of its warm pool's
	// waiting slots (e.g. "cgroup v1: cpu.shares, cpu.idle; no I/O
	// weight").
	Priority string `json:"priority,omitempty"`
	// Limits are what the node's instances get where their app spec is
	// silent (the agent's `limits:`).
	Limits  *spec.Limits `json:"limits,omitempty"`
	Started time.Time    `json:"started"`
	// Ready is set by Nodes: the agent's lease is alive.
	Ready bool `json:"ready"`
	// Cordon is set by Nodes while an operator keeps new work off the
	// node (fogctl node cordon): placement skips it and its agent keeps
	// no warm pool; what runs there stays.
	Cordon *Cordon `json:"cordon,omitempty"`
}

// Cordon is why and since when a node takes no new deployment.
type Cordon struct {
	Reason string    `json:"reason,omitempty"`
	Since  time.Time `json:"since"`
}

// Describe says since when and why: "since 2026-11-27T23:00:00Z (disk
// replacement)".
func (c Cordon) Describe() string {
	reason := c.Reason
	if reason == "" {
		reason = "no reason given"
	}
	return "since " + c.Since.Format(time.RFC3339) + " (" + reason + ")"
}

// MaxCordonReason bounds Cordon.Reason.
const MaxCordonReason = 200

// CordonNode keeps new deployments and warm-pool slots off the registered
// node name (again: the reason and time are replaced).
func (s *Store) CordonNode(ctx context.Context, name, reason string) (Cordon, error) {
	if len(reason) > MaxCordonReason || strings.ContainsFunc(reason, unicode.IsControl) || !utf8.ValidString(reason) {
		return Cordon{}, hint.With(fmt.Errorf("cordon reason: longer than %d bytes, more than one line, or with control characters", MaxCordonReason),
			"give one short line, e.g. --reason \"disk replacement\"")
	}
	c := Cordon{Reason: reason, Since: time.Now().UTC()}
	b, err := json.Marshal(c)
	if err != nil {
		return Cordon{}, err
	}
	r, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(nodeInfoKey(name)), ">", 0)).
		Then(clientv3.OpPut(nodeCordonKey(name), string(b))).Commit()
	if err != nil {
		return Cordon{}, wrapUnavailable(err)
	}
	if !r.Succeeded {
		return Cordon{}, nodeNotFound(name)
	}
	return c, nil
}

// UncordonNode lets placement and the warm pool use node name again. A
// node that is not cordoned is no error; one that never registered is
// ErrNotFound.
func (s *Store) UncordonNode(ctx context.Context, name string) error {
	r, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(nodeInfoKey(name)), ">", 0)).
		Then(clientv3.OpDelete(nodeCordonKey(name))).Commit()
	if err != nil {
		return wrapUnavailable(err)
	}
	if !r.Succeeded {
		return nodeNotFound(name)
	}
	return nil
}

// Session is a node's lease in etcd: what it holds (its record, its pool
// slots, its locks) goes when the session ends or lapses.
type Session = concurrency.Session

// NewSession opens a session on the default lease TTL (tests that put what
// a node would).
func (s *Store) NewSession() (*Session, error) { return concurrency.NewSession(s.Client()) }

// Register writes the node's record and its liveness key bound to a lease
// of ttl seconds, kept alive until ctx ends. It returns the session (whose
// lease also holds the agent's locks).
func (s *Store) Register(ctx context.Context, n Node, ttl int) (*concurrency.Session, error) {
	sess, err := concurrency.NewSession(s.cli, concurrency.WithTTL(ttl), concurrency.WithContext(ctx))
	if err != nil {
		return nil, wrapUnavailable(err)
	}
	b, err := json.Marshal(n)
	if err != nil {
		return nil, err
	}
	if _, err := s.cli.Txn(ctx).Then(
		clientv3.OpPut(nodeInfoKey(n.Name), string(b)),
		clientv3.OpPut(nodeAliveKey(n.Name), "1", clientv3.WithLease(sess.Lease())),
	).Commit(); err != nil {
		sess.Close()
		return nil, wrapUnavailable(err)
	}
	return sess, nil
}

// Answers reports whether etcd answers a read (of node name's record:
// whether it is there does not matter), within ctx.
func (s *Store) Answers(ctx context.Context, name string) error {
	_, err := s.cli.Get(ctx, nodeInfoKey(name), clientv3.WithCountOnly())
	return wrapUnavailable(err)
}

// Nodes lists the registered nodes, with Ready set from their leases.
func (s *Store) Nodes(ctx context.Context) ([]Node, error) {
	r, err := s.cli.Get(ctx, Prefix+"nodes/", clientv3.WithPrefix())
	if err != nil {
		return nil, wrapUnavailable(err)
	}
	return parseNodes(r)
}

// Node returns the registered node name, with Ready set from its lease.
func (s *Store) Node(ctx context.Context, name string) (Node, error) {
	r, err := s.cli.Get(ctx, Prefix+"nodes/"+name+"/", clientv3.WithPrefix())
	if err != nil {
		return Node{}, wrapUnavailable(err)
	}
	nodes, err := parseNodes(r)
	if err != nil {
		return Node{}, err
	}
	for _, n := range nodes {
		if n.Name == name {
			return n, nil
		}
	}
	return Node{}, nodeNotFound(name)
}

// nodeNotFound is the error for a node name that no node registered.
func nodeNotFound(name string) error {
	return hint.With(fmt.Errorf("node %s: %w", name, ErrNotFound), "`fogctl node ls` lists the nodes")
}

// parseNodes reads the node records and liveness keys of a Get of nodes/.
func parseNodes(r *clientv3.GetResponse) ([]Node, error) {
	alive := map[string]bool{}
	cordons := map[string]*Cordon{}
	var nodes []Node
	for _, kv := range r.Kvs {
		k := strings.TrimPrefix(string(kv.Key), Prefix+"nodes/")
		name, kind, _ := strings.Cut(k, "/")
		switch kind {
		case "alive":
			alive[name] = true
		case "cordon":
			c := &Cordon{}
			if err := json.Unmarshal(kv.Value, c); err != nil {
				c.Reason = "(unreadable cordon record)" // still cordoned
			}
			cordons[name] = c
		case "info":
			var n Node
			if err := json.Unmarshal(kv.Value, &n); err != nil {
				return nil, fmt.Errorf("node record %s: %w", kv.Key, err)
			}
			nodes = append(nodes, n)
		}
	}
	for i := range nodes {
		nodes[i].Ready = alive[nodes[i].Name]
		nodes[i].Cordon = cordons[nodes[i].Name]
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	return nodes, nil
}
