package state_test

import (
	"context"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
)

// TestWatchDesired: after a list, the watch gives every change of the
// deployments' records in order; a deployment seen created carries its
// app as it was at its creation (after a replace of the app, its new
// spec), a changed record or one whose app the list and stream lack
// carries none; a withdrawal carries the record withdrawn; a record that
// does not decode is marked so.
func TestWatchDesired(t *testing.T) {
	st := statetest.Store(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	app := func(cmd string) spec.App {
		return spec.App{Name: "web", Env: "e", Command: []string{cmd}, Ready: spec.Readiness{Kind: spec.ReadyOutput, Phrase: "up"}}
	}
	if err := st.CreateApp(ctx, app("v1"), false); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateDeployment(ctx, state.Desired{ID: "web-0", App: "web", Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	l, err := st.ListDesired(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Desired) != 1 || l.Desired[0].ID != "web-0" || l.Apps["web"].Command[0] != "v1" || l.Header.Revision == 0 {
		t.Fatalf("ListDesired = %+v", l)
	}
	changes := st.WatchDesired(ctx, l)

	// The app replaced, then deployed; then its deployment's record
	// changed; then a deployment of an app that is gone; a bad record;
	// a withdrawal.
	if err := st.CreateApp(ctx, app("v2"), true); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateDeployment(ctx, state.Desired{ID: "web-1", App: "web", Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Client().Put(ctx, state.DeploymentsPrefix+"web-1", `{"id":"web-1","app":"web","node":"n2"}`); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateDeployment(ctx, state.Desired{ID: "db-1", App: "db", Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Client().Put(ctx, state.DeploymentsPrefix+"bad-1", `{not json`); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteDeployment(ctx, "web-0"); err != nil {
		t.Fatal(err)
	}
	var got []state.DesiredChange
	for len(got) < 5 {
		batch, ok := <-changes
		if !ok || batch.Err != nil || batch.Header.Revision <= l.Header.Revision {
			t.Fatalf("watch ended or went back: %+v", batch)
		}
		got = append(got, batch.Changes...)
	}
	if c := got[0]; c.ID != "web-1" || c.App == nil || c.App.Command[0] != "v2" || c.Desired.Node != "n1" {
		t.Errorf("deployment created after the app's replace: %+v; want its app's new spec (v2)", c)
	}
	if c := got[1]; c.ID != "web-1" || c.App != nil || c.Desired.Node != "n2" {
		t.Errorf("a changed deployment record: %+v; want it on n2 with no app (read from the cluster)", c)
	}
	if c := got[2]; c.ID != "db-1" || c.App != nil {
		t.Errorf("a deployment of an app the stream lacks: %+v; want no app", c)
	}
	if c := got[3]; c.ID != "bad-1" || !c.Invalid {
		t.Errorf("a record that does not decode: %+v; want it marked Invalid", c)
	}
	if c := got[4]; c.ID != "web-0" || !c.Deleted || !c.Known || c.Desired.Node != "n1" {
		t.Errorf("a withdrawal: %+v; want the record withdrawn (on n1)", c)
	}
	// A deleted app leaves the stream's apps: a deployment created after
	// (by a writer that does not check) carries none.
	for _, id := range []string{"web-1", "db-1", "bad-1"} {
		if _, err := st.Client().Delete(ctx, state.DeploymentsPrefix+id); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.DeleteApp(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateDeployment(ctx, state.Desired{ID: "web-2", App: "web", Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	for done := false; !done; {
		batch := <-changes
		for _, c := range batch.Changes {
			if c.ID == "web-2" {
				done = true
				if c.App != nil {
					t.Errorf("a deployment of a deleted app: %+v; want no app", c)
				}
			}
		}
	}
	// The watch ends with its context: the channel closes.
	cancel()
	for range changes {
	}
}
