//go:build !no_ceph

package e2e

import (
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// TestOnDemandPoP: redis served on demand (frontend.on_demand) on a 2-node
// PoP, under DMTCP and CRIU, with no hook call at all. A client reaches the
// app's shared endpoint through n2's front end: its connection makes the
// app's instance on n2 and is answered by it; the next connections reach
// the same instance; idle for the app's idle_after, the instance is
// undeployed (its slot released); the next connection makes a new one,
// which holds nothing of the one before. fogctl app create made the app's
// first generation, which the first connection restores. fogctl endpoint ls lists the
// shared endpoint, and the agent's metrics count what it made and
// undeployed.
func TestOnDemandPoP(t *testing.T) {
	for _, eng := range []engine.Name{engine.NameDMTCP, engine.NameCRIU} {
		t.Run(string(eng), func(t *testing.T) { testOnDemand(t, eng) })
	}
}

func testOnDemand(t *testing.T, eng engine.Name) {
	ctx, p, _, app := redisOnPoP(t, "e2e-od", eng, func(a *spec.App) {
		a.Frontend = spec.AppFrontend{OnDemand: true, IdleAfter: spec.Duration(5 * time.Second)}
	}, "n1", "n2")
	// fogctl app create made its first generation: no connection waits
	// for its boot.
	if gens, err := p.st.Checkpoints(ctx, app.Name); err != nil || len(gens) == 0 {
		t.Fatalf("generations of %s after fogctl app create: %v, %v; want the first one made", app.Name, gens, err)
	}
	eps, err := p.st.Endpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(eps, func(e state.Endpoint) bool { return e.App == app.Name && e.Shared })
	if i < 0 {
		t.Fatalf("endpoints %+v: want %s's shared one", eps, app.Name)
	}
	addr := net.JoinHostPort(p.frontend("n2"), strconv.Itoa(eps[i].Port))
	redis := func(args ...string) (string, error) {
		var got string
		var err error
		// The front end listens once its view holds the endpoint; a
		// connection that makes the app's first instance may wait for
		// its first boot and checkpoint longer than one exchange's 5 s.
		for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			got, err = testenv.RedisDo(ctx, nil, addr, args...)
			var ne net.Error
			if retry := err != nil && (strings.Contains(err.Error(), "refused") || errors.As(err, &ne) && ne.Timeout()); !retry || time.Now().After(deadline) {
				return got, err
			}
		}
	}
	onDemand := func() []state.Deployment {
		t.Helper()
		deps, err := p.st.Deployments(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []state.Deployment
		for _, d := range deps {
			if d.App == app.Name {
				if !d.OnDemand {
					t.Errorf("deployment %s of %s was not made on demand", d.ID, app.Name)
				}
				out = append(out, d)
			}
		}
		return out
	}

	start := time.Now()
	if got, err := redis("SET", "user", "alice"); err != nil || got != "OK" {
		t.Fatalf("the first connection to the shared endpoint: SET = %q, %v; want it to make an instance and be answered", got, err)
	}
	t.Logf("%s: made on demand and answered in %s", eng, time.Since(start).Round(time.Millisecond))
	deps := onDemand()
	if len(deps) != 1 || deps[0].Status.Node != "n2" || deps[0].Status.Phase != spec.PhaseRunning || deps[0].Status.Mode != spec.ModeRestore {
		t.Fatalf("after the first connection through n2: %+v; want one instance Running on n2, restored", deps)
	}
	first := deps[0].ID
	if got, err := redis("GET", "user"); err != nil || got != "alice" {
		t.Errorf("the next connection: GET user = %q, %v; want alice (the same instance)", got, err)
	}
	if n := len(onDemand()); n != 1 {
		t.Errorf("%d instances after two connections; want 1", n)
	}
	evs, _ := p.st.Events(ctx, first)
	if !slices.ContainsFunc(evs, func(e state.Event) bool { return e.Reason == "on demand" }) {
		t.Errorf("no on-demand event among %+v", evs)
	}
	out, _, code := p.fogctl(ctx, "endpoint", "ls", "--app", app.Name)
	if code != 0 || !strings.Contains(out, "(on demand)") || !strings.Contains(out, "1 running") {
		t.Errorf("fogctl endpoint ls --app %s = %d:\n%s\nwant the shared endpoint with its instance running", app.Name, code, out)
	}

	// Idle for 5 s: undeployed.
	for deadline := time.Now().Add(60 * time.Second); len(onDemand()) != 0; time.Sleep(500 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the idle instance is still there after 60 s: %+v", onDemand())
		}
	}
	if v := metricCount(t, p.apis["n2"], "fogdeploy_idle_undeploys_total"); v != 1 {
		t.Errorf("fogdeploy_idle_undeploys_total on n2 = %v; want 1", v)
	}
	// The next connection makes a new one, from the app's checkpoint.
	start = time.Now()
	got, err := redis("GET", "user")
	t.Logf("%s: scaled from zero again (a restore) and answered in %s", eng, time.Since(start).Round(time.Millisecond))
	if err == nil || !strings.Contains(err.Error(), "nil") {
		t.Errorf("after the idle instance went: GET user = %q, %v; want a new instance, without alice (a nil reply)", got, err)
	}
	if deps := onDemand(); len(deps) != 1 || deps[0].ID == first || deps[0].Status.Node != "n2" {
		t.Errorf("after the idle instance went: %+v; want a new one on n2", deps)
	}
	if v := metricCount(t, p.apis["n2"], `fogdeploy_frontend_made_total{endpoint="`+strconv.Itoa(eps[i].Port)+`"}`); v != 2 {
		t.Errorf("fogdeploy_frontend_made_total on n2 = %v; want 2", v)
	}
	for _, d := range onDemand() {
		if err := p.st.DeleteDeployment(ctx, d.ID); err != nil {
			t.Error(err)
		}
	}
	p.waitAll(context.WithoutCancel(ctx), app.Name, 0)
}
