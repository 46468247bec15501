package state

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// PoPKey holds the PoP's identity (PoP, JSON): made once, by the first
// agent or fogctl command that writes to an etcd without one, and never
// changed. An etcd without it while nodes remember one was emptied or
// replaced.
const PoPKey = Prefix + "pop"

// ProblemControlPlane is the key of Node.Problems under which a fenced
// agent says why it acts on nothing (docs/design.md#faults).
const ProblemControlPlane = "control_plane"

// ErrFenced: the PoP's etcd is not the one its nodes knew (emptied,
// another cluster, or behind the revision they saw), and what would act on
// it refuses to.
var ErrFenced = errors.New("control plane fenced")

// PoP is the identity of a PoP's etcd.
type PoP struct {
	// ID is random, made with the record.
	ID      string    `json:"id"`
	Created time.Time `json:"created"`
}

// Header says which etcd cluster answered a request, and at which
// revision.
type Header struct {
	ClusterID uint64
	Revision  int64
}

// HeaderOf reads the header of an etcd response (zero for nil).
func HeaderOf(h *etcdserverpb.ResponseHeader) Header {
	if h == nil {
		return Header{}
	}
	return Header{ClusterID: h.ClusterId, Revision: h.Revision}
}

// PoP reads the PoP record: nil when etcd has none. The header says which
// cluster answered, at which revision.
func (s *Store) PoP(ctx context.Context) (*PoP, Header, error) {
	r, err := s.cli.Get(ctx, PoPKey)
	if err != nil {
		return nil, Header{}, wrapUnavailable(err)
	}
	h := HeaderOf(r.Header)
	if len(r.Kvs) == 0 {
		return nil, h, nil
	}
	p, err := parsePoP(r.Kvs[0].Value)
	return p, h, err
}

// EnsurePoP returns the PoP record, creating it first (a create-if-absent
// transaction) when etcd has none.
func (s *Store) EnsurePoP(ctx context.Context) (PoP, Header, error) {
	id := make([]byte, 8)
	if _, err := rand.Read(id); err != nil {
		return PoP{}, Header{}, err
	}
	p := PoP{ID: hex.EncodeToString(id), Created: time.Now().UTC()}
	b, err := json.Marshal(p)
	if err != nil {
		return PoP{}, Header{}, err
	}
	r, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(PoPKey), "=", 0)).
		Then(clientv3.OpPut(PoPKey, string(b))).Else(clientv3.OpGet(PoPKey)).Commit()
	if err != nil {
		return PoP{}, Header{}, wrapUnavailable(err)
	}
	h := HeaderOf(r.Header)
	if r.Succeeded {
		return p, h, nil
	}
	kvs := r.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) == 0 {
		return PoP{}, h, fmt.Errorf("%s: neither created nor read", PoPKey)
	}
	got, err := parsePoP(kvs[0].Value)
	if err != nil {
		return PoP{}, h, err
	}
	return *got, h, nil
}

func parsePoP(b []byte) (*PoP, error) {
	var p PoP
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("PoP record %s is unreadable: %w", PoPKey, err)
	}
	if p.ID == "" {
		return nil, fmt.Errorf("PoP record %s holds no id: %q", PoPKey, b)
	}
	return &p, nil
}

// UpdateNode writes a registered node's record again (its problems
// changed), and its liveness key bound to sess's lease when sess is given.
func (s *Store) UpdateNode(ctx context.Context, n Node, sess *concurrency.Session) error {
	b, err := json.Marshal(n)
	if err != nil {
		return err
	}
	ops := []clientv3.Op{clientv3.OpPut(nodeInfoKey(n.Name), string(b))}
	if sess != nil {
		ops = append(ops, clientv3.OpPut(nodeAliveKey(n.Name), "1", clientv3.WithLease(sess.Lease())))
	}
	_, err = s.cli.Txn(ctx).Then(ops...).Commit()
	return wrapUnavailable(err)
}

// Fence says why the node's agent acts on nothing ("" while it acts): its
// problem ProblemControlPlane.
func (n Node) Fence() string { return n.Problems[ProblemControlPlane] }
