// A migration recorded in the deployment it moves, so that it goes on whoever asked for it:
//
//	Running ─RequestMigrate→ (Suspend, Move{From}) ─its node suspends it→ Suspended
//	Suspended + Move ─MoveOn→ Pending on the target (Move.To, or placement among the others) → Running there
//	a target that refuses it or fails ─MoveOn→ Pending on From again (Move.Back) → Running where it was
//	a resume back that fails too → Suspended with why, the move over (Move cleared)
//
// The node that suspends it takes the next step (after its suspend, and at every resync while one
// is due), and so does the target after a failed resume: a migration whose caller is gone, or
// whose agents are killed and started again, ends Running on one node, never on two.

package state

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// Move is a migration under way.
type Move struct {
	// From is the node it runs on when the migration is asked.
	From string `json:"from"`
	// To is the target asked for ("": placement picks among the nodes
	// other than From), then the one it was placed on.
	To string `json:"to,omitempty"`
	// Likely is where placement would put it when the migration was
	// asked without a target (To ""): MoveOn tries that node first, and
	// its agent prepares the resume meanwhile.
	Likely string `json:"likely,omitempty"`
	// Back: the target refused it or its resume failed there, and it is
	// resumed on From again.
	Back bool `json:"back,omitempty"`
	// Error is why it is back (or, Suspended, why it stays so).
	Error   string    `json:"error,omitempty"`
	Started time.Time `json:"started"`
	// Prepared is the target (To, or Likely) once its agent has made the
	// instance that will resume it (or found it cannot): the source
	// checkpoints then, so that the resume does not wait for it while the
	// app answers nothing (MarkPrepared).
	Prepared string `json:"prepared,omitempty"`
}

// Target is the node the move's resume is prepared on: To, or Likely
// when none was asked ("": none known yet).
func (m Move) Target() string {
	if m.To != "" {
		return m.To
	}
	return m.Likely
}

// RequestMigrate asks deployment id's node to suspend it for a move to
// node (or, "", to the node placement picks among the others): once it
// is Suspended, MoveOn resumes it there. It must be Running and not on
// node; a migration already asked is not asked again.
func (s *Store) RequestMigrate(ctx context.Context, id, node string) (Deployment, error) {
	d, r, err := s.deploymentAt(ctx, id)
	if err != nil {
		return d, err
	}
	if d.Move != nil && d.Suspend {
		return d, nil
	}
	switch {
	case d.Suspend || d.Status.Phase != spec.PhaseRunning:
		return d, hint.With(fmt.Errorf("deployment %s is %s: %w", id, phaseOf(d), ErrConflict), "migrate a Running deployment")
	case node != "" && node == d.Node:
		return d, hint.With(fmt.Errorf("deployment %s runs on %s already: %w", id, node, ErrConflict), "give another node, or none")
	}
	if node != "" {
		if _, err := s.Node(ctx, node); err != nil {
			return d, err
		}
	}
	m := &Move{From: d.Node, To: node, Started: time.Now().UTC()}
	if node == "" {
		m.Likely = s.likelyTarget(ctx, d)
	}
	d.Suspend, d.Move = true, m
	ok, err := s.putDesired(ctx, d, r.Responses[0].GetResponseRange().Kvs[0].ModRevision)
	if err != nil {
		return d, err
	}
	if !ok {
		return d, fmt.Errorf("deployment %s changed meanwhile: %w", id, ErrContended)
	}
	s.Event(ctx, id, "migrate requested", "from node "+d.Node+to(node))
	return d, nil
}

// likelyTarget is the node placement picks for d among the nodes other
// than its own, or "" (none fits, or etcd did not answer): a guess, which
// reserves nothing.
func (s *Store) likelyTarget(ctx context.Context, d Deployment) string {
	v, err := s.readPlacement(ctx)
	if err != nil {
		return ""
	}
	pl, err := s.place(v, Desired{App: d.App}, func(n Node) bool { return n.Name != d.Node })
	if err != nil {
		return ""
	}
	return pl.Node
}

// transient: a step that failed for want of etcd, not for a refusal,
// is asked again rather than taken as the move's failure.
func transient(ctx context.Context, err error) bool {
	return errors.Is(err, ErrUnavailable) || ctx.Err() != nil
}

func to(node string) string {
	if node == "" {
		return ""
	}
	return " to node " + node
}

// MoveOn takes the next step of deployment id's migration if one is due:
// Suspended and moving, it is resumed on its target; Suspended again
// after a failed resume there (or no node takes it), on the node it came
// from, even cordoned; Suspended after a failed resume back, the move is
// over and it stays Suspended with why. It returns the deployment as it
// left it, and does nothing (no error) when no step is due or another
// caller took it meanwhile.
func (s *Store) MoveOn(ctx context.Context, id string) (Deployment, error) {
	d, err := s.Deployment(ctx, id)
	if err != nil || d.Move == nil || d.Node != "" || d.Status.Phase != spec.PhaseSuspended || d.Status.Suspension == nil {
		return d, err
	}
	m := *d.Move
	if m.Back && d.Status.Error == "" {
		return d, nil
	}
	if !m.Back && d.Status.Error == "" {
		from := m.From
		resumeOn := func(node string) (Deployment, error) {
			return s.requestResume(ctx, id, node, func(n Node) bool { return n.Name != from }, false, func(d *Desired) {
				if d.Move != nil {
					d.Move.To = d.Node // the target placement chose
				}
			})
		}
		first := m.To
		if first == "" {
			first = m.Likely // where its resume was prepared, if it still fits there
		}
		placed, err := resumeOn(first)
		if err != nil && first != m.To && !transient(ctx, err) && !errors.Is(err, ErrConflict) && !errors.Is(err, ErrContended) {
			placed, err = resumeOn(m.To)
		}
		if err == nil || errors.Is(err, ErrConflict) || errors.Is(err, ErrContended) {
			return placed, nil
		}
		if transient(ctx, err) {
			return d, err // the next resync asks again
		}
		d.Status.Error = err.Error() // no node takes it: back
	}
	if !m.Back {
		why := d.Status.Error
		back, err := s.requestResume(ctx, id, m.From, nil, true, func(d *Desired) {
			if d.Move != nil {
				d.Move.Back, d.Move.Error = true, why
			}
		})
		if err == nil || errors.Is(err, ErrConflict) || errors.Is(err, ErrContended) {
			if err == nil {
				s.Event(ctx, id, "migration failed", why+"; resumed back on node "+m.From)
			}
			return back, nil
		}
		if transient(ctx, err) {
			return d, err
		}
		d.Status.Error = err.Error()
	}
	// Back failed too: it stays Suspended, the move over.
	for range placeAttempts {
		cur, r, err := s.deploymentAt(ctx, id)
		if err != nil || cur.Move == nil || cur.Node != "" {
			return cur, err
		}
		cur.Move = nil
		ok, err := s.putDesired(ctx, cur, r.Responses[0].GetResponseRange().Kvs[0].ModRevision)
		if err != nil || ok {
			if ok {
				s.Event(ctx, id, "migration failed", d.Status.Error+"; it stays suspended")
			}
			return cur, err
		}
	}
	return d, fmt.Errorf("deployment %s: %w", id, ErrContended)
}

// MarkPrepared records that node, the target of deployment id's migration
// (Move.Target), has prepared its resume, or tried: its source checkpoints
// it then. A move that went on meanwhile (Suspended, back, elsewhere) is
// left as it is.
func (s *Store) MarkPrepared(ctx context.Context, id, node string) error {
	for range placeAttempts {
		d, r, err := s.deploymentAt(ctx, id)
		if err != nil {
			return err
		}
		if !d.Suspend || d.Move == nil || d.Move.Back || d.Move.Target() != node || d.Move.Prepared == node || d.Node != d.Move.From {
			return nil
		}
		d.Move.Prepared = node
		ok, err := s.putDesired(ctx, d, r.Responses[0].GetResponseRange().Kvs[0].ModRevision)
		if err != nil || ok {
			return err
		}
	}
	return fmt.Errorf("deployment %s: %w", id, ErrContended)
}
