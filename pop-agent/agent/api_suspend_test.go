package agent

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
)

// The hook API's suspend and resume against a real (embedded) etcd: a
// suspend is refused (409) unless the deployment runs, and asked once; a
// resume is refused unless it is Suspended, and places it on a Ready node
// with room, or the one given; a bad ID, node or body is a 400 naming it,
// an unknown deployment a 404, and no refused request writes anything; a
// client's token reaches only its own deployments (403).
func TestSuspendResumeRequests(t *testing.T) {
	st := statetest.Store(t)
	ctx := context.Background()
	if err := st.CreateApp(ctx, spec.App{Name: "web", Env: "e", Command: []string{"x"},
		Ready: spec.Readiness{Kind: spec.ReadyOutput, Phrase: "up"}}, false); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"n1", "n2"} {
		if _, err := st.Register(ctx, state.Node{Name: n, Capacity: 4}, 10); err != nil {
			t.Fatal(err)
		}
	}
	const admin, other = "0123456789abcdef-admin", "0123456789abcdef-other"
	sec := credentials(t, admin, entry("other", other, "  apps: [web]\n  label: user\n"), nil)
	mux := http.NewServeMux()
	(&hooks{a: &agent{st: st}, keys: sec.keys}).register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	do := func(tok, path, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&v)
		return resp.StatusCode, v
	}
	if err := st.CreateDeployment(ctx, state.Desired{ID: "web-1", App: "web", Node: "n1", Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	revision := func() int64 { return statetest.Revision(ctx, t, st) }
	before := revision()
	for _, c := range []struct {
		name, tok, path, body string
		code                  int
		field                 string
	}{
		{"suspend of a Pending deployment", admin, "/v1/deployments/web-1/suspend", "", 409, ""},
		{"resume of a deployment not suspended", admin, "/v1/deployments/web-1/resume", "", 409, ""},
		{"suspend of an unknown deployment", admin, "/v1/deployments/web-9/suspend", "", 404, ""},
		{"a bad ID", admin, "/v1/deployments/Web%20One/suspend", "", 400, "id"},
		{"a bad wait", admin, "/v1/deployments/web-1/suspend?wait=forever", "", 400, "wait"},
		{"a bad node", admin, "/v1/deployments/web-1/resume", `{"node":"bad node"}`, 400, "node"},
		{"an unknown field", admin, "/v1/deployments/web-1/resume", `{"nodes":"n2"}`, 400, "body"},
		{"another client's deployment", other, "/v1/deployments/web-1/suspend", "", 403, ""},
	} {
		code, body := do(c.tok, c.path, c.body)
		if code != c.code || body["error"] == nil || (c.field != "" && body["field"] != c.field) {
			t.Errorf("%s: %d %v; want %d naming %q", c.name, code, body, c.code, c.field)
		}
	}
	if after := revision(); after != before {
		t.Errorf("refused requests wrote to etcd (revision %d, then %d)", before, after)
	}

	// Running, it is suspended once: its node's agent is asked to.
	if err := st.SetStatus(ctx, "web-1", state.Status{Instance: spec.Instance{Phase: spec.PhaseRunning, Node: "n1"}}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if code, body := do(admin, "/v1/deployments/web-1/suspend", ""); code != http.StatusAccepted {
			t.Fatalf("suspend of a Running deployment: %d %v", code, body)
		}
	}
	d, err := st.Deployment(ctx, "web-1")
	if err != nil || !d.Suspend || d.Node != "n1" {
		t.Fatalf("after suspend: %+v, %v; want Suspend asked of n1", d.Desired, err)
	}
	// Its node could not begin it: withdrawn, it runs on; asked again.
	if err := st.CancelSuspend(ctx, "web-1"); err != nil {
		t.Fatal(err)
	}
	if d, _ := st.Deployment(ctx, "web-1"); d.Suspend || d.Node != "n1" {
		t.Fatalf("after CancelSuspend: %+v; want no suspend asked, on n1", d.Desired)
	}
	if code, body := do(admin, "/v1/deployments/web-1/suspend", ""); code != http.StatusAccepted {
		t.Fatalf("suspend asked again: %d %v", code, body)
	}
	// Its agent records it Suspended, on no node; a resume places it.
	susp := spec.Suspension{From: spec.Generation{App: "web", Gen: 1}, Engine: "dmtcp", CkptGen: 2, Node: "n1"}
	if err := st.SetSuspended(ctx, "web-1", susp, nil); err != nil {
		t.Fatal(err)
	}
	if d, _ := st.Deployment(ctx, "web-1"); d.Node != "" || d.Status.Phase != spec.PhaseSuspended || d.Status.Suspension == nil {
		t.Fatalf("recorded suspended: %+v; want Suspended on no node, with its suspension", d)
	}
	if code, body := do(admin, "/v1/deployments/web-1/resume", `{"node":"n9"}`); code != http.StatusNotFound {
		t.Errorf("resume on an unknown node: %d %v; want 404", code, body)
	}
	code, body := do(admin, "/v1/deployments/web-1/resume", `{"node":"n2"}`)
	d, _ = st.Deployment(ctx, "web-1")
	if code != http.StatusAccepted || d.Node != "n2" || d.Suspend || d.Status.Phase != spec.PhasePending || d.Status.Suspension == nil {
		t.Errorf("resume on n2: %d %v, then %+v; want it Pending on n2 with its suspension", code, body, d)
	}
}
