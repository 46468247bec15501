// Releasing what a slot or a deployment owns: its instance, its mounts,
// its mappings and its images, in that order.

package deploy

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

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
