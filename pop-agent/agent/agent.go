// Package agent is the pop-agent: one per node. It registers the node in
// the PoP's etcd with a lease, watches the deployments placed on its node
// and reconciles them (deploy: restore from the app's checkpoint, producing
// it first under a PoP-wide lock when there is none; undeploy), writes
// their status and per-phase timings back, and serves /healthz,
// Prometheus /metrics and the redeployment hook API until SIGINT/SIGTERM.
// `pop-agent etcd` runs the embedded single-node etcd of one machine;
// `pop-agent token` mints a client's token of the hook API.
package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/fogdeploy/fogdeploy/internal/config"
)

// Options are pop-agent's flags.
type Options struct {
	ConfigFile string
	Listen     string
	LogLevel   string
	LogFormat  string
	Node       string
	StateDir   string
	Mapper     string
	// Dev serves the hook API without a token (one machine only), and
	// /metrics without one; its listener must be on a loopback address
	// unless the API has a certificate.
	Dev bool
	// ShutdownTimeout bounds the graceful shutdown.
	ShutdownTimeout time.Duration
	// AdoptPoP takes the etcd the agent finds at its start as its PoP's,
	// lifting a fence (an etcd replaced on purpose).
	AdoptPoP bool
}

func parseFlags(args []string, errOut io.Writer) (Options, error) {
	var o Options
	fs := flag.NewFlagSet("pop-agent", flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.StringVar(&o.ConfigFile, "config", os.Getenv("FOGDEPLOY_CONFIG"), "config file (YAML)")
	fs.StringVar(&o.Listen, "listen", "127.0.0.1:7480", "address of the hook API, /healthz and /metrics (over TLS with agent.tls_cert_file; plain HTTP on a loopback address only)")
	fs.StringVar(&o.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.LogFormat, "log-format", "text", "text or json")
	fs.StringVar(&o.Node, "node", "", "node name (default: config, else the host name)")
	fs.StringVar(&o.StateDir, "state-dir", "", "node state directory (default: config)")
	fs.StringVar(&o.Mapper, "mapper", "", "mapping backend: auto, krbd, nbd or fuse")
	fs.BoolVar(&o.Dev, "dev", false, "development mode: the hook API needs no token unless one is configured, /metrics none")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "bound of the graceful shutdown")
	fs.BoolVar(&o.AdoptPoP, "adopt-pop", false, "take the etcd found at start as this PoP's, once: lifts the fence of an agent whose etcd was emptied, replaced or restored from an "+
		"older backup (/healthz says why it is fenced). Check that etcd's apps and deployments first: the agent then undeploys what it does not hold. Remove the flag afterwards")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q: pop-agent takes flags only", fs.Args())
	}
	return o, nil
}

// loadConfig layers defaults, file, environment and flags, then validates
// everything at once.
func loadConfig(o Options) (config.Config, error) {
	c, err := config.Load(o.ConfigFile)
	if err != nil {
		return c, err
	}
	c.ApplyEnv()
	if o.Node != "" {
		c.Node.Name = o.Node
	}
	if o.StateDir != "" {
		c.Node.StateDir = o.StateDir
	}
	if o.Mapper != "" {
		c.Mapper.Backend = o.Mapper
	}
	var errs []error
	if err := c.Validate(); err != nil {
		errs = append(errs, err)
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(o.LogLevel)); err != nil {
		errs = append(errs, fmt.Errorf("--log-level %q: use debug, info, warn or error", o.LogLevel))
	}
	if o.LogFormat != "text" && o.LogFormat != "json" {
		errs = append(errs, fmt.Errorf("--log-format %q: use text or json", o.LogFormat))
	}
	if _, _, err := net.SplitHostPort(o.Listen); err != nil {
		errs = append(errs, fmt.Errorf("--listen %q: give host:port, e.g. 127.0.0.1:7480", o.Listen))
	}
	if err := c.Agent.CheckServe(o.Listen, o.Dev); err != nil {
		errs = append(errs, err)
	}
	if o.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--shutdown-timeout %s: use a positive duration", o.ShutdownTimeout))
	}
	return c, errors.Join(errs...)
}

func newLogger(o Options, w io.Writer) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(o.LogLevel))
	h := &slog.HandlerOptions{Level: lvl}
	if o.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, h))
	}
	return slog.New(slog.NewTextHandler(w, h))
}

// Main runs the agent and returns its exit code: 0 after a clean
// shutdown, 2 for invalid flags or config, 1 otherwise.
func Main(args []string, out, errOut io.Writer) int {
	if len(args) > 0 && args[0] == "etcd" {
		return etcdMain(args[1:], errOut)
	}
	if len(args) > 0 && args[0] == "token" {
		return tokenMain(args[1:], out, errOut)
	}
	o, err := parseFlags(args, errOut)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	c, err := loadConfig(o)
	if err != nil {
		fmt.Fprintf(errOut, "pop-agent: invalid configuration:\n%v\n", err)
		return 2
	}
	log := newLogger(o, errOut)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := Run(ctx, c, o, log); err != nil {
		log.Error("pop-agent stopped", "err", err)
		return 1
	}
	return 0
}

type metrics struct {
	backend     *prometheus.GaugeVec
	recovered   prometheus.Counter
	checkpoints prometheus.Counter
	deploys     *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	auto        *prometheus.CounterVec
	autoEngine  *prometheus.CounterVec
	measured    *prometheus.CounterVec
	poolHits    *prometheus.CounterVec
	poolMisses  *prometheus.CounterVec
	poolRefill  *prometheus.HistogramVec
	recycled    *prometheus.CounterVec
	poolIdle    *prometheus.GaugeVec
	cacheBytes  prometheus.Gauge
	cacheGens   prometheus.Gauge
	unflushed   prometheus.Gauge
	fetches     *prometheus.CounterVec
	evictions   prometheus.Counter
	envCopies   prometheus.Gauge
	// suspends and resumes count them by result; their durations are
	// from the pickup to Suspended, and to Running.
	suspends, resumes *prometheus.CounterVec
	idleSuspends      prometheus.Counter
	idleUndeploys     prometheus.Counter
	// prepared counts the resumes prepared here during a migration's
	// suspend, by result (prepared, failed, dropped).
	prepared *prometheus.CounterVec
	// targetWait is how long a migration's source let its instance run
	// on until its target had prepared the resume.
	targetWait                      prometheus.Histogram
	suspendDuration, resumeDuration prometheus.Histogram
	// spareTaken counts the restores that took a spare slot, by engine;
	// spareIdle is the idle spares by engine; spareRefill times one.
	spareTaken  *prometheus.CounterVec
	spareIdle   *prometheus.GaugeVec
	spareRefill prometheus.Histogram
	// apiInflight is the hook API's requests under way that a client's
	// token bounds (apiauth.Kind), by client and kind.
	apiInflight *prometheus.GaugeVec
	// handoff counts migrations' checkpoints moved node to node.
	handoff handoffMetrics
	pages   pagesMetrics
	// etcdRequests counts the requests the agent made of etcd, by method.
	etcdRequests *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		backend: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fogdeploy_mapper_backend", Help: "Mapping backend chosen on this node (1 for the chosen one).",
		}, []string{"backend"}),
		recovered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fogdeploy_mappings_recovered_total", Help: "Mappings left by a previous run or a killed process (an environment build) and released by this agent.",
		}),
		checkpoints: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fogdeploy_checkpoints_total", Help: "Checkpoint generations produced on this node.",
		}),
		deploys: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fogdeploy_deploys_total", Help: "Deploys handled on this node, by mode (restore; checkpoint: produced the first checkpoint, then restored; boot: without a checkpoint engine) and result.",
		}, []string{"mode", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "fogdeploy_deploy_seconds", Help: "Time from a deployment's pickup to ready, by mode.",
			Buckets: []float64{0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64},
		}, []string{"mode"}),
		auto: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fogdeploy_auto_decisions_total", Help: "Choices of mode auto on this node, by choice (boot or restore) and why (pool_slot: an idle slot of the app waited; no_generation: the deploy made the app's generation; first: a kind not measured yet in the PoP; faster: the lower median; cannot_boot: the node cannot boot apps).",
		}, []string{"choice", "why"}),
		poolHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fogdeploy_pool_hits_total", Help: "Restores that found an idle warm-pool slot of their app's generation on this node, by app and whether the slot was restored ahead (ahead: yes, the deploy only raised it; no: it restarted the app).",
		}, []string{"app", "ahead"}),
		poolMisses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fogdeploy_pool_misses_total", Help: "Restores that found no idle warm-pool slot and provisioned their own, by app.",
		}, []string{"app"}),
		recycled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fogdeploy_pool_recycled_total", Help: "Undeployed instances given back to their app's warm pool in their container, by app and outcome (recycled, or removed: it could not serve again).",
		}, []string{"app", "outcome"}),
		poolRefill: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "fogdeploy_pool_refill_seconds", Help: "Time to provision one warm-pool slot (clone, map, mount, create), by app.",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8},
		}, []string{"app"}),
		poolIdle: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fogdeploy_pool_idle_slots", Help: "Idle warm-pool slots on this node, by app.",
		}, []string{"app"}),
	}
	m.autoEngine = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fogdeploy_auto_engine_decisions_total", Help: "Engines chosen for apps of engine auto on this node, by engine and why (first: measuring it; faster: the lowest median restore; explore: the second best, to measure it again).",
	}, []string{"engine", "why"})
	m.measured = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fogdeploy_auto_measurements_total", Help: "Deploys that mode auto measured in the background (never on a user's request), by mode and outcome.",
	}, []string{"mode", "outcome"})
	m.cacheBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fogdeploy_checkpoint_cache_bytes", Help: "Bytes of checkpoint generations this node holds for its restores (agent.checkpoint_cache is the budget).",
	})
	m.cacheGens = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fogdeploy_checkpoint_cache_generations", Help: "Checkpoint generations this node holds for its restores.",
	})
	m.unflushed = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fogdeploy_checkpoint_cache_unflushed_bytes", Help: "Bytes of the node's checkpoint copies not flushed to disk yet: a restart of the machine drops them, and they are fetched again.",
	})
	m.fetches = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fogdeploy_checkpoint_fetches_total", Help: "Checkpoint generations copied to this node from the cluster, by what asked (restore: a deploy waited for it; ahead: a warm-pool slot or agent.fetch sealed).",
	}, []string{"by"})
	m.evictions = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fogdeploy_checkpoint_cache_evictions_total", Help: "Checkpoint generations dropped from this node: removed generations, and the least recently used beyond the budget.",
	})
	m.envCopies = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fogdeploy_env_copies", Help: "Generations whose environment this node holds as a read-only copy that its restores share (agent.env_read shared).",
	})
	m.registerLifecycle(reg)
	m.registerSpares(reg)
	reg.MustRegister(m.envCopies, m.backend, m.recovered, m.checkpoints, m.deploys, m.duration, m.auto, m.poolHits, m.poolMisses, m.poolRefill, m.recycled, m.poolIdle,
		m.autoEngine, m.measured, m.cacheBytes, m.cacheGens, m.unflushed, m.fetches, m.evictions,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// registerLifecycle makes and registers the metrics of suspends, resumes
// and idle suspends.
func (m *metrics) registerLifecycle(reg prometheus.Registerer) {
	m.suspends = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fogdeploy_suspends_total", Help: "Deployments suspended on this node (memory and file-system changes sealed in the cluster), by result.",
	}, []string{"result"})
	m.resumes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fogdeploy_resumes_total", Help: "Suspended deployments resumed on this node, by result.",
	}, []string{"result"})
	lifecycle := []float64{0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32}
	m.suspendDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "fogdeploy_suspend_seconds", Help: "Time from a suspend's pickup to Suspended.", Buckets: lifecycle,
	})
	m.resumeDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "fogdeploy_resume_seconds", Help: "Time from a resume's pickup to Running.", Buckets: lifecycle,
	})
	m.idleSuspends = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fogdeploy_idle_suspends_total", Help: "Suspends this node asked for instances idle for their app's suspend_after.",
	})
	m.idleUndeploys = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fogdeploy_idle_undeploys_total", Help: "Instances made on demand that this node undeployed, idle for their app's frontend.idle_after.",
	})
	m.prepared = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fogdeploy_resumes_prepared_total",
		Help: "Resumes this node prepared (its container created) while a migration's source suspended the instance, by result: prepared, failed, dropped (no resume took it).",
	}, []string{"result"})
	m.targetWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "fogdeploy_migrate_target_wait_seconds",
		Help:    "How long a migration's source let its instance run on, before its checkpoint, until the target had prepared the resume (at most 3 s).",
		Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 3},
	})
	reg.MustRegister(m.suspends, m.resumes, m.suspendDuration, m.resumeDuration, m.idleSuspends, m.idleUndeploys, m.prepared, m.targetWait)
	m.apiInflight = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fogdeploy_api_inflight", Help: "Hook API requests under way that a client's token bounds (long polls, migrations), by client and kind; beyond its bound a request is a 429.",
	}, []string{"client", "kind"})
	reg.MustRegister(m.apiInflight)
	m.handoff = newHandoffMetrics(reg)
	m.pages = newPagesMetrics(reg)
	m.etcdRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fogdeploy_etcd_requests_total", Help: "Requests this agent made of etcd (reads, transactions, lease grants and revocations; not its watches' events), by gRPC method.",
	}, []string{"method"})
	reg.MustRegister(m.etcdRequests)
}
