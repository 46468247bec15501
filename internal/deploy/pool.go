// The warm pool's slots on this node: provisioned ahead of any request, at background priority,
// for an app's newest generation; a restore takes one (claim, in slots.go) and runs only start,
// ready and bind. Which apps get how many is the agent's policy (pop-agent/agent/pool.go).

package deploy

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// SlotReleasing: an idle slot being released (dropped from the pool, or a
// spare released), or whose release failed and is to be done again.
const SlotReleasing SlotPhase = "Releasing"

// ProvisionPoolSlot provisions one warm-pool slot of generation g: clones
// of both snapshots, mapped and mounted, and the instance created at
// background priority, its entrypoint waiting. On error nothing of it is
// left.
func (p *Pool) ProvisionPoolSlot(ctx context.Context, g spec.Generation) (_ Slot, err error) {
	app := g.Spec.WithDefaults()
	if _, err := p.drv.driver(app, g.Engine); err != nil {
		return Slot{}, err
	}
	s, err := p.newSlot(app.Name, g.Gen, drivers.RunRestart, true, "", nil)
	if err != nil {
		return Slot{}, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.ReleaseSlot(context.WithoutCancel(ctx), s.ID))
		}
	}()
	o := p.stages.newOp(&s.Timings, nil)
	if err := p.stages.provision(ctx, o, s, slotSource{app: app, engine: g.Engine, env: g.EnvSnap, gen: &g,
		config: p.stages.genConfig(ctx, g)}); err != nil {
		return Slot{}, err
	}
	// The record of the deployment that binds the slot is written there.
	if err := p.slots.Reserve(s.ID); err != nil {
		return Slot{}, fmt.Errorf("pool slot %s: %w", s.ID, err)
	}
	p.offer(s, &g)
	p.log.Info("pool slot provisioned", "slot", s.ID, "app", s.App, "gen", s.Gen, "timings", s.Timings.String())
	return *s, nil
}

// idleSlot is what this process knows of one of its idle pool slots: the
// index (Deployer.idle) that claims pick from without reading a record.
// A slot is in it exactly while its record is SlotIdle and no stage has
// taken it (claim, StartAhead, DropPool, ReleaseSlot take it out first,
// under slotMu); recovery at start releases every slot a previous process
// left, so the index of a new process starts empty and complete.
type idleSlot struct {
	// slot is its record as last saved: a claim takes it from here.
	slot Slot
	// filled is the generation it was provisioned or restored ahead
	// with, for pooledGen (nil for a recycled slot until it is restored
	// ahead again).
	filled *spec.Generation
}

// offer puts idle pool slot s (its record as saved), of generation filled
// if known, in the index: deploys may claim it from now on.
func (p *Pool) offer(s *Slot, filled *spec.Generation) {
	p.slotMu.Lock()
	p.idle[s.ID] = idleSlot{slot: *s, filled: filled}
	p.slotMu.Unlock()
}

// withdraw takes slot id out of the index, and reports whether it was
// there (idle and untaken). The caller holds slotMu.
func (p *Pool) withdraw(id string) bool {
	_, ok := p.idle[id]
	delete(p.idle, id)
	return ok
}

// forget takes slot id out of the indexes (the pool's, the spares') and
// its claim (it is bound or released).
func (p *Pool) forget(id string) {
	p.slotMu.Lock()
	p.withdraw(id)
	delete(p.claimed, id)
	delete(p.spares, id)
	p.slotMu.Unlock()
}

// pooledGen returns the generation of app that an idle pool slot on this
// node was filled with, and, with eng set, of that engine: a deploy that
// finds one needs none of a full deploy's lookups (the engine's check, the
// generation's record and whether this node can restore it), which the
// refill made before the request. Whether a generation was made since is
// one read of the pool (newerGen), which runs meanwhile: fresh waits for
// its answer and returns errNewerGen when there is one, and the deploy
// restores the newest instead. A generation retired since the refill is
// still restored until the agent's next refill drops its slots (its
// removal waits for the deployment, as for any other).
func (p *Pool) pooledGen(ctx context.Context, app spec.App, eng engine.Name) (g spec.Generation, fresh func() error, ok bool) {
	best, ok := p.WaitingSlot(app, eng)
	if !ok {
		return spec.Generation{}, nil, false
	}
	newer := async(func() error { return p.ckpts.stillNewest(ctx, app.Name, best.Gen) })
	return best, newer, true
}

// WaitingSlot returns the newest generation of which an idle pool slot of
// app waits on this node (idle, or being restored ahead), of engine eng
// ("": any), made from app's process; ok is false if none does. It reads
// the deployer's memory only.
func (p *Pool) WaitingSlot(app spec.App, eng engine.Name) (g spec.Generation, ok bool) {
	p.slotMu.Lock()
	defer p.slotMu.Unlock()
	var best *spec.Generation
	pick := func(g *spec.Generation) {
		if g != nil && g.App == app.Name && (eng == "" || g.Engine == eng) && (len(g.Spec.Command) == 0 || g.Spec.SameProcess(app)) &&
			(best == nil || g.Gen > best.Gen) {
			best = g
		}
	}
	for _, s := range p.idle {
		pick(s.filled)
	}
	for _, s := range p.starting {
		pick(&s.filled) // restore waits for it (awaitStarting)
	}
	if best == nil {
		return spec.Generation{}, false
	}
	return *best, true
}

// errNewerGen: the app may have a generation newer than its pool slots'
// (pooledGen); the deploy looks the newest up and restores it.
var errNewerGen = errors.New("newer generation")

// appGen names one generation of an app.
type appGen struct {
	app string
	gen int
}

// PoolSlots returns the warm pool's slots on this node, oldest first:
// idle, and being provisioned, claimed or released.
func (p *Pool) PoolSlots() ([]Slot, error) {
	all, err := p.Slots()
	if err != nil {
		return nil, err
	}
	var out []Slot
	for _, s := range all {
		if s.Pool {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, nil
}

// DropPool releases the idle pool slots of app that drop says to (nil:
// all of them), e.g. those of a generation that is no longer the newest,
// and those of app whose release failed before (a cluster that did not
// answer). A slot being claimed or restored ahead meanwhile is left to its
// stage. A release once started runs to its end, whatever ctx says, so
// that an agent shutting down leaves no half-released slot. It returns
// the released IDs.
func (p *Pool) DropPool(ctx context.Context, app string, drop func(Slot) bool) ([]string, error) {
	p.slotMu.Lock()
	all, err := p.slots.List()
	if err != nil {
		p.slotMu.Unlock()
		return nil, err
	}
	var picked []Slot
pick:
	for _, s := range all {
		if !s.Pool || s.App != app || p.releasing[s.ID] {
			continue
		}
		switch _, idle := p.idle[s.ID]; {
		case s.Phase == SlotReleasing: // its release failed before: again
			p.releasing[s.ID] = true
		case s.Phase == SlotIdle && idle && (drop == nil || drop(s)):
			if err = p.markReleasing(&s); err != nil {
				break pick
			}
			p.withdraw(s.ID)
		default:
			continue
		}
		picked = append(picked, s)
	}
	p.slotMu.Unlock()
	done, rerr := p.releasePicked(ctx, picked)
	return done, errors.Join(rerr, err)
}

// markReleasing records idle slot s as being released (its record says
// Releasing, and d.releasing holds it) before its release begins: should
// the release fail, the record says so, and the next DropPool of its app
// (a pool slot) or ReleaseSpares (a spare) does it again. The caller
// holds slotMu and takes s out of its index.
func (p *Pool) markReleasing(s *Slot) error {
	s.Phase = SlotReleasing
	if err := p.slots.Save(s.ID, s); err != nil {
		return err
	}
	p.releasing[s.ID] = true
	return nil
}

// releasePicked releases the slots that markReleasing marked (or whose
// failed release is retried, in d.releasing too), and then takes them out
// of d.releasing, released or not.
func (p *Pool) releasePicked(ctx context.Context, picked []Slot) ([]string, error) {
	done, err := p.releaseSlots(ctx, picked)
	p.slotMu.Lock()
	for _, s := range picked {
		delete(p.releasing, s.ID)
	}
	p.slotMu.Unlock()
	return done, err
}

// releaseSlots releases slots (taken out of the indexes already) and
// returns the IDs of those it released. Each release runs to its end
// whatever ctx says: a slot out of the indexes that stays half released
// would wait for the agent's next start.
func (p *Pool) releaseSlots(ctx context.Context, slots []Slot) ([]string, error) {
	ctx = context.WithoutCancel(ctx)
	var done []string
	var errs []error
	for _, s := range slots {
		if err := p.ReleaseSlot(ctx, s.ID); err != nil {
			errs = append(errs, fmt.Errorf("slot %s: %w", s.ID, err))
			continue
		}
		done = append(done, s.ID)
	}
	return done, errors.Join(errs...)
}

// ReleasePool releases every idle pool slot on this node (at shutdown).
func (p *Pool) ReleasePool(ctx context.Context) ([]string, error) {
	slots, err := p.PoolSlots()
	if err != nil {
		return nil, err
	}
	apps := map[string]bool{}
	var out []string
	var errs []error
	for _, s := range slots {
		if apps[s.App] {
			continue
		}
		apps[s.App] = true
		ids, err := p.DropPool(ctx, s.App, nil)
		out = append(out, ids...)
		errs = append(errs, err)
	}
	return out, errors.Join(errs...)
}
