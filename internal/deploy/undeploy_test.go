//go:build !no_ceph

package deploy_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// TestUndeployAfterKilledRbdFuse: the rbd-fuse of a running deployment is
// killed (SIGKILL, as the mapper does to a stalled mapping and as the agent
// does when an undeploy is stuck), which leaves the watch of its image
// registered in the OSDs for osd_client_watch_timeout (30 s): plain Remove
// refuses. Undeploy still removes everything at once, evicting the dead
// watch, instead of failing until a later reconcile.
func TestUndeployAfterKilledRbdFuse(t *testing.T) {
	f := deploytest.NewBootFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	app := deploytest.BusyboxHTTPApp("killfuse-"+strconv.FormatInt(time.Now().UnixNano()%1e6, 36), f.Env)
	t.Cleanup(func() { f.UndeployAll(t, app.Name) })

	dep, err := f.D.Deploy(ctx, app, deploy.Options{Mode: deploy.ModeBoot})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range dep.Mappings {
		if err := f.L.Mapper.Abort(ctx, m); err != nil {
			t.Fatalf("kill the rbd-fuse of mapping %s: %v", m, err)
		}
	}
	// The dead rbd-fuse still watches the image, which a plain removal
	// refuses (this is what left the image to the reconcile loop).
	if err := f.L.Store.Remove(ctx, dep.Images[0]); !errors.Is(err, layering.ErrBusy) {
		t.Fatalf("Remove of %s after its rbd-fuse was killed = %v; want ErrBusy (its watch outlives it)", dep.Images[0], err)
	}
	start := time.Now()
	if err := f.D.Undeploy(ctx, dep.ID); err != nil {
		t.Fatalf("undeploy after the rbd-fuse was killed (%s): %v", time.Since(start), err)
	}
	took := time.Since(start)
	deploytest.AssertNothingLeft(t, f, app.Name, false)
	// The container's stop (up to its 5 s stop timeout) plus one eviction
	// (a few seconds), well within the 30 s the OSDs keep a dead watch.
	if took > 20*time.Second {
		t.Errorf("undeploy took %s; want well under the 30 s watch timeout", took)
	}
	t.Logf("undeploy of %s after its rbd-fuse was killed: %s", dep.ID, took.Round(time.Millisecond))
}
