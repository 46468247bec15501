package state_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
)

func app(name string) deploy.App {
	return deploy.App{Name: name, Env: "e", Command: []string{"x"}, Ready: deploy.Readiness{Kind: deploy.ReadyOutput, Phrase: "up"}}
}

func TestApps(t *testing.T) {
	st := statetest.Store(t)
	ctx := context.Background()
	if err := st.CreateApp(ctx, app("web"), false); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateApp(ctx, app("web"), false); !errors.Is(err, state.ErrExists) {
		t.Errorf("second create = %v; want ErrExists", err)
	}
	bad := app("bad")
	bad.Command = nil
	if err := st.CreateApp(ctx, bad, false); !errors.Is(err, deploy.ErrInvalidSpec) {
		t.Errorf("invalid app = %v; want ErrInvalidSpec", err)
	}
	if _, err := st.App(ctx, "bad"); !errors.Is(err, state.ErrNotFound) {
		t.Errorf("an invalid app was stored: %v", err)
	}
	got, err := st.App(ctx, "web")
	if err != nil || got.Engine != "dmtcp" {
		t.Errorf("App = %+v, %v; want defaults applied", got, err)
	}
	if err := st.CreateDeployment(ctx, state.Desired{ID: "web-1", App: "web", Node: "n1", Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteApp(ctx, "web"); !errors.Is(err, state.ErrInUse) {
		t.Errorf("delete of an app in use = %v; want ErrInUse", err)
	}
	if err := st.DeleteDeployment(ctx, "web-1"); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteApp(ctx, "web"); err != nil {
		t.Errorf("delete = %v", err)
	}
}

func TestDeploymentsAndStatus(t *testing.T) {
	st := statetest.Store(t)
	ctx := context.Background()
	d := state.Desired{ID: "a-1", App: "a", Node: "n1", Created: time.Now()}
	if err := st.CreateDeployment(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateDeployment(ctx, d); !errors.Is(err, state.ErrExists) {
		t.Errorf("duplicate ID = %v; want ErrExists", err)
	}
	got, err := st.Deployment(ctx, "a-1")
	if err != nil || got.Status.Phase != "Pending" {
		t.Errorf("new deployment = %+v, %v; want Pending", got, err)
	}
	if err := st.SetStatus(ctx, "a-1", state.Status{Phase: deploy.PhaseRunning, Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := st.Deployment(ctx, "a-1"); got.Status.Phase != deploy.PhaseRunning {
		t.Errorf("status = %q", got.Status.Phase)
	}
	if err := st.DeleteDeployment(ctx, "a-1"); err != nil {
		t.Fatal(err)
	}
	// A status written after the withdrawal does not bring it back.
	if err := st.SetStatus(ctx, "a-1", state.Status{Phase: deploy.PhaseRunning}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Deployment(ctx, "a-1"); !errors.Is(err, state.ErrNotFound) {
		t.Errorf("withdrawn deployment = %v; want ErrNotFound", err)
	}
	if evs, _ := st.Events(ctx, "a-1"); len(evs) < 2 {
		t.Errorf("events = %v; want requested and undeploy requested", evs)
	}
}

// A node is Ready while its agent's lease lives, and NotReady after.
func TestNodeLease(t *testing.T) {
	st := statetest.Store(t)
	ctx, cancel := context.WithCancel(context.Background())
	sess, err := st.Register(ctx, state.Node{Name: "n1", Capacity: 4}, 2)
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := st.Nodes(context.Background())
	if err != nil || len(nodes) != 1 || !nodes[0].Ready {
		t.Fatalf("nodes = %+v, %v; want n1 Ready", nodes, err)
	}
	// Stop keeping the lease alive without revoking it, as a killed agent.
	cancel()
	_ = sess
	deadline := time.Now().Add(10 * time.Second)
	for {
		nodes, _ = st.Nodes(context.Background())
		if len(nodes) == 1 && !nodes[0].Ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("n1 still Ready 10 s after its lease stopped being renewed")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// The checkpoint lock is held by one agent at a time.
func TestLockCheckpoint(t *testing.T) {
	st := statetest.Store(t)
	ctx := context.Background()
	s1, err := st.Register(ctx, state.Node{Name: "n1"}, 5)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := st.Register(ctx, state.Node{Name: "n2"}, 5)
	if err != nil {
		t.Fatal(err)
	}
	unlock, err := st.LockCheckpoint(ctx, s1, "web", true)
	if err != nil {
		t.Fatal(err)
	}
	// A deploy that would rather boot than wait is told at once.
	if _, err := st.LockCheckpoint(ctx, s2, "web", false); !errors.Is(err, deploy.ErrBusy) {
		t.Errorf("try-lock while held = %v; want deploy.ErrBusy", err)
	}
	got := make(chan struct{})
	go func() {
		u, err := st.LockCheckpoint(ctx, s2, "web", true)
		if err == nil {
			u()
		}
		close(got)
	}()
	select {
	case <-got:
		t.Fatal("second agent took the lock while the first held it")
	case <-time.After(500 * time.Millisecond):
	}
	unlock()
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("second agent did not get the lock after the first released it")
	}
}

func TestPlace(t *testing.T) {
	nodes := []state.Node{{Name: "a", Capacity: 4, Ready: true}, {Name: "b", Capacity: 4, Ready: true}, {Name: "c", Capacity: 4}}
	var deps []state.Deployment
	counts := map[string]int{}
	for i := range 6 {
		n, err := state.Place(nodes, deps, "web")
		if err != nil {
			t.Fatal(err)
		}
		counts[n]++
		deps = append(deps, state.Deployment{Desired: state.Desired{ID: strconv.Itoa(i), App: "web", Node: n}})
	}
	if counts["a"] != 3 || counts["b"] != 3 || counts["c"] != 0 {
		t.Errorf("placement = %v; want 3/3 and nothing on the NotReady node", counts)
	}
	// Full nodes take nothing.
	deps = append(deps, state.Deployment{Desired: state.Desired{ID: "x", App: "db", Node: "a"}}, state.Deployment{Desired: state.Desired{ID: "y", App: "db", Node: "b"}})
	if _, err := state.Place(nodes, deps, "web"); !errors.Is(err, state.ErrNoNode) {
		t.Errorf("place on full nodes = %v; want ErrNoNode", err)
	}
	// A lone node takes instances of one app up to its capacity, however
	// low the spreading penalty brings its score.
	one := []state.Node{{Name: "solo", Capacity: 8, Ready: true}}
	deps = nil
	for i := range 8 {
		if _, err := state.Place(one, deps, "web"); err != nil {
			t.Fatalf("instance %d on a node with capacity 8: %v", i+1, err)
		}
		deps = append(deps, state.Deployment{Desired: state.Desired{ID: strconv.Itoa(i), App: "web", Node: "solo"}})
	}
	if _, err := state.Place(one, deps, "web"); !errors.Is(err, state.ErrNoNode) {
		t.Errorf("a 9th instance on a node with capacity 8 = %v; want ErrNoNode", err)
	}
}
