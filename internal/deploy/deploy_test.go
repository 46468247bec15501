//go:build !no_ceph

package deploy_test

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

func TestDeployRedisDMTCPContainer(t *testing.T) { testDeployRedis(t, "container", engine.NameDMTCP) }
func TestDeployRedisCRIU(t *testing.T)           { testDeployRedis(t, "host", engine.NameCRIU) }

// testDeployRedis is what an operator checks: the first deploy boots redis,
// a key is written, the checkpoint is sealed in the pool; 5 sequential and
// then 5 concurrent restores each answer GET with the key as distinct
// instances; undeploy leaves nothing.
func testDeployRedis(t *testing.T, driver, eng string) {
	f := deploytest.NewFixture(t, driver)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := f.D.Host().Check(ctx, eng); err != nil && driver == "host" {
		testenv.Unavailable(t, eng, err.Error())
	}
	app := deploytest.RedisApp("redis-"+eng+"-"+strconv.FormatInt(time.Now().UnixNano()%1e6, 36), f.Env, eng)
	t.Cleanup(func() { f.RemoveGenerations(t, app.Name) })

	t.Cleanup(func() { f.UndeployAll(t, app.Name) })

	var phases []string
	first, err := f.D.Deploy(ctx, app, deploy.Options{
		Progress: func(p string, took time.Duration) { phases = append(phases, p) },
		Prepare: func(ctx context.Context, ports map[string]string) error {
			_, err := testenv.RedisDo(ctx, nil, ports["6379/tcp"], "SET", "greeting", "written before the checkpoint")
			return err
		},
	})
	if err != nil {
		t.Fatalf("first deploy: %v", err)
	}
	t.Logf("first deploy (boot + checkpoint + restore): %s", first.Timings)
	if !first.Booted || first.Phase != deploy.PhaseRunning || first.Gen != 1 {
		t.Errorf("first deploy = booted %v, phase %s, gen %d; want booted, Running, gen 1", first.Booted, first.Phase, first.Gen)
	}
	for _, want := range []string{"clone", "map", "mount", "container", "ready", "prepare", "checkpoint", "seal"} {
		if !contains(phases, want) {
			t.Errorf("progress phases %v lack %q", phases, want)
		}
	}

	// The generation: both images sealed by a protected snapshot, the
	// engine's image in the checkpoint image.
	g, err := f.D.Latest(ctx, app.Name)
	if err != nil {
		t.Fatal(err)
	}
	if g.Bytes <= 0 || g.Engine != eng {
		t.Errorf("generation = %+v; want a non-empty %s image", g, eng)
	}
	for _, ref := range []layering.SnapRef{g.EnvSnap, g.CkptSnap} {
		info, err := f.L.Store.Stat(ctx, ref.Image)
		if err != nil {
			t.Fatal(err)
		}
		if len(info.Snapshots) != 1 || info.Snapshots[0].Name != layering.SealedSnap || !info.Snapshots[0].Protected {
			t.Errorf("%s snapshots = %+v; want one protected %q", ref.Image, info.Snapshots, layering.SealedSnap)
		}
	}
	pattern := map[string]string{engine.NameDMTCP: "ckpt_*.dmtcp", engine.NameCRIU: "pages-*.img"}[eng]
	if files, _ := filepath.Glob(filepath.Join(first.Dir, "ckpt", "1", pattern)); len(files) == 0 {
		t.Errorf("the restored instance's checkpoint clone holds no %s in generation 1", pattern)
	}

	check := func(dep deploy.Deployment) {
		t.Helper()
		got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, dep), "GET", "greeting")
		if err != nil || got != "written before the checkpoint" {
			t.Errorf("%s: GET greeting = %q, %v", dep.ID, got, err)
		}
	}
	check(first)
	all := []deploy.Deployment{first}

	for i := range 5 {
		dep, err := f.D.Deploy(ctx, app, deploy.Options{})
		if err != nil {
			t.Fatalf("sequential restore %d: %v", i+1, err)
		}
		if dep.Booted || dep.Gen != 1 {
			t.Errorf("restore %d: booted %v gen %d; want a restore of gen 1", i+1, dep.Booted, dep.Gen)
		}
		t.Logf("sequential restore %d: %s (total %s)", i+1, dep.Timings, dep.Total().Round(time.Millisecond))
		check(dep)
		all = append(all, dep)
	}

	var wg sync.WaitGroup
	conc := make([]deploy.Deployment, 5)
	errs := make([]error, 5)
	for i := range conc {
		wg.Go(func() { conc[i], errs[i] = f.D.Deploy(ctx, app, deploy.Options{}) })
	}
	wg.Wait()
	for i, dep := range conc {
		if errs[i] != nil {
			t.Errorf("concurrent restore %d: %v", i+1, errs[i])
			continue
		}
		t.Logf("concurrent restore %d: %s", i+1, dep.Timings)
		check(dep)
		all = append(all, dep)
	}

	// Distinct instances: handles and host addresses.
	refs, addrs := map[string]bool{}, map[string]bool{}
	for _, dep := range all {
		refs[dep.Handle.Ref] = true
		addrs[deploytest.RedisAddr(t, dep)] = true
	}
	if len(refs) != len(all) || len(addrs) != len(all) {
		t.Errorf("%d deployments ran as %d instances on %d addresses", len(all), len(refs), len(addrs))
	}
	// Each instance has its own state: a write to one is not seen by another.
	if _, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, all[1]), "SET", "greeting", "changed"); err != nil {
		t.Fatal(err)
	}
	check(all[2])

	for _, dep := range all {
		if err := f.D.Undeploy(ctx, dep.ID); err != nil {
			t.Errorf("undeploy %s: %v", dep.ID, err)
		}
	}
	deploytest.AssertNothingLeft(t, f, app.Name, true)
	if err := f.D.Undeploy(ctx, first.ID); !errors.Is(err, deploy.ErrNotFound) {
		t.Errorf("second undeploy of %s = %v; want ErrNotFound", first.ID, err)
	}
}

// TestDeployNeverReady: an app that never answers fails with a timeout
// error that shows its last output, and leaves nothing: no generation, no
// clone, mapping, mount, container or record.
func TestDeployNeverReady(t *testing.T) {
	f := deploytest.NewFixture(t, "container")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	app := deploytest.RedisApp("never-"+strconv.FormatInt(time.Now().UnixNano()%1e6, 36), f.Env, engine.NameDMTCP)
	app.Command = []string{"sh", "-c", "echo warming up the cache forever; exec sleep 600"}
	app.Ready.Timeout = deploy.Duration(3 * time.Second)
	_, err := f.D.Deploy(ctx, app, deploy.Options{})
	if !errors.Is(err, deploy.ErrNotReady) {
		t.Fatalf("deploy of an app that never listens = %v; want ErrNotReady", err)
	}
	if !strings.Contains(err.Error(), "warming up the cache forever") {
		t.Errorf("the error does not show the app's last lines:\n%v", err)
	}
	deploytest.AssertNothingLeft(t, f, app.Name, false)
}

// TestDeployBadSpec: a bad spec is refused before anything is created.
func TestDeployBadSpec(t *testing.T) {
	f := deploytest.NewFixture(t, "container")
	ctx := context.Background()
	good := deploytest.RedisApp("bad-spec", f.Env, engine.NameDMTCP)
	cases := map[string]func(a *deploy.App){
		"missing command":         func(a *deploy.App) { a.Command = nil },
		"port out of range":       func(a *deploy.App) { a.Ports = []deploy.Port{{Port: 70000}} },
		"unknown engine":          func(a *deploy.App) { a.Engine = "podman" },
		"readiness without port":  func(a *deploy.App) { a.Ready = deploy.Readiness{Kind: deploy.ReadyTCP} },
		"readiness without kind":  func(a *deploy.App) { a.Ready = deploy.Readiness{} },
		"unknown environment":     func(a *deploy.App) { a.Env = "no-such-env" },
		"exec without command":    func(a *deploy.App) { a.Ready = deploy.Readiness{Kind: deploy.ReadyExec} },
		"output without a phrase": func(a *deploy.App) { a.Ready = deploy.Readiness{Kind: deploy.ReadyOutput} },
	}
	for name, mutate := range cases {
		a := good
		mutate(&a)
		if _, err := f.D.Deploy(ctx, a, deploy.Options{}); err == nil {
			t.Errorf("%s: deploy succeeded", name)
		}
	}
	deploytest.AssertNothingLeft(t, f, good.Name, false)
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
