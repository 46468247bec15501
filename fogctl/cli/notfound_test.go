package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/config"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
	"github.com/fogdeploy/fogdeploy/internal/wire"
)

// Names that are not there, and arguments that are empty or look like
// flags, are errors with their exit code, not empty output.
func TestMissingNamesAndBadArguments(t *testing.T) {
	endpoint, st := statetest.Start(t)
	ctx := context.Background()
	if _, err := st.Register(ctx, state.Node{Name: "node1", Capacity: 4}, 30); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (int, string) {
		code, _, errOut := runOn(endpoint, nil)(args...)
		return code, errOut
	}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"pool", "ls", "--node", "nosuch"}, ExitNotFound, "node nosuch: not found"},
		{[]string{"pool", "ls", "--node", "node"}, ExitNotFound, "node node: not found"},
		{[]string{"pool", "ls", "nosuch"}, ExitNotFound, "app nosuch: not found"},
		{[]string{"undeploy", ""}, ExitInvalid, "argument 1 is empty"},
		{[]string{"app", "inspect", " "}, ExitInvalid, "argument 1 is empty"},
		{[]string{"app", "pool", "web", "-3"}, ExitInvalid, "unknown shorthand flag"},
		// A --node given empty is not "any node".
		{[]string{"deploy", "web", "--node", ""}, ExitInvalid, "--node is empty"},
		{[]string{"deploy", "web", "--node=Node 1"}, ExitInvalid, `--node "Node 1" may only hold`},
		{[]string{"checkpoint", "refresh", "web", "--node", ""}, ExitInvalid, "--node is empty"},
		{[]string{"pool", "ls", "--node="}, ExitInvalid, "--node is empty"},
		{[]string{"logs", "web-1", "--tail", "0"}, ExitInvalid, "--tail 0: give a number of lines"},
		{[]string{"app", "rm", "web", "--wait", "-1s"}, ExitInvalid, "--wait -1s is negative"},
		{[]string{"checkpoint", "rm", "web", "1", "--wait=-1m"}, ExitInvalid, "--wait -1m0s is negative"},
	} {
		code, errOut := run(c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("fogctl %q = exit %d:\n%s\nwant exit %d and %q", c.args, code, errOut, c.code, c.want)
		}
		if c.code == ExitNotFound && !strings.Contains(errOut, "Hint:") {
			t.Errorf("fogctl %q: no hint:\n%s", c.args, errOut)
		}
	}
	if code, errOut := run("pool", "ls", "--node", "node1"); code != 0 {
		t.Errorf("pool ls --node node1 = exit %d:\n%s", code, errOut)
	}
}

// runOn returns a runner of fogctl commands on the etcd at endpoint and,
// when l is set, on that environment manager: it gives the exit code,
// the output and the error output.
func runOn(endpoint string, l *wire.Layering) func(args ...string) (int, string, string) {
	return func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		f := &Factory{In: strings.NewReader(""), Out: &out, ErrOut: &errOut, Global: &GlobalOptions{}}
		f.State = func(ctx context.Context) (*state.Store, error) {
			// As fogctl opens it, from its configuration's defaults.
			c := config.Default()
			c.Etcd.Endpoints = []string{endpoint}
			return state.Open(ctx, wire.StateConfig(c))
		}
		if l != nil {
			f.Layering = func(context.Context) (*wire.Layering, error) { return l, nil }
		}
		code := run(context.Background(), f, args)
		return code, out.String(), errOut.String()
	}
}
