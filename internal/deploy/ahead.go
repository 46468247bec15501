// The ahead stage: a warm pool's idle slot whose app is restored before any request, at the
// background CPU weight, and then waits, running at that weight. A deploy that takes it raises it
// to the normal weight (its start stage, in stages.go), probes it once (ready) and binds it: the
// engine's restart is off its critical path. The price is the app's memory for as long as the
// slot waits.

package deploy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// Slot phases and steps of the ahead stage.
const (
	// SlotStarting: an idle pool slot being restored ahead (StartAhead);
	// no deploy takes it meanwhile.
	SlotStarting SlotPhase = "Starting"
	// StepRaise: a deploy raised the instance of a slot restored ahead to
	// the normal CPU weight.
	StepRaise Step = "raise"
)

// ErrNotAhead: a slot cannot be restored ahead (its driver cannot keep an
// instance at background priority, or it is not an idle pool slot waiting
// for an order).
var ErrNotAhead = errors.New("cannot restore ahead")

// CanStartAhead says why slots of generation g cannot be restored ahead on
// this node (nil: they can): their app would wait at normal priority,
// competing with the serving instances.
func (p *Pool) CanStartAhead(g spec.Generation) error {
	dr, err := p.drv.driver(g.Spec, g.Engine)
	if err != nil {
		return err
	}
	if _, ok := dr.(drivers.Raiser); !ok {
		return fmt.Errorf("driver %s cannot run an instance at background priority: %w", dr.Name(), ErrNotAhead)
	}
	if c, ok := dr.(*drivers.Container); ok && c.Priority == nil {
		return fmt.Errorf("this node's cgroups cannot be reweighted: %w", ErrNotAhead)
	}
	return nil
}

// StartAhead restores the app of idle pool slot id (of generation g) before
// any request and leaves it running at the slot's background CPU weight. A
// deploy that takes the slot raises it to the normal weight and runs the
// app's post_restore with its own identity. On error the slot is released.
func (p *Pool) StartAhead(ctx context.Context, g spec.Generation, id string) (_ Slot, err error) {
	if err := p.CanStartAhead(g); err != nil {
		return Slot{}, err
	}
	p.slotMu.Lock()
	s, err := p.slots.Load(id)
	if _, idle := p.idle[id]; err == nil && (!s.Pool || s.Phase != SlotIdle || s.Ahead || s.Mode != drivers.RunRestart || s.Handle == nil || s.Gen != g.Gen || s.App != g.App || !idle) {
		err = fmt.Errorf("slot %s (%s, generation %d of %s): not an idle pool slot waiting for an order: %w", id, s.Phase, s.Gen, s.App, ErrNotAhead)
	}
	if err == nil {
		s.Phase = SlotStarting
		if err = p.slots.Save(id, &s); err == nil {
			p.withdraw(id) // no deploy claims it while it is Starting
		}
	}
	var st *startingSlot
	if err == nil {
		// A deploy that finds no idle slot meanwhile waits for this one
		// (awaitStarting) rather than provisioning its own.
		st = &startingSlot{app: s.App, gen: s.Gen, filled: g, handle: *s.Handle, done: make(chan struct{})}
		p.starting[id] = st
	}
	p.slotMu.Unlock()
	if err != nil {
		return Slot{}, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("restore slot %s ahead: %w", id, err), p.ReleaseSlot(context.WithoutCancel(ctx), id))
		}
		p.slotMu.Lock()
		delete(p.starting, id)
		p.slotMu.Unlock()
		close(st.done)
	}()
	if p.aheadPause > 0 {
		time.Sleep(p.aheadPause) // tests: a deploy arrives meanwhile
	}
	app := g.Spec.WithDefaults()
	app.PostRestore = nil // it runs when a deployment binds the slot, with its identity
	timings := s.Timings
	o := p.stages.newOp(&timings, nil)
	o.merge = p.cfg.MemoryMerge
	// Start must not raise the slot's weight: the app restores and waits
	// at background priority, and the deploy that binds it raises it.
	bg := s.Handle.Background
	s.Handle.Background = false
	_, h, err := p.stages.startReady(ctx, o, &s, s.ID, app, true)
	if err != nil {
		return Slot{}, err
	}
	h.Background = bg
	p.slotMu.Lock()
	s.Handle, s.Ahead, s.Phase, s.Timings = &h, true, SlotIdle, timings
	err = p.slots.Save(id, &s)
	p.slotMu.Unlock()
	if err != nil {
		return Slot{}, err
	}
	p.offer(&s, &g)
	p.log.Info("pool slot restored ahead", "slot", s.ID, "app", s.App, "gen", s.Gen, "timings", timings.String())
	return s, nil
}

// startingSlot is a pool slot being restored ahead (StartAhead), as a
// deploy that finds no idle slot sees it.
type startingSlot struct {
	app    string
	gen    int
	filled spec.Generation
	// handle is its instance, running its entrypoint at background
	// priority: a deploy that waits for it raises it.
	handle drivers.Handle
	// promised is set once a deploy waits for it: one waiter per slot.
	promised bool
	// done is closed when StartAhead ends (the slot idle, or released).
	done chan struct{}
}

// StepAwait: a deploy that found no idle slot waited for one being
// restored ahead (raised to the normal weight meanwhile).
const StepAwait Step = "await"

// awaitStarting waits for a slot of app's generation gen that is being
// restored ahead and that no other deploy waits for, raising it to the
// normal weight first so that its restore no longer runs in the
// background; it reports whether there was one. The slot is then offered
// like any other idle slot, for the caller's next claim.
func (p *Pool) awaitStarting(ctx context.Context, app string, gen int) bool {
	p.slotMu.Lock()
	var st *startingSlot
	for _, c := range p.starting {
		if c.app == app && c.gen == gen && !c.promised {
			st = c
			break
		}
	}
	if st != nil {
		st.promised = true
	}
	p.slotMu.Unlock()
	if st == nil {
		return false
	}
	if r, ok := p.drv.driverByName(st.handle.Driver).(drivers.Raiser); ok {
		h := st.handle
		h.Background = true
		if _, err := r.Raise(ctx, h); err != nil {
			p.log.Debug("raising a slot being restored ahead for a waiting deploy", "app", app, "err", err)
		}
	}
	select {
	case <-st.done:
		return true
	case <-ctx.Done():
		return false
	}
}
