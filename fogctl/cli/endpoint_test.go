package cli

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// `fogctl deploy` gives a deployment its endpoint from pop.frontend.ports;
// `fogctl endpoint ls` lists it (table and -o json, with --app), and `ps`
// shows it; the front ends' addresses are the Ready nodes'.
func TestEndpointLs(t *testing.T) {
	run, st := twoNodes(t)
	ctx := context.Background()
	if _, err := st.Register(ctx, state.Node{Name: "n3", Capacity: 4, Frontend: "10.0.0.13"}, 30); err != nil {
		t.Fatal(err)
	}
	web := spec.App{Name: "web", Env: "e", Command: []string{"x"}, Ready: spec.Readiness{Kind: spec.ReadyOutput, Phrase: "up"},
		Ports: []spec.Port{{Port: 80}}}
	if err := st.CreateApp(ctx, web, false); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run("deploy", "web")
	if code != 0 {
		t.Fatalf("deploy = exit %d\n%s%s", code, out, errOut)
	}
	deps, err := st.Deployments(ctx)
	if err != nil || len(deps) != 1 {
		t.Fatalf("deployments: %v, %v", deps, err)
	}
	port := deps[0].Endpoint["80/tcp"]
	if port < 20000 || port > 29999 {
		t.Fatalf("endpoint of the deploy: %v; want a port of the default range 20000-29999", deps[0].Endpoint)
	}
	code, out, errOut = run("endpoint", "ls")
	if code != 0 || !strings.Contains(out, strconv.Itoa(port)) || !strings.Contains(out, deps[0].ID) || !strings.Contains(out, "80/tcp") ||
		!strings.Contains(out, "# reach each at any front end: 10.0.0.13") {
		t.Errorf("endpoint ls = exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = run("endpoint", "ls", "-o", "json", "--app", "web")
	var got endpointList
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || len(got.Endpoints) != 1 || got.Endpoints[0].Port != port ||
		len(got.Addresses) != 1 || got.Addresses[0] != "10.0.0.13" {
		t.Errorf("endpoint ls -o json = exit %d, %v\n%s", code, err, out)
	}
	if code, out, _ = run("endpoint", "ls", "--app", "other", "-o", "json"); code != 0 || !strings.Contains(out, `"endpoints": []`) {
		t.Errorf("endpoint ls --app other = exit %d\n%s; want an empty list", code, out)
	}
	if code, out, _ = run("ps"); code != 0 || !strings.Contains(out, "ENDPOINT") || !strings.Contains(out, ":"+strconv.Itoa(port)) {
		t.Errorf("ps = exit %d\n%s; want the endpoint column", code, out)
	}
}
