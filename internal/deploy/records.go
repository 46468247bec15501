// Deployment records: the journal of one instance on this node (StateDir/deployments/<id>.json),
// written before each step so that Undeploy, Recover and Adopt, in any process, undo exactly what
// was made.

package deploy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// Phases of a deployment.
const (
	PhaseCreating   = "Creating"
	PhaseBooting    = "Booting"
	PhaseRestoring  = "Restoring"
	PhaseRunning    = "Running"
	PhaseFailed     = "Failed"
	PhaseRemoving   = "Removing"
	PhaseCheckpoint = "Checkpointing"
	// PhaseCheckpointed ends a checkpoint refresh: a new generation is
	// sealed and no instance runs.
	PhaseCheckpointed = "Checkpointed"
)

// Deployment is the record of one instance on this node.
type Deployment struct {
	ID    string `json:"id"`
	App   string `json:"app"`
	Node  string `json:"node,omitempty"`
	Phase string `json:"phase"`
	// Gen is the checkpoint generation restored (0 while booting).
	Gen int `json:"gen"`
	// Mode is ModeRestore (from a checkpoint generation) or ModeBoot (the
	// app booted with no checkpoint engine; BootReason says why). Reason
	// says why a restore was chosen, when the caller said (mode auto).
	Mode       string `json:"mode"`
	BootReason string `json:"boot_reason,omitempty"`
	Reason     string `json:"reason,omitempty"`
	// Booted is set when this deploy had to produce the generation first.
	Booted bool `json:"booted,omitempty"`
	// Images are the RBD images this deployment owns.
	Images []string `json:"images,omitempty"`
	// Mappings are the mapper IDs of its mapped images.
	Mappings []string `json:"mappings,omitempty"`
	// Dir holds its mount points.
	Dir    string  `json:"dir,omitempty"`
	Handle *Handle `json:"handle,omitempty"`
	// Ports maps "6379/tcp" to the address where the instance answers.
	Ports map[string]string `json:"ports,omitempty"`
	// Timings are this deploy's phases in order; EngineReadyMS is the
	// engine's own restart-to-ready (or launch-to-ready) as measured
	// inside the instance, when the driver reports it.
	Timings       layering.Timings `json:"timings"`
	EngineReadyMS float64          `json:"engine_ready_ms,omitempty"`
	Error         string           `json:"error,omitempty"`
	Created       time.Time        `json:"created"`
}

// Total is the sum of the phases.
func (d Deployment) Total() time.Duration {
	var t time.Duration
	for _, p := range d.Timings {
		t += p.Duration
	}
	return t
}

// NewID returns a fresh deployment ID for app.
func NewID(app string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	if len(app) > MaxIDLen-9 {
		app = strings.TrimRight(app[:MaxIDLen-9], "-._")
	}
	return app + "-" + hex.EncodeToString(b)
}

// ValidateID checks a deployment ID.
func ValidateID(id string) error {
	if err := layering.ValidateName("deployment id", id); err != nil {
		return fmt.Errorf("%w: %w", err, ErrInvalidSpec)
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("deployment id %q is longer than %d characters: %w", id, MaxIDLen, ErrInvalidSpec)
	}
	return nil
}

// Logs returns the last n lines of a deployment's output.
func (d *Deployer) Logs(ctx context.Context, id string, n int) ([]string, error) {
	rec, err := d.Load(id)
	if err != nil {
		return nil, err
	}
	if rec.Handle == nil {
		return nil, fmt.Errorf("deployment %s has no instance yet (phase %s)", id, rec.Phase)
	}
	dr := d.driverByName(rec.Handle.Driver)
	if dr == nil {
		return nil, fmt.Errorf("%w: driver %q of deployment %s", ErrDriver, rec.Handle.Driver, id)
	}
	return dr.Logs(ctx, *rec.Handle, n)
}

// Adopt checks, at start, the deployments a previous run left on the
// node: a Running one whose instance still runs is kept; every other one
// (interrupted, failed, or whose instance is gone) is undeployed. It
// returns the kept and the removed IDs.
func (d *Deployer) Adopt(ctx context.Context) (kept, removed []string, err error) {
	recs, err := d.List()
	if err != nil {
		return nil, nil, err
	}
	var errs []error
	for _, r := range recs {
		if r.Phase == PhaseRunning && r.Handle != nil {
			if dr := d.driverByName(r.Handle.Driver); dr != nil {
				if ok, err := dr.Running(ctx, *r.Handle); err == nil && ok {
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

// Mappings returns the mapping IDs that deployment records own.
func (d *Deployer) Mappings() (map[string]bool, error) {
	recs, err := d.List()
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, r := range recs {
		for _, m := range r.Mappings {
			out[m] = true
		}
	}
	return out, nil
}

// List returns this node's deployment records, by ID.
func (d *Deployer) List() ([]Deployment, error) {
	ents, err := os.ReadDir(filepath.Join(d.cfg.StateDir, "deployments"))
	if err != nil {
		return nil, err
	}
	var out []Deployment
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		if rec, err := d.Load(id); err == nil {
			out = append(out, rec)
		}
	}
	return out, nil
}

// Load reads a deployment record.
func (d *Deployer) Load(id string) (Deployment, error) {
	if err := ValidateID(id); err != nil && !strings.HasPrefix(id, "boot-") {
		return Deployment{}, err
	}
	b, err := os.ReadFile(d.recordPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return Deployment{}, fmt.Errorf("deployment %s: %w", id, ErrNotFound)
	} else if err != nil {
		return Deployment{}, err
	}
	var rec Deployment
	if err := json.Unmarshal(b, &rec); err != nil {
		return Deployment{}, fmt.Errorf("deployment record %s: %w", id, err)
	}
	return rec, nil
}

// Recover undoes every deployment record left in a state other than
// Running (a deploy interrupted by a crash) and returns their IDs.
func (d *Deployer) Recover(ctx context.Context) ([]string, error) {
	recs, err := d.List()
	if err != nil {
		return nil, err
	}
	var done []string
	var errs []error
	for _, r := range recs {
		if r.Phase == PhaseRunning {
			continue
		}
		if err := d.Undeploy(ctx, r.ID); err != nil {
			errs = append(errs, err)
			continue
		}
		done = append(done, r.ID)
	}
	return done, errors.Join(errs...)
}

func (d *Deployer) recordPath(id string) string {
	return filepath.Join(d.cfg.StateDir, "deployments", id+".json")
}

func (d *Deployer) create(rec *Deployment) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.OpenFile(d.recordPath(rec.ID), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("deployment %s: %w", rec.ID, ErrExists)
	} else if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err = errors.Join(err, f.Sync(), f.Close()); err != nil {
		// A record cut short (a full disk) is unreadable, and would
		// stay behind with its ID taken.
		_ = os.Remove(d.recordPath(rec.ID))
	}
	return err
}

// save replaces a record atomically.
func (d *Deployer) save(rec *Deployment) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	tmp := d.recordPath(rec.ID) + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err = errors.Join(err, f.Sync(), f.Close()); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, d.recordPath(rec.ID))
}

func (d *Deployer) remove(id string) error {
	err := os.Remove(d.recordPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}
