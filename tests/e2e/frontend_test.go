//go:build !no_ceph

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/scheduler"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// TestFrontendPoP: redis on a 2-node PoP, under DMTCP and CRIU, reached
// only at its endpoint (the PoP's port of the deployment, on either node's
// front end). It answers through the front end of the node it does not run
// on; two deployments never share an endpoint; a migration and a drain
// under a client that PINGs the endpoint every 10 ms (a new connection
// each time, through the other node's front end) fail none of its
// requests, and the endpoint and the keys stay; a connection to a
// Suspended deployment wakes it, with its keys, and the events say woken.
func TestFrontendPoP(t *testing.T) {
	for _, eng := range []engine.Name{engine.NameDMTCP, engine.NameCRIU} {
		t.Run(string(eng), func(t *testing.T) { testFrontend(t, eng) })
	}
}

func testFrontend(t *testing.T, eng engine.Name) {
	ctx, p, _, app := redisOnPoP(t, "e2e-fe", eng, nil, "n1", "n2")
	api := "http://" + p.apis["n1"]
	client := &http.Client{}
	endpointOf := func(id string) int {
		t.Helper()
		d, err := p.st.Deployment(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		port := d.Endpoint["6379/tcp"]
		if port == 0 {
			t.Fatalf("deployment %s has no endpoint: %+v", id, d.Desired)
		}
		return port
	}
	at := func(node string, port int) string { return net.JoinHostPort(p.frontend(node), strconv.Itoa(port)) }
	redis := func(addr string, args ...string) (string, error) {
		return testenv.RedisDo(ctx, nil, addr, args...)
	}

	dep := createOn(ctx, t, client, api, app.Name, "n1")
	port := endpointOf(dep.ID)
	// The kernel of the node it runs on forwards its endpoint there.
	if n := kernelRoutes(t, p, "n1"); n != 1 {
		t.Errorf("n1's kernel routes: %v; want 1 (its endpoint, to the instance that runs there)", n)
	}
	benchOut := os.Getenv("FOGDEPLOY_BENCH_OUT")
	var bench *frontendBench
	if benchOut != "" {
		bench = benchFrontend(ctx, t, p, client, api, app.Name, eng, dep.Status.Ports[drivers.PortKey(6379, "tcp")], at("n1", port), at("n2", port))
	}
	// Through n2's front end, to n1's instance.
	if got, err := redis(at("n2", port), "SET", "user", "alice"); err != nil || got != "OK" {
		t.Fatalf("SET through n2's front end: %q, %v", got, err)
	}
	if got, err := redis(at("n1", port), "GET", "user"); err != nil || got != "alice" {
		t.Errorf("GET through n1's front end: %q, %v; want alice", got, err)
	}
	other := createOn(ctx, t, client, api, app.Name, "n2")
	if op := endpointOf(other.ID); op == port {
		t.Errorf("two deployments share endpoint port %d", port)
	}
	if err := p.st.DeleteDeployment(ctx, other.ID); err != nil {
		t.Fatal(err)
	}
	out, _, code := p.fogctl(ctx, "endpoint", "ls", "-o", "json")
	var eps struct {
		Addresses []string `json:"addresses"`
	}
	if err := json.Unmarshal([]byte(out), &eps); code != 0 || err != nil || !slices.Contains(eps.Addresses, p.frontend("n1")) || !slices.Contains(eps.Addresses, p.frontend("n2")) {
		t.Errorf("fogctl endpoint ls -o json = %d, %v: %s; want both front ends' addresses", code, err, out)
	}

	// A migration under a client's steady load through the endpoint, and
	// another client's PINGs straight to the instance (its downtime).
	direct := directPings(ctx, dep.Status.Ports[drivers.PortKey(6379, "tcp")])
	var moved scheduler.Moved
	failed, slowest := underLoad(ctx, t, at("n2", port), func() {
		var code int
		code, moved = migrateHook(t, client, api, dep.ID, "n2")
		if code != http.StatusOK || moved.To != "n2" {
			t.Errorf("migrate to n2: %d %+v", code, moved)
		}
	})
	downtime := direct(moved.Ports[drivers.PortKey(6379, "tcp")])
	if failed != 0 {
		t.Errorf("%d requests failed through the endpoint during the migration; want none (held, not refused)", failed)
	}
	t.Logf("%s: migration under load: 0 failed, slowest request %s; the instance answered nothing for %s (direct)", eng,
		slowest.Round(time.Millisecond), downtime.Round(time.Millisecond))
	if bench != nil {
		bench.MigrateStallMS, bench.MigrateDowntimeMS = float64(slowest.Microseconds())/1000, float64(downtime.Microseconds())/1000
		b, _ := json.MarshalIndent(bench, "", "  ")
		if err := os.WriteFile(filepath.Join(benchOut, "frontend-"+string(eng)+".json"), append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := redis(at("n1", port), "GET", "user"); err != nil || got != "alice" {
		t.Errorf("after the migration, at the same endpoint: GET user = %q, %v; want alice", got, err)
	}
	if d, _ := p.st.Deployment(ctx, dep.ID); d.Status.Node != "n2" || d.Endpoint["6379/tcp"] != port {
		t.Errorf("after the migration: on %s with endpoint %v; want n2 and port %d", d.Status.Node, d.Endpoint, port)
	}

	// Suspended: the next connection wakes it, with its keys.
	if code, body := lifecycle(t, client, api, dep.ID, "suspend", ""); code != http.StatusAccepted {
		t.Fatalf("suspend: %d %v", code, body)
	}
	start := time.Now()
	if got, err := redis(at("n1", port), "GET", "user"); err != nil || got != "alice" {
		t.Errorf("a connection to the suspended deployment: GET user = %q, %v; want it woken, with its keys", got, err)
	}
	t.Logf("%s: woken and answered in %s", eng, time.Since(start).Round(time.Millisecond))
	evs, err := p.st.Events(ctx, dep.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(evs, func(e state.Event) bool { return e.Reason == "woken" }) {
		t.Errorf("no woken event: %+v", evs)
	}

	// A drain of the node it runs on, under load.
	d, _ := p.st.Deployment(ctx, dep.ID)
	from := d.Status.Node
	via := "n1"
	if from == "n1" {
		via = "n2"
	}
	var report []scheduler.Moved
	failed, slowest = underLoad(ctx, t, at(via, port), func() {
		stdout, errOut, rc := p.fogctl(ctx, "node", "drain", from, "-o", "json")
		if err := json.Unmarshal([]byte(stdout), &report); rc != 0 || err != nil || len(report) != 1 {
			t.Errorf("fogctl node drain %s = %d, %v: %s%s", from, rc, err, stdout, errOut)
		}
	})
	if failed != 0 {
		t.Errorf("%d requests failed through the endpoint during the drain; want none", failed)
	}
	t.Logf("%s: drain under load: 0 failed, slowest request %s", eng, slowest.Round(time.Millisecond))
	if got, err := redis(at(from, port), "GET", "user"); err != nil || got != "alice" {
		t.Errorf("after the drain: GET user = %q, %v; want alice", got, err)
	}
	if _, _, rc := p.fogctl(ctx, "node", "uncordon", from); rc != 0 {
		t.Errorf("uncordon %s: %d", from, rc)
	}
	if d, _ := p.st.Deployment(ctx, dep.ID); d.Status.Phase != spec.PhaseRunning || d.Endpoint["6379/tcp"] != port {
		t.Errorf("after the drain: %s with endpoint %v; want Running at port %d", d.Status.Phase, d.Endpoint, port)
	}

	// The agent of a node whose front end forwards an open connection is
	// killed: the client's connection is closed (not left hanging), the
	// deployment runs on, and the agent started again forwards anew.
	d, _ = p.st.Deployment(ctx, dep.ID)
	fwd := "n1"
	if d.Status.Node == "n1" {
		fwd = "n2"
	}
	conn, err := net.DialTimeout("tcp", at(fwd, port), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := r.ReadString('\n'); err != nil || line != "+PONG\r\n" {
		t.Fatalf("PING on a kept connection through %s: %q, %v", fwd, line, err)
	}
	p.stopAgent(fwd, syscall.SIGKILL)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, _ = conn.Write([]byte("PING\r\n"))
	if line, err := r.ReadString('\n'); err == nil {
		t.Errorf("a connection through the front end of a killed agent answered %q; want it closed", line)
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Errorf("a connection through the front end of a killed agent hangs; want it closed")
	}
	if got, err := redis(at(d.Status.Node, port), "GET", "user"); err != nil || got != "alice" {
		t.Errorf("with %s's agent killed, through %s's front end: GET user = %q, %v; want alice", fwd, d.Status.Node, got, err)
	}
	startAgain(t, p, fwd)
	var got string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if got, err = redis(at(fwd, port), "GET", "user"); err == nil {
			break
		}
	}
	if got != "alice" {
		t.Errorf("through %s's front end once its agent is started again: GET user = %q, %v; want alice", fwd, got, err)
	}
}

// underLoad PINGs addr every 10 ms, each on a new connection, while act
// runs and for 200 ms after, and returns how many failed and the slowest.
func underLoad(ctx context.Context, t *testing.T, addr string, act func()) (failed int, slowest time.Duration) {
	t.Helper()
	var mu sync.Mutex
	lctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for lctx.Err() == nil {
			start := time.Now()
			got, err := testenv.RedisDo(ctx, nil, addr, "PING")
			took := time.Since(start)
			mu.Lock()
			if err != nil || got != "PONG" {
				failed++
				t.Logf("PING through %s: %q, %v after %s", addr, got, err, took)
			}
			slowest = max(slowest, took)
			mu.Unlock()
			time.Sleep(10 * time.Millisecond)
		}
	}()
	time.Sleep(100 * time.Millisecond)
	act()
	time.Sleep(200 * time.Millisecond)
	stop()
	<-done
	return failed, slowest
}

// frontendBench is what TestFrontendPoP measured for make bench: PINGs on
// 16 kept connections for 3 s, direct to the instance and through the
// front ends, and a wake at the client against a restore.
type frontendBench struct {
	Engine engine.Name `json:"engine"`
	// RPS and MedianUS by path: direct, local (the front end of the node it
	// runs on), remote (another node's, which forwards to the local one).
	RPS      map[string]float64 `json:"rps"`
	MedianUS map[string]float64 `json:"median_us"`
	// WakeMS is a connection's first PING answered by a Suspended
	// deployment; RestoreMS a create's restore of the same app (its
	// phases), on the same PoP.
	WakeMS    float64 `json:"wake_ms"`
	RestoreMS float64 `json:"restore_ms"`
	// MigrateStallMS is the slowest PING through the endpoint (a new
	// connection every 10 ms) during a migration; MigrateDowntimeMS how
	// long the instance answered nothing to PINGs straight to it.
	MigrateStallMS    float64 `json:"migrate_stall_ms"`
	MigrateDowntimeMS float64 `json:"migrate_downtime_ms"`
}

func benchFrontend(ctx context.Context, t *testing.T, p *pop, client *http.Client, api, app string, eng engine.Name, direct, local, remote string) *frontendBench {
	t.Helper()
	res := frontendBench{Engine: eng, RPS: map[string]float64{}, MedianUS: map[string]float64{}}
	// Twice each, alternating, the better kept: two shared cores.
	for range 2 {
		for _, path := range []struct{ name, addr string }{{"direct", direct}, {"local", local}, {"remote", remote}} {
			rps, med := pingLoad(ctx, t, path.addr, 16, 3*time.Second)
			if rps > res.RPS[path.name] {
				res.RPS[path.name], res.MedianUS[path.name] = rps, float64(med.Microseconds())
			}
		}
	}
	for _, path := range []string{"local", "remote"} {
		t.Logf("%s: front end (%s): %.0f requests/s, %.0f%% of direct; median %.0f us, %+.0f us against direct", eng, path,
			res.RPS[path], 100*res.RPS[path]/res.RPS["direct"], res.MedianUS[path], res.MedianUS[path]-res.MedianUS["direct"])
	}
	// A wake at the client against a restore of the same app.
	d := createOn(ctx, t, client, api, app, "n2")
	var restore time.Duration
	for _, ph := range d.Status.Timings {
		restore += ph.Duration
	}
	res.RestoreMS = float64(restore.Microseconds()) / 1000
	if code, body := lifecycle(t, client, api, d.ID, "suspend", ""); code != http.StatusAccepted {
		t.Fatalf("suspend: %d %v", code, body)
	}
	got, err := p.st.Deployment(ctx, d.ID)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if pong, err := testenv.RedisDo(ctx, nil, net.JoinHostPort(p.frontend("n1"), strconv.Itoa(got.Endpoint["6379/tcp"])), "PING"); err != nil || pong != "PONG" {
		t.Errorf("wake: %q, %v", pong, err)
	}
	res.WakeMS = float64(time.Since(start).Microseconds()) / 1000
	t.Logf("%s: woken at the client in %.0f ms; a restore of the same app %.0f ms (%.1fx)", eng, res.WakeMS, res.RestoreMS, res.WakeMS/res.RestoreMS)
	if err := p.st.DeleteDeployment(ctx, d.ID); err != nil {
		t.Fatal(err)
	}
	return &res
}

// directPings PINGs the instance at src every 10 ms, on a new connection
// each time, until it is given the instance's address after its move,
// which it PINGs until it answers: it returns how long nothing answered
// (the last answer at src to the first at dst).
func directPings(ctx context.Context, src string) func(dst string) time.Duration {
	var mu sync.Mutex
	var last time.Time
	pctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for pctx.Err() == nil {
			cctx, cancel := context.WithTimeout(pctx, 50*time.Millisecond)
			if got, err := testenv.RedisDo(cctx, nil, src, "PING"); err == nil && got == "PONG" {
				mu.Lock()
				last = time.Now()
				mu.Unlock()
			}
			cancel()
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return func(dst string) time.Duration {
		var first time.Time
		for deadline := time.Now().Add(10 * time.Second); dst != "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if got, err := testenv.RedisDo(ctx, nil, dst, "PING"); err == nil && got == "PONG" {
				first = time.Now()
				break
			}
		}
		stop()
		<-done
		mu.Lock()
		defer mu.Unlock()
		if first.IsZero() || last.IsZero() {
			return 0
		}
		return first.Sub(last)
	}
}

// pingLoad runs conns connections to addr, each sending PING after PING
// for d, and returns the requests per second and the median latency.
func pingLoad(ctx context.Context, t *testing.T, addr string, conns int, d time.Duration) (float64, time.Duration) {
	t.Helper()
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				t.Errorf("dial %s: %v", addr, err)
				return
			}
			defer c.Close()
			r := bufio.NewReader(c)
			var mine []time.Duration
			for time.Now().Before(deadline) && ctx.Err() == nil {
				start := time.Now()
				if _, err := c.Write([]byte("PING\r\n")); err != nil {
					break
				}
				if line, err := r.ReadString('\n'); err != nil || line != "+PONG\r\n" {
					break
				}
				mine = append(mine, time.Since(start))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(lat) == 0 {
		return 0, 0
	}
	slices.Sort(lat)
	return float64(len(lat)) / d.Seconds(), lat[len(lat)/2]
}

// kernelRoutes is node's fogdeploy_frontend_kernel_routes, once it is not
// 0 (within 5 s), from its agent's /metrics.
func kernelRoutes(t *testing.T, p *pop, node string) float64 {
	t.Helper()
	v := -1.0
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get("http://" + p.apis[node] + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) == 2 && f[0] == "fogdeploy_frontend_kernel_routes" {
				v, _ = strconv.ParseFloat(f[1], 64)
			}
		}
		if v > 0 {
			break
		}
	}
	return v
}
