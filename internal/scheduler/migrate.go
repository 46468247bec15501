// Migrate and drain: a running deployment moved to another node with its state, as a suspend on
// its node and a resume on the other, which the agents carry on (state.RequestMigrate, state.MoveOn).

package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

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
// suspends it, the target resumes it (state.RequestMigrate; the agents
// carry the move on, state.MoveOn, whether or not this call sees it end).
// A resume that fails on the target is resumed back on its first node; it
// is never on two nodes. Migrate follows the move to its end and reports.
func Migrate(ctx context.Context, st *state.Store, id, node string) (Moved, error) {
	start := time.Now()
	d, err := st.RequestMigrate(ctx, id, node)
	m := Moved{ID: id, App: d.App, From: d.Node}
	if err != nil {
		return m, err
	}
	if d.Move != nil {
		m.From = d.Move.From
	}
	var bytes int64
	left := false // a phase other than Running seen: its suspend began
	end, err := st.Follow(ctx, id, func(d state.Deployment) bool {
		if s := d.Status.Suspension; s != nil && s.Bytes > 0 {
			bytes = s.Bytes
		}
		left = left || d.Status.Phase != spec.PhaseRunning
		return moveEnded(d, m.From, left)
	})
	m.Bytes = bytes
	if err != nil {
		return m, err
	}
	switch {
	case end.Status.Phase == spec.PhaseRunning && end.Status.Node != m.From:
		m.To, m.Ports = end.Status.Node, end.Status.Ports
		m.Downtime, m.Total = time.Since(start), time.Since(start)
		return m, nil
	case end.Status.Phase == spec.PhaseRunning && end.Move != nil && end.Move.Back:
		m.To, m.Back, m.Ports, m.Error = end.Move.To, true, end.Status.Ports, end.Move.Error
		return m, fmt.Errorf("deployment %s: %s; it runs on %s again: %w", id, end.Move.Error, m.From, ErrNotMoved)
	case end.Status.Phase == spec.PhaseRunning:
		// Its suspend failed before its checkpoint: it ran on.
		m.Error = "its suspend did not begin; it runs on " + m.From
		return m, fmt.Errorf("deployment %s: %s: %w", id, m.Error, ErrNotMoved)
	}
	m.Error = end.Status.Error
	return m, fmt.Errorf("deployment %s is %s: %s: %w", id, end.Status.Phase, end.Status.Error, ErrNotMoved)
}

// moveEnded says whether the migration of d, from node from, has ended:
// Running on another node, or on from again once its suspend did not
// begin or its move came back (left: its status has been in another
// phase since); Failed; or Suspended with the move over. Its status and
// its desired record are watched apart: the status's node is the one it
// runs on.
func moveEnded(d state.Deployment, from string, left bool) bool {
	switch d.Status.Phase {
	case spec.PhaseRunning:
		return left && d.Status.Node != from || d.Move == nil || left && d.Move.Back
	case spec.PhaseFailed:
		return true
	case spec.PhaseSuspended:
		return d.Move == nil && d.Status.Error != ""
	}
	return false
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
