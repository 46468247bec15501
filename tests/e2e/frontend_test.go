//go:build !no_ceph

package e2e

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

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

	// A migration under a client's steady load through the endpoint.
	failed, slowest := underLoad(ctx, t, at("n2", port), func() {
		code, moved := migrateHook(t, client, api, dep.ID, "n2")
		if code != http.StatusOK || moved.To != "n2" {
			t.Errorf("migrate to n2: %d %+v", code, moved)
		}
	})
	if failed != 0 {
		t.Errorf("%d requests failed through the endpoint during the migration; want none (held, not refused)", failed)
	}
	t.Logf("%s: migration under load: 0 failed, slowest request %s", eng, slowest.Round(time.Millisecond))
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
		t.Errorf("at the end: %s with endpoint %v; want Running at port %d", d.Status.Phase, d.Endpoint, port)
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
