package scheduler_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/scheduler"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
)

// agents stands in for the agents of nodes: a suspend asked of a node's
// deployment is recorded Suspended; a resume placed on a node in fail is
// recorded Suspended again with an error, elsewhere Running there; after
// either, the agent takes the next step of a migration (MoveOn).
func agents(ctx context.Context, st *state.Store, fail map[string]bool) {
	go func() {
		for ctx.Err() == nil {
			deps, err := st.Deployments(ctx)
			if err != nil {
				return
			}
			for _, d := range deps {
				switch {
				case d.Suspend && d.Node != "" && d.Status.Phase == spec.PhaseRunning:
					susp := spec.Suspension{From: spec.Generation{App: d.App, Gen: 1}, Engine: "dmtcp", CkptGen: 2, Node: d.Node, Bytes: 42}
					_ = st.SetSuspended(ctx, d.ID, susp, nil)
					_, _ = st.MoveOn(ctx, d.ID)
				case d.Status.Phase == spec.PhasePending && d.Status.Suspension != nil && fail[d.Node]:
					_ = st.SetSuspended(ctx, d.ID, *d.Status.Suspension, errors.New("no room on "+d.Node))
					_, _ = st.MoveOn(ctx, d.ID)
				case d.Status.Phase == spec.PhasePending && d.Status.Suspension != nil:
					_ = st.SetStatus(ctx, d.ID, state.Status{Instance: spec.Instance{Phase: spec.PhaseRunning, Node: d.Node,
						Ports: map[string]string{"6379/tcp": "127.0.0.1:1" + d.Node[1:]}}})
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
}

// threeNodes is a store with nodes n1, n2 and n3 of capacity 4, and a
// context that ends with the test (a minute at most).
func threeNodes(t *testing.T) (*state.Store, context.Context) {
	t.Helper()
	st := statetest.Store(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	for _, n := range []string{"n1", "n2", "n3"} {
		if _, err := st.Register(ctx, state.Node{Name: n, Capacity: 4}, 30); err != nil {
			t.Fatal(err)
		}
	}
	return st, ctx
}

// A migration moves a running deployment to another node; when the
// resume fails there, it is resumed back where it was, even on a cordoned
// node, and the error says so: never lost, never on two nodes. One not
// running, or asked to its own node, is refused with nothing changed; a
// drain cordons the node and moves what runs there.
func TestMigrate(t *testing.T) {
	st, ctx := threeNodes(t)
	running := func(id, node string) {
		t.Helper()
		if err := st.CreateDeployment(ctx, state.Desired{ID: id, App: "web", Node: node, Created: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if err := st.SetStatus(ctx, id, state.Status{Instance: spec.Instance{Phase: spec.PhaseRunning, Node: node}}); err != nil {
			t.Fatal(err)
		}
	}
	agents(ctx, st, map[string]bool{"n3": true})

	running("web-1", "n1")
	if _, err := scheduler.Migrate(ctx, st, "web-1", "n1"); !errors.Is(err, state.ErrConflict) {
		t.Errorf("migrate to its own node = %v; want ErrConflict", err)
	}
	m, err := scheduler.Migrate(ctx, st, "web-1", "n2")
	if d, _ := st.Deployment(ctx, "web-1"); err != nil || m.From != "n1" || m.To != "n2" || m.Bytes != 42 || d.Node != "n2" || d.Status.Phase != spec.PhaseRunning {
		t.Fatalf("migrate to n2 = %+v, %v, then %s on %s; want Running on n2", m, err, d.Status.Phase, d.Node)
	}

	// The resume fails on n3 and the deployment's node is cordoned
	// meanwhile: it runs on n2 again.
	if _, err := st.CordonNode(ctx, "n2", "maintenance"); err != nil {
		t.Fatal(err)
	}
	m, err = scheduler.Migrate(ctx, st, "web-1", "n3")
	d, _ := st.Deployment(ctx, "web-1")
	if !errors.Is(err, scheduler.ErrNotMoved) || !m.Back || d.Node != "n2" || d.Status.Phase != spec.PhaseRunning {
		t.Fatalf("migrate to failing n3 = %+v, %v, then %s on %s; want ErrNotMoved, back and Running on n2", m, err, d.Status.Phase, d.Node)
	}
	if err := st.UncordonNode(ctx, "n2"); err != nil {
		t.Fatal(err)
	}

	// A migration whose caller is gone goes on: the agents carry it from
	// the suspend to the resume on the target, and, failed there, back.
	if _, err := st.RequestMigrate(ctx, "web-1", "n3"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.RequestMigrate(ctx, "web-1", "n3"); err != nil {
		t.Errorf("the same migration asked again = %v; want nothing asked again", err)
	}
	for d, _ := st.Deployment(ctx, "web-1"); d.Node != "n2" || d.Status.Phase != spec.PhaseRunning || d.Move == nil || !d.Move.Back; d, _ = st.Deployment(ctx, "web-1") {
		if ctx.Err() != nil {
			t.Fatalf("migration without its caller: %s on %s, move %+v; want Running on n2, back", d.Status.Phase, d.Node, d.Move)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := st.RequestMigrate(ctx, "web-1", "nowhere"); !errors.Is(err, state.ErrNotFound) {
		t.Errorf("migrate to an unknown node = %v; want ErrNotFound", err)
	}
	if d, _ := st.Deployment(ctx, "web-1"); d.Suspend {
		t.Errorf("a refused migration asked a suspend: %+v", d.Desired)
	}

	// A drain of n1 moves what runs there (to n2, or, placed on n3 whose
	// resumes fail, back on n1 with why) and leaves n1 cordoned; a
	// deployment that does not run is left alone.
	running("web-2", "n1")
	if err := st.CreateDeployment(ctx, state.Desired{ID: "web-3", App: "web", Node: "n1", Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	moved, err := scheduler.Drain(ctx, st, "n1", 2, "drained")
	if n, _ := st.Node(ctx, "n1"); n.Cordon == nil {
		t.Errorf("n1 not cordoned after its drain")
	}
	if len(moved) != 1 || moved[0].ID != "web-2" {
		t.Fatalf("drain = %+v, %v; want web-2 moved (web-3 is not running)", moved, err)
	}
	d2, _ := st.Deployment(ctx, "web-2")
	switch m := moved[0]; {
	case m.To == "n2" && m.Error == "" && err == nil && d2.Node == "n2" && d2.Status.Phase == spec.PhaseRunning:
	case m.To == "n3" && m.Back && errors.Is(err, scheduler.ErrNotMoved) && d2.Node == "n1" && d2.Status.Phase == spec.PhaseRunning:
	default:
		t.Errorf("drain of web-2 = %+v, %v, then %s on %s; want Running on n2, or back on n1 with why", m, err, d2.Status.Phase, d2.Node)
	}
	if d, _ := st.Deployment(ctx, "web-3"); d.Node != "n1" || d.Suspend {
		t.Errorf("web-3, Pending, was touched by the drain: %+v", d.Desired)
	}
}

// A migration asked without a target names the node placement picks then
// (Move.Likely, whose agent prepares the resume meanwhile), and is resumed
// there; where that node no longer takes it (cordoned meanwhile), on
// another.
func TestMigrateLikelyTarget(t *testing.T) {
	st, ctx := threeNodes(t)
	for i, cordon := range []bool{false, true} {
		id := "web-" + string(rune('a'+i))
		if err := st.CreateDeployment(ctx, state.Desired{ID: id, App: "web", Node: "n1", Created: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if err := st.SetStatus(ctx, id, state.Status{Instance: spec.Instance{Phase: spec.PhaseRunning, Node: "n1"}}); err != nil {
			t.Fatal(err)
		}
		d, err := st.RequestMigrate(ctx, id, "")
		if err != nil || d.Move == nil || d.Move.To != "" || (d.Move.Likely != "n2" && d.Move.Likely != "n3") {
			t.Fatalf("migrate %s without a target = %+v, %v; want the likely target n2 or n3", id, d.Move, err)
		}
		likely := d.Move.Likely
		if cordon {
			if _, err := st.CordonNode(ctx, likely, "maintenance"); err != nil {
				t.Fatal(err)
			}
		}
		susp := spec.Suspension{From: spec.Generation{App: "web", Gen: 1}, Engine: "dmtcp", CkptGen: 2, Node: "n1", Bytes: 42}
		if err := st.SetSuspended(ctx, id, susp, nil); err != nil {
			t.Fatal(err)
		}
		d, err = st.MoveOn(ctx, id)
		switch {
		case err != nil || d.Move == nil || d.Node == "" || d.Node == "n1" || d.Move.To != d.Node:
			t.Errorf("%s moved on = node %q, move %+v, %v; want placed on another node", id, d.Node, d.Move, err)
		case !cordon && d.Node != likely:
			t.Errorf("%s resumed on %s; want %s, its likely target", id, d.Node, likely)
		case cordon && d.Node == likely:
			t.Errorf("%s resumed on %s, cordoned since; want the other node", id, d.Node)
		}
		// Its source, started again, records its suspension once more:
		// the move that went on stays.
		if err := st.RecordSuspended(ctx, id, susp); err != nil {
			t.Fatal(err)
		}
		if again, err := st.Deployment(ctx, id); err != nil || again.Node != d.Node || again.Status.Phase != spec.PhasePending {
			t.Errorf("%s after its source recorded its suspension again: %s on %q, %v; want Pending on %s", id, again.Status.Phase, again.Node, err, d.Node)
		}
		if cordon {
			if err := st.UncordonNode(ctx, likely); err != nil {
				t.Fatal(err)
			}
		}
	}
}
