package deploy

import (
	"context"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// WriteIdentity is writeIdentity, for the external tests.
var WriteIdentity = writeIdentity

// DirectDial is directDial.
var DirectDial = directDial

// PauseAhead holds every StartAhead of d for p before its restore, so that
// a test's deploy arrives while the slot is being restored ahead.
func PauseAhead(d *Deployer, p time.Duration) { d.pool.aheadPause = p }

// AttachSpare is what a restore of g into a spare slot does up to its
// start (takeSpare: the deployment's record created, the spare claimed
// and attached), for a test that then stops as a killed process would.
func AttachSpare(ctx context.Context, d *Deployer, app spec.App, g spec.Generation, id string) (Slot, error) {
	rec := &Deployment{ID: id, App: app.Name, Instance: spec.Instance{Node: d.cfg.Node, Phase: spec.PhaseRestoring, Gen: g.Gen, Engine: g.Engine, Mode: spec.ModeRestore}}
	s, err := d.pool.takeSpare(ctx, d.stages.newOp(&rec.Timings, nil), rec, restoredSpec(g, app), g)
	if err != nil {
		return Slot{}, err
	}
	return *s, nil
}
