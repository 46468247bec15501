package deploy_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/cgroup"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// TestPoolRecycle: under each engine (CRIU with lazy pages too), an undeployed pool instance goes
// back to the pool in the container it ran in; the next deployment there answers with the
// checkpoint's state and nothing of the one before (its keys, its files),
// and knows its own identity; an instance that serves once is refused; a
// recycle cut short by a crash is released at the next start.
func TestPoolRecycle(t *testing.T) {
	for _, tc := range []struct {
		name string
		eng  engine.Name
		lazy bool
	}{{"dmtcp", engine.NameDMTCP, false}, {"criu", engine.NameCRIU, false}, {"criu-lazy", engine.NameCRIU, true}} {
		t.Run(tc.name, func(t *testing.T) { testPoolRecycle(t, tc.eng, tc.lazy) })
	}
}

func testPoolRecycle(t *testing.T, eng engine.Name, lazy bool) {
	f, ctx, app := redisFixture(t, "container", eng, "recycle")
	app.Lazy = lazy
	first, err := f.D.Deploy(ctx, app, deploy.Options{Prepare: func(ctx context.Context, tg deploy.Target) error {
		_, err := testenv.RedisDo(ctx, nil, tg.Ports["6379/tcp"], "SET", "greeting", "from the checkpoint")
		return err
	}})
	if err != nil {
		t.Fatalf("first deploy: %v", err)
	}
	// A boot has no checkpoint to serve again from: its instance serves
	// once, and a refused recycle leaves it running.
	boot, err := f.D.Deploy(ctx, app, deploy.Options{Mode: spec.ModeBoot})
	if err != nil {
		t.Fatalf("boot: %v", err)
	}
	if _, err := f.D.Pool().Recycle(ctx, boot.ID); !errors.Is(err, drivers.ErrNotRecyclable) {
		t.Errorf("Recycle of a boot: %v; want ErrNotRecyclable", err)
	}
	if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, boot), "PING"); err != nil || got != "PONG" {
		t.Errorf("deployment %s after a refused recycle: PING = %q, %v", boot.ID, got, err)
	}
	if err := f.D.Undeploy(ctx, boot.ID); err != nil {
		t.Fatal(err)
	}
	g, err := f.D.Checkpoints().Latest(ctx, app.Name)
	if err != nil {
		t.Fatal(err)
	}
	slot, err := f.D.Pool().ProvisionPoolSlot(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	ref := slot.Handle.Ref
	for round := 1; round <= 3; round++ {
		dep, err := f.D.Deploy(ctx, app, deploy.Options{})
		if err != nil {
			t.Fatalf("round %d: deploy: %v", round, err)
		}
		if dep.Pool != spec.PoolHit || dep.Slot != slot.ID || dep.Handle == nil || dep.Handle.Ref != ref {
			t.Fatalf("round %d: deploy %s took slot %s (%s, handle %+v); want a hit of slot %s in container %s",
				round, dep.ID, dep.Slot, dep.Pool, dep.Handle, slot.ID, ref)
		}
		addr := deploytest.RedisAddr(t, dep)
		if got, err := testenv.RedisDo(ctx, nil, addr, "GET", "greeting"); err != nil || got != "from the checkpoint" {
			t.Errorf("round %d: GET greeting = %q, %v; want the checkpoint's", round, got, err)
		}
		// Nothing of the instance before: neither its keys nor its files.
		if got, err := testenv.RedisDo(ctx, nil, addr, "EXISTS", "scratch"); err != nil || got != "0" {
			t.Errorf("round %d: EXISTS scratch = %q, %v; want 0 (a key of the deployment before)", round, got, err)
		}
		marker := filepath.Join(dep.Handle.EnvPath, "var", "recycled-marker")
		if _, err := os.Stat(marker); err == nil {
			t.Errorf("round %d: %s, written by the deployment before, is still in the root", round, marker)
		}
		if id, _ := f.Identity(ctx, t, dep, app.User); id.Instance != dep.ID {
			t.Errorf("round %d: identity %+v; want deployment %s", round, id, dep.ID)
		}
		if _, err := testenv.RedisDo(ctx, nil, addr, "SET", "scratch", dep.ID); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(marker, []byte(dep.ID), 0o644); err != nil {
			t.Fatal(err)
		}

		s, err := f.D.Pool().Recycle(ctx, dep.ID)
		if err != nil {
			t.Fatalf("round %d: recycle %s: %v", round, dep.ID, err)
		}
		if s.ID != slot.ID || s.Phase != deploy.SlotIdle || s.Deployment != "" || s.Handle == nil || s.Handle.Ref != ref || !hasPhase(s.Timings, deploy.StepRecycle) {
			t.Errorf("round %d: recycled slot %+v; want slot %s idle in container %s", round, s, slot.ID, ref)
		}
		if _, err := f.D.Records().Load(dep.ID); !errors.Is(err, spec.ErrNotFound) {
			t.Errorf("round %d: deployment %s still has a record after its recycle: %v", round, dep.ID, err)
		}
		// Its clones name its slot, not the deployment that is gone (gc
		// would take them for orphans).
		for _, img := range s.Images {
			meta, err := f.L.Store.Meta(ctx, img)
			if err != nil || meta[catalog.MetaDeployment] != "" || meta[catalog.MetaSlot] != s.ID {
				t.Errorf("round %d: recycled slot's image %s has metadata %v (%v); want slot %s and no deployment", round, img, meta, err, s.ID)
			}
		}
		// Its app has ended: nothing answers until the next deployment.
		if got, err := testenv.RedisDo(ctx, nil, addr, "PING"); err == nil {
			t.Errorf("round %d: recycled slot answered PING with %q before any deployment", round, got)
		}
		if f.Container != nil && f.Container.Priority != nil {
			st, err := f.RT.Inspect(ctx, ref)
			if err != nil {
				t.Fatal(err)
			}
			if w, err := f.Container.Priority.Get(st.Pid); err != nil || w.CPU != cgroup.Background.CPU {
				t.Errorf("round %d: recycled slot's CPU weight %+v, %v; want %d (background)", round, w, err, cgroup.Background.CPU)
			}
		}
		// Rearmed, the container waits for its next order without reading
		// the checkpoint again: the restart just read it.
		if f.Container != nil {
			time.Sleep(300 * time.Millisecond)
			tm, err := f.Container.Timings(ctx, *s.Handle)
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range tm {
				if x.Phase == "warm" {
					t.Errorf("round %d: the recycled container read its checkpoint ahead again (%+v)", round, x)
				}
			}
		}
		t.Logf("round %d: hit %s; recycled in %s", round, dep.Timings, s.Timings)
	}

	// A pool miss recycled: its own slot joins the pool, and its clones
	// stop naming it (gc would take them for a gone deployment's).
	dep, err := f.D.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	miss, err := f.D.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if miss.Pool != spec.PoolMiss {
		t.Fatalf("deploy %s with the only slot taken: pool %q; want a miss", miss.ID, miss.Pool)
	}
	own, err := f.D.Pool().Recycle(ctx, miss.ID)
	if err != nil {
		t.Fatalf("recycle the pool miss %s: %v", miss.ID, err)
	}
	for _, img := range own.Images {
		meta, err := f.L.Store.Meta(ctx, img)
		if err != nil || meta[catalog.MetaDeployment] != "" || meta[catalog.MetaSlot] != own.ID {
			t.Errorf("recycled pool miss's image %s has metadata %v (%v); want slot %s and no deployment", img, meta, err, own.ID)
		}
	}
	if _, err := f.D.Pool().DropPool(ctx, app.Name, func(s deploy.Slot) bool { return s.ID == own.ID }); err != nil {
		t.Fatal(err)
	}

	// A recycle cut short by a crash: the slot record holds the resources,
	// the deployment's record is gone. A new process releases it all.
	if dep.Slot != slot.ID {
		t.Fatalf("deploy %s took slot %s; want %s", dep.ID, dep.Slot, slot.ID)
	}
	cut := deploy.Slot{ID: dep.Slot, App: dep.App, Gen: dep.Gen, Mode: drivers.RunRestart, Phase: deploy.SlotRecycling, Pool: true,
		Deployment: dep.ID, Owned: dep.Owned, Ports: dep.Ports}
	writeSlot(t, f, cut)
	if err := os.Remove(filepath.Join(f.State, "deploy", "deployments", dep.ID+".json")); err != nil {
		t.Fatal(err)
	}
	d2 := f.Reopen(t)
	if released, err := d2.Pool().RecoverSlots(ctx); err != nil || len(released) != 1 || released[0] != slot.ID {
		t.Errorf("RecoverSlots = %v, %v; want the slot cut short in its recycle, %s", released, err, slot.ID)
	}
	if _, err := f.RT.Inspect(ctx, ref); err == nil {
		t.Errorf("container %s of the slot cut short in its recycle is still there", ref)
	}
	if err := d2.Undeploy(ctx, first.ID); err != nil {
		t.Errorf("undeploy %s: %v", first.ID, err)
	}
	deploytest.AssertNothingLeft(t, f, app.Name, true)
}
