package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
	"github.com/fogdeploy/fogdeploy/internal/wire/wiretest"
)

// A fenced node shows in `fogctl node ls` with why; `fogctl gc` removes
// nothing from a pool that holds deployments' images while etcd has no
// PoP record, nor while a node is fenced, and says why (exit 1, a hint).
func TestFencedNodeAndGC(t *testing.T) {
	endpoint, st := statetest.Start(t)
	ctx := context.Background()
	l := wiretest.FakeLayering(t)
	run := runOn(endpoint, l)
	img := catalog.GenImage("web", 1, "ckpt")
	if err := l.Store.Create(ctx, img, 1<<20); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run("gc", "--min-age", "0s")
	if code != ExitError || !strings.Contains(errOut, "Error: gc: control plane fenced: etcd has no PoP record") ||
		!strings.Contains(errOut, img) || !strings.Contains(errOut, "Hint: restore etcd") {
		t.Errorf("gc on an etcd without a PoP record = exit %d\n%s%s\nwant exit %d, why and a hint", code, out, errOut, ExitError)
	}
	if _, err := l.Store.Stat(ctx, img); err != nil {
		t.Errorf("the refused gc removed %s: %v", img, err)
	}

	why := "control plane fenced: etcd has no PoP record (/fogdeploy/pop), while this node remembers PoP 01ab (hint: restore etcd)"
	sess, err := st.Register(ctx, state.Node{Name: "n1", Capacity: 4, Problems: map[string]string{state.ProblemControlPlane: why, "criu": "criu is not installed"}}, 30)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if _, err := st.Register(ctx, state.Node{Name: "n2", Capacity: 4}, 30); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = run("node", "ls")
	if code != 0 || !strings.Contains(out, "n1    Ready,Fenced  ") || !strings.Contains(out, "n2    Ready         ") ||
		!strings.Contains(out, "! n1: fenced, acting on nothing (its instances keep running): "+why) || !strings.Contains(out, "! n1: no criu: criu is not installed") {
		t.Errorf("node ls with a fenced node = exit %d\n%s%s", code, out, errOut)
	}
	if _, _, err := st.EnsurePoP(ctx); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = run("gc", "--dry-run")
	if code != ExitError || !strings.Contains(errOut, "node(s) n1 act on nothing") || !strings.Contains(errOut, "--adopt-pop") {
		t.Errorf("gc with a fenced node = exit %d\n%s%s\nwant exit %d naming the node", code, out, errOut, ExitError)
	}
}
