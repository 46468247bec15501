// Package agent is the pop-agent: one per node. Today it validates its
// configuration, undoes the mappings a previous run left (crash
// recovery), probes the mapping backend, and serves /healthz and
// Prometheus /metrics until SIGINT/SIGTERM. The deploy lifecycle is added
// on top of this loop.
package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fogdeploy/fogdeploy/internal/config"
	"github.com/fogdeploy/fogdeploy/internal/version"
	"github.com/fogdeploy/fogdeploy/internal/wire"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
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
	// ShutdownTimeout bounds the graceful shutdown.
	ShutdownTimeout time.Duration
}

func parseFlags(args []string, errOut io.Writer) (Options, error) {
	var o Options
	fs := flag.NewFlagSet("pop-agent", flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.StringVar(&o.ConfigFile, "config", os.Getenv("FOGDEPLOY_CONFIG"), "config file (YAML)")
	fs.StringVar(&o.Listen, "listen", "127.0.0.1:7480", "address of /healthz and /metrics")
	fs.StringVar(&o.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.LogFormat, "log-format", "text", "text or json")
	fs.StringVar(&o.Node, "node", "", "node name (default: config, else the host name)")
	fs.StringVar(&o.StateDir, "state-dir", "", "node state directory (default: config)")
	fs.StringVar(&o.Mapper, "mapper", "", "mapping backend: auto, krbd, nbd or fuse")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "bound of the graceful shutdown")
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

// Run starts the agent and blocks until ctx is done.
func Run(ctx context.Context, c config.Config, o Options, log *slog.Logger) error {
	log = log.With("node", c.Node.Name)
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	mp, err := mapper.New(ctx, wire.MapperConfig(c), log)
	if err != nil {
		return fmt.Errorf("mapper: %w", err)
	}
	ch := mp.Choice()
	m.backend.WithLabelValues(ch.Backend).Set(1)
	undone, err := mp.Recover(ctx)
	if err != nil {
		log.Warn("recovering mappings left by a previous run", "err", err)
	}
	for _, u := range undone {
		log.Info("released a mapping left by a previous run", "image", u.Image.String(), "device", u.Device, "target", u.Target)
	}
	m.recovered.Add(float64(len(undone)))

	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", o.Listen, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, "{\"status\":\"ok\",\"node\":%q,\"mapper\":%q,\"version\":%q}\n", c.Node.Name, ch.Backend, version.String())
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("pop-agent ready", "listen", ln.Addr().String(), "version", version.String())

	select {
	case <-ctx.Done():
	case err := <-errc:
		return err
	}
	log.Info("shutting down", "bound", o.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.ShutdownTimeout)
	defer cancel()
	return srv.Shutdown(sctx)
}

type metrics struct {
	backend   *prometheus.GaugeVec
	recovered prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		backend: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fogdeploy_mapper_backend", Help: "Mapping backend chosen on this node (1 for the chosen one).",
		}, []string{"backend"}),
		recovered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fogdeploy_mappings_recovered_total", Help: "Mappings left by a previous run and released at start.",
		}),
	}
	reg.MustRegister(m.backend, m.recovered, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}
