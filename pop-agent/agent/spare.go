// The spare slots' keeper: agent.spare_slots idle spare slots per engine whose driver makes them on
// this node (deploy.Pool.ProvisionSpare), none while the node is cordoned, made one at a time at
// background priority once no deploy is under way, within the node's capacity.

package agent

import (
	"context"
	"errors"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/prometheus/client_golang/prometheus"
)

// spareEngines are the engines spares are kept for.
var spareEngines = engine.NamesWith(func(f engine.Facts) bool { return f.SpareSlots })

// registerSpares makes and registers the spare slots' metrics.
func (m *metrics) registerSpares(reg prometheus.Registerer) {
	m.spareTaken = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fogdeploy_spare_slots_taken_total", Help: "Restores that found no idle warm-pool slot of their app and took a spare slot (made for no app) on this node, by engine.",
	}, []string{"engine"})
	m.spareIdle = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fogdeploy_spare_slots_idle", Help: "Idle spare slots on this node, by engine (agent.spare_slots per engine).",
	}, []string{"engine"})
	m.spareRefill = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "fogdeploy_spare_refill_seconds", Help: "Time to provision one spare slot (clone, map, mount, create).",
		Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8},
	})
	reg.MustRegister(m.spareTaken, m.spareIdle, m.spareRefill)
}

// refillSpares keeps agent.spare_slots idle spares of each engine that
// this node makes spares of (none when cordoned): extra ones are
// released, missing ones made while the node has room. An engine whose
// spares cannot be made now keeps those it has.
func (a *agent) refillSpares(ctx context.Context, cordoned bool) {
	want := a.c.Agent.SpareSlots
	if cordoned {
		want = 0
	}
	cannot, idle := map[engine.Name]error{}, map[engine.Name]int{}
	for _, eng := range spareEngines {
		if want > 0 {
			if err := a.d.Pool().MakesSpares(ctx, eng); err != nil {
				a.log.Debug("spare slots: this node makes none of this engine now", "engine", eng, "err", err)
				cannot[eng] = err
				idle[eng], _ = a.idleSpares(eng) // what it keeps
			}
		}
	}
	wants, size := spareWants(want, spareEngines, cannot, idle)
	defer a.publishSpares(ctx, size)
	for _, eng := range spareEngines {
		n := wants[eng]
		for ctx.Err() == nil {
			idle, unreleased := a.idleSpares(eng)
			a.m.spareIdle.WithLabelValues(string(eng)).Set(float64(idle))
			if idle > n || unreleased > 0 {
				// Extra spares, and those whose release failed before.
				ids, err := a.d.Pool().ReleaseSpares(ctx, eng, max(idle-n, 0))
				if err != nil {
					a.log.Warn("spare slots: releasing extra ones; retried at the next refill", "engine", eng, "err", err)
					break
				}
				if len(ids) == 0 { // another call releases them now
					break
				}
				continue
			}
			if idle == n || a.room() <= 0 || !a.waitIdle(ctx) {
				break
			}
			start := time.Now()
			s, err := a.d.Pool().ProvisionSpare(ctx, eng)
			if err != nil {
				if !errors.Is(err, context.Canceled) {
					a.log.Warn("spare slots: provisioning one failed; retried at the next refill", "engine", eng, "err", err)
				}
				break
			}
			a.m.spareRefill.Observe(time.Since(start).Seconds())
			a.log.Info("spare slot ready", "engine", eng, "slot", s.ID, "took", time.Since(start).Round(time.Millisecond))
			a.publishSpares(ctx, size)
		}
	}
}

// spareWants is how many idle spares of each engine a node keeps when it
// wants want of each: an engine whose spares cannot be made now (its
// check failed: a dockerd busy for a moment, say) keeps the idle ones it
// has, which were made when it could, up to want, and makes none. size is
// their sum.
func spareWants(want int, engines []engine.Name, cannot map[engine.Name]error, idle map[engine.Name]int) (wants map[engine.Name]int, size int) {
	wants = map[engine.Name]int{}
	for _, eng := range engines {
		wants[eng] = want
		if cannot[eng] != nil {
			wants[eng] = min(want, idle[eng])
		}
		size += wants[eng]
	}
	return wants, size
}

// idleSpares counts the idle spare slots of engine eng on this node, and
// those whose release failed (deploy.SlotReleasing), to be released again.
func (a *agent) idleSpares(eng engine.Name) (idle, unreleased int) {
	slots, err := a.d.Pool().SpareSlots()
	if err != nil {
		return 0, 0
	}
	for _, s := range slots {
		switch {
		case s.Spare.Engine != eng:
		case s.Phase == deploy.SlotIdle:
			idle++
		case s.Phase == deploy.SlotReleasing:
			unreleased++
		}
	}
	return idle, unreleased
}

// publishSpares writes this node's spare slots to etcd as the pool of
// spec.SpareApp, which no app takes for its name (`fogctl pool ls`, and
// the POOL of `fogctl node ls`), size the number it keeps, or withdraws
// it when the node keeps and has none.
func (a *agent) publishSpares(ctx context.Context, size int) {
	slots, err := a.d.Pool().SpareSlots()
	if err != nil {
		return
	}
	p := state.Pool{Node: a.c.Node.Name, App: spec.SpareApp, Size: size}
	for _, s := range slots {
		switch s.Phase {
		case deploy.SlotIdle:
			p.Idle++
			p.Slots = append(p.Slots, s.ID)
		case deploy.SlotProvisioning:
			p.Provisioning++
		}
	}
	if size == 0 && p.Idle == 0 && p.Provisioning == 0 {
		// Once: a node without spares writes nothing at each refill.
		if a.pool.sparesShown.Load() && a.st.DeletePool(ctx, a.c.Node.Name, spec.SpareApp) == nil {
			a.pool.sparesShown.Store(false)
		}
		return
	}
	if err := a.st.PutPool(ctx, a.session(), p); err != nil {
		a.log.Debug("spare slots: publishing", "err", err)
		return
	}
	a.pool.sparesShown.Store(true)
}
