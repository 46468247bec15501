package agent

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fogdeploy/fogdeploy/internal/config"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// TestAgentOnUnitNode is the whole agent, from a client's hook to the
// instance and back, on a node of fakes (deploytest.Unit) and an embedded
// etcd: no root, no Ceph, no dockerd. A POST is placed on the node, which
// boots the app, checkpoints it and reports it Running with an address
// that answers; a client's POST of a restore restores generation 1; GET
// shows each, a client's token only its own; DELETE undoes each and leaves nothing
// on the node; the agent stops when its context ends.
func TestAgentOnUnitNode(t *testing.T) {
	endpoint, st := statetest.Start(t)
	u := deploytest.NewUnit(t)
	app := u.RedisApp("unit-web", engine.NameDMTCP)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := st.CreateApp(ctx, app, false); err != nil {
		t.Fatal(err)
	}
	const operator, alice = "0123456789abcdef-operator", "alice-0123456789abcdef"
	sec := credentials(t, operator, entry("alice", alice, "  apps: [unit-web]\n  label: user\n"), nil)
	c := config.Default()
	c.Node.Name, c.Node.StateDir = "unit", t.TempDir()
	c.Etcd.Endpoints = []string{endpoint}
	c.Agent.ReconcileInterval = time.Second
	o := Options{Listen: "127.0.0.1:0", ShutdownTimeout: 10 * time.Second}
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- runNode(runCtx, c, o, log, sec, reg, newMetrics(reg),
			nodeParts{d: u.D, store: u.Images, mapper: u.Mapper, backend: "fake", priority: u.Priority.Describe()})
	}()
	var api string
	for deadline := time.Now().Add(30 * time.Second); api == ""; time.Sleep(20 * time.Millisecond) {
		if nodes, err := st.Nodes(ctx); err == nil && len(nodes) == 1 {
			api = nodes[0].API
		}
		if time.Now().After(deadline) {
			t.Fatal("the agent never registered its node")
		}
	}
	do := func(method, path, token, body string, v any) int {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, "http://"+api+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if v != nil {
			_ = json.NewDecoder(resp.Body).Decode(v)
		}
		return resp.StatusCode
	}
	running := func(id, token string) state.Deployment {
		t.Helper()
		var d state.Deployment
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
			if code := do("GET", "/v1/deployments/"+id, token, "", &d); code != http.StatusOK {
				t.Fatalf("GET %s: %d", id, code)
			}
			if d.Status.Phase == spec.PhaseRunning || d.Status.Phase == spec.PhaseFailed || time.Now().After(deadline) {
				break
			}
		}
		if d.Status.Phase != spec.PhaseRunning {
			t.Fatalf("deployment %s: %s (%s); want Running", id, d.Status.Phase, d.Status.Error)
		}
		return d
	}

	var ids []string
	for i, want := range []struct {
		token, body string
		booted      bool
	}{{operator, `{"app":"unit-web"}`, true}, {alice, `{"app":"unit-web","mode":"restore","labels":{"user":"alice"}}`, false}} {
		var cr CreateResponse
		if code := do("POST", "/v1/deployments", want.token, want.body, &cr); code != http.StatusCreated {
			t.Fatalf("POST %d: %d", i+1, code)
		}
		d := running(cr.ID, want.token)
		ids = append(ids, cr.ID)
		if d.Node != "unit" || d.Status.Gen != 1 || d.Status.Booted != want.booted {
			t.Errorf("deployment %d: node %s, gen %d, booted %v (mode %s: %s%s); want node unit, gen 1, booted %v", i+1, d.Node, d.Status.Gen, d.Status.Booted, d.Status.Mode, d.Status.Reason, d.Status.BootReason, want.booted)
		}
		if len(d.Status.Timings) == 0 {
			t.Errorf("deployment %d reports no phase timings", i+1)
		}
		if got, err := testenv.RedisDo(ctx, nil, d.Status.Ports["6379/tcp"], "PING"); err != nil || got != "PONG" {
			t.Errorf("deployment %d at %v: PING = %q, %v", i+1, d.Status.Ports, got, err)
		}
	}
	// With ?wait, the create answers once the instance runs, with its
	// address: one round trip. A bad wait is refused before anything is
	// made.
	var bad map[string]any
	if code := do("POST", "/v1/deployments?wait=forever", alice, `{"app":"unit-web","labels":{"user":"alice"}}`, &bad); code != http.StatusBadRequest || bad["field"] != "wait" {
		t.Errorf("POST ?wait=forever: %d %v; want 400 naming wait", code, bad)
	}
	if all, err := st.Deployments(ctx); err != nil || len(all) != 2 {
		t.Errorf("deployments after a refused create: %d, %v; want the 2 made before", len(all), err)
	}
	var cr CreateResponse
	if code := do("POST", "/v1/deployments?wait=30s", alice, `{"app":"unit-web","mode":"restore","labels":{"user":"alice"}}`, &cr); code != http.StatusCreated {
		t.Fatalf("POST ?wait=30s: %d", code)
	}
	ids = append(ids, cr.ID)
	if cr.Status == nil || cr.Status.Phase != spec.PhaseRunning {
		t.Errorf("POST ?wait=30s answered %+v; want the deployment Running", cr)
	} else if got, err := testenv.RedisDo(ctx, nil, cr.Status.Ports["6379/tcp"], "PING"); err != nil || got != "PONG" {
		t.Errorf("the address the create answered (%v): PING = %q, %v", cr.Status.Ports, got, err)
	}
	// A long poll on GET answers at the status's next change after the
	// caller's, or when its wait ends with the status unchanged; a bad
	// after is refused.
	if cr.Status != nil {
		after := cr.Status.Updated.Format(time.RFC3339Nano)
		var same state.Deployment
		if code := do("GET", "/v1/deployments/"+cr.ID+"?wait=300ms&after="+after, alice, "", &same); code != http.StatusOK || !same.Status.Updated.Equal(cr.Status.Updated) {
			t.Errorf("long poll with no change: %d, updated %s; want 200 and the status as it was (%s)", code, same.Status.Updated, after)
		}
		for _, q := range []string{"?after=" + after, "?wait=1s&after=yesterday"} {
			var bad map[string]any
			if code := do("GET", "/v1/deployments/"+cr.ID+q, alice, "", &bad); code != http.StatusBadRequest || bad["field"] != "after" {
				t.Errorf("GET %s: %d %v; want 400 naming after", q, code, bad)
			}
		}
		polled := make(chan int, 1)
		go func() { polled <- do("GET", "/v1/deployments/"+cr.ID+"?wait=30s&after="+after, alice, "", nil) }()
		time.Sleep(100 * time.Millisecond)
		if code := do("DELETE", "/v1/deployments/"+cr.ID, alice, "", nil); code/100 != 2 {
			t.Errorf("DELETE %s: %d", cr.ID, code)
		}
		select {
		case code := <-polled:
			if code != http.StatusNotFound {
				t.Errorf("long poll of a deployment deleted meanwhile: %d; want 404", code)
			}
		case <-time.After(20 * time.Second):
			t.Error("the long poll did not answer when its deployment was deleted")
		}
		ids = ids[:len(ids)-1]
	}
	// A client sees its own deployments only.
	if code := do("GET", "/v1/deployments/"+ids[0], alice, "", nil); code != http.StatusForbidden {
		t.Errorf("alice reading the operator's deployment: %d; want 403", code)
	}
	for i, id := range ids {
		tok := operator
		if i > 0 {
			tok = alice
		}
		if code := do("DELETE", "/v1/deployments/"+id, tok, "", nil); code/100 != 2 {
			t.Errorf("DELETE %s: %d", id, code)
		}
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if recs, err := u.D.Records().List(); err == nil && len(recs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the node still holds the deleted deployments")
		}
	}
	u.AssertNothingLeft(t, app.Name, true)
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("the agent stopped with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not stop when its context ended")
	}
}

type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
