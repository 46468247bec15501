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
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fogdeploy/fogdeploy/internal/apiauth"
	"github.com/fogdeploy/fogdeploy/internal/cgroup"
	"github.com/fogdeploy/fogdeploy/internal/config"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/frontend"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/keyedmutex"
	"github.com/fogdeploy/fogdeploy/internal/ksm"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/spec"
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
	mapper nodeMapper
	pool   *poolKeeper
	// plane fences the agent when etcd is not the one it knew (plane.go).
	plane *plane
	// frontend is the node's front end to the PoP's endpoints
	// (frontend.go; its listen address "": none).
	frontend frontendSetup
	// recs is the deployer as the reconciler asks it; nil: d.
	recs nodeRecords
	// auto is the deployer as mode auto asks it; nil: d.
	auto autoNode
	// measuring are mode auto's measurements under way.
	measuring measurements
	// following are the hand-overs whose deployments the agent follows
	// (handoff.go); refusals gates the log of the reads it refuses.
	following sync.Map
	refusals  logGate
	// pages are the page sessions of the hand-overs sent without their
	// pages (pages.go).
	pages pageSessions

	busy keyedmutex.Map[string] // one operation per deployment ID at a time
	wg   sync.WaitGroup

	sessMu   sync.Mutex
	sess     *state.Session // the node's lease; replaced after an etcd outage
	etcdLost time.Time      // when the lease was lost; zero while registered
}

// Run starts the agent and blocks until ctx is done. Its stages: the
// API's credentials, the storage, the deployer and its drivers, the
// engines' check, crash recovery, the control plane, then serving; at
// shutdown the hooks stop, then the loops, then the operations, and the
// warm pool and unused node copies go.
func Run(ctx context.Context, c config.Config, o Options, log *slog.Logger) error {
	log = log.With("node", c.Node.Name)
	// The API's credentials first: a bad token file or certificate stops
	// the agent before it touches the node or etcd.
	sec, err := loadAPISecurity(c, o, time.Now(), log)
	if err != nil {
		return err
	}
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
	// The etcd revision this node has seen, kept by its control plane and
	// written on the images it makes for an owner (stampStore).
	seen := &atomic.Int64{}
	d, priority, err := newDeployer(ctx, c, l, seen, log)
	if err != nil {
		return err
	}
	registerFetchBytes(reg, d)
	if err := startMemoryMerge(c.Agent.MemoryMerge, ksm.Node{}, reg, log); err != nil {
		return err
	}
	return runNode(ctx, c, o, log, sec, reg, m, nodeParts{d: d, store: l.Store, mapper: l.Mapper, backend: l.Mapper.Choice().Backend, priority: priority, seen: seen})
}

// nodeMapper is what the agent asks of the node's mapper beyond the
// deployer: its crash recovery and the release of what dead builds left.
type nodeMapper interface {
	List() ([]mapper.Mapping, error)
	Release(ctx context.Context, id string) error
	ReleaseAbandoned(ctx context.Context) ([]mapper.Mapping, error)
}

// nodeParts are the node's components that an agent drives: the pool's
// images, the mapper (its backend named), and the deployer over them, with
// how its waiting slots are prioritized. Run makes them on the node; a
// unit test gives fakes (deploytest.Unit).
type nodeParts struct {
	// seen, if set, receives the etcd revision the control plane saw.
	seen     *atomic.Int64
	d        *deploy.Deployer
	store    layering.Store
	mapper   nodeMapper
	backend  string
	priority string
}

// runNode is Run once the node's components are made: the engines'
// check, crash recovery, the control plane, the node's record, then
// serving the hook API and the loops until ctx is done.
func runNode(ctx context.Context, c config.Config, o Options, log *slog.Logger, sec apiSecurity, reg *prometheus.Registry, m *metrics, n nodeParts) error {
	d := n.d
	engines, fingerprint, problems := checkEngines(ctx, c, d, log)
	recoverNode(ctx, d, n.mapper, m, log)

	sc := wire.StateConfig(c)
	sc.Requests = func(method string) { m.etcdRequests.WithLabelValues(method).Inc() }
	st, err := state.Open(ctx, sc)
	if err != nil {
		return err
	}
	defer st.Close()
	// The hook API places creates and follows long polls from a view kept
	// current by watching.
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	st.Watch(wctx, log)
	pl, err := openPlane(ctx, c, o, st, d, reg, n.seen, log)
	if err != nil {
		return err
	}
	defer func() {
		if err := pl.flush(); err != nil {
			log.Warn("control plane: saving the revision seen", "err", err)
		}
	}()

	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", o.Listen, err)
	}
	api, err := advertised(c.Agent.Advertise, ln.Addr())
	if err != nil {
		_ = ln.Close()
		return err
	}
	if sec.tls != nil {
		api = "https://" + api // fogctl's scheme; plain HTTP stays host:port
	}
	limits := c.Limits.Spec()
	fe, err := openFrontend(c, strings.TrimPrefix(api, "https://"), reg, log)
	if err != nil {
		_ = ln.Close()
		return err
	}
	node := state.Node{Name: c.Node.Name, API: api, Frontend: fe.listen, Capacity: c.Agent.Capacity,
		Mapper: n.backend, Engines: engines, Fingerprint: fingerprint, Problems: problems, Priority: n.priority, Limits: &limits, Started: time.Now().UTC()}
	a := &agent{c: c, o: o, log: log, st: st, node: node, d: d, m: m, store: n.store, mapper: n.mapper, pool: newPoolKeeper(), plane: pl, frontend: fe}
	pl.changed = a.fenceChanged
	sess, err := st.Register(ctx, a.nodeRecord(), c.Agent.LeaseTTL)
	if err != nil {
		_ = ln.Close()
		return err
	}
	a.sess = sess
	defer func() { a.session().Close() }()
	h := &hooks{a: a, keys: sec.keys, openMetrics: o.Dev}
	h.inflight.Changed = func(client string, k apiauth.Kind, n int) {
		a.m.apiInflight.WithLabelValues(client, string(k)).Set(float64(n))
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", a.serveHealthz(h, n.backend, engines))
	mux.Handle("GET /metrics", h.metrics(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})))
	h.register(mux)
	mux.HandleFunc("GET "+handoffPath+"{id}", a.serveHandoff)
	mux.HandleFunc("GET "+handoffPath+"{id}/pages", a.servePages)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second, TLSConfig: sec.tls}
	return a.serve(ctx, srv, ln)
}

// hostCgroups is the parent cgroup of the host driver's instances (with
// the node's name).
const hostCgroups = "fogdeploy-host"

// newDeployer makes the node's drivers (the host driver, the light
// container where dockerd answers, with the cgroups that lower a waiting
// slot's priority) and its deployer. priority says how slots wait.
func newDeployer(ctx context.Context, c config.Config, l *wire.Layering, seen *atomic.Int64, log *slog.Logger) (d *deploy.Deployer, priority string, err error) {
	ec := engine.Config{Logger: log, TempDir: filepath.Join(c.Node.StateDir, "engine"), Confine: true}
	if err := os.MkdirAll(ec.TempDir, 0o700); err != nil {
		return nil, "", err
	}
	host := drivers.NewHost(engine.All(ec)...)
	// One parent per node name: agents of several nodes may share a
	// machine (dev, tests), and each sweeps only its own.
	if gs, err := cgroup.NewGroups(cgroup.Paths{}, hostCgroups+"-"+c.Node.Name); err != nil {
		log.Warn("host driver: its instances run without the node's limits", "err", err)
	} else {
		host.Groups = gs
		// Host instances end with the agent that started them: what a
		// killed agent left still runs, in its cgroups.
		n, err := gs.Sweep()
		if n > 0 || err != nil {
			log.Info("host driver: killed the instances a previous run left", "groups", n, "err", err)
		}
	}
	deps := deploy.Deps{Store: stampStore{Backend: l.Store, seen: seen}, Envs: l.Manager, Mapper: l.Mapper, Log: log, Host: host}
	var ctr *drivers.Container
	if rt, err := runtime.Dial(ctx, c.Docker.Host, log); err != nil {
		log.Warn("dockerd unavailable: DMTCP apps cannot run in the DMTCP container", "err", err)
	} else {
		ctr = &drivers.Container{RT: rt, Image: c.Agent.DMTCPImage, BootImage: c.Agent.BootImage}
		deps.Container = ctr
	}
	// The warm pool's slots wait at the lowest CPU weight and are raised
	// when a deployment binds them.
	priority = "none: this node's cgroups cannot be reweighted; warm-pool slots wait at the runtime's lowest CPU shares only"
	if p, err := cgroup.Detect(cgroup.Paths{}); err != nil {
		log.Warn("warm-pool slots cannot be raised to normal priority when bound; they are created at normal priority", "err", err)
	} else {
		priority = p.Describe()
		if ctr != nil {
			ctr.Priority = p
		}
	}
	if ctr != nil {
		// A spare takes its app's limits in its cgroup's files.
		if l, err := cgroup.NewLimiter(cgroup.Paths{}); err != nil {
			log.Info("spare slots take their apps' limits through dockerd (docker update), not the cgroup files", "err", err)
		} else {
			ctr.Limiter = l
		}
	}
	log.Info("warm-pool refill priority", "cgroup", priority)
	if c.Agent.PoolAhead.IsOn() {
		if ctr == nil || ctr.Priority == nil {
			log.Warn("warm-pool slots are not restored ahead: their apps could not wait below the serving instances' priority; a pool hit restarts its app")
		} else {
			log.Info("warm-pool slots are restored ahead and wait at the background CPU weight (agent.pool_ahead)")
		}
	}
	cacheBytes, err := c.Agent.CheckpointCacheBytes()
	if err != nil {
		return nil, "", err
	}
	spareBytes, err := c.Agent.SpareDiskBytes()
	if err != nil {
		return nil, "", err
	}
	d, err = deploy.New(deploy.Config{StateDir: filepath.Join(c.Node.StateDir, "deploy"), Pool: c.Ceph.Pool,
		Node: c.Node.Name, Drivers: c.Agent.Drivers, CacheBytes: cacheBytes, EnvRead: deploy.EnvRead(c.Agent.EnvRead),
		HitConcurrency: c.Agent.HitConcurrency, Limits: c.Limits.Spec(), SparePorts: c.Agent.SparePorts, SpareBytes: spareBytes,
		MemoryMerge: c.Agent.MemoryMerge.Enabled}, deps)
	if err != nil {
		return nil, "", err
	}
	for eng, driver := range c.Agent.Drivers {
		if driver == spec.DriverHost && !host.Limited() {
			log.Warn("the host driver cannot bound this engine's instances (no cgroups): it runs only apps marked `trusted: true`; the others are refused under this engine, or boot in the container (agent.if_no_engine: boot) (docs/security.md)",
				"engine", eng)
		}
	}
	if held, err := d.Checkpoints().Cached(); err == nil {
		log.Info("checkpoint cache", "budget", c.Agent.CheckpointCache, "fetch", c.Agent.Fetch, "generations", len(held), "env_read", c.Agent.EnvRead)
	}
	return d, priority, nil
}

// checkEngines returns the engines this node runs, its fingerprint (arch,
// kernel, each engine's version and driver, the boot image) and, per
// engine or "boot", why it cannot.
func checkEngines(ctx context.Context, c config.Config, d *deploy.Deployer, log *slog.Logger) (engines []engine.Name, fingerprint, problems map[string]string) {
	engines = []engine.Name{}
	fingerprint = map[string]string{"arch": goruntime.GOARCH, "kernel": kernelRelease()}
	problems = map[string]string{}
	for _, e := range spec.Engines {
		if drv, v, err := d.Drivers().CheckEngine(ctx, e); err != nil {
			log.Warn("engine unavailable: apps of this engine boot without a checkpoint here (agent.if_no_engine)", "engine", e, "reason", err)
			problems[string(e)] = hint.Sentence(err)
		} else {
			engines = append(engines, e)
			fingerprint[string(e)] = v + " (" + drv + ")"
		}
	}
	if err := d.Drivers().CheckBoot(ctx); err != nil {
		log.Warn("cannot boot apps without an engine", "reason", err)
		problems["boot"] = hint.Sentence(err)
	} else {
		fingerprint["boot"] = c.Agent.BootImage
	}
	return engines, fingerprint, problems
}

// recoverNode is crash recovery: release the mappings that no deployment
// owns, then keep Running instances that still run and undo the rest.
// Undoing removes a deployment's images once nothing on this node maps
// them, evicting the watches that clients killed with them open
// (rbd-fuse, the previous agent) left, instead of leaving the images to a
// later reconcile.
func recoverNode(ctx context.Context, d *deploy.Deployer, mp nodeMapper, m *metrics, log *slog.Logger) {
	if owned, err := d.Mappings(); err != nil {
		log.Warn("listing the mappings of deployments; orphaned mappings stay", "err", err)
	} else if maps, err := mp.List(); err == nil {
		for _, mg := range maps {
			// A live process's own (a build that fogctl runs now) are
			// not this node's to release.
			if !owned[mg.ID] && !mg.Live {
				if err := mp.Release(ctx, mg.ID); err != nil {
					log.Warn("releasing an orphaned mapping", "id", mg.ID, "err", err)
				} else {
					m.recovered.Inc()
				}
			}
		}
	}
	if released, err := d.Pool().RecoverSlots(ctx); err != nil {
		log.Warn("releasing the slots a previous run left; retried at the next start", "err", err)
	} else if len(released) > 0 {
		log.Info("released the slots a previous run left (the warm pool provisions anew)", "slots", released)
	}
	kept, removed, err := d.Adopt(ctx)
	if err != nil {
		log.Warn("recovering deployments left by a previous run", "err", err)
	}
	log.Info("recovered", "kept", kept, "removed", removed)
}

// serve runs the hook API on ln and the node's loops (the reconciler, the
// lease's keeper, the warm pool's keeper) until ctx is done or the API
// stops. Each operation they or the hooks start is in a.wg. Shutting down
// stops the hooks, then the loops (nothing starts an operation after
// that), then waits for the operations: only then do Run's deferred
// closes of the store, the state and the session run.
func (a *agent) serve(ctx context.Context, srv *http.Server, ln net.Listener) error {
	loops, stopLoops := context.WithCancel(ctx)
	defer stopLoops()
	var loopWG sync.WaitGroup
	errc := make(chan error, 1)
	go func() {
		if srv.TLSConfig != nil {
			errc <- srv.ServeTLS(ln, "", "")
			return
		}
		errc <- srv.Serve(ln)
	}()
	loopWG.Go(func() { a.reconcile(loops) })
	loopWG.Go(func() { a.keepRegistered(loops) })
	loopWG.Go(func() { a.keepPool(loops) })
	if a.d != nil {
		loopWG.Go(func() { a.watchIdle(loops) })
		a.recoverHandoffs(loops)
	}
	if a.frontend.listen != "" {
		r := a.newRouter()
		fe := frontend.New(a.frontend.cfg, r)
		loopWG.Go(func() { a.runFrontend(loops, fe, r) })
	}
	a.log.Info("pop-agent ready", "api", a.node.API, "frontend", a.node.Frontend, "engines", a.node.Engines, "version", version.String())

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	a.log.Info("shutting down", "bound", a.o.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.o.ShutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	stopLoops()
	loopWG.Wait()
	a.waitOperations(sctx)
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		err = fmt.Errorf("the hook API stopped: %w", serveErr)
	}
	a.releaseNode(sctx)
	return err
}

// releaseNode lets go, at shutdown, of what the next start makes anew:
// the warm pool's waiting slots (a killed agent's are released by
// RecoverSlots) and the node's copies of environments that no running
// instance uses (a killed agent's stay recorded and are kept at its next
// start).
func (a *agent) releaseNode(ctx context.Context) {
	if released, err := a.d.Pool().ReleasePool(ctx); err != nil {
		a.log.Warn("releasing the warm pool's slots; the next start releases the rest", "err", err)
	} else if len(released) > 0 {
		a.log.Info("released the warm pool's slots", "slots", len(released))
	}
	if released, err := a.d.Pool().ReleaseSpares(ctx, "", -1); err != nil {
		a.log.Warn("releasing the spare slots; the next start releases the rest", "err", err)
	} else if len(released) > 0 {
		a.log.Info("released the spare slots", "slots", len(released))
	}
	if dropped, err := a.d.EnvCopies().TrimLowers(ctx, nil); err != nil {
		a.log.Warn("dropping the node's unused copies of environments; the next start keeps or drops them", "err", err)
	} else if len(dropped) > 0 {
		a.log.Info("dropped the node's unused copies of environments", "copies", len(dropped))
	}
}

// serveHealthz answers GET /healthz (hooks.healthz says who sees what):
// "ok"; "degraded" while etcd is unavailable; "fenced", with HTTP 503,
// while etcd is not the one this node knew (plane.go).
func (a *agent) serveHealthz(h *hooks, backend string, engines []engine.Name) http.HandlerFunc {
	healthz := h.healthz(func() map[string]any {
		status, etcd := "ok", "ok"
		if lost := a.etcdState(); !lost.IsZero() {
			// Still alive: instances keep running.
			status = "degraded"
			etcd = fmt.Sprintf("unavailable for %s: node lease lost at %s; instances keep running, registering again when etcd answers",
				time.Since(lost).Round(time.Second), lost.UTC().Format(time.RFC3339))
		}
		if err := a.plane.err(); err != nil {
			// Alive, and acting on nothing: the body says why to anyone.
			status, etcd = "fenced", hint.Sentence(err)
		}
		return map[string]any{"status": status, "etcd": etcd, "node": a.c.Node.Name, "mapper": backend,
			"engines": engines, "version": version.String(), "control_plane": a.plane.describe()}
	})
	return func(w http.ResponseWriter, r *http.Request) {
		if a.plane.err() != nil {
			w = statusWriter{ResponseWriter: w, code: http.StatusServiceUnavailable}
		}
		healthz(w, r)
	}
}

// waitOperations waits for the deploys and undeploys under way, which
// end soon after their context (their undo runs to its end). Past the
// shutdown's bound it says what it waits for, and waits on: closing the
// store under them would leave their steps half done.
func (a *agent) waitOperations(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		a.wg.Wait()
		if a.d != nil {
			a.d.Handoffs().Wait() // the durable copies behind migrations
		}
		close(done)
	}()
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

// advertised is the address the agent registers for its API: advertise,
// else the listener's, which must name a host (not 0.0.0.0 or [::]).
func advertised(advertise string, l net.Addr) (string, error) {
	if advertise != "" {
		host, port, err := net.SplitHostPort(advertise)
		if err != nil || host == "" || port == "" {
			return "", fmt.Errorf("agent.advertise %q: give the host:port where fogctl and the other nodes reach this agent, e.g. 10.0.0.11:7480", advertise)
		}
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			return "", fmt.Errorf("agent.advertise %q: give this node's own address, not %s", advertise, host)
		}
		return advertise, nil
	}
	a := l.String()
	if t, ok := l.(*net.TCPAddr); ok && t.IP.IsUnspecified() {
		return "", fmt.Errorf("--listen %s: on every address, the agent needs agent.advertise (the host:port that fogctl and the other nodes reach it at, e.g. 10.0.0.11:%d)", a, t.Port)
	}
	return a, nil
}
