// Run: the wiring of one pop-agent (storage, engines and drivers, crash recovery, the node's
// registration, the HTTP API) and its shutdown.

package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fogdeploy/fogdeploy/internal/cgroup"
	"github.com/fogdeploy/fogdeploy/internal/config"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/keyedmutex"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/version"
	"github.com/fogdeploy/fogdeploy/internal/wire"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// agent is one running pop-agent.
type agent struct {
	c      config.Config
	o      Options
	log    *slog.Logger
	st     *state.Store
	node   state.Node
	d      *deploy.Deployer
	m      *metrics
	store  layering.Store
	mapper *mapper.Mapper
	pool   *poolKeeper
	// auto is the deployer as mode auto asks it; nil: d.
	auto autoNode
	// measuring are mode auto's measurements under way.
	measuring measurements

	busy keyedmutex.Map[string] // one operation per deployment ID at a time
	wg   sync.WaitGroup

	sessMu   sync.Mutex
	sess     *concurrency.Session // the node's lease; replaced after an etcd outage
	etcdLost time.Time            // when the lease was lost; zero while registered
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
	if sc, ok := l.Store.(layering.StallCounter); ok {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "fogdeploy_ceph_stalls_total", Help: "Calls into librbd given up on after 3 x ceph.timeout; after each the agent connected to the cluster again.",
		}, func() float64 { return float64(sc.Stalls()) }))
	}

	ec := engine.Config{Logger: log, TempDir: filepath.Join(c.Node.StateDir, "engine")}
	if err := os.MkdirAll(ec.TempDir, 0o700); err != nil {
		return err
	}
	deps := deploy.Deps{Store: l.Store, Envs: l.Manager, Mapper: l.Mapper, Log: log,
		Host: deploy.NewHost(engine.NewDMTCP(ec), engine.NewCRIU(ec))}
	engines := []string{}
	var ctr *deploy.Container
	if rt, err := runtime.Dial(ctx, c.Docker.Host, log); err != nil {
		log.Warn("dockerd unavailable: DMTCP apps cannot run in the DMTCP container", "err", err)
	} else {
		ctr = &deploy.Container{RT: rt, Image: c.Agent.DMTCPImage, BootImage: c.Agent.BootImage}
		deps.Container = ctr
	}
	// The warm pool's slots wait at the lowest CPU weight and are raised
	// when a deployment binds them.
	priority := "none: this node's cgroups cannot be reweighted; warm-pool slots wait at the runtime's lowest CPU shares only"
	if p, err := cgroup.Detect(cgroup.Paths{}); err != nil {
		log.Warn("warm-pool slots cannot be raised to normal priority when bound; they are created at normal priority", "err", err)
	} else {
		priority = p.Describe()
		if ctr != nil {
			ctr.Priority = p
		}
	}
	log.Info("warm-pool refill priority", "cgroup", priority)
	if c.Agent.PoolAhead == "on" {
		if ctr == nil || ctr.Priority == nil {
			log.Warn("warm-pool slots are not restored ahead: their apps could not wait below the serving instances' priority; a pool hit restarts its app")
		} else {
			log.Info("warm-pool slots are restored ahead and wait at the background CPU weight (agent.pool_ahead)")
		}
	}
	cacheBytes, err := c.Agent.CheckpointCacheBytes()
	if err != nil {
		return err
	}
	d, err := deploy.New(deploy.Config{StateDir: filepath.Join(c.Node.StateDir, "deploy"), Pool: c.Ceph.Pool,
		Node: c.Node.Name, DMTCPDriver: c.Agent.DMTCPDriver, CRIUDriver: c.Agent.CRIUDriver, CacheBytes: cacheBytes, EnvRead: deploy.EnvRead(c.Agent.EnvRead),
		HitConcurrency: c.Agent.HitConcurrency}, deps)
	if err != nil {
		return err
	}
	if held, err := d.Cached(); err == nil {
		log.Info("checkpoint cache", "budget", c.Agent.CheckpointCache, "fetch", c.Agent.Fetch, "generations", len(held), "env_read", c.Agent.EnvRead)
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
			// A live process's own (a build that fogctl runs now) are
			// not this node's to release.
			if !owned[mp.ID] && !mp.Live {
				if err := l.Mapper.Release(ctx, mp.ID); err != nil {
					log.Warn("releasing an orphaned mapping", "id", mp.ID, "err", err)
				} else {
					m.recovered.Inc()
				}
			}
		}
	}
	if released, err := d.RecoverSlots(ctx); err != nil {
		log.Warn("releasing the slots a previous run left; retried at the next start", "err", err)
	} else if len(released) > 0 {
		log.Info("released the slots a previous run left (the warm pool provisions anew)", "slots", released)
	}
	kept, removed, err := d.Adopt(ctx)
	if err != nil {
		log.Warn("recovering deployments left by a previous run", "err", err)
	}
	log.Info("recovered", "kept", kept, "removed", removed)

	st, err := state.Open(ctx, wire.StateConfig(c))
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
		Mapper: l.Mapper.Choice().Backend, Engines: engines, Fingerprint: fingerprint, Problems: problems, Priority: priority, Started: time.Now().UTC()}
	sess, err := st.Register(ctx, node, c.Agent.LeaseTTL)
	if err != nil {
		return err
	}

	a := &agent{c: c, o: o, log: log, st: st, node: node, sess: sess, d: d, m: m, store: l.Store, mapper: l.Mapper, pool: newPoolKeeper()}
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
	// The node's loops (the reconciler, the lease's keeper, the warm
	// pool's keeper) end with loops; each operation they or the hooks
	// start is in a.wg. Shutting down stops the hooks, then the loops
	// (nothing starts an operation after that), then waits for the
	// operations: only then do the deferred closes of the store, the
	// state and the session run.
	loops, stopLoops := context.WithCancel(ctx)
	defer stopLoops()
	var loopWG sync.WaitGroup
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	loopWG.Go(func() { a.reconcile(loops) })
	loopWG.Go(func() { a.keepRegistered(loops) })
	loopWG.Go(func() { a.keepPool(loops) })
	log.Info("pop-agent ready", "api", api, "engines", engines, "version", version.String())

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	log.Info("shutting down", "bound", o.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.ShutdownTimeout)
	defer cancel()
	err = srv.Shutdown(sctx)
	stopLoops()
	loopWG.Wait()
	a.waitOperations(sctx)
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		err = fmt.Errorf("the hook API stopped: %w", serveErr)
	}
	// The warm pool's waiting slots go with the agent; the next start
	// provisions anew (a killed agent's are released by RecoverSlots).
	if released, rerr := d.ReleasePool(sctx); rerr != nil {
		log.Warn("releasing the warm pool's slots; the next start releases the rest", "err", rerr)
	} else if len(released) > 0 {
		log.Info("released the warm pool's slots", "slots", len(released))
	}
	// So do the node's copies of environments that no running instance
	// uses (a killed agent's stay recorded and are kept at its next start).
	if dropped, rerr := d.TrimLowers(sctx, nil); rerr != nil {
		log.Warn("dropping the node's unused copies of environments; the next start keeps or drops them", "err", rerr)
	} else if len(dropped) > 0 {
		log.Info("dropped the node's unused copies of environments", "copies", len(dropped))
	}
	return err
}

// waitOperations waits for the deploys and undeploys under way, which
// end soon after their context (their undo runs to its end). Past the
// shutdown's bound it says what it waits for, and waits on: closing the
// store under them would leave their steps half done.
func (a *agent) waitOperations(ctx context.Context) {
	done := make(chan struct{})
	go func() { a.wg.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-ctx.Done():
	}
	a.log.Warn("shutting down: operations still under way past the bound; waiting for them to end")
	<-done
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
