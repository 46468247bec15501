// Deployment records: the journal of one instance on this node (StateDir/deployments/<id>.json),
// written before each step so that Undeploy and Adopt, in any process, undo exactly what
// was made.

package deploy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/journal"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// Records are this node's deployments' records.
type Records struct {
	*node
	drv         *Drivers
	deployments journal.Journal[Deployment]
}

// Records returns the node's deployment records.
func (d *Deployer) Records() *Records { return d.recs }

// Deployment is the record of one instance on this node.
type Deployment struct {
	ID  string `json:"id"`
	App string `json:"app"`
	spec.Instance
	// Owned is what the deployment owns once it has bound its slot;
	// until then, the slot's record owns them.
	Owned
	Created time.Time `json:"created"`
}

// Total is the sum of the phases.
func (d Deployment) Total() time.Duration {
	var t time.Duration
	for _, p := range d.Timings {
		t += p.Duration
	}
	return t
}

// Logs returns the last n lines of a deployment's output.
func (r *Records) Logs(ctx context.Context, id string, n int) ([]string, error) {
	rec, err := r.Load(id)
	if err != nil {
		return nil, err
	}
	if rec.Handle == nil {
		return nil, fmt.Errorf("deployment %s has no instance yet (phase %s)", id, rec.Phase)
	}
	dr := r.drv.driverByName(rec.Handle.Driver)
	if dr == nil {
		return nil, fmt.Errorf("%w: driver %q of deployment %s", drivers.ErrDriver, rec.Handle.Driver, id)
	}
	return dr.Logs(ctx, *rec.Handle, n)
}

// Targets is, for each TCP port of deployment id, the address and port
// where the node reaches its app directly (drivers.Targeter); ErrNoTargets
// for an instance whose driver has none (the host driver's).
func (r *Records) Targets(ctx context.Context, id string) (map[string]netip.AddrPort, error) {
	rec, err := r.Load(id)
	if err != nil {
		return nil, err
	}
	if rec.Handle == nil {
		return nil, fmt.Errorf("deployment %s has no instance yet (phase %s)", id, rec.Phase)
	}
	t, ok := r.drv.driverByName(rec.Handle.Driver).(drivers.Targeter)
	if !ok {
		return nil, fmt.Errorf("deployment %s: %w", id, ErrNoTargets)
	}
	return t.Targets(ctx, *rec.Handle)
}

// ErrNoTargets: an instance's driver gives no address of its own.
var ErrNoTargets = errors.New("no address of its own")

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

// DefaultAdoptWait is the default Config.AdoptWait.
const DefaultAdoptWait = 10 * time.Second

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

// List returns this node's deployment records, by ID.
func (r *Records) List() ([]Deployment, error) {
	return r.deployments.List()
}

// Load reads a deployment record.
func (r *Records) Load(id string) (Deployment, error) {
	if err := spec.ValidateID(id); err != nil {
		return Deployment{}, err
	}
	return r.deployments.Load(id)
}

// suspending reports a record that a suspend holds: Suspending (begun) or
// Suspended.
func suspending(r Deployment) bool {
	return (r.Phase == spec.PhaseSuspending || r.Phase == spec.PhaseSuspended) && r.Suspension != nil
}

// create writes a new deployment's record. It owns nothing yet, and the
// save that names its slot is durable before anything is made for it
// (provisionFor), or a claimed slot's record says whose it is: it need
// not wait for the disk.
func (r *Records) create(rec *Deployment) error { return r.deployments.Create(rec.ID, rec, false) }

func (r *Records) save(rec *Deployment) error { return r.deployments.Save(rec.ID, rec) }

func (r *Records) remove(id string) error { return r.deployments.Remove(id) }

// createFrom writes a new deployment's record from the spare record at
// path (journal.Journal.CreateFrom): refused if the ID is taken.
func (r *Records) createFrom(path string, rec *Deployment) error {
	return r.deployments.CreateFrom(path, rec.ID, rec)
}

// note saves rec without waiting for the disk (journal.Journal.Note).
func (r *Records) note(rec *Deployment) error { return r.deployments.Note(rec.ID, rec) }
