// Mode auto on this node: the choice between a boot and a restore (internal/adaptive), the cost of
// each deploy recorded for the next choices, and the measurements that the choice asks for, run in
// the background at the pool's priority instead of on a user's request.

package agent

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/adaptive"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// autoNode is what mode auto asks of the node's deployer.
type autoNode interface {
	// WaitingSlot: the newest generation of which an idle slot of app
	// waits (deploy.Pool.WaitingSlot).
	WaitingSlot(app spec.App, eng engine.Name) (spec.Generation, bool)
	// Restorable: why this node cannot restore g, or nil.
	Restorable(ctx context.Context, g spec.Generation) error
	// CheckBoot: why this node cannot boot apps without an engine, or nil.
	CheckBoot(ctx context.Context) error
}

// choice is how a deployment runs on this node.
type choice struct {
	mode   spec.Mode
	reason string
	// auto: mode auto chose the mode, for why.
	auto bool
	why  adaptive.Why
	// engine is, for an app of engine auto, the engine whose generation
	// a restore takes ("": the newest, or none yet).
	engine engine.Name
}

// choose resolves the mode of a deployment: its own, else its app's, else
// auto. For auto it takes a slot of the app that waits on this node, and
// otherwise chooses a boot or a restore from what they cost here and in
// the PoP (adaptive.Decide), and says why; a measurement the choice asks
// for runs in the background. For an app of engine auto it also chooses
// the engine (adaptive.ChooseEngine).
func (a *agent) choose(ctx context.Context, dsr state.Desired, app spec.App) choice {
	ch := choice{mode: dsr.Mode}
	if ch.mode == "" {
		ch.mode = app.Mode
	}
	auto := ch.mode == "" || ch.mode == spec.ModeAuto
	engineAuto := app.Engine == spec.EngineAuto && ch.mode != spec.ModeBoot
	if !auto && !engineAuto {
		return ch
	}
	if auto {
		// A slot waits: a hit, with no read of the cluster.
		if g, ok := a.autoNode().WaitingSlot(app, ""); ok {
			d := adaptive.Decide(adaptive.Costs{}, adaptive.Situation{SlotWaiting: true})
			a.m.auto.WithLabelValues(string(d.Mode), string(d.Why)).Inc()
			ch.mode, ch.reason, ch.auto, ch.why = d.Mode, d.Reason, true, d.Why
			if engineAuto {
				ch.engine = g.Engine
			}
			return ch
		}
	}
	cctx, cancel := context.WithTimeout(ctx, a.etcdTimeout())
	pop, err := a.st.Costs(cctx, app.Name)
	cancel()
	if err != nil {
		// As before there were costs: restore.
		a.log.Warn("mode auto: the app's costs are unavailable; restoring", "deployment", dsr.ID, "app", app.Name, "err", err)
	}
	c := adaptive.Costs{App: app.Name, Node: a.c.Node.Name}
	if i := slices.IndexFunc(pop, func(c adaptive.Costs) bool { return c.Node == a.c.Node.Name }); i >= 0 {
		c = pop[i]
	}
	engines := a.restorableEngines(ctx, app)
	var engReason string
	if engineAuto {
		var why adaptive.Why
		ch.engine, why, engReason = adaptive.ChooseEngine(c, engines)
		if ch.engine != "" {
			a.m.autoEngine.WithLabelValues(string(ch.engine), string(why)).Inc()
			c = c.ForEngine(ch.engine)
		}
	}
	if !auto {
		ch.reason = engReason
		return ch
	}
	// The node could not boot apps when the agent started (no boot
	// image): look again, since an operator may have built it since.
	cannotBoot := a.node.Problems["boot"]
	if cannotBoot != "" && a.autoNode().CheckBoot(ctx) == nil {
		cannotBoot = ""
	}
	d := adaptive.Decide(c, adaptive.Situation{CannotBoot: cannotBoot, Generation: len(engines) > 0, Pool: a.poolSize(app), PoP: pop})
	a.m.auto.WithLabelValues(string(d.Mode), string(d.Why)).Inc()
	ch.mode, ch.reason, ch.auto, ch.why = d.Mode, d.Reason, true, d.Why
	if d.Mode == spec.ModeRestore && engReason != "" {
		ch.reason += "; " + engReason
	}
	a.log.Info("mode auto", "deployment", dsr.ID, "app", app.Name, "mode", ch.mode, "engine", ch.engine, "reason", ch.reason)
	if d.Measure != "" {
		a.measureSoon(ctx, app, d.Measure, ch.engine)
	}
	return ch
}

// autoNode is the deployer as mode auto asks it (a.auto in unit tests).
func (a *agent) autoNode() autoNode {
	if a.auto != nil {
		return a.auto
	}
	return nodeAuto{a.d, a.d.Drivers(), a.d.Pool()}
}

// nodeAuto is the deployer's parts that mode auto asks.
type nodeAuto struct {
	*deploy.Deployer
	*deploy.Drivers
	*deploy.Pool
}

// restorableEngines are the engines of which app has a generation, made
// from its process as it is now, that this node can restore (its newest
// of each), in spec.Engines' order. None: the app has no generation here.
func (a *agent) restorableEngines(ctx context.Context, app spec.App) []engine.Name {
	cctx, cancel := context.WithTimeout(ctx, a.etcdTimeout())
	gens, err := a.st.Checkpoints(cctx, app.Name)
	cancel()
	if err != nil {
		return nil
	}
	newest := map[engine.Name]spec.Generation{}
	for _, g := range gens {
		if g.Gen > newest[g.Engine].Gen && (len(g.Spec.Command) == 0 || g.Spec.SameProcess(app)) {
			newest[g.Engine] = g
		}
	}
	var out []engine.Name
	for _, e := range spec.Engines {
		if g, ok := newest[e]; ok && slices.Contains(a.node.Engines, e) && a.autoNode().Restorable(ctx, g) == nil {
			out = append(out, e)
		}
	}
	return out
}

// recordCost adds what a deploy that ended Running cost to the app's costs
// on this node: its critical path (clone to ready), a pool hit apart from
// a restore without a slot, and the boot of a deploy that produced its
// generation first as a boot. Failures are logged: they only cost the next
// choices a sample.
func (a *agent) recordCost(ctx context.Context, dep deploy.Deployment, auto, engineAuto bool) {
	if dep.Mode != spec.ModeBoot && dep.Mode != spec.ModeRestore {
		return
	}
	r := adaptive.Run{Mode: dep.Mode, Gen: dep.Gen, Cost: adaptive.Cost(dep.Timings), Hit: dep.Pool == spec.PoolHit, Auto: auto}
	if dep.Booted {
		r.Boot = adaptive.BootCost(dep.Timings)
	}
	if engineAuto && dep.Mode == spec.ModeRestore {
		r.Engine = dep.Engine
	}
	cctx, cancel := context.WithTimeout(ctx, a.etcdTimeout())
	defer cancel()
	if err := a.st.RecordCost(cctx, dep.App, a.c.Node.Name, r); err != nil {
		a.log.Warn("recording what the deploy cost", "deployment", dep.ID, "app", dep.App, "mode", dep.Mode, "cost", r.Cost.Round(time.Millisecond), "err", err)
	}
}

// measurements are the background measurements under way on this node, by
// app (one at a time per app), and the IDs of their instances (which the
// reconciler leaves alone while they run).
type measurements struct {
	mu   sync.Mutex
	apps map[string]string
}

// running says whether id is a measurement's instance under way.
func (m *measurements) running(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, v := range m.apps {
		if v == id {
			return true
		}
	}
	return false
}

// start marks a measurement of app as under way with instance id; false
// if one is already.
func (m *measurements) start(app, id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.apps[app]; ok {
		return false
	}
	if m.apps == nil {
		m.apps = map[string]string{}
	}
	m.apps[app] = id
	return true
}

func (m *measurements) done(app string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.apps, app)
}

// measureSoon measures one deploy of app in mode (a boot, or a restore
// that takes no pool slot) in the background: once no deploy is under way
// and the node has room, at background CPU priority, in an instance that
// nobody is given and that is removed at once. Its cost is recorded as
// any other deploy's (not as mode auto's choice). One measurement per app
// at a time; an agent killed meanwhile leaves a record that the next
// reconcile removes (no desired deployment has its ID).
func (a *agent) measureSoon(ctx context.Context, app spec.App, mode spec.Mode, eng engine.Name) {
	if a.d == nil {
		return
	}
	id := spec.NewID(app.Name)
	if !a.measuring.start(app.Name, id) {
		return
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		defer a.measuring.done(app.Name)
		if !a.waitIdle(ctx) || a.room() <= 0 {
			return
		}
		log := a.log.With("app", app.Name, "mode", mode, "instance", id)
		dep, err := a.d.Deploy(ctx, app, deploy.Options{ID: id, Mode: mode, Reason: "auto: measured in the background", NoPool: true,
			Background: true, Engine: eng, IfBusy: spec.PolicyBoot, IfNoEngine: spec.PolicyFail})
		if err != nil {
			a.m.measured.WithLabelValues(string(mode), "failed").Inc()
			log.Warn("mode auto: a measurement in the background failed", "err", err)
			if cerr := a.clean(context.WithoutCancel(ctx), id); cerr != nil {
				log.Warn("mode auto: removing the measurement's instance; the next reconcile retries", "err", cerr)
			}
			return
		}
		a.recordCost(ctx, dep, false, app.Engine == spec.EngineAuto)
		a.m.measured.WithLabelValues(string(dep.Mode), "ok").Inc()
		log.Info("mode auto: measured in the background", "cost", adaptive.Cost(dep.Timings).Round(time.Millisecond), "timings", dep.Timings.String())
		if err := a.clean(context.WithoutCancel(ctx), id); err != nil && !errors.Is(err, spec.ErrNotFound) {
			log.Warn("mode auto: removing the measurement's instance; the next reconcile retries", "err", err)
		}
	}()
}
