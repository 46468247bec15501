package agent

import (
	"bufio"
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/time/rate"

	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
)

// TestOnDemandRoutes: two nodes' front ends route an app's shared
// endpoint. Connections at once to one node make one instance there (the
// others wait for it), made on demand by the front end's client, with no
// endpoint of its own; the other node makes its own; an instance
// undeployed (idle) is made anew by the next connection; a failed one is
// undeployed and the connection closed; a node that cannot make one (here
// fenced) forwards to another node's instance.
func TestOnDemandRoutes(t *testing.T) {
	endpoint, seed := statetest.Start(t)
	ctx := context.Background()
	var fenced atomic.Bool
	stores, regs := frontendNodes(t, endpoint, seed, state.PortRange{Lo: 24200, Hi: 24299}, rate.NewLimiter(100, 100),
		map[string]func() error{"n1": func() error {
			if fenced.Load() {
				return errors.New("fenced: etcd is not the one this node knew")
			}
			return nil
		}})
	app := spec.App{Name: "web", Env: "e", Command: []string{"x"}, Ready: spec.Readiness{Kind: spec.ReadyOutput, Phrase: "up"},
		Ports: []spec.Port{{Port: 80}}, Frontend: spec.AppFrontend{OnDemand: true}}
	if err := stores["n1"].CreateApp(ctx, app, false); err != nil {
		t.Fatal(err)
	}
	eps, err := stores["n1"].Endpoints(ctx)
	if err != nil || len(eps) != 1 || !eps[0].Shared {
		t.Fatalf("endpoints: %+v, %v; want web's shared one", eps, err)
	}
	port := eps[0].Port

	// As the agents would: each instance made runs (on its node's line
	// server) a moment after it is asked.
	servers := map[string]string{"n1": lineServer(t, "on-n1"), "n2": lineServer(t, "on-n2")}
	actx, stop := context.WithCancel(ctx)
	defer stop()
	var failNext atomic.Bool
	go func() {
		for actx.Err() == nil {
			time.Sleep(20 * time.Millisecond)
			deps, err := seed.Deployments(actx)
			if err != nil {
				continue
			}
			for _, d := range deps {
				if !d.OnDemand || d.Status.Phase != spec.PhasePending {
					continue
				}
				st := state.Status{Instance: spec.Instance{Phase: spec.PhaseRunning, Node: d.Node,
					Ports: map[string]string{"80/tcp": servers[d.Node]}}}
				if failNext.Swap(false) {
					st.Instance = spec.Instance{Phase: spec.PhaseFailed, Node: d.Node, Error: "restore: the engine said no"}
				}
				_ = seed.SetStatus(actx, d.ID, st)
			}
		}
	}()
	say := func(via, line string) string {
		t.Helper()
		c, err := dialEndpoint(via, port)
		if err != nil {
			return "dial: " + err.Error()
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		return sayLine(c, bufio.NewReader(c), line)
	}
	onDemand := func() map[string][]state.Deployment {
		t.Helper()
		deps, err := seed.Deployments(ctx)
		if err != nil {
			t.Fatal(err)
		}
		by := map[string][]state.Deployment{}
		for _, d := range deps {
			if d.App == "web" {
				if !d.OnDemand || d.Client != onDemandClient || d.Endpoint != nil {
					t.Errorf("deployment %+v: want one made on demand by the front end, with no endpoint of its own", d.Desired)
				}
				by[d.Node] = append(by[d.Node], d)
			}
		}
		return by
	}

	// Five connections at once through n2: one instance, on n2.
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if got := say("n2", "hi"+strconv.Itoa(i)); got != "on-n2:hi"+strconv.Itoa(i) {
				t.Errorf("through n2's front end: %q; want on-n2:hi%d", got, i)
			}
		}()
	}
	wg.Wait()
	by := onDemand()
	if len(by["n2"]) != 1 || len(by["n1"]) != 0 {
		t.Fatalf("instances made on demand by 5 connections through n2: %v; want one, on n2", by)
	}
	first := by["n2"][0].ID
	if v := testutil.ToFloat64(counterOf(t, regs["n2"], "fogdeploy_frontend_made_total")); v != 1 {
		t.Errorf("fogdeploy_frontend_made_total on n2 = %v; want 1", v)
	}
	evs, _ := seed.Events(ctx, first)
	made := false
	for _, e := range evs {
		made = made || e.Reason == "on demand"
	}
	if !made {
		t.Errorf("no on-demand event among %+v", evs)
	}
	// Through n1: its own.
	if got := say("n1", "a"); got != "on-n1:a" {
		t.Errorf("through n1's front end: %q; want on-n1:a (an instance of its own)", got)
	}
	if by := onDemand(); len(by["n1"]) != 1 || len(by["n2"]) != 1 {
		t.Errorf("after a connection through n1: %v; want one instance on each node", by)
	}

	// Undeployed (idle): the next connection makes another.
	if err := seed.DeleteDeployment(ctx, first); err != nil {
		t.Fatal(err)
	}
	if got := say("n2", "again"); got != "on-n2:again" {
		t.Errorf("after n2's instance was undeployed: %q; want on-n2:again", got)
	}
	if by := onDemand(); len(by["n2"]) != 1 || by["n2"][0].ID == first {
		t.Errorf("after n2's instance was undeployed: %v; want a new one there", by)
	}

	// A failed one: the connection is closed, the instance undeployed.
	n1 := onDemand()["n1"][0].ID
	if err := seed.DeleteDeployment(ctx, n1); err != nil {
		t.Fatal(err)
	}
	failNext.Store(true)
	if got := say("n1", "x"); !strings.HasPrefix(got, "read:") {
		t.Errorf("a connection whose instance failed: %q; want it closed", got)
	}
	for deadline := time.Now().Add(5 * time.Second); len(onDemand()["n1"]) != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the failed instance is still there: %v", onDemand()["n1"])
		}
	}

	// n1 fenced: it makes none, and forwards to n2's.
	fenced.Store(true)
	if got := say("n1", "far"); got != "on-n2:far" {
		t.Errorf("through a fenced n1: %q; want on-n2:far (n2's instance)", got)
	}
	if by := onDemand(); len(by["n1"]) != 0 {
		t.Errorf("a fenced node made an instance: %v", by["n1"])
	}
}
