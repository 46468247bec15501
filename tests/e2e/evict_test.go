//go:build !no_ceph

package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// TestRestartRemovesWatchedClone: the node loses the agent, the rbd-fuse
// of a running deployment and its container at once (all SIGKILLed), and
// the deployment is withdrawn meanwhile. The dead rbd-fuse's watch stays
// registered in the OSDs for osd_client_watch_timeout (30 s), so a plain
// removal of the clone is refused. The restarted agent still removes the
// clone in its start-up cleanup (before it answers /healthz), evicting the
// dead watch, although its periodic reconcile is an hour away.
func TestRestartRemovesWatchedClone(t *testing.T) {
	f := deploytest.NewBootFixture(t)
	app := deploytest.BusyboxHTTPApp("evict-web-"+strconv.FormatInt(time.Now().UnixNano()%1e6, 36), f.Env)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	p := startPoP(ctx, t, f, app.Name, "fogdeploy/dmtcp:absent", "", "n1")
	cfg := filepath.Join(p.dir, "agent.yaml")
	if err := os.WriteFile(cfg, []byte("agent:\n  reconcile_interval: 1h\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p.env = append(p.env, "FOGDEPLOY_CONFIG="+cfg)
	p.stopAgent("n1", syscall.SIGTERM)
	p.startAgent("n1", "")

	st := p.st
	if err := st.CreateApp(ctx, app, false); err != nil {
		t.Fatal(err)
	}
	d, err := createDeployment(ctx, st, app.Name)
	if err != nil {
		t.Fatal(err)
	}
	running := p.waitAll(ctx, app.Name, 1)
	// The instance's resources are named after its slot.
	slot := running[0].Status.Slot
	if slot == "" {
		t.Fatalf("deployment %s has no slot in its status: %+v", d.ID, running[0].Status)
	}
	img := catalog.InstancePrefix + slot + "-env"

	p.stopAgent("n1", syscall.SIGKILL)
	killed := 0
	for _, pid := range deploytest.FusePIDs(func(argv []string) bool { return slices.Contains(argv, img) }) {
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			killed++
		}
	}
	if killed != 1 {
		t.Fatalf("killed %d rbd-fuse processes of %s; want 1", killed, img)
	}
	sts, err := f.RT.List(ctx, map[string]string{runtime.LabelDeployment: slot})
	if err != nil || len(sts) != 1 {
		t.Fatalf("containers of %s (slot %s): %v, %v; want 1", d.ID, slot, sts, err)
	}
	if err := f.RT.Signal(ctx, sts[0].ID, "KILL"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.RT.Wait(ctx, sts[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := f.L.Store.Remove(ctx, img); !errors.Is(err, layering.ErrBusy) {
		t.Fatalf("Remove of %s after its rbd-fuse was killed = %v; want ErrBusy (the OSDs keep its watch)", img, err)
	}
	if err := st.DeleteDeployment(ctx, d.ID); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	p.startAgent("n1", "") // returns once /healthz answers: after the start-up cleanup
	took := time.Since(start)
	names, err := f.L.Store.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(names, img) {
		t.Fatalf("%s is still in the pool %s after the agent started again; want it removed by the start-up cleanup", img, took)
	}
	if took > 20*time.Second {
		t.Errorf("the agent took %s to start and clean up; want well under the 30 s watch timeout", took)
	}
	waitGone(ctx, t, st, d.ID)
	t.Logf("the restarted agent removed %s, watched by a killed rbd-fuse, in its start-up cleanup: ready after %s", img, took.Round(time.Millisecond))
}
