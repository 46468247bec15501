package deploy_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/overlay"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// TestSharedEnvReadPath: the restores of a generation on a node read its
// environment from one read-only copy on the node, each through an
// overlay whose writes stay its own; the copy is a clone of the
// generation (gc sees it in use), stays while instances use it, and goes
// with the generation. With EnvClone a restore reads its own clone only.
func TestSharedEnvReadPath(t *testing.T) {
	f, ctx, app := redisFixture(t, "container", engine.NameDMTCP, "lower")
	first, err := f.D.Deploy(ctx, app, deploy.Options{Prepare: func(ctx context.Context, tg deploy.Target) error {
		if err := os.WriteFile(filepath.Join(tg.Root, "checkpointed.txt"), []byte("in the generation"), 0o644); err != nil {
			return err
		}
		_, err := testenv.RedisDo(ctx, nil, tg.Ports["6379/tcp"], "SET", "greeting", "from the checkpoint")
		return err
	}})
	if err != nil {
		t.Fatalf("first deploy: %v", err)
	}
	g, err := f.D.Checkpoints().Latest(ctx, app.Name)
	if err != nil {
		t.Fatal(err)
	}
	var deps []deploy.Deployment
	for range 2 {
		dep, err := f.D.Deploy(ctx, app, deploy.Options{})
		if err != nil {
			t.Fatalf("restore: %v", err)
		}
		deps = append(deps, dep)
		if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, dep), "GET", "greeting"); err != nil || got != "from the checkpoint" {
			t.Errorf("restore %s: GET greeting = %q, %v; want the checkpoint's value", dep.ID, got, err)
		}
	}
	a, b := deps[0], deps[1]
	if a.Lower == "" || a.Lower != b.Lower {
		t.Fatalf("restores read from copies %q and %q; want one node copy for both", a.Lower, b.Lower)
	}
	lowers, err := f.D.EnvCopies().Lowers()
	if err != nil || len(lowers) != 1 || lowers[0].ID != a.Lower || !lowers[0].Ready {
		t.Fatalf("Lowers() = %+v, %v; want one ready copy %s", lowers, err, a.Lower)
	}
	l := lowers[0]
	rootA, rootB := a.Handle.EnvPath, b.Handle.EnvPath
	for _, root := range []string{rootA, rootB} {
		if ok, err := overlay.Mounted(root); err != nil || !ok {
			t.Errorf("%s: overlay mounted = %v, %v; want the instance's root as an overlay", root, ok, err)
		}
		if got, err := os.ReadFile(filepath.Join(root, "checkpointed.txt")); err != nil || string(got) != "in the generation" {
			t.Errorf("%s: the generation's file reads %q, %v", root, got, err)
		}
	}
	// One instance's writes are its own, in its own clone; the node's copy
	// is never written.
	if err := os.WriteFile(filepath.Join(rootA, "only-a.txt"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(rootA, "checkpointed.txt")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(rootB, "only-a.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("instance b sees instance a's file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(rootB, "checkpointed.txt")); err != nil {
		t.Errorf("instance a's delete reached instance b: %v", err)
	}
	if _, err := os.Stat(filepath.Join(l.Root, "checkpointed.txt")); err != nil {
		t.Errorf("instance a's delete reached the node's copy: %v", err)
	}
	if _, err := os.Stat(filepath.Join(a.Dir, "disk", overlay.Dir, "upper", "only-a.txt")); err != nil {
		t.Errorf("instance a's write is not in its own clone: %v", err)
	}
	if err := os.WriteFile(filepath.Join(l.Root, "x"), nil, 0o644); err == nil {
		t.Errorf("the node's copy %s is writable", l.Root)
	}
	// The copy is a clone of the generation's environment: gc sees it.
	kids, err := f.L.Store.Children(ctx, g.EnvSnap)
	if err != nil || !slices.Contains(kids, catalog.LowerImage(app.Name, g.Gen, "test")) {
		t.Errorf("children of %s = %v, %v; want the node copy among them", g.EnvSnap, kids, err)
	}
	// Each instance's writes go to a clone of the pool's one blank
	// filesystem of the environment's size, which says what it restores.
	env, err := f.L.Store.Stat(ctx, g.EnvSnap.Image)
	if err != nil {
		t.Fatal(err)
	}
	for _, dep := range deps {
		info, err := f.L.Store.Stat(ctx, dep.Images[0])
		if err != nil {
			t.Fatal(err)
		}
		want := layering.SnapRef{Image: layering.BlankImage(env.Size), Snap: layering.SealedSnap}
		if info.Parent == nil || *info.Parent != want || info.Meta[catalog.MetaRestores] != app.Name+"/"+strconv.Itoa(g.Gen) {
			t.Errorf("writable image %s: parent %v, %s %q; want a clone of %s restoring %s/%d", dep.Images[0], info.Parent,
				catalog.MetaRestores, info.Meta[catalog.MetaRestores], want, app.Name, g.Gen)
		}
	}
	if dropped, err := f.D.EnvCopies().TrimLowers(ctx, nil); err != nil || len(dropped) != 0 {
		t.Errorf("TrimLowers while instances use the copy = %v, %v; want it kept", dropped, err)
	}
	if err := f.D.Checkpoints().RemoveGeneration(ctx, app.Name, g.Gen); !errors.Is(err, layering.ErrHasChildren) {
		t.Errorf("RemoveGeneration while instances run = %v; want ErrHasChildren", err)
	}
	for _, dep := range append(deps, first) {
		if err := f.D.Undeploy(ctx, dep.ID); err != nil {
			t.Errorf("undeploy %s: %v", dep.ID, err)
		}
	}
	// Unused, it stays while the agent keeps it (its generation is current).
	if dropped, err := f.D.EnvCopies().TrimLowers(ctx, func(deploy.Lower) bool { return true }); err != nil || len(dropped) != 0 {
		t.Errorf("TrimLowers keeping every copy = %v, %v", dropped, err)
	}
	deploytest.AssertNothingLeft(t, f, app.Name, true)

	// The blank filesystem removed from the pool (fogctl gc, once no
	// clone uses it): the next restore, whose deployer knew it, makes it
	// again.
	blank := layering.BlankImage(env.Size)
	switch err := f.L.Store.Remove(ctx, blank); {
	case errors.Is(err, layering.ErrHasChildren):
		t.Logf("blank %s is in use by another test's instance; not removed", blank)
	case err != nil:
		t.Fatalf("remove blank %s: %v", blank, err)
	default:
		again, err := f.D.Deploy(ctx, app, deploy.Options{})
		if err != nil {
			t.Fatalf("restore after the blank filesystem went: %v", err)
		}
		if info, err := f.L.Store.Stat(ctx, again.Images[0]); err != nil || info.Parent == nil || info.Parent.Image != blank {
			t.Errorf("restore after the blank went: writable image %v, %v; want a clone of %s made again", info.Parent, err, blank)
		}
		if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, again), "GET", "greeting"); err != nil || got != "from the checkpoint" {
			t.Errorf("restore after the blank went: GET greeting = %q, %v", got, err)
		}
		if err := f.D.Undeploy(ctx, again.ID); err != nil {
			t.Error(err)
		}
	}

	// Without the shared path, a restore reads its own clone: no overlay.
	dc := f.ReopenWith(t, func(c *deploy.Config) { c.EnvRead = deploy.EnvClone })
	own, err := dc.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatalf("restore with EnvClone: %v", err)
	}
	if ok, _ := overlay.Mounted(filepath.Join(own.Dir, "root")); own.Lower != "" || ok {
		t.Errorf("restore with EnvClone: lower %q, overlay root %v; want its own clone", own.Lower, ok)
	}
	if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, own), "GET", "greeting"); err != nil || got != "from the checkpoint" {
		t.Errorf("restore with EnvClone: GET greeting = %q, %v", got, err)
	}
	if err := dc.Undeploy(ctx, own.ID); err != nil {
		t.Error(err)
	}

	// Removed from elsewhere (fogctl) while only the node's copy holds
	// it: retired, so that no deploy takes it and the node drops its copy.
	if err := catalog.RemoveGeneration(ctx, f.L.Store, app.Name, g.Gen); !errors.Is(err, catalog.ErrHeldByNodes) {
		t.Fatalf("RemoveGeneration held by the node's copy only = %v; want ErrHeldByNodes", err)
	}
	if _, err := f.D.Checkpoints().Latest(ctx, app.Name); !errors.Is(err, deploy.ErrNoCheckpoint) {
		t.Errorf("Latest of a retired generation = %v; want ErrNoCheckpoint", err)
	}
	if gens, err := f.D.Checkpoints().Generations(ctx, app.Name); err != nil || len(gens) != 1 || !gens[0].Retired {
		t.Errorf("Generations = %+v, %v; want generation %d retired", gens, err, g.Gen)
	}
	// The node drops its copy, and the generation goes.
	if err := f.D.Checkpoints().RemoveGeneration(ctx, app.Name, g.Gen); err != nil {
		t.Fatalf("RemoveGeneration: %v", err)
	}
	if ls, err := f.D.EnvCopies().Lowers(); err != nil || len(ls) != 0 {
		t.Errorf("Lowers() after the generation's removal = %+v, %v; want none", ls, err)
	}
	deploytest.AssertNothingLeft(t, f, app.Name, false)
}
