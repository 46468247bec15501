package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/adaptive"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
	"github.com/fogdeploy/fogdeploy/internal/wire/wiretest"
)

// The modes on the command line (app create --mode, deploy --mode) and
// `fogctl app costs`, against a real (embedded) etcd.
func TestModesAndAppCosts(t *testing.T) {
	run, st := withEnvE(t)
	ctx := context.Background()
	// An app whose environment is not in the catalog is refused, and not
	// created.
	if code, _, errOut := run("app", "create", "web", "--env", "nosuch", "--ready", "output:up", "--", "x"); code != ExitNotFound ||
		!strings.Contains(errOut, `environment "nosuch": not found`) || !strings.Contains(errOut, "Hint: build or import it first") {
		t.Errorf("app create --env nosuch = exit %d:\n%s\nwant exit %d, the environment named, and a hint", code, errOut, ExitNotFound)
	}
	if _, err := st.App(ctx, "web"); err == nil {
		t.Errorf("app web was created with an environment that does not exist")
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"app", "create", "web", "--env", "e", "--ready", "output:up", "--mode", "fast", "--", "x"}, `mode: "fast": use auto`},
		{[]string{"deploy", "web", "--mode", "fast"}, `--mode "fast": use auto (boot or restore, whichever has been faster on the node), restore`},
		{[]string{"deploy", "web", "--mode", "checkpoint"}, "--mode"},
	} {
		if code, _, errOut := run(c.args...); code != ExitInvalid || !strings.Contains(errOut, c.want) {
			t.Errorf("fogctl %s = exit %d:\n%s\nwant exit %d naming %q", strings.Join(c.args, " "), code, errOut, ExitInvalid, c.want)
		}
	}
	if code, _, errOut := run("app", "create", "web", "--env", "e", "--ready", "output:up", "--mode", "restore", "--", "x"); code != 0 {
		t.Fatalf("app create --mode restore = exit %d:\n%s", code, errOut)
	}
	if a, err := st.App(ctx, "web"); err != nil || a.Mode != spec.ModeRestore {
		t.Errorf("app web = %+v, %v; want mode restore", a, err)
	}

	if code, out, errOut := run("app", "costs", "web"); code != 0 || strings.Count(out, "\n") != 1 {
		t.Errorf("app costs before any deploy = exit %d, %q; want the header only\n%s", code, out, errOut)
	}
	for i, c := range []struct {
		mode spec.Mode
		ms   int
	}{{spec.ModeRestore, 600}, {spec.ModeRestore, 620}, {spec.ModeRestore, 580}, {spec.ModeBoot, 150}, {spec.ModeBoot, 160}, {spec.ModeBoot, 140}} {
		if err := st.RecordCost(ctx, "web", "n1", adaptive.Run{Mode: c.mode, Gen: 1, Cost: time.Duration(c.ms) * time.Millisecond, Auto: i > 0}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.RecordCost(ctx, "web", "n2", adaptive.Run{Mode: spec.ModeRestore, Gen: 1, Cost: 700 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if err := st.RecordCost(ctx, "web", "n3", adaptive.Run{Mode: spec.ModeRestore, Gen: 1, Cost: 5 * time.Millisecond, Hit: true}); err != nil {
		t.Fatal(err)
	}
	// Without a generation, and restores known to be slower: a boot, no
	// generation made.
	code, out, errOut := run("app", "costs", "web")
	if code != 0 || !strings.Contains(out, "boot     auto: boot 0.15 s, median of 3 runs < restore 0.60 s, median of 3 runs; no generation is made") {
		t.Errorf("app costs without a generation = exit %d:\n%s%s", code, out, errOut)
	}
	if err := st.PutCheckpoint(ctx, spec.Generation{App: "web", Gen: 1, Engine: "dmtcp"}); err != nil {
		t.Fatal(err)
	}
	// A slot of web waits on n3.
	sess, err := st.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if err := st.PutPool(ctx, sess, state.Pool{Node: "n3", App: "web", Gen: 1, Size: 1, Idle: 1}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = run("app", "costs", "web")
	if code != 0 || !strings.Contains(out, "n1    0.15 s (3 runs)  0.60 s (3 runs)  -") ||
		!strings.Contains(out, "boot                 auto: boot 0.15 s, median of 3 runs < restore 0.60 s, median of 3 runs") ||
		!strings.Contains(out, "n2    -                0.70 s (1 run)") ||
		!strings.Contains(out, "auto: boot 0.15 s, median of 3 runs on other nodes < restore 0.70 s, median of 1 run") ||
		!strings.Contains(out, "n3    -                -                5.0 ms (1 run)") ||
		!strings.Contains(out, "restore (pool slot)  auto: pool slot: an idle slot of the app waits on this node (hits: 5.0 ms, median of 1 run)") {
		t.Errorf("app costs = exit %d:\n%s%s", code, out, errOut)
	}
	code, out, errOut = run("app", "costs", "web", "-o", "json")
	var got []struct {
		Node            string  `json:"node"`
		Boot            []int64 `json:"boot_ms"`
		Restore         []int64 `json:"restore_ms"`
		BootMedianMS    float64 `json:"boot_median_ms"`
		RestoreMedianMS float64 `json:"restore_median_ms"`
		Auto            int     `json:"auto"`
		Next            struct{ Mode, Why, Reason string }
	}
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || len(got) != 3 || got[0].Node != "n1" || got[2].Next.Why != "pool_slot" ||
		got[0].BootMedianMS != 150 || got[0].RestoreMedianMS != 600 || len(got[0].Boot) != 3 || got[0].Auto != 5 ||
		got[0].Next.Mode != string(spec.ModeBoot) || got[0].Next.Why != "faster" {
		t.Errorf("app costs -o json = exit %d, %v, %+v\n%s%s", code, err, got, out, errOut)
	}
	if code, out, _ := run("app", "inspect", "web"); code != 0 || !strings.Contains(out, "costs on n1: boot 0.15 s (3 runs), restore 0.60 s (3 runs), hit -; next boot, auto: boot 0.15 s") {
		t.Errorf("app inspect = exit %d:\n%s", code, out)
	}
	// The limits an instance gets on each node: the app's resources, the
	// node's defaults where the spec is silent.
	def := spec.Limits{CPUs: 1, MemoryBytes: 2 << 30, Pids: 1024, OpenFiles: 16384, LogBytes: 10 << 20, LogFiles: 2}
	if _, err := st.Register(ctx, state.Node{Name: "n1", Capacity: 4, Limits: &def}, 10); err != nil {
		t.Fatal(err)
	}
	if code, out, _ := run("app", "inspect", "web"); code != 0 || !strings.Contains(out, "limits on n1: cpus 1, memory 2GiB, pids 1024, open files 16384, output 2 x 10MiB") {
		t.Errorf("app inspect = exit %d:\n%s\nwant n1's limits", code, out)
	}
	if code, out, _ := run("app", "inspect", "web", "-o", "json"); code != 0 || !strings.Contains(out, `"costs": [`) ||
		!strings.Contains(out, `"limits": {`) || !strings.Contains(out, `"open_files": 16384`) {
		t.Errorf("app inspect -o json = exit %d:\n%s", code, out)
	}
	if code, _, errOut := run("app", "costs", "nope"); code != ExitNotFound || !strings.Contains(errOut, "app nope") {
		t.Errorf("app costs of an unknown app = exit %d:\n%s", code, errOut)
	}
}

// withEnvE starts an embedded etcd and a catalog that holds environment
// e, and returns fogctl run against them.
func withEnvE(t *testing.T) (func(args ...string) (int, string, string), *state.Store) {
	t.Helper()
	endpoint, st := statetest.Start(t)
	l := wiretest.FakeLayering(t)
	if err := l.Store.SetTag(context.Background(), "e", []byte(`{"name":"e","ref":{"image":"fdl-e","snap":"sealed"}}`)); err != nil {
		t.Fatal(err)
	}
	return runOn(endpoint, l), st
}
