package frontend

import (
	"errors"
	"net"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are a front end's, by endpoint port.
type Metrics struct {
	connections *prometheus.CounterVec
	bytes       *prometheus.CounterVec
	open        *prometheus.GaugeVec
	holding     *prometheus.GaugeVec
	held        prometheus.Histogram
	wakes       *prometheus.CounterVec
	made        *prometheus.CounterVec
	failed      *prometheus.CounterVec
	kernel      prometheus.Gauge
}

// NewMetrics registers a front end's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		connections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fogdeploy_frontend_connections_total",
			Help: "Connections this node's front end accepted, by endpoint port."}, []string{"endpoint"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fogdeploy_frontend_bytes_total",
			Help: "Bytes the front end forwarded, by endpoint port and direction (in: from the client)."}, []string{"endpoint", "direction"}),
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fogdeploy_frontend_open_connections",
			Help: "Connections the front end forwards now, by endpoint port."}, []string{"endpoint"}),
		holding: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fogdeploy_frontend_held_connections",
			Help: "Connections the front end holds now until their deployment runs (moving, resuming, woken), by endpoint port."}, []string{"endpoint"}),
		held: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "fogdeploy_frontend_hold_seconds",
			Help:    "How long a held connection waited for its deployment.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}),
		wakes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fogdeploy_frontend_wakes_total",
			Help: "Suspended deployments a connection to their endpoint resumed, by endpoint port."}, []string{"endpoint"}),
		made: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fogdeploy_frontend_made_total",
			Help: "Instances a connection to an app's shared endpoint made on demand, by endpoint port."}, []string{"endpoint"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fogdeploy_frontend_failed_total",
			Help: "Connections the front end closed without forwarding them, by endpoint port and reason (no-route, timeout, dial, held-limit, wake-limit)."}, []string{"endpoint", "reason"}),
	}
	m.kernel = prometheus.NewGauge(prometheus.GaugeOpts{Name: "fogdeploy_frontend_kernel_routes",
		Help: "Endpoints whose connections the kernel forwards on this node (their instance runs here), not counted in the other front-end metrics."})
	reg.MustRegister(m.connections, m.bytes, m.open, m.holding, m.held, m.wakes, m.made, m.failed, m.kernel)
	return m
}

// endpointMetrics are one endpoint's; nil Metrics count nothing.
type endpointMetrics struct {
	m    *Metrics
	port string
}

func (m *Metrics) endpoint(port int) endpointMetrics {
	return endpointMetrics{m: m, port: strconv.Itoa(port)}
}

func (e endpointMetrics) accepted() {
	if e.m != nil {
		e.m.connections.WithLabelValues(e.port).Inc()
	}
}

func (e endpointMetrics) holding(d float64) {
	if e.m != nil {
		e.m.holding.WithLabelValues(e.port).Add(d)
	}
}

func (e endpointMetrics) held(d time.Duration) {
	if e.m != nil {
		e.m.held.Observe(d.Seconds())
	}
}

func (e endpointMetrics) woke() {
	if e.m != nil {
		e.m.wakes.WithLabelValues(e.port).Inc()
	}
}

func (e endpointMetrics) made() {
	if e.m != nil {
		e.m.made.WithLabelValues(e.port).Inc()
	}
}

func (e endpointMetrics) open(d float64) {
	if e.m != nil {
		e.m.open.WithLabelValues(e.port).Add(d)
	}
}

func (e endpointMetrics) bytes(in, out int64) {
	if e.m != nil {
		e.m.bytes.WithLabelValues(e.port, "in").Add(float64(in))
		e.m.bytes.WithLabelValues(e.port, "out").Add(float64(out))
	}
}

func (e endpointMetrics) failed(err error) {
	if e.m == nil {
		return
	}
	reason := "no-route"
	var oe *net.OpError
	switch {
	case errors.Is(err, ErrHoldTimeout):
		reason = "timeout"
	case errors.Is(err, ErrHeldLimit):
		reason = "held-limit"
	case errors.Is(err, ErrWakeLimit):
		reason = "wake-limit"
	case errors.As(err, &oe):
		reason = "dial"
	}
	e.m.failed.WithLabelValues(e.port, reason).Inc()
}

// KernelRoutes records how many endpoints the kernel forwards.
func (m *Metrics) KernelRoutes(n int) {
	if m != nil {
		m.kernel.Set(float64(n))
	}
}
