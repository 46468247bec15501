// A node's start: what a previous run left (Adopt), and the mappings the
// records own, which the mapper keeps (Mappings).

package deploy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// Adopt checks, at start, the deployments a previous run left on the
// node: a Running one whose instance still runs is kept, and so is one
// being suspended (Suspend goes on from where it stopped) or suspended
// (its caller records its suspension); every other one (interrupted,
// failed, or whose instance is gone) is undeployed. A Running one whose
// driver cannot tell yet whether it runs (a dockerd that answers late at
// the node's start) is asked again for up to Config.AdoptWait, and kept if it
// still cannot tell: an instance is never removed on a doubt (the
// agent's liveness check finds it later if it is gone); the error names
// it. It returns the kept and the removed IDs.
func (d *Deployer) Adopt(ctx context.Context) (kept, removed []string, err error) {
	recs, err := d.recs.List()
	if err != nil {
		return nil, nil, err
	}
	var errs []error
	for _, r := range recs {
		if suspending(r) {
			kept = append(kept, r.ID)
			continue
		}
		if r.Phase == spec.PhaseRunning && r.Handle != nil {
			if dr := d.drv.driverByName(r.Handle.Driver); dr != nil {
				ok, err := runningSoon(ctx, dr, *r.Handle, d.cfg.AdoptWait)
				if err != nil {
					kept = append(kept, r.ID)
					errs = append(errs, fmt.Errorf("deployment %s kept: its driver cannot tell whether it runs: %w", r.ID, err))
					continue
				}
				if ok {
					kept = append(kept, r.ID)
					continue
				}
			}
		}
		if err := d.Undeploy(ctx, r.ID); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, r.ID)
	}
	return kept, removed, errors.Join(errs...)
}

// runningSoon asks dr whether h runs until it answers, for up to wait.
func runningSoon(ctx context.Context, dr drivers.Driver, h drivers.Handle, wait time.Duration) (bool, error) {
	deadline := time.Now().Add(wait)
	for backoff := 50 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		ok, err := dr.Running(ctx, h)
		if err == nil || time.Now().Add(backoff).After(deadline) {
			return ok, err
		}
		select {
		case <-ctx.Done():
			return false, errors.Join(err, ctx.Err())
		case <-time.After(backoff):
		}
	}
}

// Mappings returns the mapping IDs that deployment and slot records own.
func (d *Deployer) Mappings() (map[string]bool, error) {
	recs, err := d.recs.List()
	if err != nil {
		return nil, err
	}
	slots, err := d.pool.Slots()
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, r := range recs {
		for _, m := range r.Mappings {
			out[m] = true
		}
	}
	for _, s := range slots {
		for _, m := range s.Mappings {
			out[m] = true
		}
	}
	// The node's copies of environments are kept across restarts.
	lowers, err := d.envs.lowers.List()
	if err != nil {
		return nil, err
	}
	for _, l := range lowers {
		out[l.ID] = true
	}
	return out, nil
}

// DefaultAdoptWait is the default Config.AdoptWait.
const DefaultAdoptWait = 10 * time.Second
