package deploy_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// TestSuspendResumeHostDriver: a redis restored under the host
// driver is suspended with a key written, resumed (its key there), and its
// undeploy leaves nothing, under each engine. A suspend was refused there
// while the release of such an instance left its loop device held.
func TestSuspendResumeHostDriver(t *testing.T) {
	for _, eng := range []engine.Name{engine.NameDMTCP, engine.NameCRIU} {
		t.Run(string(eng), func(t *testing.T) { testSuspendResumeHost(t, eng) })
	}
}

func testSuspendResumeHost(t *testing.T, eng engine.Name) {
	f, ctx, app := redisFixture(t, "host", eng, "susp-host")
	d := f.D
	first, err := d.Deploy(ctx, app, deploy.Options{}) // boot and checkpoint
	if err != nil {
		t.Fatal(err)
	}
	dep, err := d.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, dep), "SET", "k", "kept"); err != nil || got != "OK" {
		t.Fatalf("SET: %q, %v", got, err)
	}
	susp, err := d.Suspensions().Suspend(ctx, dep.ID, app, deploy.SuspendOptions{})
	if err != nil {
		t.Fatalf("suspend under the host driver: %v", err)
	}
	if err := d.Suspensions().Forget(dep.ID); err != nil { // as the agent does once etcd has the suspension
		t.Fatal(err)
	}
	resumed, err := d.Resume(ctx, app, dep.ID, susp, deploy.Options{})
	if err != nil {
		t.Fatalf("resume under the host driver: %v", err)
	}
	if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, resumed), "GET", "k"); err != nil || got != "kept" {
		t.Errorf("after suspend and resume: GET k = %q, %v; want kept", got, err)
	}
	// Once the caller recorded it Running, the suspension's checkpoint
	// goes; the resumed instance runs on without it.
	if _, err := f.Ceph.Stat(ctx, susp.Ckpt.Image); err != nil {
		t.Errorf("the suspension's checkpoint image before DropSuspension: %v; want it kept until then", err)
	}
	d.Suspensions().DropSuspension(ctx, resumed.ID, susp)
	if _, err := f.Ceph.Stat(ctx, susp.Ckpt.Image); !errors.Is(err, layering.ErrNotFound) {
		t.Errorf("the suspension's checkpoint image after DropSuspension: %v; want it removed", err)
	}
	if rec, err := d.Records().Load(resumed.ID); err != nil || slices.Contains(rec.Images, susp.Ckpt.Image) {
		t.Errorf("the resumed deployment's record after DropSuspension: images %v, %v; want it without %s", rec.Images, err, susp.Ckpt.Image)
	}
	if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, resumed), "GET", "k"); err != nil || got != "kept" {
		t.Errorf("after DropSuspension: GET k = %q, %v; want kept", got, err)
	}
	for _, id := range []string{resumed.ID, first.ID} {
		if err := d.Undeploy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	deploytest.AssertNothingLeft(t, f, app.Name, true)
}
