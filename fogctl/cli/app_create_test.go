package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// An app served on demand: created with its shared endpoint; fogctl then
// asks its first generation, and where no node can make it (here none is
// registered) says so and leaves the app created; --no-checkpoint asks
// none.
func TestAppCreateOnDemand(t *testing.T) {
	run, st := withEnvE(t)
	ctx := context.Background()
	spec := func(name string) string {
		f := filepath.Join(t.TempDir(), name+".yaml")
		body := "name: " + name + "\nenv: e\ncommand: [x]\nports: [{port: 80}]\nready: {kind: tcp, port: 80}\nfrontend: {on_demand: true}\n"
		if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	code, _, errOut := run("app", "create", "-f", spec("web"))
	if code != 0 || !strings.Contains(errOut, "warning: app web is created, but its first generation is not made") ||
		!strings.Contains(errOut, "fogctl checkpoint refresh web") {
		t.Errorf("app create of an app on demand with no node = exit %d:\n%s\nwant it created, with a warning that says how to make its generation", code, errOut)
	}
	eps, err := st.Endpoints(ctx)
	if err != nil || len(eps) != 1 || !eps[0].Shared || eps[0].App != "web" {
		t.Errorf("endpoints after app create: %+v, %v; want web's shared one", eps, err)
	}
	code, _, errOut = run("app", "create", "-f", spec("quiet"), "--no-checkpoint")
	if code != 0 || strings.Contains(errOut, "checkpoint refresh") {
		t.Errorf("app create --no-checkpoint = exit %d:\n%s\nwant it created, no checkpoint asked", code, errOut)
	}
}
