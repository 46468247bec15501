package cli

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
)

// fogctl logs asks the agent of the deployment's node over TLS when the
// node registered https://, verifying its certificate against
// FOGDEPLOY_CA_FILE or --agent-ca-file, with the token of
// FOGDEPLOY_TOKEN_FILE; it sends no token in clear beyond loopback.
func TestLogsOverTLS(t *testing.T) {
	endpoint, st := statetest.Start(t)
	ctx := context.Background()
	dir := t.TempDir()
	const token = "0123456789abcdef-operator"
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	agent := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Header.Get("Authorization") != "Bearer "+token:
			w.WriteHeader(401)
			json.NewEncoder(w).Encode(map[string]string{"error": "missing or unknown bearer token"})
		case r.URL.Path == "/v1/deployments/web-00000001/logs" && r.URL.Query().Get("tail") == "7":
			json.NewEncoder(w).Encode(map[string]any{"lines": []string{"hello", "world"}})
		default:
			w.WriteHeader(403)
			json.NewEncoder(w).Encode(map[string]string{"error": "deployment x: outside the token's scope", "hint": "use your own"})
		}
	}))
	defer agent.Close()
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: agent.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, n := range []state.Node{{Name: "n1", API: "https://" + agent.Listener.Addr().String(), Capacity: 4},
		{Name: "n2", API: "192.0.2.1:7480", Capacity: 4}} {
		if _, err := st.Register(ctx, n, 30); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []state.Desired{{ID: "web-00000001", App: "web", Node: "n1"}, {ID: "web-00000002", App: "web", Node: "n1"},
		{ID: "web-00000003", App: "web", Node: "n2"}} {
		d.Created = time.Now()
		if err := st.CreateDeployment(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("FOGDEPLOY_TOKEN_FILE", tokenFile)
	run := runOn(endpoint, nil)

	// Not trusted: the system's roots do not know the test CA.
	code, _, errOut := run("logs", "web-00000001", "--tail", "7")
	if code != ExitInvalid || !strings.Contains(errOut, "certificate does not verify") || !strings.Contains(errOut, "--agent-ca-file") {
		t.Errorf("logs without the CA = exit %d:\n%s", code, errOut)
	}
	if code, out, errOut := run("logs", "web-00000001", "--tail", "7", "--agent-ca-file", caFile); code != 0 || out != "hello\nworld\n" {
		t.Errorf("logs --agent-ca-file = exit %d %q:\n%s", code, out, errOut)
	}
	t.Setenv("FOGDEPLOY_CA_FILE", caFile)
	if code, out, errOut := run("logs", "web-00000001", "--tail", "7"); code != 0 || out != "hello\nworld\n" {
		t.Errorf("logs with FOGDEPLOY_CA_FILE = exit %d %q:\n%s", code, out, errOut)
	}
	// The agent's refusal, with its hint.
	if code, _, errOut := run("logs", "web-00000002"); code != ExitError || !strings.Contains(errOut, "outside the token's scope (HTTP 403)") ||
		!strings.Contains(errOut, "Hint: use your own") {
		t.Errorf("logs refused by the agent = exit %d:\n%s", code, errOut)
	}
	before := calls.Load()
	if code, _, errOut := run("logs", "web-00000003"); code != ExitInvalid || !strings.Contains(errOut, "fogctl sends no token in clear") {
		t.Errorf("logs of a plain agent beyond loopback = exit %d:\n%s", code, errOut)
	}
	if calls.Load() != before {
		t.Error("a refused call reached an agent")
	}
	if code, _, errOut := run("logs", "web-00000001", "--agent-ca-file", filepath.Join(dir, "none")); code == 0 || !strings.Contains(errOut, "agent.ca_file") {
		t.Errorf("logs with a missing CA file = exit %d:\n%s", code, errOut)
	}
}
