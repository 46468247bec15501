// Migrate and drain: a running deployment moved to another node with its state, as a suspend on
// its node and a resume on the other (state.RequestSuspend, state.RequestResume).

package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// Moved is what a migration did.
type Moved struct {
	ID   string `json:"id"`
	App  string `json:"app"`
	From string `json:"from"`
	To   string `json:"to,omitempty"`
	// Downtime is from the suspend's request (its checkpoint stops the
	// app) to Running on To; Total the whole migration.
	Downtime time.Duration `json:"downtime_ns"`
	Total    time.Duration `json:"total_ns"`
	// Bytes is the size of the checkpoint it moved.
	Bytes int64             `json:"bytes"`
	Ports map[string]string `json:"ports,omitempty"`
	// Error says why it did not move; Back, that it runs again on From.
	Error string `json:"error,omitempty"`
	Back  bool   `json:"back,omitempty"`
}

// ErrNotMoved: a migration did not move its deployment (it runs where it
// was, or stays Suspended: Moved says).
var ErrNotMoved = errors.New("not moved")

// Migrate moves running deployment id to node (or, "", to the node
// placement picks among the others), with its memory and files: its node
// suspends it, the target resumes it. A resume that fails on the target
// is resumed back on its first node; it is never on two nodes.
func Migrate(ctx context.Context, st *state.Store, id, node string) (Moved, error) {
	start := time.Now()
	d, err := st.Deployment(ctx, id)
	if err != nil {
		return Moved{ID: id}, err
	}
	m := Moved{ID: id, App: d.App, From: d.Node}
	if d.Status.Phase != spec.PhaseRunning {
		return m, hint.With(fmt.Errorf("deployment %s is %s: %w", id, d.Status.Phase, state.ErrConflict), "migrate a Running deployment")
	}
	if node == d.Node {
		return m, hint.With(fmt.Errorf("deployment %s runs on %s already: %w", id, node, state.ErrConflict), "give another node, or none")
	}
	if _, err := st.RequestSuspend(ctx, id); err != nil {
		return m, err
	}
	suspended, err := st.Follow(ctx, id, func(d state.Deployment) bool {
		return d.Status.Phase == spec.PhaseSuspended || d.Status.Phase == spec.PhaseFailed
	})
	if err != nil {
		return m, err
	}
	if suspended.Status.Phase != spec.PhaseSuspended || suspended.Status.Suspension == nil {
		m.Error = suspended.Status.Error
		return m, fmt.Errorf("deployment %s: the suspend on %s failed: %s: %w", id, m.From, suspended.Status.Error, ErrNotMoved)
	}
	m.Bytes = suspended.Status.Suspension.Bytes
	others := func(n state.Node) bool { return n.Name != m.From }
	placed, err := st.RequestResume(ctx, id, node, others)
	if err == nil {
		m.To = placed.Node
		var d state.Deployment
		if d, err = followResume(ctx, st, id); err == nil && d.Status.Phase == spec.PhaseRunning {
			m.Downtime, m.Total, m.Ports = time.Since(start), time.Since(start), d.Status.Ports
			return m, nil
		} else if err == nil {
			err = errors.New(d.Status.Error)
		}
	}
	// Back where it was.
	m.Error = err.Error()
	if _, berr := st.ResumeBack(ctx, id, m.From); berr != nil {
		return m, fmt.Errorf("deployment %s: the resume on %s failed (%w), and so did the one back on %s (%w): it stays Suspended", id, m.To, err, m.From, berr)
	}
	back, berr := followResume(ctx, st, id)
	if berr == nil && back.Status.Phase == spec.PhaseRunning {
		m.Back, m.Ports = true, back.Status.Ports
		return m, fmt.Errorf("deployment %s: the resume on %s failed (%w); it runs on %s again: %w", id, m.To, err, m.From, ErrNotMoved)
	}
	return m, fmt.Errorf("deployment %s: the resume on %s failed (%w), and so did the one back on %s: it stays Suspended: %w", id, m.To, err, m.From, ErrNotMoved)
}

// followResume follows a resume until it runs, failed, or is Suspended
// again with why.
func followResume(ctx context.Context, st *state.Store, id string) (state.Deployment, error) {
	return st.Follow(ctx, id, func(d state.Deployment) bool {
		p := d.Status.Phase
		return p == spec.PhaseRunning || p == spec.PhaseFailed || p == spec.PhaseSuspended && d.Status.Error != ""
	})
}

// Drain cordons node and migrates every deployment that runs on it to
// the others, parallel at a time (at least 1), and reports what moved
// where; those that did not move say why.
func Drain(ctx context.Context, st *state.Store, node string, parallel int, reason string) ([]Moved, error) {
	if _, err := st.CordonNode(ctx, node, reason); err != nil {
		return nil, err
	}
	deps, err := st.Deployments(ctx)
	if err != nil {
		return nil, err
	}
	deps = slices.DeleteFunc(deps, func(d state.Deployment) bool { return d.Node != node || d.Status.Phase != spec.PhaseRunning })
	out := make([]Moved, len(deps))
	sem := make(chan struct{}, max(1, parallel))
	var wg sync.WaitGroup
	for i, d := range deps {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			m, err := Migrate(ctx, st, d.ID, "")
			if err != nil && m.Error == "" {
				m.Error = err.Error()
			}
			out[i] = m
		})
	}
	wg.Wait()
	var failed []string
	for _, m := range out {
		if m.To == "" || m.Error != "" {
			failed = append(failed, m.ID)
		}
	}
	if len(failed) > 0 {
		return out, fmt.Errorf("drain of %s: %d of %d deployment(s) did not move (%v): %w", node, len(failed), len(out), failed, ErrNotMoved)
	}
	return out, nil
}
