package frontend

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fogdeploy/fogdeploy/internal/frontend/frontendtest"
)

// table is a Router over a table the test changes: a port without a
// route waits for one (a deployment that moves), until ctx ends.
type table struct {
	mu      sync.Mutex
	routes  map[int]string
	changed chan struct{}
	calls   int
}

func newTable() *table { return &table{routes: map[int]string{}, changed: make(chan struct{})} }

func (tb *table) set(port int, addr string) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if addr == "" {
		delete(tb.routes, port)
	} else {
		tb.routes[port] = addr
	}
	close(tb.changed)
	tb.changed = make(chan struct{})
}

func (tb *table) Route(ctx context.Context, port int) (Target, error) {
	held := false
	for {
		tb.mu.Lock()
		tb.calls++
		addr, ok := tb.routes[port]
		ch := tb.changed
		tb.mu.Unlock()
		if ok {
			return Target{Addr: addr, Deployment: "d" + strconv.Itoa(port), Held: held}, nil
		}
		held = true
		select {
		case <-ctx.Done():
			return Target{Held: held}, ctx.Err()
		case <-ch:
		}
	}
}

// echo serves lines back prefixed with name, until the test ends.
func echo(t *testing.T, name string) (addr string, stop func()) {
	t.Helper()
	return frontendtest.LineServer(t, name)
}

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

func ask(t *testing.T, c net.Conn, r *bufio.Reader, line string) string {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		t.Fatalf("write %q: %v", line, err)
	}
	got, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("read after %q: %v", line, err)
	}
	return got[:len(got)-1]
}

// TestForward: a connection to an endpoint reaches its target, both ways,
// and its bytes are counted; one to an endpoint that has no route yet is
// held and forwarded as soon as it has one (a move), or closed at the hold
// timeout; a dial that fails routes again; a port dropped from Sync is
// no longer accepted while its open connection goes on; Close closes what
// is open.
func TestForward(t *testing.T) {
	reg := prometheus.NewRegistry()
	tb := newTable()
	f := New(Config{Listen: "127.0.0.1", HoldTimeout: 2 * time.Second, Metrics: NewMetrics(reg)}, tb)
	t.Cleanup(func() { f.Close() })
	ports := freePorts(t, 3)
	a, b, c := ports[0], ports[1], ports[2]
	if errs := f.Sync(ports); len(errs) != 0 {
		t.Fatalf("Sync: %v", errs)
	}
	one, stopOne := echo(t, "one")
	tb.set(a, one)
	dial := func(port int) (net.Conn, *bufio.Reader) {
		t.Helper()
		conn, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			t.Fatalf("dial the endpoint %d: %v", port, err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn, bufio.NewReader(conn)
	}
	ca, ra := dial(a)
	if got := ask(t, ca, ra, "hello"); got != "one:hello" {
		t.Errorf("through the front end: %q; want one:hello", got)
	}

	// Held: port b has no route until 300 ms later.
	go func() {
		time.Sleep(300 * time.Millisecond)
		two, _ := echo(t, "two")
		tb.set(b, two)
	}()
	start := time.Now()
	cb, rb := dial(b)
	if got := ask(t, cb, rb, "wait"); got != "two:wait" || time.Since(start) < 250*time.Millisecond {
		t.Errorf("a held connection: %q after %v; want two:wait once routed", got, time.Since(start))
	}
	if n := testutil.CollectAndCount(reg, "fogdeploy_frontend_hold_seconds"); n != 1 {
		t.Errorf("hold histogram series: %d", n)
	}

	// Port c never routes: closed at the hold timeout, counted.
	cc, rc := dial(c)
	_ = cc.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(cc, "nobody\n")
	if _, err := rc.ReadString('\n'); err == nil {
		t.Errorf("a connection to an endpoint without a route was answered")
	}
	if v := testutil.ToFloat64(f.cfg.Metrics.failed.WithLabelValues(strconv.Itoa(c), "timeout")); v != 1 {
		t.Errorf("fogdeploy_frontend_failed_total{reason=timeout} = %v; want 1", v)
	}

	// The target stops (a move): a new connection first dials the old
	// address, fails, routes again and reaches the new one.
	stopOne()
	three, _ := echo(t, "three")
	go func() {
		time.Sleep(200 * time.Millisecond)
		tb.set(a, three)
	}()
	cn, rn := dial(a)
	if got := ask(t, cn, rn, "moved"); got != "three:moved" {
		t.Errorf("after the target moved: %q; want three:moved", got)
	}

	// Dropping port b: no new connection there; the open one goes on.
	if errs := f.Sync([]int{a, c}); len(errs) != 0 {
		t.Fatal(errs)
	}
	if conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(b), time.Second); err == nil {
		conn.Close()
		t.Errorf("port %d, dropped by Sync, still accepts", b)
	}
	if got := ask(t, cb, rb, "still"); got != "two:still" {
		t.Errorf("an open connection of a dropped port: %q; want two:still", got)
	}
	// A connection's bytes are counted when it ends.
	ca.Close()
	in := f.cfg.Metrics.bytes.WithLabelValues(strconv.Itoa(a), "in")
	for deadline := time.Now().Add(5 * time.Second); testutil.ToFloat64(in) == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if v := testutil.ToFloat64(in); v != float64(len("hello\n")) {
		t.Errorf("bytes in on %d: %v; want %d", a, v, len("hello\n"))
	}

	// A port another process holds is reported, not fatal.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port
	if errs := f.Sync([]int{a, c, taken}); len(errs) != 1 || errs[0].Port != taken || !errors.Is(errs[0], syscall.EADDRINUSE) {
		t.Errorf("Sync with a port taken: %v; want that port's error", errs)
	}

	// Close: the open connections end.
	f.Close()
	_ = cn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := rn.ReadString('\n'); err == nil {
		t.Errorf("a connection still open after Close")
	}
}

// CheckRange refuses a range that overlaps the node's ephemeral ports.
func TestCheckRange(t *testing.T) {
	b, err := os.ReadFile(ephemeralPorts)
	if err != nil {
		t.Skipf("no %s: %v", ephemeralPorts, err)
	}
	var lo, hi int
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil {
		t.Fatal(err)
	}
	if err := CheckRange(lo-10, lo); err == nil || !strings.Contains(err.Error(), "ephemeral") {
		t.Errorf("a range ending at the ephemeral ports' first (%d): %v; want refused", lo, err)
	}
	if lo > 1100 {
		if err := CheckRange(1024, lo-1); err != nil {
			t.Errorf("a range below the ephemeral ports: %v", err)
		}
	}
}

// TestHeldLimit: beyond MaxHeld connections waiting for their route, a
// connection is closed at once and counted; the held one is forwarded
// once routed.
func TestHeldLimit(t *testing.T) {
	reg := prometheus.NewRegistry()
	tb := newTable()
	f := New(Config{Listen: "127.0.0.1", HoldTimeout: 5 * time.Second, MaxHeld: 1, Metrics: NewMetrics(reg)}, tb)
	t.Cleanup(func() { f.Close() })
	port := freePorts(t, 1)[0]
	if errs := f.Sync([]int{port}); len(errs) != 0 {
		t.Fatal(errs)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	held, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	// The first is held (routing) before the second arrives.
	for deadline := time.Now().Add(5 * time.Second); testutil.ToFloat64(f.cfg.Metrics.holding.WithLabelValues(strconv.Itoa(port))) != 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first connection is not held")
		}
	}
	second, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	_ = second.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := second.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("a connection beyond MaxHeld: %v; want it closed at once (EOF)", err)
	}
	if v := testutil.ToFloat64(f.cfg.Metrics.failed.WithLabelValues(strconv.Itoa(port), "held-limit")); v != 1 {
		t.Errorf("failed{reason=held-limit} = %v; want 1", v)
	}
	srv, _ := echo(t, "up")
	tb.set(port, srv)
	r := bufio.NewReader(held)
	if got := ask(t, held, r, "late"); got != "up:late" {
		t.Errorf("the held connection once routed: %q", got)
	}
}
