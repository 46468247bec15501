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
