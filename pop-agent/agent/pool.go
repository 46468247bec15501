// The warm pool's keeper: for each app, keep the node's idle slots of its newest generation at the
// app's pool size (`pool:` in its spec, else agent.pool_size), within the node's capacity, and
// publish them for placement and `fogctl pool ls`. Refilling runs one slot at a time, waits while
// deploys are under way, and provisions each slot's instance at background CPU priority until a
// deployment binds it (drivers.Run.Background).

package agent

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/adaptive"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// poolKeeper is the warm pool's state in the agent.
type poolKeeper struct {
	// kick asks for a refill now (after a deploy, a new generation).
	kick chan struct{}
	// inflight counts the deploys under way: refilling waits for them.
	inflight atomic.Int64

	// sparesShown: the node's spare slots are published (publishSpares).
	sparesShown atomic.Bool

	mu           sync.Mutex
	hits, misses map[string]int
	lastRefillMS map[string]float64
	provisioning map[string]int
}

func newPoolKeeper() *poolKeeper {
	return &poolKeeper{kick: make(chan struct{}, 1), hits: map[string]int{}, misses: map[string]int{},
		lastRefillMS: map[string]float64{}, provisioning: map[string]int{}}
}

// refillSoon asks the keeper to refill at its next chance.
func (p *poolKeeper) refillSoon() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// poolSize is how many idle slots of app this node keeps.
func (a *agent) poolSize(app spec.App) int {
	if app.Pool != nil {
		return *app.Pool
	}
	if app.Mode == spec.ModeBoot {
		return 0 // its deploys never restore
	}
	return a.c.Agent.PoolSize
}

// keepPool refills the warm pool when kicked and every reconcile
// interval, until ctx ends.
func (a *agent) keepPool(ctx context.Context) {
	tick := time.NewTicker(a.c.Agent.ReconcileInterval)
	defer tick.Stop()
	for {
		a.refill(ctx)
		select {
		case <-ctx.Done():
			return
		case <-a.pool.kick:
		case <-tick.C:
		}
	}
}

// refill brings every app's pool on this node to its size: slots of apps
// that are gone, of generations that are not the newest, and beyond the
// size are dropped; missing ones are provisioned while the node has room.
// While the agent is fenced (an emptied etcd lists no app) it does
// nothing: every slot stays.
func (a *agent) refill(ctx context.Context) {
	apps, err := a.st.Apps(ctx)
	if err != nil {
		a.log.Debug("warm pool: listing apps", "err", err)
		return
	}
	// Checked after the list, as resync does.
	if err := a.plane.check(ctx); err != nil {
		a.log.Debug("warm pool: not refilled", "err", err)
		return
	}
	known := map[string]bool{}
	for _, app := range apps {
		known[app.Name] = true
	}
	if slots, err := a.d.Pool().PoolSlots(); err == nil {
		for _, s := range slots {
			if !known[s.App] {
				a.dropPool(ctx, s.App, nil, "its app was removed")
				_ = a.st.DeletePool(ctx, a.c.Node.Name, s.App)
				known[s.App] = true
			}
		}
	}
	// A cordoned node keeps no slot (placement sends it nothing).
	cordoned := false
	if n, err := a.st.Node(ctx, a.c.Node.Name); err == nil && n.Cordon != nil {
		cordoned = true
	}
	// Each app's pool generation: the one whose node copies stay.
	current := map[string]int{}
	for _, app := range apps {
		if ctx.Err() != nil {
			return
		}
		gen, err := a.refillApp(ctx, app, cordoned)
		switch {
		case err == nil:
			current[app.Name] = gen
		case !errors.Is(err, deploy.ErrNoCheckpoint):
			current[app.Name] = unknownGen
		}
	}
	a.refillSpares(ctx, cordoned)
	a.trimCache(ctx, apps, current)
}

// unknownGen stands for an app's pool generation while the cluster does
// not tell it: its node copies all stay.
const unknownGen = -1

// refillApp keeps app's pool on this node (none while it is cordoned),
// and returns the generation its pool restores (the error of finding it,
// if any).
func (a *agent) refillApp(ctx context.Context, app spec.App, cordoned bool) (int, error) {
	size, why := a.poolSize(app), "no pool for it on this node"
	if cordoned {
		size, why = 0, "the node is cordoned"
	}
	g, err := a.poolGeneration(ctx, app)
	if err == nil {
		if why := a.d.Restorable(ctx, g); why != nil {
			a.log.Debug("warm pool: this node cannot restore the app's generation", "app", app.Name, "gen", g.Gen, "reason", why)
			size = 0
		} else {
			a.prefetch(ctx, g)
		}
	}
	if err != nil || size == 0 {
		// No generation (yet), or no pool: none of its slots stays.
		a.dropPool(ctx, app.Name, nil, why)
		gen := 0
		if err == nil {
			gen = g.Gen
		}
		a.publishPool(ctx, app.Name, gen, 0)
		return gen, err
	}
	a.dropPool(ctx, app.Name, func(s deploy.Slot) bool { return s.Gen != g.Gen }, "a newer generation was sealed")
	a.startAhead(ctx, g)
	for ctx.Err() == nil {
		idle := a.idleSlots(app.Name, g.Gen)
		if len(idle) > size {
			if extra := a.extraSlots(idle, size); len(extra) > 0 {
				a.dropPool(ctx, app.Name, func(s deploy.Slot) bool { return extra[s.ID] }, "beyond the pool size")
			}
			break
		}
		if len(idle) == size || a.room() <= 0 {
			break
		}
		if !a.waitIdle(ctx) {
			return g.Gen, nil
		}
		a.pool.mu.Lock()
		a.pool.provisioning[app.Name]++
		a.pool.mu.Unlock()
		a.publishPool(ctx, app.Name, g.Gen, size)
		start := time.Now()
		s, err := a.d.Pool().ProvisionPoolSlot(ctx, g)
		if err == nil && a.ahead(g) {
			s, err = a.d.Pool().StartAhead(ctx, g, s.ID)
		}
		took := time.Since(start)
		a.pool.mu.Lock()
		a.pool.provisioning[app.Name]--
		if err == nil {
			a.pool.lastRefillMS[app.Name] = float64(took.Microseconds()) / 1000
		}
		a.pool.mu.Unlock()
		if err != nil {
			a.log.Warn("warm pool: provisioning a slot failed; retried at the next refill", "app", app.Name, "gen", g.Gen, "err", err)
			break
		}
		a.m.poolRefill.WithLabelValues(app.Name).Observe(took.Seconds())
		a.log.Info("warm pool: slot ready", "app", app.Name, "gen", g.Gen, "slot", s.ID, "took", took.Round(time.Millisecond))
	}
	a.publishPool(ctx, app.Name, g.Gen, size)
	return g.Gen, nil
}

// ahead says whether the pool's slots of generation g are restored ahead
// on this node (agent.pool_ahead, and cgroups that can be reweighted).
func (a *agent) ahead(g spec.Generation) bool {
	return a.c.Agent.PoolAhead.IsOn() && a.d.Pool().CanStartAhead(g) == nil
}

// startAhead restores ahead the idle slots of g that wait unstarted
// (recycled instances), one at a time, at background priority.
func (a *agent) startAhead(ctx context.Context, g spec.Generation) {
	if !a.ahead(g) {
		return
	}
	for _, s := range a.idleSlots(g.App, g.Gen) {
		if s.Ahead {
			continue
		}
		if !a.waitIdle(ctx) {
			return
		}
		// ErrNotAhead: a deploy took the slot meanwhile.
		if _, err := a.d.Pool().StartAhead(ctx, g, s.ID); err != nil && !errors.Is(err, deploy.ErrNotAhead) {
			a.log.Warn("warm pool: restoring a slot ahead failed; the slot was released", "app", g.App, "gen", g.Gen, "slot", s.ID, "err", err)
		}
	}
}

// extraSlots picks, among idle (oldest first) beyond size, the slots to
// release: those beyond twice the size at once, and the others (recycled
// instances, kept for the deploys to come) once idle longer than
// agent.recycle_keep.
func (a *agent) extraSlots(idle []deploy.Slot, size int) map[string]bool {
	extra := map[string]bool{}
	keep := len(idle)
	for _, s := range idle {
		if keep <= size {
			break
		}
		if keep > 2*size || time.Since(s.Created) > a.c.Agent.RecycleKeep {
			extra[s.ID] = true
			keep--
		}
	}
	return extra
}

// poolGeneration is the generation app's pool slots restore: its newest,
// or, for an app of engine auto, the newest of the engine its next
// restore on this node would choose.
func (a *agent) poolGeneration(ctx context.Context, app spec.App) (spec.Generation, error) {
	var eng engine.Name
	if app.Engine == spec.EngineAuto {
		cctx, cancel := context.WithTimeout(ctx, a.etcdTimeout())
		c, err := a.st.NodeCosts(cctx, app.Name, a.c.Node.Name)
		cancel()
		if err == nil {
			eng, _, _ = adaptive.ChooseEngine(c, a.restorableEngines(ctx, app))
		}
	}
	return a.d.Checkpoints().CurrentOf(ctx, app, eng)
}

// idleSlots are app's idle pool slots of generation gen, oldest first.
func (a *agent) idleSlots(app string, gen int) []deploy.Slot {
	slots, err := a.d.Pool().PoolSlots()
	if err != nil {
		return nil
	}
	var out []deploy.Slot
	for _, s := range slots {
		if s.App == app && s.Gen == gen && s.Phase == deploy.SlotIdle {
			out = append(out, s)
		}
	}
	return out
}

// room is how many more instances or slots this node takes: its capacity
// minus its deployments and its pool's slots.
func (a *agent) room() int {
	recs, err := a.d.Records().List()
	if err != nil {
		return 0
	}
	slots, err := a.d.Pool().PoolSlots()
	if err != nil {
		return 0
	}
	spares, err := a.d.Pool().SpareSlots()
	if err != nil {
		return 0
	}
	return a.c.Agent.Capacity - len(recs) - len(slots) - len(spares)
}

// makeRoom drops the oldest idle pool slot of another app when the node
// is at capacity, so that the pool never keeps a deployment out. A deploy
// that will take one of app's own slots needs no room.
func (a *agent) makeRoom(ctx context.Context, app string) {
	if a.room() > 0 {
		return
	}
	slots, err := a.d.Pool().PoolSlots()
	if err != nil {
		return
	}
	for _, s := range slots {
		if s.App == app && s.Phase == deploy.SlotIdle {
			return
		}
	}
	for _, s := range slots {
		if s.Phase == deploy.SlotIdle {
			a.dropPool(ctx, s.App, func(o deploy.Slot) bool { return o.ID == s.ID }, "the node is at capacity and a deploy of "+app+" needs room")
			return
		}
	}
	// No pool slot to give up: a spare (the deploy may take another).
	if ids, err := a.d.Pool().ReleaseSpares(ctx, "", 1); err == nil && len(ids) > 0 {
		a.log.Info("spare slots: one released; the node is at capacity and a deploy needs room", "app", app, "slot", ids[0])
	}
}

// waitIdle waits until no deploy is under way on the node: refilling
// never competes with a deploy. It reports false when ctx ended.
func (a *agent) waitIdle(ctx context.Context) bool {
	for a.pool.inflight.Load() > 0 {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
	return ctx.Err() == nil
}

// dropPool releases app's idle slots that drop selects (nil: all).
func (a *agent) dropPool(ctx context.Context, app string, drop func(deploy.Slot) bool, why string) {
	ids, err := a.d.Pool().DropPool(ctx, app, drop)
	if len(ids) > 0 {
		a.log.Info("warm pool: slots released", "app", app, "slots", ids, "why", why)
	}
	if err != nil {
		a.log.Warn("warm pool: releasing slots; retried at the next refill", "app", app, "err", err)
	}
}

// poolDeployed records what a restore of app found in the pool, publishes
// the pool as the restore left it (once the deployment's status is
// written: nobody waits for it), and asks for a refill.
func (a *agent) poolDeployed(ctx context.Context, app spec.App, dep deploy.Deployment) {
	a.pool.mu.Lock()
	switch dep.Pool {
	case spec.PoolHit:
		a.pool.hits[app.Name]++
		ahead := "no"
		if dep.Ahead {
			ahead = "yes"
		}
		a.m.poolHits.WithLabelValues(app.Name, ahead).Inc()
	case spec.PoolMiss:
		a.pool.misses[app.Name]++
		a.m.poolMisses.WithLabelValues(app.Name).Inc()
	case spec.PoolSpare:
		a.pool.misses[app.Name]++
		a.m.poolMisses.WithLabelValues(app.Name).Inc()
		a.m.spareTaken.WithLabelValues(string(dep.Engine)).Inc()
		idle, _ := a.idleSpares(dep.Engine)
		a.m.spareIdle.WithLabelValues(string(dep.Engine)).Set(float64(idle))
	}
	a.pool.mu.Unlock()
	if dep.Fetched {
		a.m.fetches.WithLabelValues("restore").Inc()
		a.exportCache()
	}
	a.publishPool(ctx, app.Name, dep.Gen, a.poolSize(app))
	a.pool.refillSoon()
}

// publishPool writes app's pool on this node to etcd (for placement and
// `fogctl pool ls`), with whether the node holds generation gen's
// checkpoint, or withdraws it when it has no size, no slot and no copy.
func (a *agent) publishPool(ctx context.Context, app string, gen, size int) {
	idle := a.idleSlots(app, gen)
	a.m.poolIdle.WithLabelValues(app).Set(float64(len(idle)))
	a.pool.mu.Lock()
	p := state.Pool{Node: a.c.Node.Name, App: app, Gen: gen, Size: size, Idle: len(idle), Provisioning: a.pool.provisioning[app],
		Hits: a.pool.hits[app], Misses: a.pool.misses[app], LastRefillMS: a.pool.lastRefillMS[app]}
	a.pool.mu.Unlock()
	p.Local = gen > 0 && a.holds(app, gen)
	for _, s := range idle {
		p.Slots = append(p.Slots, s.ID)
		if s.Ahead {
			p.Ahead++
		}
	}
	if size == 0 && p.Idle == 0 && p.Provisioning == 0 && p.Hits == 0 && p.Misses == 0 && !p.Local {
		_ = a.st.DeletePool(ctx, a.c.Node.Name, app)
		return
	}
	if err := a.st.PutPool(ctx, a.session(), p); err != nil {
		a.log.Debug("warm pool: publishing", "app", app, "err", err)
	}
}

// recycle gives deployment id's instance back to its app's warm pool
// (deploy.Pool.Recycle) when the deployment restored the pool's
// current generation and the pool holds fewer than twice its size, and
// reports whether it did. An instance that cannot serve again is left to
// clean.
func (a *agent) recycle(ctx context.Context, id string) bool {
	if !a.c.Agent.Recycle.IsOn() {
		return false
	}
	rec, err := a.d.Records().Load(id)
	if err != nil || rec.Phase != spec.PhaseRunning || rec.Mode != spec.ModeRestore {
		return false
	}
	cur, err := a.st.App(ctx, rec.App)
	if err != nil {
		return false
	}
	app := cur.WithDefaults()
	size := a.poolSize(app)
	if size == 0 {
		return false
	}
	g, err := a.poolGeneration(ctx, app)
	if err != nil || g.Gen != rec.Gen || g.Engine != rec.Engine {
		return false
	}
	// Up to twice the pool's size: the extra ones serve the next deploys
	// without a refill, and go after agent.recycle_keep.
	if len(a.idleSlots(app.Name, g.Gen)) >= 2*size {
		return false
	}
	s, err := a.d.Pool().Recycle(ctx, id)
	switch {
	case err == nil:
		a.m.recycled.WithLabelValues(app.Name, "recycled").Inc()
		a.log.Debug("warm pool: instance recycled", "deployment", id, "slot", s.ID, "timings", s.Timings.String())
		a.publishPool(ctx, app.Name, g.Gen, size)
		return true
	case errors.Is(err, drivers.ErrNotRecyclable):
		if _, lerr := a.d.Records().Load(id); errors.Is(lerr, spec.ErrNotFound) {
			// Its instance found it could not serve again (a connection
			// left on a listening port that cannot be bound again): Recycle
			// released it.
			a.m.recycled.WithLabelValues(app.Name, "removed").Inc()
			a.log.Info("warm pool: the instance could not serve again; removed", "deployment", id, "err", err)
			a.pool.refillSoon()
		} else {
			a.log.Debug("warm pool: instance not recyclable", "deployment", id, "err", err)
		}
		return false
	default:
		// Recycle released what it could not give back; clean finishes.
		a.m.recycled.WithLabelValues(app.Name, "removed").Inc()
		a.log.Warn("warm pool: recycling an instance failed; it is removed", "deployment", id, "err", err)
		a.pool.refillSoon()
		return false
	}
}
