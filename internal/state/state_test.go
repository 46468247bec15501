package state_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/placement"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
)

func app(name string) spec.App {
	return spec.App{Name: name, Env: "e", Command: []string{"x"}, Ready: spec.Readiness{Kind: spec.ReadyOutput, Phrase: "up"}}
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
	if err := st.CreateApp(ctx, bad, false); !errors.Is(err, spec.ErrInvalidSpec) {
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
	if err := st.SetStatus(ctx, "a-1", state.Status{Instance: spec.Instance{Phase: spec.PhaseRunning, Node: "n1"}}); err != nil {
		t.Fatal(err)
	}
	if got, _ := st.Deployment(ctx, "a-1"); got.Status.Phase != spec.PhaseRunning {
		t.Errorf("status = %q", got.Status.Phase)
	}
	if err := st.DeleteDeployment(ctx, "a-1"); err != nil {
		t.Fatal(err)
	}
	// A status written after the withdrawal does not bring it back.
	if err := st.SetStatus(ctx, "a-1", state.Status{Instance: spec.Instance{Phase: spec.PhaseRunning}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Deployment(ctx, "a-1"); !errors.Is(err, state.ErrNotFound) {
		t.Errorf("withdrawn deployment = %v; want ErrNotFound", err)
	}
	if evs, _ := st.Events(ctx, "a-1"); len(evs) < 2 {
		t.Errorf("events = %v; want requested and undeploy requested", evs)
	}
}

// A withdrawn deployment that node n1 suspended has its status forgotten
// by n1, unless an instance resumed from it runs on another node: that
// node's status stays until its own undeploy.
func TestForgetSuspendedStatus(t *testing.T) {
	st := statetest.Store(t)
	ctx := context.Background()
	for id, inst := range map[string]spec.Instance{
		"suspended": {Phase: spec.PhaseSuspended},
		"resumed":   {Phase: spec.PhaseRunning, Node: "n2"},
		"here":      {Phase: spec.PhaseSuspending, Node: "n1"},
	} {
		if err := st.CreateDeployment(ctx, state.Desired{ID: id, App: "a", Node: "n1", Created: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if err := st.SetStatus(ctx, id, state.Status{Instance: inst}); err != nil {
			t.Fatal(err)
		}
		if err := st.DeleteDeployment(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	for id, want := range map[string]string{"suspended": "", "resumed": "n2", "here": "", "never": ""} {
		if other, err := st.ForgetSuspendedStatus(ctx, id, "n1"); err != nil || other != want {
			t.Errorf("ForgetSuspendedStatus(%s) = %q, %v; want %q", id, other, err, want)
		}
	}
	sts, err := st.Statuses(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := sts["resumed"]; !ok || len(sts) != 1 {
		t.Errorf("statuses left = %v; want only that of the instance resumed on n2", sts)
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
	if n, err := st.Node(context.Background(), "n1"); err != nil || n.Name != "n1" || !n.Ready || n.Capacity != 4 {
		t.Fatalf("Node(n1) = %+v, %v; want n1 Ready with capacity 4", n, err)
	}
	for _, name := range []string{"n", "n10", "nosuch"} {
		if _, err := st.Node(context.Background(), name); !errors.Is(err, state.ErrNotFound) || hint.Of(err) == "" {
			t.Fatalf("Node(%s) = %v; want ErrNotFound with a hint", name, err)
		}
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
	if _, err := st.LockCheckpoint(ctx, s2, "web", false); !errors.Is(err, spec.ErrBusy) {
		t.Errorf("try-lock while held = %v; want spec.ErrBusy", err)
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

// Localities: what each node holds of an app, from the pools the agents
// report: its idle slots, its checkpoint, an idle spare slot (of no app).
func TestLocalities(t *testing.T) {
	if got := state.Localities([]state.Pool{{Node: "a", App: "web", Idle: 1}, {Node: "b", App: "web", Local: true}, {Node: "b", App: "db", Idle: 3}}, "web"); got["a"].Idle != 1 || got["a"].Local || !got["b"].Local || got["b"].Idle != 0 {
		t.Errorf("Localities = %+v; want a: 1 idle, b: local and no idle slot of web", got)
	}
	if got := state.Localities([]state.Pool{{Node: "a", App: spec.SpareApp, Idle: 1}, {Node: "b", App: spec.SpareApp, Idle: 0, Provisioning: 1}, {Node: "b", App: "web", Local: true}}, "web"); !got["a"].Spare || got["a"].Idle != 0 || got["b"].Spare || !got["b"].Local {
		t.Errorf("Localities with spares = %+v; want a: a spare and no slot of web; b: local and no idle spare", got)
	}
}

// eachView runs test on a store that reads etcd to place, and on one that
// places from its watched view.
func eachView(t *testing.T, test func(t *testing.T, st *state.Store)) {
	t.Run("Read", func(t *testing.T) { test(t, statetest.Store(t)) })
	t.Run("Watched", func(t *testing.T) {
		st := statetest.Store(t)
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		st.Watch(ctx, slog.New(slog.DiscardHandler))
		if err := eventually(func() error { return state.PlacementViewMatches(ctx, st) }); err != nil {
			t.Fatal(err)
		}
		test(t, st)
		if err := eventually(func() error { return state.PlacementViewMatches(ctx, st) }); err != nil {
			t.Error(err)
		}
	})
}

// eventually retries check for up to 5 s.
func eventually(check func() error) error {
	var err error
	for range 100 {
		if err = check(); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return err
}

// The watched placement view follows every change placement reads: node
// registrations, leases, cordons, deployments recorded and withdrawn, and
// pools; a create placed from it commits once.
func TestPlacementViewFollows(t *testing.T) {
	st := statetest.Store(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st.Watch(ctx, slog.New(slog.DiscardHandler))
	match := func(after string) {
		t.Helper()
		if err := eventually(func() error { return state.PlacementViewMatches(ctx, st) }); err != nil {
			t.Fatalf("after %s: %v", after, err)
		}
	}
	match("the start")
	registerNodes(t, st, 3, "n1", "n2")
	match("two registrations")
	if err := st.CreateApp(ctx, app("web"), false); err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreatePlaced(ctx, state.Desired{ID: "web-1", App: "web"}, nil); err != nil {
		t.Fatal(err)
	}
	match("a create")
	if _, err := st.CordonNode(ctx, "n2", "maintenance"); err != nil {
		t.Fatal(err)
	}
	match("a cordon")
	sess, err := st.Register(ctx, state.Node{Name: "n3", Capacity: 1}, 30)
	if err != nil {
		t.Fatal(err)
	}
	match("a third registration")
	if err := st.PutPool(ctx, sess, state.Pool{Node: "n3", App: "web", Gen: 1, Size: 1, Idle: 1}); err != nil {
		t.Fatal(err)
	}
	match("a pool report")
	if err := st.DeleteDeployment(ctx, "web-1"); err != nil {
		t.Fatal(err)
	}
	match("a withdrawal")
	sess.Close()
	match("a lease revoked (its pool goes with it)")
}

// registerNodes registers nodes of the given capacity, Ready until the
// test ends.
func registerNodes(t *testing.T, st *state.Store, capacity int, names ...string) {
	t.Helper()
	for _, n := range names {
		sess, err := st.Register(context.Background(), state.Node{Name: n, Capacity: capacity}, 30)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sess.Close() })
	}
}

// createConcurrently fires n creates of app at once (pinned to node unless
// "") and returns each one's error.
func createConcurrently(st *state.Store, n int, app, node string) []error {
	start := make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			d := state.Desired{ID: fmt.Sprintf("%s-%s%d", app, node, i), App: app, Node: node, Created: time.Now()}
			got, err := st.CreatePlaced(context.Background(), d, nil)
			if err == nil && (got.Node == "" || (node != "" && got.Node != node)) {
				err = fmt.Errorf("placed on %q", got.Node)
			}
			errs[i] = err
		}()
	}
	close(start)
	wg.Wait()
	return errs
}

// perNode counts the deployments recorded on each node.
func perNode(t *testing.T, st *state.Store) map[string]int {
	t.Helper()
	deps, err := st.Deployments(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	for _, d := range deps {
		m[d.Node]++
	}
	return m
}

// succeededOrFull counts the creates that succeeded, and fails t for any
// that failed other than with ErrFull (and ErrNoNode).
func succeededOrFull(t *testing.T, errs []error) int {
	t.Helper()
	ok := 0
	for i, err := range errs {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, placement.ErrFull) || !errors.Is(err, placement.ErrNoNode):
			t.Errorf("create %d = %v; want success or ErrFull (and ErrNoNode)", i, err)
		}
	}
	return ok
}

// Concurrent creates never overfill a node: the capacity check commits
// with the record (reading, placing and then writing would let all of
// them pick the same node).
func TestCreatePlacedConcurrent(t *testing.T) { eachView(t, testCreatePlacedConcurrent) }

func testCreatePlacedConcurrent(t *testing.T, st *state.Store) {
	registerNodes(t, st, 3, "n1", "n2")
	if err := st.CreateApp(context.Background(), app("web"), false); err != nil {
		t.Fatal(err)
	}
	ok := succeededOrFull(t, createConcurrently(st, 20, "web", ""))
	per := perNode(t, st)
	if ok != 6 || per["n1"] != 3 || per["n2"] != 3 || len(per) != 2 {
		t.Errorf("%d of 20 concurrent creates succeeded, deployments per node %v; want 6, 3 on each of n1 and n2", ok, per)
	}
}

// A deployment pinned to a node is refused when the node is full, however
// many ask at once, with an error that names the node and its capacity.
func TestCreatePlacedPinned(t *testing.T) { eachView(t, testCreatePlacedPinned) }

func testCreatePlacedPinned(t *testing.T, st *state.Store) {
	ctx := context.Background()
	registerNodes(t, st, 3, "n1", "n2")
	// Before its app exists, a create that finds room is refused by its
	// own transaction, and records nothing.
	if _, err := st.CreatePlaced(ctx, state.Desired{ID: "web-0", App: "web", Node: "n1"}, nil); !errors.Is(err, state.ErrNotFound) ||
		!strings.Contains(err.Error(), "app web") {
		t.Errorf("create before its app exists = %v; want ErrNotFound naming the app", err)
	}
	if n := perNode(t, st); len(n) != 0 {
		t.Errorf("a refused create left deployments %v", n)
	}
	if err := st.CreateApp(ctx, app("web"), false); err != nil {
		t.Fatal(err)
	}
	ok := succeededOrFull(t, createConcurrently(st, 10, "web", "n1"))
	if per := perNode(t, st); ok != 3 || per["n1"] != 3 || per["n2"] != 0 {
		t.Errorf("%d of 10 creates pinned to n1 succeeded, deployments per node %v; want 3, all on n1", ok, per)
	}
	_, err := st.CreatePlaced(ctx, state.Desired{ID: "web-x", App: "web", Node: "n1"}, nil)
	if !errors.Is(err, placement.ErrFull) || !strings.Contains(err.Error(), "node n1") || !strings.Contains(err.Error(), "capacity 3") ||
		!strings.Contains(hint.Of(err), "undeploy") {
		t.Errorf("pinned create on full n1 = %v (hint %q); want ErrFull naming n1 and capacity 3, with a hint", err, hint.Of(err))
	}
	// Unpinned, the PoP places it on n2; the ID stays unique.
	if d, err := st.CreatePlaced(ctx, state.Desired{ID: "web-y", App: "web"}, nil); err != nil || d.Node != "n2" {
		t.Errorf("unpinned create = %+v, %v; want it on n2", d, err)
	}
	if _, err := st.CreatePlaced(ctx, state.Desired{ID: "web-y", App: "web"}, nil); !errors.Is(err, state.ErrExists) {
		t.Errorf("duplicate ID = %v; want ErrExists", err)
	}
	if _, err := st.CreatePlaced(ctx, state.Desired{ID: "web-z", App: "web", Node: "n9"}, nil); !errors.Is(err, state.ErrNotFound) {
		t.Errorf("pinned to an unknown node = %v; want ErrNotFound", err)
	}
	// Nodes the filter refuses take nothing.
	none := func(state.Node) bool { return false }
	if _, err := st.CreatePlaced(ctx, state.Desired{ID: "web-z", App: "web"}, none); !errors.Is(err, placement.ErrNoNode) || errors.Is(err, placement.ErrFull) {
		t.Errorf("create with no eligible node = %v; want ErrNoNode without ErrFull", err)
	}
	// A deployment recorded without placement (CreateDeployment) counts.
	if err := st.CreateDeployment(ctx, state.Desired{ID: "db-1", App: "db", Node: "n2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreatePlaced(ctx, state.Desired{ID: "web-z", App: "web", Node: "n2"}, nil); err != nil {
		t.Errorf("third instance on n2 = %v", err)
	}
	if _, err := st.CreatePlaced(ctx, state.Desired{ID: "web-w", App: "web"}, nil); !errors.Is(err, placement.ErrFull) {
		t.Errorf("create on a full PoP = %v; want ErrFull", err)
	}
	// An unknown app is said first, even on a full PoP, and records nothing.
	if _, err := st.CreatePlaced(ctx, state.Desired{ID: "nope-1", App: "nope"}, nil); !errors.Is(err, state.ErrNotFound) ||
		!strings.Contains(err.Error(), "app nope") || !strings.Contains(hint.Of(err), "app create") {
		t.Errorf("create of an unknown app on a full PoP = %v (hint %q); want ErrNotFound naming the app, with a hint", err, hint.Of(err))
	}
	if _, err := st.Deployment(ctx, "nope-1"); !errors.Is(err, state.ErrNotFound) {
		t.Errorf("the refused create of an unknown app left a record: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := st.CreatePlaced(cctx, state.Desired{ID: "web-v", App: "web"}, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("create with a canceled context = %v; want context.Canceled", err)
	}
}

// A cordoned node takes no new deployment, placed or pinned, and says why
// in its record; what it runs stays; uncordoned, it is placed on again. A
// node that never registered cannot be cordoned, and a reason of more than
// one line is refused.
func TestCordon(t *testing.T) { eachView(t, testCordon) }

func testCordon(t *testing.T, st *state.Store) {
	ctx := context.Background()
	registerNodes(t, st, 3, "n1", "n2")
	if err := st.CreateApp(ctx, app("web"), false); err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreatePlaced(ctx, state.Desired{ID: "web-0", App: "web", Node: "n1"}, nil); err != nil {
		t.Fatal(err)
	}
	c, err := st.CordonNode(ctx, "n1", "disk replacement")
	if err != nil || c.Reason != "disk replacement" || c.Since.IsZero() {
		t.Fatalf("CordonNode = %+v, %v", c, err)
	}
	if n, err := st.Node(ctx, "n1"); err != nil || n.Cordon == nil || n.Cordon.Reason != "disk replacement" || !n.Ready {
		t.Fatalf("n1 after cordon = %+v, %v; want Ready and cordoned with its reason", n, err)
	}
	for i := range 4 {
		d, err := st.CreatePlaced(ctx, state.Desired{ID: fmt.Sprintf("web-%d", i+1), App: "web"}, nil)
		if i < 3 && (err != nil || d.Node != "n2") {
			t.Fatalf("create %d with n1 cordoned = %+v, %v; want it on n2", i, d, err)
		}
		if i == 3 && !errors.Is(err, placement.ErrFull) {
			t.Fatalf("create with n2 full and n1 cordoned = %v; want ErrFull", err)
		}
	}
	_, err = st.CreatePlaced(ctx, state.Desired{ID: "web-p", App: "web", Node: "n1"}, nil)
	if !errors.Is(err, placement.ErrNoNode) || !strings.Contains(err.Error(), "node n1 is cordoned since ") || !strings.Contains(err.Error(), "(disk replacement)") || !strings.Contains(hint.Of(err), "uncordon n1") {
		t.Errorf("create pinned to cordoned n1 = %v (hint %q); want ErrNoNode saying why, with a hint", err, hint.Of(err))
	}
	if _, err := st.Deployment(ctx, "web-0"); err != nil {
		t.Errorf("the deployment on n1 after the cordon: %v; want it kept", err)
	}
	if err := st.UncordonNode(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if err := st.UncordonNode(ctx, "n1"); err != nil {
		t.Errorf("uncordon twice = %v; want no error", err)
	}
	if d, err := st.CreatePlaced(ctx, state.Desired{ID: "web-5", App: "web"}, nil); err != nil || d.Node != "n1" {
		t.Errorf("create after uncordon = %+v, %v; want it on n1", d, err)
	}
	if _, err := st.CordonNode(ctx, "n9", ""); !errors.Is(err, state.ErrNotFound) {
		t.Errorf("cordon of an unknown node = %v; want ErrNotFound", err)
	}
	if err := st.UncordonNode(ctx, "n9"); !errors.Is(err, state.ErrNotFound) {
		t.Errorf("uncordon of an unknown node = %v; want ErrNotFound", err)
	}
	for _, bad := range []string{"two\nlines", "a\x1b[2Jb", strings.Repeat("x", state.MaxCordonReason+1), "\xff"} {
		if _, err := st.CordonNode(ctx, "n2", bad); err == nil {
			t.Errorf("cordon reason %q was accepted", bad)
		}
	}
	if n, _ := st.Node(ctx, "n2"); n.Cordon != nil {
		t.Errorf("n2 cordoned by a refused request: %+v", n.Cordon)
	}
}

// DeploymentsOf counts a client's deployments, from the watched view once
// it follows etcd, and from etcd before: the same either way.
func TestDeploymentsOf(t *testing.T) {
	st := statetest.Store(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	registerNodes(t, st, 8, "n1")
	if err := st.CreateApp(ctx, app("web"), false); err != nil {
		t.Fatal(err)
	}
	for i, client := range []string{"a", "a", "b", ""} {
		if _, err := st.CreatePlaced(ctx, state.Desired{ID: fmt.Sprintf("web-%d", i), App: "web", Client: client}, nil); err != nil {
			t.Fatal(err)
		}
	}
	count := func() map[string]int {
		got := map[string]int{}
		for _, c := range []string{"a", "b", "c"} {
			n, err := st.DeploymentsOf(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			got[c] = n
		}
		return got
	}
	want := map[string]int{"a": 2, "b": 1, "c": 0}
	if got := count(); !reflect.DeepEqual(got, want) {
		t.Errorf("read from etcd: %v; want %v", got, want)
	}
	st.Watch(ctx, slog.New(slog.DiscardHandler))
	if err := eventually(func() error { return state.PlacementViewMatches(ctx, st) }); err != nil {
		t.Fatal(err)
	}
	if got := count(); !reflect.DeepEqual(got, want) {
		t.Errorf("from the watched view: %v; want %v", got, want)
	}
}
