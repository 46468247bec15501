package deploy_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// TestSuspendRefusedUnderHostDriver: a trusted redis restored under the
// host driver (CRIU) cannot be suspended yet: the suspend is refused
// before it checkpoints, naming the driver with a hint, and the instance
// runs on with its key; its undeploy leaves nothing.
func TestSuspendRefusedUnderHostDriver(t *testing.T) {
	f, ctx, app := redisFixture(t, "host", engine.NameCRIU, "susp-host")
	d := f.D
	first, err := d.Deploy(ctx, app, deploy.Options{}) // boot and checkpoint
	if err != nil {
		t.Fatal(err)
	}
	dep, err := d.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	addr := deploytest.RedisAddr(t, dep)
	if got, err := testenv.RedisDo(ctx, nil, addr, "SET", "k", "kept"); err != nil || got != "OK" {
		t.Fatalf("SET: %q, %v", got, err)
	}
	_, err = d.Suspend(ctx, dep.ID, app, nil)
	if !errors.Is(err, deploy.ErrNotSuspendable) || !strings.Contains(err.Error(), "host driver") ||
		!strings.Contains(hint.Of(err), "container") {
		t.Fatalf("suspend under the host driver = %v (hint %q); want ErrNotSuspendable naming the driver, with a hint", err, hint.Of(err))
	}
	if rec, err := d.Load(dep.ID); err != nil || rec.Phase != spec.PhaseRunning {
		t.Errorf("after the refused suspend: %s, %v; want Running", rec.Phase, err)
	}
	if got, err := testenv.RedisDo(ctx, nil, addr, "GET", "k"); err != nil || got != "kept" {
		t.Errorf("after the refused suspend: GET k = %q, %v; want kept", got, err)
	}
	for _, id := range []string{dep.ID, first.ID} {
		if err := d.Undeploy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	deploytest.AssertNothingLeft(t, f, app.Name, true)
}
