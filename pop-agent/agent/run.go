package agent

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fogdeploy/fogdeploy/internal/config"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/devenv"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/gc"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/keyedmutex"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/version"
	"github.com/fogdeploy/fogdeploy/internal/wire"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// StateConfig turns the config into the etcd client's.
func StateConfig(c config.Config) state.Config {
	return state.Config{Endpoints: c.Etcd.Endpoints, DialTimeout: c.Etcd.DialTimeout,
		CAFile: c.Etcd.CAFile, CertFile: c.Etcd.CertFile, KeyFile: c.Etcd.KeyFile}
}

// agent is one running pop-agent.
type agent struct {
	c      config.Config
	o      Options
	log    *slog.Logger
	st     *state.Store
	node   state.Node
	d      *deploy.Deployer
	m      *metrics
	pool   layering.Store
	mapper *mapper.Mapper

	busy keyedmutex.Map[string] // one operation per deployment ID at a time
	wg   sync.WaitGroup

	sessMu   sync.Mutex
	sess     *concurrency.Session // the node's lease; replaced after an etcd outage
	etcdLost time.Time            // when the lease was lost; zero while registered
}

// session returns the node's current etcd session (its lease also holds
// the checkpoint locks this agent takes).
func (a *agent) session() *concurrency.Session {
	a.sessMu.Lock()
	defer a.sessMu.Unlock()
	return a.sess
}

// etcdState returns when the node lost its lease, or the zero time.
func (a *agent) etcdState() time.Time {
	a.sessMu.Lock()
	defer a.sessMu.Unlock()
	return a.etcdLost
}

// Run starts the agent and blocks until ctx is done.
func Run(ctx context.Context, c config.Config, o Options, log *slog.Logger) error {
	log = log.With("node", c.Node.Name)
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)

	l, err := wire.OpenLayering(ctx, c, log)
	if err != nil {
		return fmt.Errorf("storage: %w", err)
	}
	defer l.Close()
	m.backend.WithLabelValues(l.Mapper.Choice().Backend).Set(1)

	ec := engine.Config{Logger: log, TempDir: filepath.Join(c.Node.StateDir, "engine")}
	if err := os.MkdirAll(ec.TempDir, 0o700); err != nil {
		return err
	}
	deps := deploy.Deps{Store: l.Store, Envs: l.Manager, Mapper: l.Mapper, Log: log,
		Host: deploy.NewHost(engine.NewDMTCP(ec), engine.NewCRIU(ec))}
	engines := []string{}
	if rt, err := runtime.Dial(ctx, c.Docker.Host, log); err != nil {
		log.Warn("dockerd unavailable: DMTCP apps cannot run in the DMTCP container", "err", err)
	} else {
		deps.Container = &deploy.Container{RT: rt, Image: c.Agent.DMTCPImage, BootImage: c.Agent.BootImage}
	}
	d, err := deploy.New(deploy.Config{StateDir: filepath.Join(c.Node.StateDir, "deploy"), Pool: c.Ceph.Pool,
		Node: c.Node.Name, DMTCPDriver: c.Agent.DMTCPDriver}, deps)
	if err != nil {
		return err
	}
	fingerprint := map[string]string{"arch": goruntime.GOARCH, "kernel": kernelRelease()}
	problems := map[string]string{}
	for _, e := range []string{engine.NameDMTCP, engine.NameCRIU} {
		if drv, v, err := d.CheckEngine(ctx, e); err != nil {
			log.Warn("engine unavailable: apps of this engine boot without a checkpoint here (agent.if_no_engine)", "engine", e, "reason", err)
			problems[e] = hint.Sentence(err)
		} else {
			engines = append(engines, e)
			fingerprint[e] = v + " (" + drv + ")"
		}
	}
	if err := d.CheckBoot(ctx); err != nil {
		log.Warn("cannot boot apps without an engine", "reason", err)
		problems["boot"] = hint.Sentence(err)
	} else {
		fingerprint["boot"] = c.Agent.BootImage
	}

	// Crash recovery: release the mappings that no deployment owns, then
	// keep Running instances that still run and undo the rest. Undoing
	// removes a deployment's images once nothing on this node maps them,
	// evicting the watches that clients killed with them open (rbd-fuse,
	// the previous agent) left, instead of leaving the images to a later
	// reconcile.
	if owned, err := d.Mappings(); err != nil {
		log.Warn("listing the mappings of deployments; orphaned mappings stay", "err", err)
	} else if maps, err := l.Mapper.List(); err == nil {
		for _, mp := range maps {
			if !owned[mp.ID] {
				if err := l.Mapper.Release(ctx, mp.ID); err != nil {
					log.Warn("releasing an orphaned mapping", "id", mp.ID, "err", err)
				} else {
					m.recovered.Inc()
				}
			}
		}
	}
	kept, removed, err := d.Adopt(ctx)
	if err != nil {
		log.Warn("recovering deployments left by a previous run", "err", err)
	}
	log.Info("recovered", "kept", kept, "removed", removed)

	st, err := state.Open(ctx, StateConfig(c))
	if err != nil {
		return err
	}
	defer st.Close()

	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", o.Listen, err)
	}
	api := ln.Addr().String()
	node := state.Node{Name: c.Node.Name, API: api, Capacity: c.Agent.Capacity,
		Mapper: l.Mapper.Choice().Backend, Engines: engines, Fingerprint: fingerprint, Problems: problems, Started: time.Now().UTC()}
	sess, err := st.Register(ctx, node, c.Agent.LeaseTTL)
	if err != nil {
		return err
	}

	a := &agent{c: c, o: o, log: log, st: st, node: node, sess: sess, d: d, m: m, pool: l.Store, mapper: l.Mapper}
	defer func() { a.session().Close() }()
	token, err := readToken(c.Agent.TokenFile)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		status, etcd := "ok", "ok"
		if lost := a.etcdState(); !lost.IsZero() {
			// Still alive: instances keep running.
			status = "degraded"
			etcd = fmt.Sprintf("unavailable for %s: node lease lost at %s; instances keep running, registering again when etcd answers",
				time.Since(lost).Round(time.Second), lost.UTC().Format(time.RFC3339))
		}
		writeJSON(w, http.StatusOK, map[string]any{"status": status, "etcd": etcd, "node": c.Node.Name, "mapper": l.Mapper.Choice().Backend,
			"engines": engines, "version": version.String()})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	(&hooks{a: a, token: token}).register(mux)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second}
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	go func() { errc <- a.reconcile(ctx) }()
	go a.keepRegistered(ctx)
	log.Info("pop-agent ready", "api", api, "engines", engines, "version", version.String())

	select {
	case <-ctx.Done():
	case err := <-errc:
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	log.Info("shutting down", "bound", o.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.ShutdownTimeout)
	defer cancel()
	err = srv.Shutdown(sctx)
	a.wg.Wait()
	return err
}

// keepRegistered watches the node's lease. When etcd does not answer for
// longer than the lease TTL the lease is lost: the agent says so in its log
// and in /healthz, keeps every instance running (it never undeploys for
// want of etcd), and registers the node again as soon as etcd answers,
// then reconciles what changed meanwhile.
func (a *agent) keepRegistered(ctx context.Context) {
	for {
		old := a.session()
		select {
		case <-ctx.Done():
			return
		case <-old.Done():
		}
		if ctx.Err() != nil {
			return
		}
		lost := time.Now()
		a.sessMu.Lock()
		a.etcdLost = lost
		a.sessMu.Unlock()
		a.log.Warn("etcd unavailable: the node lease is lost; instances keep running, registering again when etcd answers",
			"lease_ttl", a.c.Agent.LeaseTTL, "endpoints", a.c.Etcd.Endpoints)
		sess, err := a.register(ctx, old)
		if err != nil {
			return // shutting down
		}
		a.sessMu.Lock()
		a.sess, a.etcdLost = sess, time.Time{}
		a.sessMu.Unlock()
		a.log.Info("etcd available again: node registered", "unavailable_for", time.Since(lost).Round(time.Millisecond))
		if _, err := a.resync(ctx); err != nil {
			a.log.Warn("reconciling", "err", err)
		}
	}
}

// register retries until etcd answers, then drops the lost session's
// lease and registers the node with a new one. It fails only when ctx
// ends.
func (a *agent) register(ctx context.Context, old *concurrency.Session) (*concurrency.Session, error) {
	wait := time.Second
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := a.st.Client().Get(pctx, state.Prefix+"nodes/"+a.c.Node.Name+"/info", clientv3.WithCountOnly())
		cancel()
		if err != nil {
			a.log.Debug("etcd still unavailable", "err", err)
			continue
		}
		_ = old.Close() // revokes the old lease if etcd still has it
		sess, err := a.st.Register(ctx, a.node, a.c.Agent.LeaseTTL)
		if err != nil {
			a.log.Warn("registering the node again", "err", err)
			continue
		}
		return sess, nil
	}
}

// reconcile handles the deployments of this node: the existing ones first,
// then every change, until ctx ends.
func (a *agent) reconcile(ctx context.Context) error {
	for {
		rev, err := a.resync(ctx)
		if err != nil {
			a.log.Warn("listing deployments", "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(2 * time.Second):
				continue
			}
		}
		wch := a.st.Client().Watch(ctx, state.DeploymentsPrefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithPrevKV())
		tick := time.NewTicker(a.c.Agent.ReconcileInterval)
		for {
			var wr clientv3.WatchResponse
			var ok bool
			select {
			case wr, ok = <-wch:
			case <-tick.C:
				// Periodically: retry what failed, catch what was missed.
				if _, err := a.resync(ctx); err != nil {
					a.log.Warn("reconciling", "err", err)
				}
				continue
			}
			if !ok {
				break
			}
			if err := wr.Err(); err != nil {
				a.log.Warn("watch", "err", err)
				break
			}
			for _, ev := range wr.Events {
				id := strings.TrimPrefix(string(ev.Kv.Key), state.DeploymentsPrefix)
				switch ev.Type {
				case clientv3.EventTypePut:
					var dsr state.Desired
					if err := json.Unmarshal(ev.Kv.Value, &dsr); err == nil && dsr.Node == a.c.Node.Name {
						a.spawn(ctx, id, func(ctx context.Context) { a.deploy(ctx, dsr) })
					}
				case clientv3.EventTypeDelete:
					if ev.PrevKv != nil {
						var dsr state.Desired
						if err := json.Unmarshal(ev.PrevKv.Value, &dsr); err == nil && dsr.Node != a.c.Node.Name {
							continue
						}
					}
					a.spawn(ctx, id, func(ctx context.Context) { a.undeploy(ctx, id) })
				}
			}
		}
		tick.Stop()
		if ctx.Err() != nil {
			return nil
		}
	}
}

// resync deploys what is desired here and missing, and undeploys what is
// here and no longer desired. It returns the etcd revision it saw.
func (a *agent) resync(ctx context.Context) (int64, error) {
	r, err := a.st.Client().Get(ctx, state.DeploymentsPrefix, clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	want := map[string]bool{}
	for _, kv := range r.Kvs {
		var dsr state.Desired
		if json.Unmarshal(kv.Value, &dsr) != nil || dsr.Node != a.c.Node.Name {
			continue
		}
		want[dsr.ID] = true
		if rec, err := a.d.Load(dsr.ID); err == nil && rec.Phase == deploy.PhaseRunning {
			// Its instance may have died meanwhile (its container
			// exited, or went with a dockerd restarted without
			// live-restore). A driver that cannot tell is asked again
			// next time.
			if alive, err := a.d.Alive(ctx, dsr.ID); err == nil && !alive {
				a.spawn(ctx, dsr.ID, func(ctx context.Context) { a.revive(ctx, dsr) })
				continue
			}
			// A deploy that ended while etcd was unavailable could not
			// say so.
			if dep, err := a.st.Deployment(ctx, dsr.ID); err == nil && dep.Status.Phase != deploy.PhaseRunning {
				a.spawn(ctx, dsr.ID, func(ctx context.Context) { a.resetStatus(ctx, dsr.ID) })
			}
			continue
		}
		if dep, err := a.st.Deployment(ctx, dsr.ID); err == nil && dep.Status.Phase == deploy.PhaseFailed {
			// A failed deploy whose undo could not finish (the cluster
			// did not answer) left its record: retry the undo. The
			// deployment stays Failed.
			if _, err := a.d.Load(dsr.ID); err == nil {
				a.spawn(ctx, dsr.ID, func(ctx context.Context) { a.cleanFailed(ctx, dsr.ID) })
			}
			continue
		}
		a.spawn(ctx, dsr.ID, func(ctx context.Context) { a.deploy(ctx, dsr) })
	}
	recs, _ := a.d.List()
	here := map[string]bool{}
	for _, rec := range recs {
		here[rec.ID] = true
		if !want[rec.ID] && !strings.HasPrefix(rec.ID, "boot-") {
			id := rec.ID
			a.spawn(ctx, id, func(ctx context.Context) { a.undeploy(ctx, id) })
		}
	}
	// Statuses of withdrawn deployments that are gone from this node (an
	// undeploy interrupted after its instance was removed).
	if stale, err := a.st.StaleStatuses(ctx, a.c.Node.Name); err == nil {
		for _, id := range stale {
			if !here[id] {
				_ = a.st.ForgetStatus(ctx, id)
			}
		}
	}
	return r.Header.Revision, nil
}

// spawn runs fn for deployment id, one operation per ID at a time.
func (a *agent) spawn(ctx context.Context, id string, fn func(context.Context)) {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		defer a.busy.Lock(id)()
		fn(ctx)
	}()
}

func (a *agent) deploy(ctx context.Context, dsr state.Desired) {
	log := a.log.With("deployment", dsr.ID, "app", dsr.App)
	if rec, err := a.d.Load(dsr.ID); err == nil && rec.Phase == deploy.PhaseRunning {
		return // already here (a repeated event)
	}
	if cur, err := a.st.Deployment(ctx, dsr.ID); err != nil {
		return // withdrawn meanwhile
	} else if cur.Status.Phase == deploy.PhaseRunning || cur.Status.Phase == deploy.PhaseFailed || cur.Status.Phase == deploy.PhaseCheckpointed {
		return
	}
	app, err := a.st.App(ctx, dsr.App)
	if err != nil {
		a.fail(ctx, dsr, nil, err)
		return
	}
	if dsr.Mode == deploy.ModeCheckpoint {
		a.refresh(ctx, dsr, app)
		return
	}
	st := state.Status{Phase: deploy.PhaseCreating, Node: a.c.Node.Name}
	var mu sync.Mutex
	_ = a.setStatus(ctx, dsr.ID, st)
	start := time.Now()
	booting := false
	progress := func(phase string, took time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		name := phase
		if booting {
			name = "boot." + phase
		}
		st.Timings = append(st.Timings, layering.Phase{Name: name, Duration: took})
		if phase == "seal" {
			booting = false
		}
		_ = a.setStatus(ctx, dsr.ID, st)
	}
	dep, err := a.d.Deploy(ctx, app, deploy.Options{
		ID:         dsr.ID,
		Mode:       dsr.Mode,
		IfBusy:     a.c.Agent.IfBusy,
		IfNoEngine: a.c.Agent.IfNoEngine,
		Progress:   progress,
		LockCheckpoint: func(ctx context.Context, wait bool) (func(), error) {
			unlock, err := a.st.LockCheckpoint(ctx, a.session(), app.Name, wait)
			if err != nil {
				return nil, err
			}
			mu.Lock()
			booting = true
			st.Phase = deploy.PhaseBooting
			mu.Unlock()
			return func() {
				mu.Lock()
				booting = false
				mu.Unlock()
				unlock()
			}, nil
		},
		Sealed: func(ctx context.Context, g deploy.Generation) error {
			a.m.checkpoints.Inc()
			a.event(ctx, dsr.ID, "checkpointed", fmt.Sprintf("app %s generation %d (%d bytes)", g.App, g.Gen, g.Bytes))
			err := a.st.PutCheckpoint(ctx, g)
			a.retain(ctx, g.App)
			return err
		},
	})
	if err != nil {
		if _, lerr := a.d.Load(dsr.ID); lerr == nil {
			// The deployer's own undo did not finish.
			if cerr := a.clean(ctx, dsr.ID); cerr != nil {
				log.Warn("what the failed deploy left stays until the cluster answers; retried every reconcile interval", "err", cerr)
			}
		}
		if step := failedStep(st.Timings); step != "" {
			err = fmt.Errorf("step %s: %w", step, err)
		}
		a.fail(ctx, dsr, &st, err)
		return
	}
	mode := dep.Mode // restore or boot
	if dep.Booted {
		mode = "checkpoint" // produced the first checkpoint, then restored
	}
	a.m.deploys.WithLabelValues(mode, "ok").Inc()
	a.m.duration.WithLabelValues(mode).Observe(time.Since(start).Seconds())
	st = runningStatus(dep)
	if err := a.setStatus(ctx, dsr.ID, st); err != nil {
		log.Warn("writing status", "err", err)
	}
	what := fmt.Sprintf("restored gen %d", dep.Gen)
	if dep.Mode == deploy.ModeBoot {
		what = "booted without a checkpoint (" + dep.BootReason + ")"
	}
	a.event(ctx, dsr.ID, "running", fmt.Sprintf("%s, %s", what, dep.Timings))
	log.Info("deployment running", "mode", dep.Mode, "gen", dep.Gen, "booted", dep.Booted, "ports", dep.Ports, "timings", dep.Timings.String())
	// Withdrawn while we deployed? Then undo at once (without etcd, resync
	// does when it answers again).
	wctx, cancel := context.WithTimeout(ctx, a.etcdTimeout())
	_, err = a.st.Deployment(wctx, dsr.ID)
	cancel()
	if errors.Is(err, state.ErrNotFound) {
		a.undeploy(ctx, dsr.ID)
	}
}

// etcdTimeout bounds the status and event writes of the deploy path, so
// that a deploy goes on while etcd is unavailable (resync writes a
// Running status again once etcd answers).
func (a *agent) etcdTimeout() time.Duration {
	if a.c.Etcd.DialTimeout > 0 {
		return a.c.Etcd.DialTimeout
	}
	return 5 * time.Second
}

func (a *agent) setStatus(ctx context.Context, id string, st state.Status) error {
	ctx, cancel := context.WithTimeout(ctx, a.etcdTimeout())
	defer cancel()
	return a.st.SetStatus(ctx, id, st)
}

func (a *agent) event(ctx context.Context, id, reason, msg string) {
	ctx, cancel := context.WithTimeout(ctx, a.etcdTimeout())
	defer cancel()
	a.st.Event(ctx, id, reason, msg)
}

// runningStatus is the status of a Running deployment record.
func runningStatus(dep deploy.Deployment) state.Status {
	return state.Status{Phase: deploy.PhaseRunning, Node: dep.Node, Gen: dep.Gen, Mode: dep.Mode, BootReason: dep.BootReason,
		Booted: dep.Booted, Ports: dep.Ports, Timings: dep.Timings, EngineReadyMS: dep.EngineReadyMS}
}

// refresh produces a new checkpoint generation of app under the PoP-wide
// checkpoint lock (waiting for it), records it, and ends the deployment
// Checkpointed; no instance is left running.
func (a *agent) refresh(ctx context.Context, dsr state.Desired, app deploy.App) {
	st := state.Status{Phase: deploy.PhaseBooting, Node: a.c.Node.Name, Mode: deploy.ModeCheckpoint}
	_ = a.setStatus(ctx, dsr.ID, st)
	unlock, err := a.st.LockCheckpoint(ctx, a.session(), app.Name, true)
	if err != nil {
		a.fail(ctx, dsr, &st, err)
		return
	}
	defer unlock()
	start := time.Now()
	g, err := a.d.Checkpoint(ctx, app, deploy.CheckpointOptions{Progress: func(phase string, took time.Duration) {
		st.Timings = append(st.Timings, layering.Phase{Name: phase, Duration: took})
		_ = a.setStatus(ctx, dsr.ID, st)
	}})
	if err != nil {
		a.fail(ctx, dsr, &st, err)
		return
	}
	a.m.checkpoints.Inc()
	a.m.deploys.WithLabelValues(deploy.ModeCheckpoint, "ok").Inc()
	a.m.duration.WithLabelValues(deploy.ModeCheckpoint).Observe(time.Since(start).Seconds())
	if err := a.st.PutCheckpoint(ctx, g); err != nil {
		a.fail(ctx, dsr, &st, fmt.Errorf("generation %d of %s is sealed in the pool but not recorded: %w", g.Gen, g.App, err))
		return
	}
	a.retain(ctx, g.App)
	st.Phase, st.Gen, st.Timings = deploy.PhaseCheckpointed, g.Gen, g.Timings
	_ = a.setStatus(ctx, dsr.ID, st)
	a.event(ctx, dsr.ID, "checkpointed", fmt.Sprintf("app %s generation %d (%d bytes), refreshed", g.App, g.Gen, g.Bytes))
	a.log.Info("checkpoint refreshed", "deployment", dsr.ID, "app", app.Name, "gen", g.Gen, "timings", g.Timings.String())
}

// retain removes the generations of app beyond agent.keep_generations that
// no deployment uses; the caller holds the app's checkpoint lock.
func (a *agent) retain(ctx context.Context, app string) {
	items, err := gc.Retain(ctx, a.pool, app, a.c.Agent.KeepGenerations, false)
	for _, it := range items {
		if it.Skip {
			a.log.Info("keeping an old generation", "generation", it.Name, "reason", it.Reason)
			continue
		}
		_ = a.st.DeleteCheckpoint(ctx, app, it.Gen)
		a.log.Info("old generation removed", "generation", it.Name, "reason", it.Reason)
	}
	if err != nil {
		a.log.Warn("retention", "app", app, "err", err)
	}
}

func (a *agent) fail(ctx context.Context, dsr state.Desired, st *state.Status, err error) {
	err = a.explain(ctx, err)
	a.m.deploys.WithLabelValues("", "error").Inc()
	h := hintOf(err)
	a.log.Error("deployment failed", "deployment", dsr.ID, "app", dsr.App, "err", err, "hint", h)
	s := state.Status{Node: a.c.Node.Name}
	if st != nil {
		s = *st
	}
	s.Phase, s.Error, s.Hint, s.Cause = deploy.PhaseFailed, err.Error(), h, state.CauseOf(err)
	_ = a.setStatus(ctx, dsr.ID, s)
	a.event(ctx, dsr.ID, "failed", err.Error())
}

// hintOf returns the hint an error carries, of either kind.
func hintOf(err error) string {
	if h := layering.Hint(err); h != "" {
		return h
	}
	return hint.Of(err)
}

// explain adds to a failure what the cluster or the node says about it:
// why Ceph did not serve I/O (a full pool, OSDs down) when a mapping
// stalled or an operation timed out, or that the node's state directory is
// full. The cause comes first, with its hint.
func (a *agent) explain(ctx context.Context, err error) error {
	if errors.Is(err, syscall.ENOSPC) && !errors.Is(err, layering.ErrFull) {
		return hint.With(fmt.Errorf("node %s: its state directory is full: %w", a.c.Node.Name, err),
			fmt.Sprintf("free space in %s (`df -h %s`), then deploy again", a.c.Node.StateDir, a.c.Node.StateDir))
	}
	if !errors.Is(err, mapper.ErrStalled) && !errors.Is(err, layering.ErrUnavailable) && !errors.Is(err, layering.ErrFull) {
		return err
	}
	var why error
	if d, ok := a.pool.(layering.Diagnoser); ok {
		why = d.Diagnose(ctx)
	}
	first, _, _ := strings.Cut(err.Error(), "\n")
	switch {
	case why != nil && !strings.Contains(first, why.Error()): // not said yet, or only of the undo
		return fmt.Errorf("ceph: %w; %w", why, err)
	case hintOf(err) != "":
		return err
	}
	return hint.With(fmt.Errorf("ceph: the deployment's images were not served in time; %w", err),
		"`ceph -s` and `ceph health detail` say why; deploy again once the cluster answers")
}

// failedStep names the step that follows the last phase passed, or "".
func failedStep(passed layering.Timings) string {
	if len(passed) == 0 {
		return ""
	}
	steps := []string{"clone", "map", "mount", "container", "ready"} // docs/design.md
	last, booting := strings.CutPrefix(passed[len(passed)-1].Name, "boot.")
	switch last {
	case "ready", "prepare":
		if booting {
			return "boot.checkpoint"
		}
		return ""
	case "checkpoint":
		return "boot.seal" // only a first deploy checkpoints
	case "seal":
		return "clone" // the restore that follows
	}
	i := slices.Index(steps, last)
	if i < 0 || i+1 == len(steps) {
		return ""
	}
	if booting {
		return "boot." + steps[i+1]
	}
	return steps[i+1]
}

// clean removes what a failed or withdrawn deployment left on this node.
// When the first try fails (an instance or a mount blocked on a cluster
// that stopped serving its images), the deployment's mappings are cut off,
// which ends whatever waits on them, and it tries again. The images stay
// in the pool while the cluster does not answer; the reconcile loop
// retries then.
func (a *agent) clean(ctx context.Context, id string) error {
	err := a.d.Undeploy(ctx, id)
	if err == nil || errors.Is(err, deploy.ErrNotFound) {
		return nil
	}
	rec, lerr := a.d.Load(id)
	if lerr != nil {
		return err
	}
	for _, m := range rec.Mappings {
		if aerr := a.mapper.Abort(ctx, m); aerr != nil && !errors.Is(aerr, mapper.ErrNotMapped) {
			a.log.Warn("cutting off a mapping", "deployment", id, "mapping", m, "err", aerr)
		}
	}
	if err := a.d.Undeploy(ctx, id); err != nil && !errors.Is(err, deploy.ErrNotFound) {
		return err
	}
	return nil
}

// cleanFailed retries removing what a failed deployment left; it stays
// Failed (with its error) until withdrawn.
func (a *agent) cleanFailed(ctx context.Context, id string) {
	if _, err := a.d.Load(id); err != nil {
		return
	}
	if err := a.clean(ctx, id); err != nil {
		a.log.Debug("what a failed deployment left is still there", "deployment", id, "err", err)
		return
	}
	a.log.Info("removed what a failed deployment left", "deployment", id)
	a.event(ctx, id, "cleaned", "what the failed deploy left on the node and in the pool is removed")
}

// resetStatus writes the status of a Running deployment from its record,
// when etcd says otherwise (its deploy ended while etcd was unavailable).
func (a *agent) resetStatus(ctx context.Context, id string) {
	rec, err := a.d.Load(id)
	if err != nil || rec.Phase != deploy.PhaseRunning {
		return
	}
	if dep, err := a.st.Deployment(ctx, id); err != nil || dep.Status.Phase == deploy.PhaseRunning {
		return
	}
	if err := a.setStatus(ctx, id, runningStatus(rec)); err != nil {
		a.log.Warn("writing status", "deployment", id, "err", err)
		return
	}
	a.log.Info("status written again: the deployment runs", "deployment", id)
	a.event(ctx, id, "running", "status written again after etcd was unavailable")
}

// revive deploys a Running deployment again whose instance is gone (its
// container exited, or was removed with a dockerd restarted without
// live-restore): what is left of it is removed, and it is restored (or
// booted) anew under the same ID.
func (a *agent) revive(ctx context.Context, dsr state.Desired) {
	if alive, err := a.d.Alive(ctx, dsr.ID); err != nil || alive {
		return // it runs, or was undone meanwhile
	}
	if _, err := a.st.Deployment(ctx, dsr.ID); err != nil {
		return // withdrawn meanwhile, or etcd unavailable: next time
	}
	a.log.Warn("instance gone: deploying it again", "deployment", dsr.ID, "app", dsr.App)
	a.event(ctx, dsr.ID, "instance lost", "its instance stopped running; deploying it again")
	if err := a.clean(ctx, dsr.ID); err != nil {
		a.log.Warn("removing what is left of a lost instance", "deployment", dsr.ID, "err", err)
		return
	}
	if err := a.setStatus(ctx, dsr.ID, state.Status{Phase: deploy.PhaseCreating, Node: a.c.Node.Name}); err != nil {
		return
	}
	a.deploy(ctx, dsr)
}

func (a *agent) undeploy(ctx context.Context, id string) {
	err := a.clean(ctx, id)
	if err != nil {
		a.log.Error("undeploy failed", "deployment", id, "err", err)
		a.event(ctx, id, "undeploy failed", err.Error())
		return
	}
	_ = a.st.ForgetStatus(ctx, id)
	a.event(ctx, id, "undeployed", "")
	a.log.Info("undeployed", "deployment", id)
}

func kernelRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func readToken(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("agent.token_file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("agent.token_file %s is readable by others (mode %o): chmod 600 it", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	t := strings.TrimSpace(string(b))
	if len(t) < 16 {
		return "", fmt.Errorf("agent.token_file %s: the token is shorter than 16 characters", path)
	}
	return t, nil
}

// etcdMain runs `pop-agent etcd`: the embedded single-node etcd.
func etcdMain(args []string, errOut io.Writer) int {
	fs := flag.NewFlagSet("pop-agent etcd", flag.ContinueOnError)
	fs.SetOutput(errOut)
	dir := fs.String("data-dir", filepath.Join(devenv.Dir(), "etcd"), "etcd data directory")
	listen := fs.String("listen", devenv.EtcdEndpoint, "client address host:port (the peer port is the next one)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewTextHandler(errOut, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := state.Embedded(ctx, *dir, *listen, log); err != nil {
		log.Error("embedded etcd stopped", "err", err)
		return 1
	}
	return 0
}
