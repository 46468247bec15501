// A migration's hand-over: the source keeps the suspension's checkpoint on its disk and records
// here who may read it, node to node, while it writes the durable copy into the cluster behind
// it (spec.Suspension.Pending):
//
//	source: PutHandoff (once the checkpoint's files are kept) → RecordSuspended (Pending: source)
//	        → MoveOn → … → MarkDurable
//	target: MarkPrepared → Handoff (the token, the source's API) → reads the checkpoint from the
//	        source (while the source seals the suspension, or after), or, once MarkDurable ran,
//	        from the cluster
//
// The token is the only secret: it is in a key of its own, never in a record that the hook API
// shows, and goes with the deployment or once the copy is durable.

package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Handoff is who serves the checkpoint of a suspension whose image in the
// cluster is being written, and the secret its reader shows.
type Handoff struct {
	// Node is the source; Ckpt the suspension's checkpoint image.
	Node string `json:"node"`
	Ckpt string `json:"ckpt"`
	// Token is a secret the source made for this hand-over alone.
	Token string `json:"token"`
	// Gen is the checkpoint's generation (its directory) and Bytes its
	// size; Pages: its target fetches its memory after it runs, from the
	// source's page server. The migration's prepared target reads it from
	// these before the suspension is recorded.
	Gen   int   `json:"gen,omitempty"`
	Bytes int64 `json:"bytes,omitempty"`
	Pages bool  `json:"pages,omitempty"`
}

const handoffsPrefix = Prefix + "handoffs/"

func handoffKey(id string) string { return handoffsPrefix + id }

// handoffPoll is how often AwaitHandoff reads etcd while the store keeps
// no view.
const handoffPoll = 25 * time.Millisecond

// AwaitHandoff waits for a hand-over of deployment id's checkpoint that
// want accepts, while still holds for the deployment (ErrNotFound once it
// does not, or once the deployment is withdrawn). Where the store keeps
// the agent's view (Watch) it waits in the view: no read of etcd, and no
// delay once the source records it. Otherwise it reads etcd every
// handoffPoll.
func (s *Store) AwaitHandoff(ctx context.Context, id string, want func(Handoff) bool, still func(Deployment) bool) (Handoff, error) {
	gone := fmt.Errorf("hand-over of deployment %s: %w", id, ErrNotFound)
	for {
		if c := s.watched.Load(); c != nil {
			if h, err, ok := c.awaitHandoff(ctx, id, want, still); ok {
				if errors.Is(err, ErrNotFound) {
					err = gone
				}
				return h, err
			}
		}
		h, err := s.Handoff(ctx, id)
		switch {
		case err == nil && want(h):
			return h, nil
		case err != nil && !errors.Is(err, ErrNotFound):
			return Handoff{}, err
		}
		d, _, err := s.deploymentAt(ctx, id)
		if errors.Is(err, ErrNotFound) || err == nil && !still(d) {
			return Handoff{}, gone
		}
		if err != nil {
			return Handoff{}, err
		}
		select {
		case <-ctx.Done():
			return Handoff{}, ctx.Err()
		case <-time.After(handoffPoll):
		}
	}
}

// awaitHandoff is AwaitHandoff in the view: ok false once the view is
// not (or no longer) loaded, for the caller to read etcd instead.
func (c *watchCache) awaitHandoff(ctx context.Context, id string, want func(Handoff) bool, still func(Deployment) bool) (h Handoff, err error, ok bool) {
	ch := c.subscribe(id)
	defer c.unsubscribe(id, ch)
	for {
		c.mu.Lock()
		loaded := c.loaded
		h, kept := c.handoffs[id]
		desired, held := c.deps[deploymentKey(id)]
		d := Deployment{Desired: desired, Status: c.statuses[id]}
		c.mu.Unlock()
		switch {
		case !loaded:
			return Handoff{}, nil, false
		case kept && want(h):
			return h, nil, true
		case !held || !still(d):
			return Handoff{}, ErrNotFound, true
		}
		select {
		case <-ctx.Done():
			return Handoff{}, ctx.Err(), true
		case <-ch:
		}
	}
}

// PutHandoff records hand-over h of deployment id's checkpoint, before its
// suspension names it Pending.
func (s *Store) PutHandoff(ctx context.Context, id string, h Handoff) error {
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	_, err = s.cli.Put(ctx, handoffKey(id), string(b))
	return wrapUnavailable(err)
}

// Handoff is the hand-over of deployment id's checkpoint (ErrNotFound:
// none, or it is over).
func (s *Store) Handoff(ctx context.Context, id string) (Handoff, error) {
	r, err := s.cli.Get(ctx, handoffKey(id))
	if err != nil {
		return Handoff{}, wrapUnavailable(err)
	}
	if len(r.Kvs) == 0 {
		return Handoff{}, fmt.Errorf("hand-over of deployment %s: %w", id, ErrNotFound)
	}
	var h Handoff
	if err := json.Unmarshal(r.Kvs[0].Value, &h); err != nil {
		return Handoff{}, fmt.Errorf("hand-over of deployment %s: %w", id, err)
	}
	return h, nil
}

// EndHandoff removes the record of deployment id's hand-over of
// checkpoint image ckpt, which is over (its deployment runs again, or is
// gone); a later hand-over's record stays.
func (s *Store) EndHandoff(ctx context.Context, id, ckpt string) error {
	r, err := s.cli.Get(ctx, handoffKey(id))
	if err != nil {
		return wrapUnavailable(err)
	}
	if len(r.Kvs) == 0 {
		return nil
	}
	var h Handoff
	if json.Unmarshal(r.Kvs[0].Value, &h) == nil && h.Ckpt != ckpt {
		return nil
	}
	_, err = s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(handoffKey(id)), "=", r.Kvs[0].ModRevision)).
		Then(clientv3.OpDelete(handoffKey(id))).Commit()
	return wrapUnavailable(err)
}

// MarkDurable records that the checkpoint image ckpt of deployment id's
// suspension is sealed in the cluster: a suspension that still names it
// is Pending no more, and the hand-over's record goes.
func (s *Store) MarkDurable(ctx context.Context, id, ckpt string) error {
	for range placeAttempts {
		r, err := s.cli.Get(ctx, statusKey(id))
		if err != nil {
			return wrapUnavailable(err)
		}
		var st Status
		if len(r.Kvs) > 0 {
			if err := json.Unmarshal(r.Kvs[0].Value, &st); err != nil {
				return fmt.Errorf("status of deployment %s: %w", id, err)
			}
		}
		susp := st.Suspension
		if len(r.Kvs) == 0 || susp == nil || susp.Ckpt.Image != ckpt || susp.Pending == "" {
			return s.EndHandoff(ctx, id, ckpt)
		}
		susp.Pending = ""
		b, err := json.Marshal(st)
		if err != nil {
			return err
		}
		tr, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(statusKey(id)), "=", r.Kvs[0].ModRevision)).
			Then(clientv3.OpPut(statusKey(id), string(b))).Commit()
		if err != nil {
			return wrapUnavailable(err)
		}
		if tr.Succeeded {
			s.Event(ctx, id, "suspension durable", "its checkpoint is sealed in the cluster")
			return s.EndHandoff(ctx, id, ckpt)
		}
	}
	return fmt.Errorf("status of deployment %s: %w", id, ErrContended)
}

// HandoffTarget reports whether deployment id is placed on node for a
// resume from a suspension whose checkpoint image is ckpt: the one node
// a hand-over's source serves. Before the suspension is recorded, that
// is the node its migration goes to, once it has prepared the resume.
func (s *Store) HandoffTarget(ctx context.Context, id, node, ckpt string) (bool, error) {
	d, err := s.Deployment(ctx, id)
	if err != nil {
		return false, err
	}
	if susp := d.Status.Suspension; susp != nil {
		return d.Node == node && susp.Ckpt.Image == ckpt, nil
	}
	m := d.Move
	return d.Suspend && m != nil && !m.Back && m.Target() == node && m.Prepared == node, nil
}
