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
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/version"
	"github.com/fogdeploy/fogdeploy/internal/wire"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// StateConfig turns the config into the etcd client's.
func StateConfig(c config.Config) state.Config {
	return state.Config{Endpoints: c.Etcd.Endpoints, DialTimeout: c.Etcd.DialTimeout,
		CAFile: c.Etcd.CAFile, CertFile: c.Etcd.CertFile, KeyFile: c.Etcd.KeyFile}
}

// agent is one running pop-agent.
type agent struct {
	c    config.Config
	o    Options
	log  *slog.Logger
	st   *state.Store
	sess *concurrency.Session
	d    *deploy.Deployer
	m    *metrics
	pool layering.Store

	mu   sync.Mutex
	busy map[string]*sync.Mutex // per deployment
	wg   sync.WaitGroup
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
	for _, e := range []string{engine.NameDMTCP, engine.NameCRIU} {
		if drv, v, err := d.CheckEngine(ctx, e); err != nil {
			log.Info("engine unavailable", "engine", e, "reason", err)
		} else {
			engines = append(engines, e)
			fingerprint[e] = v + " (" + drv + ")"
		}
	}
	if err := d.CheckBoot(ctx); err != nil {
		log.Info("cannot boot apps without an engine", "reason", err)
	} else {
		fingerprint["boot"] = c.Agent.BootImage
	}

	// Crash recovery: keep Running instances that still run, undo the rest,
	// and release mappings that no deployment owns.
	kept, removed, err := d.Adopt(ctx)
	if err != nil {
		log.Warn("recovering deployments left by a previous run", "err", err)
	}
	owned, _ := d.Mappings()
	if maps, err := l.Mapper.List(); err == nil {
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
	sess, err := st.Register(ctx, state.Node{Name: c.Node.Name, API: api, Capacity: c.Agent.Capacity,
		Mapper: l.Mapper.Choice().Backend, Engines: engines, Fingerprint: fingerprint, Started: time.Now().UTC()}, c.Agent.LeaseTTL)
	if err != nil {
		return err
	}
	defer sess.Close()

	a := &agent{c: c, o: o, log: log, st: st, sess: sess, d: d, m: m, pool: l.Store, busy: map[string]*sync.Mutex{}}
	token, err := readToken(c.Agent.TokenFile)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "node": c.Node.Name, "mapper": l.Mapper.Choice().Backend,
			"engines": engines, "version": version.String()})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	(&hooks{a: a, token: token}).register(mux)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second}
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	go func() { errc <- a.reconcile(ctx) }()
	log.Info("pop-agent ready", "api", api, "engines", engines, "version", version.String())

	select {
	case <-ctx.Done():
	case err := <-errc:
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	case <-sess.Done():
		return errors.New("etcd lease lost")
	}
	log.Info("shutting down", "bound", o.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.ShutdownTimeout)
	defer cancel()
	err = srv.Shutdown(sctx)
	a.wg.Wait()
	return err
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
			continue
		}
		if dep, err := a.st.Deployment(ctx, dsr.ID); err == nil && dep.Status.Phase == deploy.PhaseFailed {
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
	a.mu.Lock()
	l, ok := a.busy[id]
	if !ok {
		l = &sync.Mutex{}
		a.busy[id] = l
	}
	a.mu.Unlock()
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		l.Lock()
		defer l.Unlock()
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
	_ = a.st.SetStatus(ctx, dsr.ID, st)
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
		_ = a.st.SetStatus(ctx, dsr.ID, st)
	}
	dep, err := a.d.Deploy(ctx, app, deploy.Options{
		ID:         dsr.ID,
		Mode:       dsr.Mode,
		IfBusy:     a.c.Agent.IfBusy,
		IfNoEngine: a.c.Agent.IfNoEngine,
		Progress:   progress,
		LockCheckpoint: func(ctx context.Context, wait bool) (func(), error) {
			unlock, err := a.st.LockCheckpoint(ctx, a.sess, app.Name, wait)
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
			a.st.Event(ctx, dsr.ID, "checkpointed", fmt.Sprintf("app %s generation %d (%d bytes)", g.App, g.Gen, g.Bytes))
			err := a.st.PutCheckpoint(ctx, g)
			a.retain(ctx, g.App)
			return err
		},
	})
	if err != nil {
		a.fail(ctx, dsr, &st, err)
		return
	}
	mode := dep.Mode // restore or boot
	if dep.Booted {
		mode = "checkpoint" // produced the first checkpoint, then restored
	}
	a.m.deploys.WithLabelValues(mode, "ok").Inc()
	a.m.duration.WithLabelValues(mode).Observe(time.Since(start).Seconds())
	st = state.Status{Phase: deploy.PhaseRunning, Node: a.c.Node.Name, Gen: dep.Gen, Mode: dep.Mode, BootReason: dep.BootReason,
		Booted: dep.Booted, Ports: dep.Ports, Timings: dep.Timings, EngineReadyMS: dep.EngineReadyMS}
	if err := a.st.SetStatus(ctx, dsr.ID, st); err != nil {
		log.Warn("writing status", "err", err)
	}
	what := fmt.Sprintf("restored gen %d", dep.Gen)
	if dep.Mode == deploy.ModeBoot {
		what = "booted without a checkpoint (" + dep.BootReason + ")"
	}
	a.st.Event(ctx, dsr.ID, "running", fmt.Sprintf("%s, %s", what, dep.Timings))
	log.Info("deployment running", "mode", dep.Mode, "gen", dep.Gen, "booted", dep.Booted, "ports", dep.Ports, "timings", dep.Timings.String())
	// Withdrawn while we deployed? Then undo at once.
	if _, err := a.st.Deployment(ctx, dsr.ID); errors.Is(err, state.ErrNotFound) {
		a.undeploy(ctx, dsr.ID)
	}
}

// refresh produces a new checkpoint generation of app under the PoP-wide
// checkpoint lock (waiting for it), records it, and ends the deployment
// Checkpointed; no instance is left running.
func (a *agent) refresh(ctx context.Context, dsr state.Desired, app deploy.App) {
	st := state.Status{Phase: deploy.PhaseBooting, Node: a.c.Node.Name, Mode: deploy.ModeCheckpoint}
	_ = a.st.SetStatus(ctx, dsr.ID, st)
	unlock, err := a.st.LockCheckpoint(ctx, a.sess, app.Name, true)
	if err != nil {
		a.fail(ctx, dsr, &st, err)
		return
	}
	defer unlock()
	start := time.Now()
	g, err := a.d.Checkpoint(ctx, app, deploy.CheckpointOptions{Progress: func(phase string, took time.Duration) {
		st.Timings = append(st.Timings, layering.Phase{Name: phase, Duration: took})
		_ = a.st.SetStatus(ctx, dsr.ID, st)
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
	_ = a.st.SetStatus(ctx, dsr.ID, st)
	a.st.Event(ctx, dsr.ID, "checkpointed", fmt.Sprintf("app %s generation %d (%d bytes), refreshed", g.App, g.Gen, g.Bytes))
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
	a.m.deploys.WithLabelValues("", "error").Inc()
	a.log.Error("deployment failed", "deployment", dsr.ID, "app", dsr.App, "err", err)
	s := state.Status{Node: a.c.Node.Name}
	if st != nil {
		s = *st
	}
	s.Phase, s.Error = deploy.PhaseFailed, err.Error()
	_ = a.st.SetStatus(ctx, dsr.ID, s)
	a.st.Event(ctx, dsr.ID, "failed", err.Error())
}

func (a *agent) undeploy(ctx context.Context, id string) {
	err := a.d.Undeploy(ctx, id)
	if err != nil && !errors.Is(err, deploy.ErrNotFound) {
		a.log.Error("undeploy failed", "deployment", id, "err", err)
		a.st.Event(ctx, id, "undeploy failed", err.Error())
		return
	}
	_ = a.st.ForgetStatus(ctx, id)
	a.st.Event(ctx, id, "undeployed", "")
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
