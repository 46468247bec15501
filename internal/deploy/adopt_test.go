package deploy_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// TestAdoptKeepsWhatItCannotCheck: an agent that starts while dockerd
// does not answer yet keeps its running instance (the error names it)
// instead of undeploying it; once dockerd answers, the next start keeps it
// as running, and a user still reaches it. An instance that is gone is
// removed.
func TestAdoptKeepsWhatItCannotCheck(t *testing.T) {
	u, ctx, app := unitRedis(t, engine.NameDMTCP)
	dep, err := u.D.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	u.RT.SetDown(errors.New("Cannot connect to the Docker daemon"))
	d := u.ReopenWith(t, func(c *deploy.Config) { c.AdoptWait = 300 * time.Millisecond })
	kept, removed, err := d.Adopt(ctx)
	if err == nil || !slices.Contains(kept, dep.ID) || len(removed) != 0 {
		t.Fatalf("Adopt while dockerd does not answer = kept %v, removed %v, %v; want %s kept and an error", kept, removed, err, dep.ID)
	}
	u.RT.SetDown(nil)
	if got, err := testenv.RedisDo(ctx, nil, dep.Ports["6379/tcp"], "PING"); err != nil || got != "PONG" {
		t.Fatalf("the instance after that start: PING = %q, %v; want PONG", got, err)
	}
	kept, removed, err = u.Reopen(t).Adopt(ctx)
	if err != nil || !slices.Contains(kept, dep.ID) || len(removed) != 0 {
		t.Fatalf("Adopt once dockerd answers = kept %v, removed %v, %v; want %s kept", kept, removed, err, dep.ID)
	}
	if rec, err := d.Records().Load(dep.ID); err != nil || rec.Phase != spec.PhaseRunning {
		t.Fatalf("record = %+v, %v; want Running", rec, err)
	}
	// Gone behind the agent's back: removed at the next start.
	if err := u.RT.Remove(ctx, dep.Handle.Ref); err != nil {
		t.Fatal(err)
	}
	kept, removed, err = u.Reopen(t).Adopt(ctx)
	if err != nil || !slices.Contains(removed, dep.ID) || len(kept) != 0 {
		t.Fatalf("Adopt of a gone instance = kept %v, removed %v, %v; want %s removed", kept, removed, err, dep.ID)
	}
	u.AssertNothingLeft(t, app.Name, true)
}
