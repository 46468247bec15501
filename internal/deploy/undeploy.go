// Undeploy: stop an instance and remove its container, mounts, mappings and clones, evicting the
// watches that killed clients left.

package deploy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// Undeploy stops a deployment's instance, unmounts and unmaps its clones,
// removes them and its record; a slot it had not bound yet is released
// too. It is idempotent and finishes what a failed or interrupted deploy
// left.
func (d *Deployer) Undeploy(ctx context.Context, id string) error {
	rec, err := d.recs.Load(id)
	if err != nil {
		return err
	}
	rec.Phase = spec.PhaseRemoving
	_ = d.recs.save(&rec)
	var errs []error
	if rec.Slot != "" {
		if s, err := d.pool.slots.Load(rec.Slot); err == nil && s.Deployment == id {
			errs = append(errs, d.pool.ReleaseSlot(ctx, s.ID))
		}
	}
	errs = append(errs, d.stages.releaseResources(ctx, id, rec.Owned, id, rec.Slot))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return d.recs.remove(id)
}

// CutOff cuts off the I/O of deployment id's mappings, and of those of
// the slot it was starting in (a deploy that failed before it bound its
// slot owns none yet), where their backend can block forever on a cluster
// that stopped serving them (mapper.Mapper.Abort): every process blocked
// on them (its app, an unmount) returns, so that Undeploy can stop the
// instance and release them. The mappings stay recorded until then.
func (d *Deployer) CutOff(ctx context.Context, id string) error {
	rec, err := d.recs.Load(id)
	if err != nil {
		return err
	}
	maps := slices.Clone(rec.Mappings)
	var errs []error
	if rec.Slot != "" {
		// The deployment's own are cut off even if the slot's cannot be
		// listed.
		all, err := d.deps.Mapper.List()
		if err != nil {
			errs = append(errs, fmt.Errorf("list the mappings of slot %s: %w", rec.Slot, err))
		}
		for _, mp := range all {
			if strings.HasPrefix(mp.ID, rec.Slot+"-") && !slices.Contains(maps, mp.ID) {
				maps = append(maps, mp.ID)
			}
		}
	}
	for _, m := range maps {
		if err := d.deps.Mapper.Abort(ctx, m); err != nil && !errors.Is(err, mapper.ErrNotMapped) {
			errs = append(errs, fmt.Errorf("cut off mapping %s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}
