// The warm pool's slots on this node: provisioned ahead of any request, at background priority,
// for an app's newest generation; a restore takes one (claim, in slots.go) and runs only start,
// ready and bind. Which apps get how many is the agent's policy (pop-agent/agent/pool.go).

package deploy

import (
	"context"
	"errors"
	"fmt"
	"sort"
)

// SlotReleasing: an idle slot being released (dropped from the pool).
const SlotReleasing SlotPhase = "Releasing"

// ProvisionPoolSlot provisions one warm-pool slot of generation g: clones
// of both snapshots, mapped and mounted, and the instance created at
// background priority, its entrypoint waiting. On error nothing of it is
// left.
func (d *Deployer) ProvisionPoolSlot(ctx context.Context, g Generation) (_ Slot, err error) {
	app := g.Spec.WithDefaults()
	if _, err := d.driver(g.Engine); err != nil {
		return Slot{}, err
	}
	s, err := d.newSlot(app.Name, g.Gen, RunRestart, true, "", nil)
	if err != nil {
		return Slot{}, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, d.ReleaseSlot(context.WithoutCancel(ctx), s.ID))
		}
	}()
	o := d.newOp(&s.Timings, nil)
	if err := d.provision(ctx, o, s, slotSource{app: app, engine: g.Engine, env: g.EnvSnap, gen: &g,
		config: d.genConfig(ctx, g)}); err != nil {
		return Slot{}, err
	}
	d.log.Info("pool slot provisioned", "slot", s.ID, "app", s.App, "gen", s.Gen, "timings", s.Timings.String())
	return *s, nil
}

// PoolSlots returns the warm pool's slots on this node, oldest first:
// idle, and being provisioned, claimed or released.
func (d *Deployer) PoolSlots() ([]Slot, error) {
	all, err := d.Slots()
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
// all of them), e.g. those of a generation that is no longer the newest.
// A slot being claimed meanwhile is left to its deployment. It returns the
// released IDs.
func (d *Deployer) DropPool(ctx context.Context, app string, drop func(Slot) bool) ([]string, error) {
	d.slotMu.Lock()
	all, err := d.slots.list()
	var picked []Slot
	for _, s := range all {
		if err == nil && s.Pool && s.App == app && s.Phase == SlotIdle && (drop == nil || drop(s)) {
			s.Phase = SlotReleasing
			if serr := d.slots.save(s.ID, &s); serr != nil {
				err = serr
				break
			}
			picked = append(picked, s)
		}
	}
	d.slotMu.Unlock()
	var done []string
	var errs []error
	for _, s := range picked {
		if rerr := d.ReleaseSlot(ctx, s.ID); rerr != nil {
			errs = append(errs, fmt.Errorf("slot %s: %w", s.ID, rerr))
			continue
		}
		done = append(done, s.ID)
	}
	return done, errors.Join(append(errs, err)...)
}

// ReleasePool releases every idle pool slot on this node (at shutdown).
func (d *Deployer) ReleasePool(ctx context.Context) ([]string, error) {
	slots, err := d.PoolSlots()
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
		ids, err := d.DropPool(ctx, s.App, nil)
		out = append(out, ids...)
		errs = append(errs, err)
	}
	return out, errors.Join(errs...)
}
