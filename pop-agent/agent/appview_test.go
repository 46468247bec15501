package agent

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
)

// The reconciler's view of the apps, kept from its watch, gives a
// deployment seen created the app as it was when the deployment was
// created: after a replace of the app, its new spec; a deployment whose
// record changed (a resume, a move) or whose app the view lacks gets none,
// and is read from the cluster.
func TestAppViewFollowsTheWatch(t *testing.T) {
	st := statetest.Store(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	app := func(cmd string) spec.App {
		return spec.App{Name: "web", Env: "e", Command: []string{cmd}, Ready: spec.Readiness{Kind: spec.ReadyOutput, Phrase: "up"}}
	}
	if err := st.CreateApp(ctx, app("v1"), false); err != nil {
		t.Fatal(err)
	}
	r, err := st.Client().Get(ctx, state.AppsPrefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	view := newAppView(r.Kvs)
	if got := view["web"].Command; len(got) != 1 || got[0] != "v1" {
		t.Fatalf("seeded view: %+v", view)
	}
	wch := st.Client().Watch(ctx, state.AppsPrefix, clientv3.WithRange(clientv3.GetPrefixRangeEnd(state.DeploymentsPrefix)),
		clientv3.WithRev(r.Header.Revision+1))

	// The app replaced, then deployed; then its deployment's record
	// changed; then a deployment of an app that is gone.
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

	var got []*spec.App
	for len(got) < 3 {
		wr, ok := <-wch
		if !ok || wr.Err() != nil {
			t.Fatalf("watch ended: %v", wr.Err())
		}
		for _, ev := range wr.Events {
			if !isDeployment(ev) {
				view.follow(ev)
				continue
			}
			app := "web"
			if string(ev.Kv.Key) == state.DeploymentsPrefix+"db-1" {
				app = "db"
			}
			got = append(got, view.created(ev, app))
		}
	}
	if got[0] == nil || got[0].Command[0] != "v2" {
		t.Errorf("deployment created after the app's replace: app %+v; want its new spec (v2)", got[0])
	}
	if got[1] != nil {
		t.Errorf("a changed deployment record: app %+v; want none (read from the cluster)", got[1])
	}
	if got[2] != nil {
		t.Errorf("a deployment of an app the view lacks: app %+v; want none", got[2])
	}
	// Deleted, the app leaves the view.
	if err := st.DeleteApp(ctx, "web"); err == nil {
		t.Fatal("DeleteApp with a deployment: want ErrInUse")
	}
	if err := st.DeleteDeployment(ctx, "web-1"); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteApp(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	for _, ok := view["web"]; ok; _, ok = view["web"] {
		wr, open := <-wch
		if !open || wr.Err() != nil {
			t.Fatalf("watch ended before the app's deletion came: %v", wr.Err())
		}
		for _, ev := range wr.Events {
			view.follow(ev)
		}
	}
}
