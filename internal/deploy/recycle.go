// The recycle stage: an undeployed instance goes back to the warm pool as an idle slot, its
// container kept, its root reset to the generation's, instead of being removed while another slot
// is provisioned anew (clone, map, mount, container).

package deploy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/spec"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// SlotRecycling: a deployment's instance is being given back to the pool.
const SlotRecycling SlotPhase = "Recycling"

// StepRecycle is the recycle stage's timing (a slot's Timings).
const StepRecycle Step = "recycle"

// Recycle undeploys deployment id into an idle warm-pool slot of its
// generation on this node: its app ends, its root is reset to the
// generation's (what the instance wrote is dropped), and its instance
// waits for the next deployment, at background priority. Its resources
// pass to the slot's record before the deployment's goes; a crash on the
// way leaves a slot that RecoverSlots releases.
//
// A deployment whose instance cannot serve again (another driver, a boot,
// its own clone as root, an image without the entrypoint's -recycle) is
// ErrNotRecyclable and left as it was: Undeploy it. When recycling fails
// half way, everything is released as Undeploy does, and the error is
// returned.
func (p *Pool) Recycle(ctx context.Context, id string) (Slot, error) {
	rec, err := p.recs.Load(id)
	if err != nil {
		return Slot{}, err
	}
	dr, err := p.recycler(rec)
	if err != nil {
		return Slot{}, err
	}
	lower, err := p.envs.lowers.Load(rec.Lower)
	if err != nil {
		return Slot{}, fmt.Errorf("deployment %s: node copy %s: %w (%w)", id, rec.Lower, err, drivers.ErrNotRecyclable)
	}
	s := &Slot{ID: rec.Slot, App: rec.App, Node: p.cfg.Node, Gen: rec.Gen, Mode: drivers.RunRestart, Phase: SlotRecycling, Pool: true,
		Deployment: id, Owned: rec.Owned, Ports: rec.Ports, Created: time.Now().UTC()}
	if err := p.slots.Save(s.ID, s); err != nil {
		return Slot{}, err
	}
	// Its images no longer name the deployment: gc takes a clone of a
	// deployment that is gone for an orphan.
	for _, img := range s.Images {
		if err := p.deps.Store.SetMeta(ctx, img, map[string]string{catalog.MetaDeployment: ""}); err != nil && !errors.Is(err, layering.ErrNotFound) {
			return Slot{}, errors.Join(fmt.Errorf("recycle deployment %s: unmark image %s: %w", id, img, err), p.slots.Remove(s.ID))
		}
	}
	// From here the slot's record owns the resources (RecoverSlots keeps
	// the deployment's while both exist).
	if err := p.recs.remove(id); err != nil {
		_ = p.slots.Remove(s.ID)
		return Slot{}, err
	}
	o := p.stages.newOp(&s.Timings, nil)
	h, err := dr.Recycle(ctx, *rec.Handle, func(ctx context.Context) error { return p.envs.resetRoot(ctx, lower, s.Dir) })
	if err == nil {
		o.phase(StepRecycle)
		s.Handle, s.Phase, s.Deployment = &h, SlotIdle, ""
		err = p.slots.Reserve(s.ID)
		if err == nil {
			err = p.slots.Save(s.ID, s)
		}
		if err == nil {
			p.offer(s, nil)
		}
	}
	if err != nil {
		return Slot{}, errors.Join(fmt.Errorf("recycle deployment %s: %w", id, err), p.ReleaseSlot(context.WithoutCancel(ctx), s.ID))
	}
	p.log.Info("deployment recycled into a pool slot", "id", id, "slot", s.ID, "app", s.App, "gen", s.Gen, "timings", s.Timings.String())
	return *s, nil
}

// recycler returns the driver that can recycle rec's instance, or
// ErrNotRecyclable with the reason.
func (p *Pool) recycler(rec Deployment) (drivers.Recycler, error) {
	no := func(why string) error {
		return fmt.Errorf("deployment %s: %s: %w", rec.ID, why, drivers.ErrNotRecyclable)
	}
	switch {
	case rec.Phase != spec.PhaseRunning:
		return nil, no("not running (" + string(rec.Phase) + ")")
	case rec.Mode != spec.ModeRestore || rec.Slot == "":
		return nil, no("not a restore into a slot")
	case rec.Lower == "":
		return nil, no("its root is its own clone, not an overlay of the node's copy")
	case rec.Handle == nil || !rec.Handle.Recycle:
		return nil, no("its instance serves once")
	}
	dr, ok := p.drv.driverByName(rec.Handle.Driver).(drivers.Recycler)
	if !ok {
		return nil, no("driver " + rec.Handle.Driver + " cannot recycle")
	}
	return dr, nil
}
