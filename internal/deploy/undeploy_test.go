//go:build !no_ceph

package deploy_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/hint"
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

	dep, err := f.D.Deploy(ctx, app, deploy.Options{Mode: spec.ModeBoot})
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
		t.Fatalf("Remove of %s after its rbd-fuse was killed = %v; want spec.ErrBusy (its watch outlives it)", dep.Images[0], err)
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

// TestUndeployInstanceThatDoesNotExit: the rbd-fuse of a running
// instance stops answering (SIGSTOP, as a cluster that stops serving the
// image does), while its app syncs a file: the app blocks in the kernel
// and cannot exit, and Docker waits for it without end. Undeploy fails
// within the stop timeout and Config.StopGrace, with a hint, instead of
// hanging; once the mappings are cut off (what the agent does then),
// Undeploy removes everything.
func TestUndeployInstanceThatDoesNotExit(t *testing.T) {
	f := deploytest.NewBootFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	app := deploytest.BusyboxHTTPApp("stuck-"+strconv.FormatInt(time.Now().UnixNano()%1e6, 36), f.Env)
	app.Command = []string{"/bin/sh", "-c", `busybox mkdir -p /www && echo "served by $HOSTNAME" > /www/index.html || exit 1
(while :; do busybox dd if=/dev/zero of=/www/f bs=4k count=16 conv=fsync 2>/dev/null; busybox sleep 0.1; done) &
exec busybox httpd -f -p 8080 -h /www`}
	t.Cleanup(func() { f.UndeployAll(t, app.Name) })

	dep, err := f.D.Deploy(ctx, app, deploy.Options{Mode: spec.ModeBoot})
	if err != nil {
		t.Fatal(err)
	}
	// Their directory, <state>/fuse/<mapping>, is on their command line.
	pids := deploytest.FusePIDs(func(argv []string) bool {
		return slices.ContainsFunc(dep.Mappings, func(m string) bool {
			return slices.ContainsFunc(argv, func(a string) bool { return strings.HasSuffix(a, "/fuse/"+m) })
		})
	})
	if len(pids) == 0 {
		t.Fatalf("no rbd-fuse process of mappings %v", dep.Mappings)
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	t.Cleanup(func() {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	})
	time.Sleep(time.Second) // the app's next sync blocks

	d := f.ReopenWith(t, func(c *deploy.Config) { c.StopGrace = 2 * time.Second })
	start := time.Now()
	err = d.Undeploy(ctx, dep.ID)
	took := time.Since(start)
	t.Logf("undeploy of an instance blocked on its image: %s: %v", took.Round(time.Millisecond), err)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "did not exit within 7s") || !strings.Contains(hint.Of(err), "mappings off") {
		t.Errorf("undeploy of an instance that cannot exit = %v (hint %q); want it did not exit within 7s (5 s stop timeout + 2 s), with a hint", err, hint.Of(err))
	}
	if took > time.Minute {
		t.Errorf("undeploy of an instance that cannot exit took %s; want it bounded", took)
	}
	if _, err := d.Records().Load(dep.ID); err != nil {
		t.Errorf("the record after a failed undeploy: %v; want it kept for the retry", err)
	}

	for _, m := range dep.Mappings {
		if err := f.L.Mapper.Abort(ctx, m); err != nil {
			t.Fatalf("cut mapping %s off: %v", m, err)
		}
	}
	if err := d.Undeploy(ctx, dep.ID); err != nil {
		t.Fatalf("undeploy once its mappings are cut off: %v", err)
	}
	deploytest.AssertNothingLeft(t, f, app.Name, false)
}
