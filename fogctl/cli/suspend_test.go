package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// `fogctl suspend` asks the node of a Running deployment to suspend it
// and refuses one in another phase with a hint; `fogctl ps` shows a
// suspended one on no node with what it holds; `fogctl resume --node`
// places it; a bad --node or a missing ID is a usage error; `fogctl node
// drain` of a bad name or --parallel is refused, changing nothing.
func TestSuspendResumeCommands(t *testing.T) {
	run, st := twoNodes(t)
	ctx := context.Background()
	if err := st.CreateDeployment(ctx, state.Desired{ID: "web-1", App: "web", Node: "n1", Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := run("suspend", "web-1"); code != ExitConflict || !strings.Contains(errOut, "suspend a Running deployment") {
		t.Errorf("suspend of a Pending deployment = exit %d\n%s%s; want refused as a conflict (4) with a hint", code, out, errOut)
	}
	if err := st.SetStatus(ctx, "web-1", state.Status{Instance: spec.Instance{Phase: spec.PhaseRunning, Node: "n1"}}); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := run("suspend", "web-1"); code != 0 || !strings.Contains(errOut, "suspending web-1 on n1") {
		t.Errorf("suspend = exit %d\n%s%s", code, out, errOut)
	}
	if d, _ := st.Deployment(ctx, "web-1"); !d.Suspend {
		t.Errorf("after fogctl suspend: %+v; want a suspend asked", d.Desired)
	}
	susp := spec.Suspension{From: spec.Generation{App: "web", Gen: 1}, Engine: "dmtcp", CkptGen: 2, Node: "n1", Bytes: 3 << 20, EnvBytes: 1 << 20}
	if err := st.SetSuspended(ctx, "web-1", susp, nil); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run("ps")
	if code != 0 || !strings.Contains(out, "Suspended") || !strings.Contains(out, "held: checkpoint 3.0 MiB, files 1.0 MiB") {
		t.Errorf("ps with web-1 suspended = exit %d\n%s%s; want it Suspended with what it holds", code, out, errOut)
	}
	if f := strings.Fields(lineOf(out, "web-1")); len(f) < 7 || f[6] != "-" {
		t.Errorf("ps: web-1 suspended has READY-IN %v; want -", f)
	}
	susp.Pending = "n1" // a migration's hand-over
	if err := st.SetSuspended(ctx, "web-1", susp, nil); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := run("ps"); code != 0 || !strings.Contains(lineOf(out, "web-1"), "checkpoint on n1 only") {
		t.Errorf("ps with web-1's checkpoint handed over by n1 = exit %d\n%s%s; want it said", code, out, errOut)
	}
	susp.Pending = ""

	// suspend --wait shows the suspend's phases, not the deploy's before.
	if err := st.CreateDeployment(ctx, state.Desired{ID: "web-2", App: "web", Node: "n1", Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	deployed := spec.Instance{Phase: spec.PhaseRunning, Node: "n1", Timings: layering.Timings{{Name: "restart", Duration: time.Second}}}
	if err := st.SetStatus(ctx, "web-2", state.Status{Instance: deployed}); err != nil {
		t.Fatal(err)
	}
	go func() {
		for d, _ := st.Deployment(ctx, "web-2"); !d.Suspend; d, _ = st.Deployment(ctx, "web-2") {
			time.Sleep(20 * time.Millisecond)
		}
		s2 := susp
		s2.Timings = layering.Timings{{Name: "checkpoint", Duration: 400 * time.Millisecond}, {Name: "store", Duration: 300 * time.Millisecond}}
		_ = st.SetSuspended(ctx, "web-2", s2, nil)
	}()
	if code, out, errOut := run("suspend", "web-2", "--wait"); code != 0 || !strings.Contains(errOut, "400ms") ||
		strings.Contains(errOut, "restart") {
		t.Errorf("suspend --wait = exit %d\n%s%s; want the suspend's phases alone", code, out, errOut)
	}
	for _, bad := range [][]string{{"resume", "web-1", "--node", "../n1"}, {"resume"}, {"migrate", "web-1", "--node", "a b"},
		{"node", "drain", "n1", "--parallel", "0"}, {"node", "drain", "../n1"}} {
		if code, out, errOut := run(bad...); code == 0 || errOut == "" {
			t.Errorf("%v = exit %d\n%s%s; want refused", bad, code, out, errOut)
		}
	}
	if n, _ := st.Node(ctx, "n1"); n.Cordon != nil {
		t.Errorf("n1 cordoned by a refused drain: %+v", n.Cordon)
	}
	if code, out, errOut := run("resume", "web-1", "--node", "n2"); code != 0 || !strings.Contains(errOut, "resuming web-1 on n2") {
		t.Errorf("resume --node n2 = exit %d\n%s%s", code, out, errOut)
	}
	if d, _ := st.Deployment(ctx, "web-1"); d.Node != "n2" || d.Suspend || d.Status.Phase != spec.PhasePending {
		t.Errorf("after fogctl resume: %+v %s; want Pending on n2", d.Desired, d.Status.Phase)
	}

	// resume --wait shows the resume's phases, not the suspend's before.
	go func() {
		for d, _ := st.Deployment(ctx, "web-2"); d.Status.Phase != spec.PhasePending; d, _ = st.Deployment(ctx, "web-2") {
			time.Sleep(20 * time.Millisecond)
		}
		clone := layering.Phase{Name: "clone", Duration: 30 * time.Millisecond}
		_ = st.SetStatus(ctx, "web-2", state.Status{Instance: spec.Instance{Phase: spec.PhaseResuming, Node: "n1", Timings: layering.Timings{clone}}})
		_ = st.SetStatus(ctx, "web-2", state.Status{Instance: spec.Instance{Phase: spec.PhaseRunning, Node: "n1",
			Timings: layering.Timings{clone, {Name: "restart", Duration: 50 * time.Millisecond}}}})
	}()
	if code, out, errOut := run("resume", "web-2", "--wait"); code != 0 || !strings.Contains(errOut, "clone") ||
		!strings.Contains(errOut, "restart") || strings.Contains(errOut, "400ms") {
		t.Errorf("resume --wait = exit %d\n%s%s; want the resume's phases alone", code, out, errOut)
	}
}

// lineOf returns the first line of out that holds s.
func lineOf(out, s string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}
