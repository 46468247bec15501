package state_test

import (
	"context"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
)

// A migration's target says its resume is prepared: only the node the
// move targets (To, or Likely without one) is recorded, once; a move back
// or gone is left as it is.
func TestMarkPrepared(t *testing.T) {
	st := statetest.Store(t)
	ctx := context.Background()
	for _, d := range []state.Desired{
		{ID: "to", App: "a", Node: "n1", Suspend: true, Move: &state.Move{From: "n1", To: "n2"}},
		{ID: "likely", App: "a", Node: "n1", Suspend: true, Move: &state.Move{From: "n1", Likely: "n3"}},
		{ID: "back", App: "a", Node: "n1", Suspend: true, Move: &state.Move{From: "n1", To: "n2", Back: true}},
		{ID: "still", App: "a", Node: "n1"},
	} {
		d.Created = time.Now()
		if err := st.CreateDeployment(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ id, node, want string }{
		{"to", "n3", ""}, {"to", "n2", "n2"}, {"to", "n2", "n2"},
		{"likely", "n2", ""}, {"likely", "n3", "n3"},
		{"back", "n2", ""},
		{"still", "n2", ""},
	} {
		if err := st.MarkPrepared(ctx, c.id, c.node); err != nil {
			t.Fatalf("MarkPrepared(%s, %s): %v", c.id, c.node, err)
		}
		d, err := st.Deployment(ctx, c.id)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		if d.Move != nil {
			got = d.Move.Prepared
		}
		if got != c.want {
			t.Errorf("after MarkPrepared(%s, %s): prepared %q; want %q", c.id, c.node, got, c.want)
		}
	}
	if err := st.MarkPrepared(ctx, "gone", "n2"); err == nil {
		t.Error("MarkPrepared of a deployment that does not exist: no error")
	}
}
