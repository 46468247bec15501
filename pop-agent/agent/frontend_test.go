package agent

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/time/rate"

	"github.com/fogdeploy/fogdeploy/internal/frontend"
	"github.com/fogdeploy/fogdeploy/internal/frontend/frontendtest"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
)

// lineServer answers each line with name:line until the test ends: an
// instance's port.
func lineServer(t *testing.T, name string) string {
	t.Helper()
	addr, _ := frontendtest.LineServer(t, name)
	return addr
}

// TestFrontendRoutes: two nodes' front ends, each routing from its
// agent's view of one etcd. A deployment's endpoint reaches its instance
// through either node's front end (the other forwards to its node's);
// while it migrates, a new connection is held and goes to the target once
// it runs there; a Suspended deployment is woken by a connection (a
// resume asked, a `woken` event, the connection forwarded once it runs);
// an endpoint nobody holds is closed.
func TestFrontendRoutes(t *testing.T) {
	endpoint, seed := statetest.Start(t)
	ctx := context.Background()
	app := spec.App{Name: "chat", Env: "e", Command: []string{"x"}, Ready: spec.Readiness{Kind: spec.ReadyOutput, Phrase: "up"},
		Ports: []spec.Port{{Port: 6379}}}
	if err := seed.CreateApp(ctx, app, false); err != nil {
		t.Fatal(err)
	}
	addrs := frontendAddrs
	fes, regs := frontendNodes(t, endpoint, seed, state.PortRange{Lo: 24100, Hi: 24199}, rate.NewLimiter(1, 1), nil)
	d, err := fes["n1"].CreatePlaced(ctx, state.Desired{ID: "chat-1", App: "chat", Node: "n1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	port := d.Endpoint["6379/tcp"]
	if port < 24100 || port > 24199 {
		t.Fatalf("endpoint %v; want a port of 24100-24199", d.Endpoint)
	}
	running := func(node, addr string) {
		t.Helper()
		if err := seed.SetStatus(ctx, d.ID, state.Status{Instance: spec.Instance{Phase: spec.PhaseRunning, Node: node,
			Ports: map[string]string{"6379/tcp": addr}}}); err != nil {
			t.Fatal(err)
		}
	}
	connect := func(via string) (net.Conn, *bufio.Reader) {
		t.Helper()
		c, err := dialEndpoint(via, port)
		if err != nil {
			t.Fatalf("the endpoint on %s's front end: %v", via, err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		return c, bufio.NewReader(c)
	}
	say := sayLine

	one := lineServer(t, "on-n1")
	running("n1", one)
	for _, via := range []string{"n1", "n2"} {
		c, r := connect(via)
		if got := say(c, r, "hi"); got != "on-n1:hi" {
			t.Errorf("through %s's front end: %q; want on-n1:hi", via, got)
		}
	}

	// A migration to n2: suspended with its move, then running there. A
	// connection made meanwhile waits, and reaches n2.
	if _, err := seed.RequestMigrate(ctx, d.ID, "n2"); err != nil {
		t.Fatal(err)
	}
	if err := seed.SetSuspended(ctx, d.ID, spec.Suspension{Node: "n1"}, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := seed.Deployment(ctx, d.ID); got.Move == nil || got.Status.Phase != spec.PhaseSuspended {
		t.Fatalf("the migration's suspend: %+v", got)
	}
	mctx, mcancel := context.WithTimeout(ctx, 5*time.Second)
	if _, err := fes["n1"].Follow(mctx, d.ID, func(d state.Deployment) bool { return d.Status.Phase == spec.PhaseSuspended }); err != nil {
		t.Fatal(err)
	}
	mcancel()
	two := lineServer(t, "on-n2")
	go func() {
		// As the migration's target would: placed there, then running.
		time.Sleep(400 * time.Millisecond)
		if _, err := seed.RequestResume(ctx, d.ID, "n2", nil); err != nil {
			t.Errorf("placing the migration on n2: %v", err)
		}
		running("n2", two)
	}()
	start := time.Now()
	c, r := connect("n1")
	if got := say(c, r, "moved"); got != "on-n2:moved" {
		t.Errorf("during the move: %q after %v; want on-n2:moved once it runs on n2", got, time.Since(start))
	}
	if v := testutil.ToFloat64(counterOf(t, regs["n1"], "fogdeploy_frontend_wakes_total")); v != 0 {
		t.Errorf("a migration's suspend was woken by a connection (wakes %v): the move goes on by itself", v)
	}

	// Suspended, no move: the next connection wakes it.
	if err := seed.SetSuspended(ctx, d.ID, spec.Suspension{Node: "n2"}, nil); err != nil {
		t.Fatal(err)
	}
	// Once n2's view has it Suspended (the line server, unlike an
	// instance, still answers at its old address).
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	if _, err := fes["n2"].Follow(sctx, d.ID, func(d state.Deployment) bool { return d.Status.Phase == spec.PhaseSuspended }); err != nil {
		t.Fatal(err)
	}
	scancel()
	go func() {
		// As an agent would: resume it once asked.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			got, err := seed.Deployment(ctx, d.ID)
			if err == nil && got.Status.Phase == spec.PhasePending && got.Node != "" {
				running(got.Node, two)
				return
			}
		}
	}()
	c, r = connect("n2")
	if got := say(c, r, "wake"); got != "on-n2:wake" {
		t.Errorf("a connection to a suspended deployment: %q; want it woken and answered", got)
	}
	evs, err := seed.Events(ctx, d.ID)
	if err != nil {
		t.Fatal(err)
	}
	woken := false
	for _, e := range evs {
		woken = woken || e.Reason == "woken"
	}
	if !woken {
		t.Errorf("no woken event among %+v", evs)
	}
	if v := testutil.ToFloat64(counterOf(t, regs["n2"], "fogdeploy_frontend_wakes_total")); v != 1 {
		t.Errorf("fogdeploy_frontend_wakes_total on n2 = %v; want 1", v)
	}

	// Withdrawn: its endpoint closes.
	if err := seed.DeleteDeployment(ctx, d.ID); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(addrs["n1"], strconv.Itoa(port)), time.Second)
		if err != nil {
			return
		}
		c.Close()
	}
	t.Errorf("the endpoint of a withdrawn deployment still accepts")
}

// frontendAddrs are the front ends' addresses of frontendNodes' nodes:
// two nodes on one machine, each front end on an address of its own.
var frontendAddrs = map[string]string{"n1": "127.0.0.1", "n2": "127.0.0.2"}

// frontendNodes registers nodes n1 and n2 with seed and runs a front end
// for each, routing from a view of its own of the etcd at endpoint, with
// endpoint ports ports, wakes each (nil: none) and mayWrite for each node
// (nil: the node may write): each node's store and metrics.
func frontendNodes(t *testing.T, endpoint string, seed *state.Store, ports state.PortRange, wakes *rate.Limiter,
	mayWrite map[string]func() error) (map[string]*state.Store, map[string]*prometheus.Registry) {
	t.Helper()
	ctx := context.Background()
	stores, regs := map[string]*state.Store{}, map[string]*prometheus.Registry{}
	for _, n := range []string{"n1", "n2"} {
		if _, err := seed.Register(ctx, state.Node{Name: n, Capacity: 8, Frontend: frontendAddrs[n]}, 30); err != nil {
			t.Fatal(err)
		}
		st, err := state.Open(ctx, state.Config{Endpoints: []string{endpoint}, DialTimeout: time.Second, EndpointPorts: ports})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		wctx, cancel := context.WithCancel(ctx)
		t.Cleanup(cancel)
		st.Watch(wctx, slog.New(slog.DiscardHandler))
		regs[n] = prometheus.NewRegistry()
		a := &agent{st: st, log: slog.New(slog.DiscardHandler)}
		may := mayWrite[n]
		if may == nil {
			may = func() error { return nil }
		}
		r := &router{st: st, node: n, mayWrite: may, log: a.log, wakes: wakes}
		fe := frontend.New(frontend.Config{Listen: frontendAddrs[n], HoldTimeout: 5 * time.Second, Metrics: frontend.NewMetrics(regs[n])}, r)
		go a.runFrontend(wctx, fe, r)
		stores[n] = st
	}
	return stores, regs
}

// dialEndpoint connects to endpoint port on node's front end (of
// frontendNodes), trying for 5 s: a front end listens once its view
// holds the endpoint.
func dialEndpoint(node string, port int) (net.Conn, error) {
	var c net.Conn
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err = net.Dial("tcp", net.JoinHostPort(frontendAddrs[node], strconv.Itoa(port))); err == nil || time.Now().After(deadline) {
			return c, err
		}
	}
}

// sayLine writes line on c and returns the line answered (or what
// failed), as a line server answers.
func sayLine(c net.Conn, r *bufio.Reader, line string) string {
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "write: " + err.Error()
	}
	got, err := r.ReadString('\n')
	if err != nil {
		return "read: " + err.Error()
	}
	return strings.TrimSpace(got)
}

// counterOf is the sum of counter name's series in reg.
func counterOf(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "sum"})
	c.Add(sum)
	return c
}

// A node whose wakes are spent (or off: agent.frontend.wakes_per_second 0)
// wakes nothing: the connection is refused with ErrWakeLimit, and the
// deployment stays Suspended; a fenced node wakes nothing either.
func TestWakeLimits(t *testing.T) {
	st := hookStore(t, 8, "chat")
	ctx := context.Background()
	if err := st.CreateDeployment(ctx, state.Desired{ID: "chat-9", App: "chat", Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	if err := st.SetSuspended(ctx, "chat-9", spec.Suspension{Node: "n1"}, nil); err != nil {
		t.Fatal(err)
	}
	ep := state.Endpoint{Port: 24999, Deployment: "chat-9", Target: "6379/tcp"}
	off := &router{st: st, node: "n1", mayWrite: func() error { return nil }, log: slog.New(slog.DiscardHandler)}
	if err := off.wake(ctx, ep, 24999); !errors.Is(err, frontend.ErrWakeLimit) {
		t.Errorf("wake with wakes off: %v; want ErrWakeLimit", err)
	}
	spent := &router{st: st, node: "n1", mayWrite: func() error { return nil }, log: off.log, wakes: rate.NewLimiter(rate.Every(time.Hour), 1)}
	spent.wakes.Allow()
	if err := spent.wake(ctx, ep, 24999); !errors.Is(err, frontend.ErrWakeLimit) {
		t.Errorf("wake with the node's wakes spent: %v; want ErrWakeLimit", err)
	}
	fenced := &router{st: st, node: "n1", mayWrite: func() error { return errors.New("fenced: etcd is not the one this node knew") }, log: off.log,
		wakes: rate.NewLimiter(10, 10)}
	if err := fenced.wake(ctx, ep, 24999); err == nil || !strings.Contains(err.Error(), "fenced") {
		t.Errorf("wake by a fenced node: %v; want refused, saying why", err)
	}
	if d, _ := st.Deployment(ctx, "chat-9"); d.Status.Phase != spec.PhaseSuspended {
		t.Errorf("after refused wakes: %s; want still Suspended", d.Status.Phase)
	}
}
