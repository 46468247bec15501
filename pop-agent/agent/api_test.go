package agent

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
)

// The hook API against a real (embedded) etcd: creates are placed and
// recorded; bad input gets a 4xx with the field and writes nothing.
func TestHooks(t *testing.T) {
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
	const token = "0123456789abcdef-token"
	sec := credentials(t, token, "", nil)
	mux := http.NewServeMux()
	(&hooks{a: &agent{st: st}, keys: sec.keys}).register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	do := func(method, path, tok, body string) (int, map[string]any) {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&v)
		return resp.StatusCode, v
	}
	count := func() int64 { return statetest.Count(ctx, t, st, "deployments/") }
	for _, c := range []struct {
		name, tok, body string
		code            int
		field           string
	}{
		{"no token", "", `{"app":"web"}`, 401, ""},
		{"wrong token", "nope", `{"app":"web"}`, 401, ""},
		{"unknown app", token, `{"app":"db"}`, 404, ""},
		{"unknown node", token, `{"app":"web","node":"n9"}`, 404, ""},
		{"malformed", token, `{"app":`, 400, "body"},
		{"unknown field", token, `{"app":"web","x":1}`, 400, "body"},
		{"a client of its own", token, `{"app":"web","client":"someone"}`, 400, "body"},
		{"bad app name", token, `{"app":"Web App"}`, 400, "app"},
		{"bad label", token, `{"app":"web","labels":{"a b":"c"}}`, 400, "labels"},
		{"bad mode", token, `{"app":"web","mode":"fast"}`, 400, "mode"},
		{"mode checkpoint is fogctl checkpoint refresh's", token, `{"app":"web","mode":"checkpoint"}`, 400, "mode"},
		{"oversized", token, `{"app":"` + strings.Repeat("w", MaxRequestBytes) + `"}`, 413, ""},
	} {
		code, body := do("POST", "/v1/deployments", c.tok, c.body)
		if code != c.code || body["error"] == nil || (c.field != "" && body["field"] != c.field) {
			t.Errorf("%s: %d %v; want %d naming %q", c.name, code, body, c.code, c.field)
		}
	}
	if n := count(); n != 0 {
		t.Fatalf("bad requests wrote %d deployments", n)
	}
	nodes := map[string]int{}
	for range 4 {
		code, body := do("POST", "/v1/deployments", token, `{"app":"web","labels":{"user":"alice"}}`)
		if code != 201 {
			t.Fatalf("create: %d %v", code, body)
		}
		nodes[body["node"].(string)]++
		if code, got := do("GET", "/v1/deployments/"+body["id"].(string), token, ""); code != 200 || got["app"] != "web" {
			t.Errorf("get: %d %v", code, got)
		}
	}
	if nodes["n1"] != 2 || nodes["n2"] != 2 {
		t.Errorf("placement = %v; want 2 per node", nodes)
	}
	for _, mode := range []spec.Mode{spec.ModeAuto, spec.ModeRestore, spec.ModeBoot} {
		code, body := do("POST", "/v1/deployments", token, `{"app":"web","mode":"`+string(mode)+`"}`)
		if code != 201 {
			t.Fatalf("create of mode %s: %d %v", mode, code, body)
		}
		if d, err := st.Deployment(ctx, body["id"].(string)); err != nil || d.Mode != mode {
			t.Errorf("deployment of mode %s = %+v, %v", mode, d.Desired, err)
		}
	}
	if code, _ := do("GET", "/v1/deployments/nope-1", token, ""); code != 404 {
		t.Errorf("get unknown = %d; want 404", code)
	}
	if code, _ := do("DELETE", "/v1/deployments/nope-1", token, ""); code != 404 {
		t.Errorf("delete unknown = %d; want 404", code)
	}
}

func FuzzDecodeCreate(f *testing.F) {
	f.Add(`{"app":"web"}`)
	f.Add(`{"app":"web","node":"n1","labels":{"a":"b"}}`)
	f.Add(`[]`)
	f.Fuzz(func(t *testing.T, body string) {
		req, err := DecodeCreate(strings.NewReader(body))
		if err != nil {
			return
		}
		if req.App == "" || len(req.App) > 63 || len(req.Labels) > 32 || spec.ValidateMode(req.Mode) != nil {
			t.Fatalf("accepted an invalid request: %+v", req)
		}
	})
}
