package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
	"github.com/fogdeploy/fogdeploy/internal/wire/wiretest"
)

// `fogctl node cordon` shows in `node ls` (status and why) and in -o json;
// a deploy pinned to the node is refused with a hint; `uncordon` undoes
// it; an unknown node, a bad name and a reason of two lines are refused
// without a change.
func TestNodeCordon(t *testing.T) {
	run, st := twoNodes(t)
	ctx := context.Background()
	code, out, errOut := run("node", "cordon", "n1", "--reason", "disk replacement")
	if code != 0 || !strings.Contains(out, "n1 cordoned since ") || !strings.Contains(out, "(disk replacement)") {
		t.Fatalf("node cordon = exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = run("node", "ls")
	if code != 0 || !strings.Contains(out, "n1    Ready,Cordoned") || !strings.Contains(out, "# n1: cordoned since ") ||
		!strings.Contains(out, "fogctl node uncordon n1") || strings.Contains(out, "n2    Ready,Cordoned") {
		t.Errorf("node ls with n1 cordoned = exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = run("node", "ls", "-o", "json")
	var nodes []state.Node
	if err := json.Unmarshal([]byte(out), &nodes); code != 0 || err != nil || len(nodes) != 2 || nodes[0].Cordon == nil ||
		nodes[0].Cordon.Reason != "disk replacement" || nodes[1].Cordon != nil {
		t.Errorf("node ls -o json = exit %d, %v\n%s", code, err, out)
	}
	web := spec.App{Name: "web", Env: "e", Command: []string{"x"}, Ready: spec.Readiness{Kind: spec.ReadyOutput, Phrase: "up"}}
	if err := st.CreateApp(ctx, web, false); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = run("deploy", "web", "--node", "n1")
	if code == 0 || !strings.Contains(errOut, "node n1 is cordoned since") || !strings.Contains(errOut, "fogctl node uncordon n1") {
		t.Errorf("deploy pinned to cordoned n1 = exit %d\n%s%s; want refused with a hint", code, out, errOut)
	}
	for _, bad := range [][]string{{"node", "cordon", "n9"}, {"node", "uncordon", "n9"}, {"node", "cordon", "../n1"}, {"node", "cordon", "n2", "--reason", "a\nb"}} {
		if code, out, errOut := run(bad...); code == 0 || errOut == "" {
			t.Errorf("%v = exit %d\n%s%s; want refused", bad, code, out, errOut)
		}
	}
	if n, _ := st.Node(ctx, "n2"); n.Cordon != nil {
		t.Errorf("n2 cordoned by refused commands: %+v", n.Cordon)
	}
	code, out, errOut = run("node", "uncordon", "n1")
	if code != 0 || !strings.Contains(out, "n1 uncordoned") {
		t.Errorf("node uncordon = exit %d\n%s%s", code, out, errOut)
	}
	if n, _ := st.Node(ctx, "n1"); n.Cordon != nil {
		t.Errorf("n1 after uncordon: %+v", n.Cordon)
	}
}

// twoNodes starts an embedded etcd with nodes n1 and n2 registered (their
// sessions closed at the test's end) and returns fogctl run against it.
func twoNodes(t *testing.T) (func(args ...string) (int, string, string), *state.Store) {
	t.Helper()
	endpoint, st := statetest.Start(t)
	for _, n := range []string{"n1", "n2"} {
		sess, err := st.Register(context.Background(), state.Node{Name: n, Capacity: 4}, 30)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sess.Close() })
	}
	return runOn(endpoint, wiretest.FakeLayering(t)), st
}
