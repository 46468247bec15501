// A deployment suspended and resumed: the requests, and the record of a suspension.
//
//	Running ─RequestSuspend→ (Suspend: true, its node suspends it) ─SetSuspended→ Suspended (on no node)
//	Suspended ─RequestResume→ Pending on the chosen node (its agent resumes it) → Running
//	a resume that fails → Suspended again (SetSuspended), its suspension intact

package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// ErrConflict: the deployment is not in the phase the request needs.
var ErrConflict = errors.New("not in that phase")

// RequestSuspend asks deployment id's node to suspend it. It must be
// Running; a suspend already asked for is not asked again.
func (s *Store) RequestSuspend(ctx context.Context, id string) (Deployment, error) {
	d, r, err := s.deploymentAt(ctx, id)
	if err != nil {
		return d, err
	}
	if d.Suspend {
		return d, nil
	}
	if d.Status.Phase != spec.PhaseRunning {
		return d, hint.With(fmt.Errorf("deployment %s is %s: %w", id, phaseOf(d), ErrConflict),
			"suspend a Running deployment; `fogctl ps` shows each one's phase")
	}
	d.Suspend, d.Move = true, nil
	ok, err := s.putDesired(ctx, d, r.Responses[0].GetResponseRange().Kvs[0].ModRevision)
	if err != nil {
		return d, err
	}
	if !ok {
		return d, fmt.Errorf("deployment %s changed meanwhile: %w", id, ErrContended)
	}
	s.Event(ctx, id, "suspend requested", "")
	return d, nil
}

// CancelSuspend withdraws the suspend asked of deployment id (its node
// could not begin it, and it runs on).
func (s *Store) CancelSuspend(ctx context.Context, id string) error {
	for range placeAttempts {
		d, r, err := s.deploymentAt(ctx, id)
		if err != nil || !d.Suspend {
			return err
		}
		d.Suspend, d.Move = false, nil
		if ok, err := s.putDesired(ctx, d, r.Responses[0].GetResponseRange().Kvs[0].ModRevision); err != nil || ok {
			return err
		}
	}
	return fmt.Errorf("deployment %s: %w", id, ErrContended)
}

// SetSuspended records deployment id as suspended (on no node, with what
// its suspension holds), or again so after a failed resume (why). It is
// ErrNotFound when the deployment was withdrawn meanwhile: the caller
// removes the suspension's images.
func (s *Store) SetSuspended(ctx context.Context, id string, susp spec.Suspension, why error) error {
	for range placeAttempts {
		ok, err := s.setSuspended(ctx, id, susp, why, nil)
		if err != nil || ok {
			return err
		}
	}
	return fmt.Errorf("deployment %s: %w", id, ErrContended)
}

// RecordSuspended is SetSuspended (without an error) for the node that
// made suspension susp, unless it is recorded already: an agent started
// again records the suspension its record holds, and a migration may have
// gone on from it meanwhile (placed on its target, or running there),
// which must not be undone.
func (s *Store) RecordSuspended(ctx context.Context, id string, susp spec.Suspension) error {
	recorded := func(d Deployment) bool {
		cur := d.Status.Suspension
		return cur != nil && cur.Ckpt == susp.Ckpt || d.Node != "" && d.Node != susp.Node
	}
	for range placeAttempts {
		ok, err := s.setSuspended(ctx, id, susp, nil, recorded)
		if err != nil || ok {
			return err
		}
	}
	return fmt.Errorf("deployment %s: %w", id, ErrContended)
}

// setSuspended records suspension susp of deployment id unless skip says
// it needs not; false if the record changed meanwhile (read again).
func (s *Store) setSuspended(ctx context.Context, id string, susp spec.Suspension, why error, skip func(Deployment) bool) (bool, error) {
	d, r, err := s.deploymentAt(ctx, id)
	if err != nil {
		return false, err
	}
	if skip != nil && skip(d) {
		return true, nil
	}
	rev := r.Responses[0].GetResponseRange().Kvs[0].ModRevision
	d.Node, d.Suspend, d.Placement = "", true, ""
	b, err := json.Marshal(d.Desired)
	if err != nil {
		return false, err
	}
	st := Status{Updated: time.Now().UTC(), Instance: spec.Instance{Phase: spec.PhaseSuspended, Gen: susp.From.Gen,
		Engine: susp.Engine, Mode: spec.ModeRestore, Timings: susp.Timings, Suspension: &susp}}
	if why != nil {
		st.Error, st.Hint = why.Error(), hint.Of(why)
	}
	sb, err := json.Marshal(st)
	if err != nil {
		return false, err
	}
	// Withdrawn or changed meanwhile: not written, read again.
	tr, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(deploymentKey(id)), "=", rev)).
		Then(clientv3.OpPut(deploymentKey(id), string(b)), clientv3.OpPut(statusKey(id), string(sb))).Commit()
	if err != nil {
		return false, wrapUnavailable(err)
	}
	return tr.Succeeded, nil
}

// RequestResume places suspended deployment id on node (or, "", on the
// node placement picks among those eligible accepts) with the capacity
// check of CreatePlaced, and asks that node to resume it. It returns the
// deployment as placed.
func (s *Store) RequestResume(ctx context.Context, id, node string, eligible func(Node) bool) (Deployment, error) {
	// A resume asked by hand ends a migration that stopped Suspended.
	return s.requestResume(ctx, id, node, eligible, false, func(d *Desired) { d.Move = nil })
}

// requestResume places and asks the resume; edit changes the record it
// writes (a migration's step).
func (s *Store) requestResume(ctx context.Context, id, node string, eligible func(Node) bool, cordoned bool, edit func(*Desired)) (Deployment, error) {
	for range placeAttempts {
		d, r, err := s.deploymentAt(ctx, id)
		if err != nil {
			return d, err
		}
		if d.Status.Phase != spec.PhaseSuspended || d.Status.Suspension == nil {
			return d, hint.With(fmt.Errorf("deployment %s is %s: %w", id, phaseOf(d), ErrConflict),
				"resume a Suspended deployment; `fogctl ps` shows each one's phase")
		}
		v, err := s.readPlacement(ctx)
		if err != nil {
			return d, err
		}
		if cordoned {
			for i := range v.nodes {
				v.nodes[i].Cordon = nil
			}
		}
		pl, err := s.place(v, Desired{App: d.App, Node: node}, eligible)
		if err != nil {
			return d, err
		}
		d.Node, d.Placement, d.Suspend = pl.Node, pl.Reason, false
		edit(&d.Desired)
		st := d.Status
		// The suspend's timings are its suspension's; the resume's come next.
		st.Phase, st.Node, st.Error, st.Hint, st.Timings, st.Updated = spec.PhasePending, pl.Node, "", "", nil, time.Now().UTC()
		b, _ := json.Marshal(d.Desired)
		sb, _ := json.Marshal(st)
		n := pl.Node
		cmps := append([]clientv3.Cmp{
			clientv3.Compare(clientv3.ModRevision(deploymentKey(id)), "=", r.Responses[0].GetResponseRange().Kvs[0].ModRevision),
		}, v.placedOn(n, cordoned)...)
		txn, err := s.cli.Txn(ctx).If(cmps...).
			Then(clientv3.OpPut(deploymentKey(id), string(b)), clientv3.OpPut(statusKey(id), string(sb)), clientv3.OpPut(placementKey(n), id)).Commit()
		if err != nil {
			return d, wrapUnavailable(err)
		}
		if txn.Succeeded {
			s.Event(ctx, id, "resume requested", "on node "+n)
			d.Status = st
			return d, nil
		}
	}
	return Deployment{}, hint.With(fmt.Errorf("resume of deployment %s: %w", id, ErrContended), "resume again")
}

// putDesired writes d's record if it is still at mod revision rev.
func (s *Store) putDesired(ctx context.Context, d Deployment, rev int64) (bool, error) {
	b, err := json.Marshal(d.Desired)
	if err != nil {
		return false, err
	}
	r, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(deploymentKey(d.ID)), "=", rev)).
		Then(clientv3.OpPut(deploymentKey(d.ID), string(b))).Commit()
	if err != nil {
		return false, wrapUnavailable(err)
	}
	return r.Succeeded, nil
}

func phaseOf(d Deployment) string {
	if d.Status.Phase == "" {
		return "without a status yet"
	}
	return string(d.Status.Phase)
}

// DeleteSuspended withdraws deployment id if it is Suspended, and returns
// its suspension, whose images the caller removes (ForgetStatus after);
// ok is false, and nothing is written, for a deployment in another phase.
func (s *Store) DeleteSuspended(ctx context.Context, id string) (susp spec.Suspension, ok bool, err error) {
	d, r, err := s.deploymentAt(ctx, id)
	if err != nil {
		return susp, false, err
	}
	sts := r.Responses[1].GetResponseRange().Kvs
	if d.Status.Phase != spec.PhaseSuspended || d.Status.Suspension == nil || len(sts) == 0 {
		return susp, false, nil
	}
	tr, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(statusKey(id)), "=", sts[0].ModRevision)).
		Then(append([]clientv3.Op{clientv3.OpDelete(deploymentKey(id)), clientv3.OpDelete(handoffKey(id))}, freeEndpointOps(d.Desired)...)...).Commit()
	if err != nil {
		return susp, false, wrapUnavailable(err)
	}
	if !tr.Succeeded {
		return susp, false, fmt.Errorf("deployment %s changed meanwhile: %w", id, ErrContended)
	}
	s.Event(ctx, id, "undeploy requested", "suspended: its images are removed")
	return *d.Status.Suspension, true, nil
}

// ForgetSuspendedStatus removes the status of withdrawn deployment id,
// suspended by node, unless another node has it (an instance resumed
// there from the suspension, which then owns the suspension's images and
// removes them with its own undeploy): other is that node, and the
// status is left to it.
func (s *Store) ForgetSuspendedStatus(ctx context.Context, id, node string) (other string, err error) {
	for range placeAttempts {
		r, err := s.cli.Get(ctx, statusKey(id))
		if err != nil {
			return "", wrapUnavailable(err)
		}
		if len(r.Kvs) == 0 {
			return "", nil
		}
		var st Status
		if json.Unmarshal(r.Kvs[0].Value, &st) == nil && st.Node != "" && st.Node != node {
			return st.Node, nil
		}
		tr, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(statusKey(id)), "=", r.Kvs[0].ModRevision)).
			Then(clientv3.OpDelete(statusKey(id))).Commit()
		if err != nil {
			return "", wrapUnavailable(err)
		}
		if tr.Succeeded {
			return "", nil
		}
	}
	return "", fmt.Errorf("status of deployment %s: %w", id, ErrContended)
}
