package state_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// A hand-over's record: only the node placed for the resume from its
// checkpoint is its target; marked durable, the suspension is Pending no
// more and the secret goes; it goes with its deployment too.
func TestHandoff(t *testing.T) {
	st := statetest.Store(t)
	ctx := context.Background()
	susp := spec.Suspension{Ckpt: layering.SnapRef{Image: "fdi-d1-susp-x", Snap: layering.SealedSnap}, Node: "n1", Pending: "n1"}
	if err := st.CreateDeployment(ctx, state.Desired{ID: "d1", App: "a", Node: "n2", Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := st.SetStatus(ctx, "d1", state.Status{Instance: spec.Instance{Phase: spec.PhasePending, Suspension: &susp}}); err != nil {
		t.Fatal(err)
	}
	h := state.Handoff{Node: "n1", Ckpt: susp.Ckpt.Image, Token: "secret"}
	if err := st.PutHandoff(ctx, "d1", h); err != nil {
		t.Fatal(err)
	}
	if got, err := st.Handoff(ctx, "d1"); err != nil || got != h {
		t.Fatalf("Handoff = %+v, %v; want %+v", got, err, h)
	}
	for _, c := range []struct {
		node, ckpt string
		want       bool
	}{{"n2", susp.Ckpt.Image, true}, {"n3", susp.Ckpt.Image, false}, {"n1", susp.Ckpt.Image, false}, {"n2", "fdi-d1-susp-older", false}} {
		if ok, err := st.HandoffTarget(ctx, "d1", c.node, c.ckpt); err != nil || ok != c.want {
			t.Errorf("HandoffTarget(d1, %s, %s) = %v, %v; want %v", c.node, c.ckpt, ok, err, c.want)
		}
	}
	if err := st.MarkDurable(ctx, "d1", susp.Ckpt.Image); err != nil {
		t.Fatal(err)
	}
	d, err := st.Deployment(ctx, "d1")
	if err != nil || d.Status.Suspension == nil || d.Status.Suspension.Pending != "" || d.Status.Phase != spec.PhasePending {
		t.Errorf("after MarkDurable: %+v, %v; want its suspension, Pending on no node", d.Status, err)
	}
	if _, err := st.Handoff(ctx, "d1"); !errors.Is(err, state.ErrNotFound) {
		t.Errorf("Handoff after MarkDurable: %v; want ErrNotFound", err)
	}

	// With its deployment, and when it is over.
	if err := st.PutHandoff(ctx, "d1", h); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteDeployment(ctx, "d1"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Handoff(ctx, "d1"); !errors.Is(err, state.ErrNotFound) {
		t.Errorf("Handoff of a withdrawn deployment: %v; want ErrNotFound", err)
	}
	if err := st.PutHandoff(ctx, "d2", h); err != nil {
		t.Fatal(err)
	}
	later := state.Handoff{Node: "n2", Ckpt: "fdi-d2-susp-later", Token: "other"}
	if err := st.PutHandoff(ctx, "d3", later); err != nil {
		t.Fatal(err)
	}
	if err := st.EndHandoff(ctx, "d3", h.Ckpt); err != nil {
		t.Fatal(err)
	}
	if got, err := st.Handoff(ctx, "d3"); err != nil || got != later {
		t.Errorf("a later hand-over after the end of an earlier one: %+v, %v; want it kept", got, err)
	}
	for id, ckpt := range map[string]string{"d2": h.Ckpt, "d3": later.Ckpt} {
		if err := st.EndHandoff(ctx, id, ckpt); err != nil {
			t.Fatal(err)
		}
	}
	if n := statetest.Count(ctx, t, st, "handoffs/"); n != 0 {
		t.Errorf("%d hand-over records left; want none", n)
	}
}

// TestHandoffTargetEarly: before its suspension is recorded, a migration's
// checkpoint is readable by the node it moves to once that node has
// prepared the resume, and by no other node; a migration sent back reads
// nothing early.
func TestHandoffTargetEarly(t *testing.T) {
	st := statetest.Store(t)
	ctx := context.Background()
	for _, n := range []string{"n1", "n2", "n3"} {
		if _, err := st.Register(ctx, state.Node{Name: n, Capacity: 8}, 30); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.CreateDeployment(ctx, state.Desired{ID: "d1", App: "a", Node: "n1", Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := st.SetStatus(ctx, "d1", state.Status{Instance: spec.Instance{Phase: spec.PhaseRunning, Node: "n1"}}); err != nil {
		t.Fatal(err)
	}
	ckpt := "fdi-d1-susp-y"
	check := func(when string, want map[string]bool) {
		t.Helper()
		for node, w := range want {
			if ok, err := st.HandoffTarget(ctx, "d1", node, ckpt); err != nil || ok != w {
				t.Errorf("%s: HandoffTarget(d1, %s) = %v, %v; want %v", when, node, ok, err, w)
			}
		}
	}
	check("running", map[string]bool{"n1": false, "n2": false})
	if _, err := st.RequestMigrate(ctx, "d1", "n2"); err != nil {
		t.Fatal(err)
	}
	check("a migration to n2 asked, not prepared", map[string]bool{"n2": false, "n3": false})
	if err := st.MarkPrepared(ctx, "d1", "n2"); err != nil {
		t.Fatal(err)
	}
	check("prepared on n2", map[string]bool{"n2": true, "n3": false, "n1": false})
}

// TestAwaitHandoff: a prepared target's wait for its source's hand-over
// ends with the first record it accepts (not one of a checkpoint not yet
// kept), and with ErrNotFound once the migration moved on (its suspension
// recorded) or its deployment is withdrawn. The same, reading etcd and in
// the agent's watched view.
func TestAwaitHandoff(t *testing.T) {
	for _, watched := range []bool{false, true} {
		t.Run(map[bool]string{false: "etcd", true: "watched"}[watched], func(t *testing.T) {
			st := statetest.Store(t)
			if watched {
				ctx, cancel := context.WithCancel(context.Background())
				t.Cleanup(cancel)
				st.Watch(ctx, slog.New(slog.DiscardHandler))
				for i := 0; !st.Watching(); i++ {
					if i > 200 {
						t.Fatal("the view is not loaded after 2 s")
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			testAwaitHandoff(t, st)
		})
	}
}

func testAwaitHandoff(t *testing.T, st *state.Store) {
	ctx := context.Background()
	want := func(h state.Handoff) bool { return h.Node == "n1" && h.Gen > 0 }
	still := func(d state.Deployment) bool { return d.Suspend && d.Status.Suspension == nil }
	type result struct {
		h   state.Handoff
		err error
	}
	await := func(id string) chan result {
		ch := make(chan result, 1)
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			h, err := st.AwaitHandoff(wctx, id, want, still)
			ch <- result{h, err}
		}()
		return ch
	}
	for _, id := range []string{"d1", "d2", "d3"} {
		if err := st.CreateDeployment(ctx, state.Desired{ID: id, App: "a", Node: "n1", Suspend: true,
			Move: &state.Move{From: "n1", To: "n2"}, Created: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}

	// Kept: the first record with its checkpoint's generation.
	got := await("d1")
	if err := st.PutHandoff(ctx, "d1", state.Handoff{Node: "n1", Ckpt: "fdi-d1-susp-x", Token: "secret"}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		t.Fatalf("AwaitHandoff = %+v, %v before the checkpoint was kept; want it waiting", r.h, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	kept := state.Handoff{Node: "n1", Ckpt: "fdi-d1-susp-x", Token: "secret", Gen: 3, Bytes: 4096}
	if err := st.PutHandoff(ctx, "d1", kept); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.err != nil || r.h != kept {
			t.Fatalf("AwaitHandoff = %+v, %v; want %+v", r.h, r.err, kept)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("AwaitHandoff still waits 5 s after the hand-over was recorded")
	}

	// Moved on: its suspension recorded (the resume reads it then).
	got = await("d2")
	time.Sleep(100 * time.Millisecond)
	if err := st.SetStatus(ctx, "d2", state.Status{Instance: spec.Instance{Phase: spec.PhaseSuspended, Suspension: &spec.Suspension{Node: "n1"}}}); err != nil {
		t.Fatal(err)
	}
	if r := <-got; !errors.Is(r.err, state.ErrNotFound) {
		t.Errorf("AwaitHandoff once the suspension is recorded = %+v, %v; want ErrNotFound", r.h, r.err)
	}

	// Withdrawn.
	got = await("d3")
	time.Sleep(100 * time.Millisecond)
	if err := st.DeleteDeployment(ctx, "d3"); err != nil {
		t.Fatal(err)
	}
	if r := <-got; !errors.Is(r.err, state.ErrNotFound) {
		t.Errorf("AwaitHandoff of a withdrawn deployment = %+v, %v; want ErrNotFound", r.h, r.err)
	}
}
