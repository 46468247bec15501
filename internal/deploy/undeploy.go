// Undeploy: stop an instance and remove its container, mounts, mappings and clones, evicting the
// watches that killed clients left.

package deploy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
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

// releaseResources removes what an instance owns: its instance (and any
// instance the drivers find labelled with one of sweep, which a crash may
// have left unrecorded), its mappings, its images and its directory.
func (sg *Stages) releaseResources(ctx context.Context, who string, res Owned, sweep ...string) error {
	var errs []error
	if res.Handle != nil {
		if dr := sg.drv.driverByName(res.Handle.Driver); dr != nil {
			if err := sg.removeInstance(ctx, dr, *res.Handle); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, dr := range []drivers.Driver{sg.deps.Container, sg.deps.Host} {
		s, ok := dr.(drivers.Sweeper)
		if !ok || dr == nil {
			continue
		}
		for _, id := range sweep {
			if id == "" {
				continue
			}
			if err := s.RemoveDeployment(ctx, id); err != nil {
				errs = append(errs, fmt.Errorf("remove unrecorded instances: %w", err))
			}
		}
	}
	// The overlay root stacks on the clone's mount: it goes first.
	if err := sg.envs.unmountRoot(ctx, res.Dir); err != nil {
		errs = append(errs, fmt.Errorf("unmount root: %w", err))
	}
	if err := sg.releaseMappings(ctx, res.Mappings); err != nil {
		errs = append(errs, err)
	}
	rmErrs := make([]error, len(res.Images))
	var wg sync.WaitGroup
	for i, img := range res.Images {
		wg.Go(func() { rmErrs[i] = sg.removeImage(ctx, who, img) })
	}
	wg.Wait()
	for i, err := range rmErrs {
		// A parent (a resumed suspension's image) goes after its clone:
		// once more, in order.
		if errors.Is(err, layering.ErrHasChildren) {
			rmErrs[i] = sg.removeImage(ctx, who, res.Images[i])
		}
	}
	for i, err := range rmErrs {
		if err != nil && !errors.Is(err, layering.ErrNotFound) {
			errs = append(errs, fmt.Errorf("remove image %s: %w", res.Images[i], err))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return removeDir(res.Dir)
}

// removeInstance removes instance h within its driver's stop timeout and
// Config.StopGrace: an instance whose process does not exit (blocked in
// the kernel on a mapping whose I/O stalled) fails with
// context.DeadlineExceeded instead of waiting without end.
func (sg *Stages) removeInstance(ctx context.Context, dr drivers.Driver, h drivers.Handle) error {
	bound := sg.cfg.StopGrace
	if bound == 0 {
		bound = DefaultStopGrace
	}
	if c, ok := dr.(*drivers.Container); ok {
		bound += c.StopTimeoutOrDefault()
	} else {
		bound += drivers.DefaultStopTimeout
	}
	rctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	err := dr.Remove(rctx, h)
	if err != nil && ctx.Err() == nil && errors.Is(rctx.Err(), context.DeadlineExceeded) {
		return hint.With(fmt.Errorf("remove instance %s: it did not exit within %s: %w", h.Ref, bound, context.DeadlineExceeded),
			"a process of it is blocked in the kernel, most likely on its image's I/O (`ceph -s`): cutting its mappings off ends the wait (the agent does, then retries)")
	}
	if err != nil {
		return fmt.Errorf("remove instance: %w", err)
	}
	return nil
}
