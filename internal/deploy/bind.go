package deploy

import (
	"context"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// bind hands slot s to deployment rec: the deployment's record takes the
// slot's resources and is Running, then the slot's record goes. A crash in
// between leaves both records naming the same resources; RecoverSlots then
// drops the slot's record.
func (d *Deployer) bind(ctx context.Context, o *op, s *Slot, rec *Deployment, dr drivers.Driver, app spec.App, readyPhase string) (Deployment, error) {
	rec.Owned, rec.Ports, rec.Phase = s.Owned, s.Ports, spec.PhaseRunning
	rec.Fetched = s.Fetched && rec.Pool != spec.PoolHit // a pool slot fetched before the request
	var err error
	if rec.Pool == spec.PoolHit {
		// A pool hit's first record (restore), written into the spare
		// its slot was given ahead: refused if a deployment took the ID
		// meanwhile.
		err = d.recs.createFrom(d.pool.slots.SparePath(s.ID), rec)
	} else {
		err = d.recs.save(rec)
	}
	if err != nil {
		return Deployment{}, err
	}
	o.phase(StepBind)
	d.pool.forget(s.ID)
	if err := d.pool.slots.Remove(s.ID); err != nil {
		d.log.Warn("removing a bound slot's record; recovery drops it", "slot", s.ID, "err", err)
	}
	// The engine's own time to ready, as the instance measured it, is
	// read once the deploy is done: it is not part of what it waits for.
	// A slot restored ahead has none; its record keeps the phases up to
	// ready (the deploy's answer and status have the bind's too): a pool
	// hit writes one record.
	if !rec.Ahead {
		if c, ok := dr.(*drivers.Container); ok {
			rec.EngineReadyMS = c.EngineReady(ctx, *s.Handle, app, readyPhase)
		}
		_ = d.recs.note(rec) // with the bind's timing
	}

	d.log.Info("deployed", "id", rec.ID, "app", rec.App, "mode", rec.Mode, "gen", rec.Gen, "slot", s.ID, "pool", rec.Pool,
		"ports", rec.Ports, "timings", rec.Timings.String())
	return *rec, nil
}
