package state_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
)

// TestEndpoints: a deployment takes, in its create, one port of the PoP's
// range per TCP port of its app, none another deployment holds, even among
// concurrent creates; when the range is full a create is refused with a
// hint and writes nothing; a withdrawal frees its ports. The same reading
// etcd and placing from the agent's watched view.
func TestEndpoints(t *testing.T) {
	for _, watched := range []bool{false, true} {
		t.Run(map[bool]string{false: "etcd", true: "watched"}[watched], func(t *testing.T) {
			endpoint, seed := statetest.Start(t)
			ctx := context.Background()
			st, err := state.Open(ctx, state.Config{Endpoints: []string{endpoint}, DialTimeout: time.Second,
				EndpointPorts: state.PortRange{Lo: 21000, Hi: 21023}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			if watched {
				wctx, cancel := context.WithCancel(ctx)
				t.Cleanup(cancel)
				st.Watch(wctx, slog.New(slog.DiscardHandler))
				for !st.Watching() {
					time.Sleep(10 * time.Millisecond)
				}
			}
			testEndpoints(t, seed, st)
		})
	}
}

func testEndpoints(t *testing.T, seed, st *state.Store) {
	ctx := context.Background()
	two := spec.App{Name: "two", Env: "e", Command: []string{"x"}, Ready: spec.Readiness{Kind: spec.ReadyOutput, Phrase: "up"},
		Ports: []spec.Port{{Port: 6379}, {Port: 8080, Proto: "tcp"}, {Port: 5353, Proto: "udp"}}}
	one := two
	one.Name, one.Ports = "one", []spec.Port{{Port: 80}}
	none := two
	none.Name, none.Ports = "none", nil
	for _, a := range []spec.App{two, one, none} {
		if err := seed.CreateApp(ctx, a, false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := seed.Register(ctx, state.Node{Name: "n1", Capacity: 100}, 30); err != nil {
		t.Fatal(err)
	}
	create := func(app string) (state.Desired, error) {
		return st.CreatePlaced(ctx, state.Desired{ID: app + "-" + time.Now().Format("150405.000000000"), App: app}, nil)
	}
	d, err := create("two")
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Endpoint) != 2 || d.Endpoint["6379/tcp"] == d.Endpoint["8080/tcp"] || d.Endpoint["5353/udp"] != 0 {
		t.Fatalf("endpoint of an app with two TCP ports and a UDP one: %v; want two distinct ports, none for UDP", d.Endpoint)
	}
	for _, p := range d.Endpoint {
		if p < 21000 || p > 21023 {
			t.Errorf("endpoint port %d is outside the range 21000-21023", p)
		}
	}
	if got, err := seed.Deployment(ctx, d.ID); err != nil || got.Endpoint["6379/tcp"] != d.Endpoint["6379/tcp"] {
		t.Errorf("the stored deployment's endpoint: %v, %v; want %v", got.Endpoint, err, d.Endpoint)
	}
	if n, err := create("none"); err != nil || n.Endpoint != nil {
		t.Errorf("an app without TCP ports: %v, %v; want no endpoint", n.Endpoint, err)
	}

	// 22 more ports at once, from 22 creates: the range's 24 ports, each
	// held by one deployment.
	var wg sync.WaitGroup
	var mu sync.Mutex
	held := map[int]string{}
	for _, p := range d.Endpoint {
		held[p] = d.ID
	}
	for range 22 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o, err := create("one")
			if err != nil {
				t.Errorf("concurrent create: %v", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			p := o.Endpoint["80/tcp"]
			if other, ok := held[p]; ok {
				t.Errorf("port %d given to %s and %s", p, other, o.ID)
			}
			held[p] = o.ID
		}()
	}
	wg.Wait()
	eps, err := seed.Endpoints(ctx)
	if err != nil || len(eps) != 24 {
		t.Fatalf("Endpoints: %d, %v; want the 24 ports of the range", len(eps), err)
	}
	before, _ := seed.Deployments(ctx)
	if _, err := create("one"); !errors.Is(err, state.ErrNoEndpoint) || hint.Of(err) == "" {
		t.Errorf("a create with the range full: %v; want ErrNoEndpoint with a hint", err)
	}
	if after, _ := seed.Deployments(ctx); len(after) != len(before) {
		t.Errorf("the refused create wrote a deployment: %d, then %d", len(before), len(after))
	}

	// A withdrawal frees its ports, for the next create.
	if err := seed.DeleteDeployment(ctx, d.ID); err != nil {
		t.Fatal(err)
	}
	if eps, _ := seed.Endpoints(ctx); len(eps) != 22 {
		t.Errorf("endpoints after a withdrawal: %d; want 22", len(eps))
	}
	var n state.Desired
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		// The view may be a moment behind the withdrawal.
		if n, err = create("one"); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || (n.Endpoint["80/tcp"] != d.Endpoint["6379/tcp"] && n.Endpoint["80/tcp"] != d.Endpoint["8080/tcp"]) {
		t.Errorf("a create after the withdrawal: %v, %v; want one of the ports freed %v", n.Endpoint, err, d.Endpoint)
	}
}

// TestSharedEndpoints: an app served on demand takes its shared endpoint's
// ports when it is created, which no deployment then takes; a deployment
// made on demand takes none of its own and is listed as the app's; a
// replace keeps the ports of the ports the app keeps and frees the rest;
// the app's removal frees them all; a PoP without endpoints refuses such
// an app with a hint.
func TestSharedEndpoints(t *testing.T) {
	endpoint, seed := statetest.Start(t)
	ctx := context.Background()
	st, err := state.Open(ctx, state.Config{Endpoints: []string{endpoint}, DialTimeout: time.Second,
		EndpointPorts: state.PortRange{Lo: 21100, Hi: 21104}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	wctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	st.Watch(wctx, slog.New(slog.DiscardHandler))
	for !st.Watching() {
		time.Sleep(10 * time.Millisecond)
	}
	web := spec.App{Name: "web", Env: "e", Command: []string{"x"}, Ready: spec.Readiness{Kind: spec.ReadyOutput, Phrase: "up"},
		Ports: []spec.Port{{Port: 80}, {Port: 443}, {Port: 53, Proto: "udp"}}, Frontend: spec.AppFrontend{OnDemand: true}}
	one := web
	one.Name, one.Ports, one.Frontend = "one", []spec.Port{{Port: 80}}, spec.AppFrontend{}
	for _, a := range []spec.App{web, one} {
		if err := st.CreateApp(ctx, a, false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := seed.Register(ctx, state.Node{Name: "n1", Capacity: 100}, 30); err != nil {
		t.Fatal(err)
	}
	shared := func() map[string]int {
		t.Helper()
		eps, err := st.Endpoints(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]int{}
		for _, e := range eps {
			if e.Shared {
				if e.App != "web" || e.Deployment != "" {
					t.Errorf("shared endpoint %+v: want app web's, of no deployment", e)
				}
				m[e.Target] = e.Port
			}
		}
		return m
	}
	got := shared()
	if len(got) != 2 || got["80/tcp"] == got["443/tcp"] || got["80/tcp"] < 21100 || got["443/tcp"] > 21104 {
		t.Fatalf("web's shared endpoint: %v; want two distinct ports of 21100-21104, none for UDP", got)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		eps, _, _ := st.WatchedEndpoints()
		if e := eps[got["80/tcp"]]; e.Shared && e.App == "web" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the view's endpoints %v lack web's shared port %d", eps, got["80/tcp"])
		}
	}
	// The three ports left go to deployments, then the range is full.
	for i := range 4 {
		d, err := st.CreatePlaced(ctx, state.Desired{ID: fmt.Sprintf("one-%d", i), App: "one"}, nil)
		if i == 3 {
			if !errors.Is(err, state.ErrNoEndpoint) {
				t.Errorf("a 4th deployment with 2 of 5 ports shared: %v; want ErrNoEndpoint", err)
			}
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if p := d.Endpoint["80/tcp"]; p == got["80/tcp"] || p == got["443/tcp"] {
			t.Errorf("deployment %s took web's shared port %d", d.ID, p)
		}
	}
	od, err := st.CreatePlaced(ctx, state.Desired{ID: "web-od", App: "web", Node: "n1", OnDemand: true}, nil)
	if err != nil || od.Endpoint != nil {
		t.Fatalf("a deployment made on demand with the range full: %v, %v; want it made, with no endpoint of its own", od.Endpoint, err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		deps, _ := st.WatchedOnDemand("web")
		if len(deps) == 1 && deps[0].ID == "web-od" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("WatchedOnDemand(web) = %+v; want web-od", deps)
		}
	}
	if err := st.DeleteApp(ctx, "web"); !errors.Is(err, state.ErrInUse) {
		t.Errorf("removing web with an instance made on demand: %v; want ErrInUse", err)
	}

	// A replace keeps 80's port and frees 443's.
	web.Ports = []spec.Port{{Port: 80}}
	if err := st.CreateApp(ctx, web, true); err != nil {
		t.Fatal(err)
	}
	if now := shared(); len(now) != 1 || now["80/tcp"] != got["80/tcp"] {
		t.Errorf("after a replace without port 443: %v; want 80/tcp at %d alone", now, got["80/tcp"])
	}
	if n := statetest.Count(ctx, t, st, "endpoints/"); n != 4 {
		t.Errorf("endpoint keys after the replace: %d; want 4 (3 deployments, web's 80)", n)
	}
	// Off, then on again: freed, then taken anew.
	web.Frontend = spec.AppFrontend{}
	if err := st.CreateApp(ctx, web, true); err != nil {
		t.Fatal(err)
	}
	if now := shared(); len(now) != 0 {
		t.Errorf("after a replace without on_demand: %v; want none", now)
	}
	web.Frontend.OnDemand = true
	if err := st.CreateApp(ctx, web, true); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteDeployment(ctx, "web-od"); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteApp(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	if now := shared(); len(now) != 0 {
		t.Errorf("after web's removal: %v; want none", now)
	}
	if n := statetest.Count(ctx, t, st, "endpoints/"); n != 3 {
		t.Errorf("endpoint keys after web's removal: %d; want the 3 deployments'", n)
	}

	// Without endpoints, no app on demand.
	web.Name = "web2"
	err = seed.CreateApp(ctx, web, false)
	if !errors.Is(err, spec.ErrInvalidSpec) || hint.Of(err) == "" || !strings.Contains(err.Error(), "frontend.on_demand") {
		t.Errorf("an app on demand where the PoP gives no endpoints: %v; want it refused, naming frontend.on_demand, with a hint", err)
	}
}
