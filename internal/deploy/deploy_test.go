//go:build !no_ceph

package deploy_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/gencache"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

func TestDeployRedisDMTCPContainer(t *testing.T) { testDeployRedis(t, "container", engine.NameDMTCP) }
func TestDeployRedisCRIU(t *testing.T)           { testDeployRedis(t, "host", engine.NameCRIU) }
func TestDeployRedisCRIUContainer(t *testing.T)  { testDeployRedis(t, "container", engine.NameCRIU) }

// TestDeployRedisDMTCPHost: DMTCP under the host driver (a trusted app).
// Its sandboxes enter the instance's namespaces on threads of their own;
// one that was the agent's main thread stayed in them, and the undeploys
// after it looked for their overlay roots in an instance's namespace,
// left them mounted and their loop devices held.
func TestDeployRedisDMTCPHost(t *testing.T) { testDeployRedis(t, "host", engine.NameDMTCP) }

// redisFixture returns a node fixture with driver, a context of 10
// minutes, and a redis app of engine eng named after prefix, whose
// deployments and generations the test's end removes. It skips (or fails,
// when required) without the engine.
func redisFixture(t *testing.T, driver string, eng engine.Name, prefix string) (*deploytest.Fixture, context.Context, spec.App) {
	t.Helper()
	f := deploytest.NewFixture(t, driver)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	if _, err := f.D.Drivers().Host().Check(ctx, eng); err != nil && driver == "host" {
		testenv.Unavailable(t, string(eng), err.Error())
	}
	app := deploytest.RedisApp(prefix+"-"+string(eng)+"-"+strconv.FormatInt(time.Now().UnixNano()%1e6, 36), f.Env, eng)
	app.Trusted = driver == "host" // the host driver runs trusted apps only
	t.Cleanup(func() { f.RemoveGenerations(t, app.Name) })
	t.Cleanup(func() { f.UndeployAll(t, app.Name) })
	return f, ctx, app
}

// unitRedis is a Unit node (the fakes: no root, no service) and a redis
// app of eng on it.
func unitRedis(t *testing.T, eng engine.Name) (*deploytest.Unit, context.Context, spec.App) {
	t.Helper()
	u := deploytest.NewUnit(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return u, ctx, u.RedisApp("unit-redis", eng)
}

// testDeployRedis is what an operator checks: the first deploy boots redis,
// a key is written, the checkpoint is sealed in the pool; 5 sequential and
// then 5 concurrent restores each answer GET with the key as distinct
// instances; undeploy leaves nothing.
func testDeployRedis(t *testing.T, driver string, eng engine.Name) {
	f, ctx, app := redisFixture(t, driver, eng, "redis")
	deployRedis(ctx, t, f, app, driver, eng)
}

// TestDeployRedisUnit is testDeployRedis on the fakes, without root or a
// service.
func TestDeployRedisUnit(t *testing.T) {
	for _, eng := range spec.Engines {
		t.Run(string(eng), func(t *testing.T) {
			u, ctx, app := unitRedis(t, eng)
			deployRedis(ctx, t, u, app, "container", eng)
		})
	}
}

func deployRedis(ctx context.Context, t *testing.T, n deploytest.Node, app spec.App, driver string, eng engine.Name) {
	d := n.Deployer()

	var phases []string
	first, err := d.Deploy(ctx, app, deploy.Options{
		Progress: func(p string, took time.Duration) { phases = append(phases, p) },
		Prepare: func(ctx context.Context, tg deploy.Target) error {
			_, err := testenv.RedisDo(ctx, nil, tg.Ports["6379/tcp"], "SET", "greeting", "written before the checkpoint")
			return err
		},
	})
	if err != nil {
		t.Fatalf("first deploy: %v", err)
	}
	t.Logf("first deploy (boot + checkpoint + restore): %s", first.Timings)
	if !first.Booted || first.Phase != spec.PhaseRunning || first.Gen != 1 {
		t.Errorf("first deploy = booted %v, phase %s, gen %d; want booted, Running, gen 1", first.Booted, first.Phase, first.Gen)
	}
	for _, want := range []string{"clone", "map", "mount", "container", "ready", "prepare", "checkpoint", "seal"} {
		if !contains(phases, want) {
			t.Errorf("progress phases %v lack %q", phases, want)
		}
	}

	// The generation: both images sealed by a protected snapshot, the
	// engine's image in the checkpoint image.
	g, err := d.Checkpoints().Latest(ctx, app.Name)
	if err != nil {
		t.Fatal(err)
	}
	if g.Bytes <= 0 || g.Engine != eng {
		t.Errorf("generation = %+v; want a non-empty %s image", g, eng)
	}
	for _, ref := range []layering.SnapRef{g.EnvSnap, g.CkptSnap} {
		info, err := n.Store().Stat(ctx, ref.Image)
		if err != nil {
			t.Fatal(err)
		}
		if len(info.Snapshots) != 1 || info.Snapshots[0].Name != layering.SealedSnap || !info.Snapshots[0].Protected {
			t.Errorf("%s snapshots = %+v; want one protected %q", ref.Image, info.Snapshots, layering.SealedSnap)
		}
	}
	// The node that checkpointed keeps a copy of the generation, which
	// every restore on it reads: no fetch, and no clone of the checkpoint.
	pattern := n.CheckpointFiles(eng)
	cachedGen := func() string {
		t.Helper()
		es, err := d.Checkpoints().Cached()
		if err != nil {
			t.Fatal(err)
		}
		var dirs []string
		for _, e := range es {
			if e.App == app.Name && e.Gen == g.Gen && e.Key == deploy.CacheKey(g) {
				dirs = append(dirs, e.Dir)
			}
		}
		if len(dirs) != 1 {
			t.Fatalf("the node's checkpoint cache holds %d copies of generation %d (%+v); want 1", len(dirs), g.Gen, es)
		}
		if files, _ := filepath.Glob(filepath.Join(dirs[0], pattern)); len(files) == 0 {
			t.Errorf("the node's copy of generation %d (%s) holds no %s", g.Gen, dirs[0], pattern)
		}
		return dirs[0]
	}
	cachedGen()
	onlyEnv := func(dep deploy.Deployment) {
		t.Helper()
		if len(dep.Images) != 1 || !strings.HasSuffix(dep.Images[0], "-env") {
			t.Errorf("%s owns images %v; want its environment clone only (the checkpoint is the node's copy)", dep.ID, dep.Images)
		}
	}
	onlyEnv(first)
	if first.Fetched {
		t.Errorf("the first deploy fetched the checkpoint it had just written")
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
		dep, err := d.Deploy(ctx, app, deploy.Options{})
		if err != nil {
			t.Fatalf("sequential restore %d: %v", i+1, err)
		}
		if dep.Booted || dep.Gen != 1 {
			t.Errorf("restore %d: booted %v gen %d; want a restore of gen 1", i+1, dep.Booted, dep.Gen)
		}
		t.Logf("sequential restore %d: %s (total %s)", i+1, dep.Timings, dep.Total().Round(time.Millisecond))
		// The DMTCP container reports the engine's own restart time of a
		// TCP-probed app, every time.
		if driver == "container" && dep.EngineReadyMS <= 0 {
			t.Errorf("restore %d: no engine restart time (engine_ready_ms %v)", i+1, dep.EngineReadyMS)
		}
		if dep.Fetched {
			t.Errorf("restore %d fetched the generation the node holds", i+1)
		}
		onlyEnv(dep)
		check(dep)
		all = append(all, dep)
	}

	// Without its copy (a node that did not checkpoint, or one that
	// evicted it), concurrent restores fetch it from the sealed snapshot
	// once, and all of them read it.
	if dropped, err := d.Checkpoints().TrimCache(func(k gencache.Key) bool { return k.App != app.Name }); err != nil || len(dropped) != 1 {
		t.Fatalf("dropping the node's copy: dropped %+v, %v; want generation %d", dropped, err, g.Gen)
	}
	var wg sync.WaitGroup
	conc := make([]deploy.Deployment, 5)
	errs := make([]error, 5)
	fetched := 0
	for i := range conc {
		wg.Go(func() { conc[i], errs[i] = d.Deploy(ctx, app, deploy.Options{}) })
	}
	wg.Wait()
	for i, dep := range conc {
		if errs[i] != nil {
			t.Errorf("concurrent restore %d: %v", i+1, errs[i])
			continue
		}
		t.Logf("concurrent restore %d: %s (fetched %v)", i+1, dep.Timings, dep.Fetched)
		if dep.Fetched {
			fetched++
		}
		check(dep)
		all = append(all, dep)
	}
	if fetched != 1 {
		t.Errorf("%d of 5 concurrent restores fetched the checkpoint; want exactly 1", fetched)
	}
	cachedGen()

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
		if err := d.Undeploy(ctx, dep.ID); err != nil {
			t.Errorf("undeploy %s: %v", dep.ID, err)
		}
	}
	n.AssertNothingLeft(t, app.Name, true)
	if err := d.Undeploy(ctx, first.ID); !errors.Is(err, spec.ErrNotFound) {
		t.Errorf("second undeploy of %s = %v; want spec.ErrNotFound", first.ID, err)
	}
}

// TestDeployNeverReady: an app that never answers fails with a timeout
// error that shows its last output, and leaves nothing: no generation, no
// clone, mapping, mount, container or record.
func TestDeployNeverReady(t *testing.T) {
	err := deployUnready(t, "never", "echo warming up the cache forever; exec sleep 600", 3*time.Second)
	if !errors.Is(err, engine.ErrNotReady) {
		t.Fatalf("deploy of an app that never listens = %v; want ErrNotReady", err)
	}
	if !strings.Contains(err.Error(), "warming up the cache forever") {
		t.Errorf("the error does not show the app's last lines:\n%v", err)
	}
}

// TestDeployExits: an app that exits before it is ready fails its deploy
// as soon as its instance is gone, not at its ready timeout, with an
// error that says so and shows its last output, and leaves nothing.
func TestDeployExits(t *testing.T) {
	err := deployUnready(t, "exits", "echo cannot read its configuration; sleep 0.3; exit 3", 2*time.Minute)
	if !errors.Is(err, engine.ErrNotReady) || !strings.Contains(err.Error(), "the instance exited") {
		t.Fatalf("deploy of an app that exits = %v; want ErrNotReady saying the instance exited", err)
	}
	if !strings.Contains(err.Error(), "cannot read its configuration") {
		t.Errorf("the error does not show the app's last lines:\n%v", err)
	}
}

// deployUnready deploys, under DMTCP in the container driver, an app of
// the redis spec whose command is the shell script script and whose ready
// timeout is timeout, checks that it leaves nothing, and returns the
// deploy's error.
func deployUnready(t *testing.T, prefix, script string, timeout time.Duration) error {
	t.Helper()
	f := deploytest.NewFixture(t, "container")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	app := deploytest.RedisApp(prefix+"-"+strconv.FormatInt(time.Now().UnixNano()%1e6, 36), f.Env, engine.NameDMTCP)
	app.Command = []string{"sh", "-c", script}
	app.Ready.Timeout = spec.Duration(timeout)
	_, err := f.D.Deploy(ctx, app, deploy.Options{})
	if err == nil {
		t.Fatalf("deploy of %s (%q) succeeded; want it to fail", app.Name, script)
	}
	deploytest.AssertNothingLeft(t, f, app.Name, false)
	return err
}

// TestDeployBadSpec: a bad spec is refused before anything is created,
// with an error that says which field is wrong.
func TestDeployBadSpec(t *testing.T) {
	f := deploytest.NewBootFixture(t)
	ctx := context.Background()
	good := deploytest.BusyboxHTTPApp("bad-spec", f.Env)
	cases := map[string]struct {
		mutate func(a *spec.App)
		field  string
	}{
		"missing command":         {func(a *spec.App) { a.Command = nil }, "command"},
		"port out of range":       {func(a *spec.App) { a.Ports = []spec.Port{{Port: 70000}} }, "ports[0]"},
		"unknown engine":          {func(a *spec.App) { a.Engine = "podman" }, "engine"},
		"readiness without port":  {func(a *spec.App) { a.Ready = spec.Readiness{Kind: spec.ReadyTCP} }, "ready.port"},
		"readiness without kind":  {func(a *spec.App) { a.Ready = spec.Readiness{} }, "ready"},
		"exec without command":    {func(a *spec.App) { a.Ready = spec.Readiness{Kind: spec.ReadyExec} }, "ready.command"},
		"output without a phrase": {func(a *spec.App) { a.Ready = spec.Readiness{Kind: spec.ReadyOutput} }, "ready.phrase"},
	}
	for name, c := range cases {
		a := good
		c.mutate(&a)
		for _, opts := range []deploy.Options{{}, {Mode: spec.ModeBoot}} {
			_, err := f.D.Deploy(ctx, a, opts)
			if !errors.Is(err, spec.ErrInvalidSpec) || !strings.Contains(err.Error(), c.field) {
				t.Errorf("%s (mode %q): deploy = %v; want spec.ErrInvalidSpec naming %s", name, opts.Mode, err, c.field)
			}
		}
	}
	a := good
	a.Env = "no-such-env"
	if _, err := f.D.Deploy(ctx, a, deploy.Options{Mode: spec.ModeBoot}); !errors.Is(err, layering.ErrNotFound) {
		t.Errorf("unknown environment: deploy = %v; want layering.ErrNotFound", err)
	}
	if _, err := f.D.Deploy(ctx, good, deploy.Options{Mode: "fast"}); !errors.Is(err, spec.ErrInvalidSpec) || !strings.Contains(err.Error(), "mode") {
		t.Errorf("unknown mode: deploy = %v; want spec.ErrInvalidSpec naming mode", err)
	}
	deploytest.AssertNothingLeft(t, f, good.Name, false)
}

// TestDeployBootWithoutEngine is a node with no checkpoint engine: a deploy
// fails with a hint unless it may boot the app normally; booted instances
// run from writable clones of the environment, answer on their own ports,
// record their phases, and leave nothing after undeploy. No checkpoint is
// ever produced.
func TestDeployBootWithoutEngine(t *testing.T) {
	f := deploytest.NewBootFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	app := deploytest.BusyboxHTTPApp("web-"+strconv.FormatInt(time.Now().UnixNano()%1e6, 36), f.Env)
	t.Cleanup(func() { f.UndeployAll(t, app.Name) })

	_, err := f.D.Deploy(ctx, app, deploy.Options{})
	if !errors.Is(err, drivers.ErrDriver) || hint.Of(err) == "" {
		t.Fatalf("deploy without an engine = %v; want ErrDriver with a hint", err)
	}
	deploytest.AssertNothingLeft(t, f, app.Name, false)

	deps := make([]deploy.Deployment, 3)
	var wg sync.WaitGroup
	errs := make([]error, len(deps))
	for i := range deps {
		opts := deploy.Options{IfNoEngine: spec.PolicyBoot}
		if i == 2 {
			opts = deploy.Options{Mode: spec.ModeBoot}
		}
		wg.Go(func() { deps[i], errs[i] = f.D.Deploy(ctx, app, opts) })
	}
	wg.Wait()
	pages := map[string]bool{}
	for i, dep := range deps {
		if errs[i] != nil {
			t.Fatalf("boot %d: %v", i, errs[i])
		}
		wantReason := "no checkpoint engine"
		if i == 2 {
			wantReason = "requested"
		}
		if dep.Mode != spec.ModeBoot || dep.Phase != spec.PhaseRunning || !strings.Contains(dep.BootReason, wantReason) {
			t.Errorf("boot %d = mode %q phase %s reason %q; want boot, Running, %q", i, dep.Mode, dep.Phase, dep.BootReason, wantReason)
		}
		for _, p := range []string{"clone", "map", "mount", "container", "ready"} {
			if _, ok := dep.Timings.Get(p); !ok {
				t.Errorf("boot %d timings %s lack %s", i, dep.Timings, p)
			}
		}
		// The entrypoint's own HTTP probe times the boot from inside.
		if dep.EngineReadyMS <= 0 || dep.EngineReadyMS > float64(dep.Total().Milliseconds()) {
			t.Errorf("boot %d: the app's own time to ready (engine_ready_ms) = %v; want a positive time within the deploy's %s", i, dep.EngineReadyMS, dep.Total())
		}
		body := testenv.HTTPGet(ctx, t, "http://"+dep.Ports["8080/tcp"]+"/")
		if !strings.HasPrefix(body, "served by ") || pages[body] {
			t.Errorf("boot %d answers %q; want its own page", i, body)
		}
		pages[body] = true
		t.Logf("boot %d: %s at %s, %s", i, dep.ID, dep.Ports["8080/tcp"], dep.Timings)
	}
	if gens, err := f.D.Checkpoints().Generations(ctx, app.Name); err != nil || len(gens) != 0 {
		t.Errorf("generations after boots = %v, %v; want none", gens, err)
	}
	for _, dep := range deps {
		if err := f.D.Undeploy(ctx, dep.ID); err != nil {
			t.Errorf("undeploy %s: %v", dep.ID, err)
		}
	}
	deploytest.AssertNothingLeft(t, f, app.Name, false)
}

// TestDeployBootWhileCheckpointing: a deploy that arrives while another
// produces the app's first checkpoint boots normally when IfBusy says so,
// and never produces a second checkpoint; one that waits restores.
func TestDeployBootWhileCheckpointing(t *testing.T) {
	f, ctx, app := redisFixture(t, "container", engine.NameDMTCP, "busy")
	bootWhileCheckpointing(ctx, t, f, app)
}

// TestDeployBootWhileCheckpointingUnit is TestDeployBootWhileCheckpointing
// on the fakes.
func TestDeployBootWhileCheckpointingUnit(t *testing.T) {
	u, ctx, app := unitRedis(t, engine.NameDMTCP)
	bootWhileCheckpointing(ctx, t, u, app)
}

func bootWhileCheckpointing(ctx context.Context, t *testing.T, n deploytest.Node, app spec.App) {
	d := n.Deployer()

	producing := make(chan struct{})
	var once sync.Once
	var first, waiter deploy.Deployment
	var firstErr, waitErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		first, firstErr = d.Deploy(ctx, app, deploy.Options{
			Progress: func(p string, _ time.Duration) { once.Do(func() { close(producing) }) },
			// Hold the checkpoint back until the other deploys have arrived.
			Prepare: func(ctx context.Context, _ deploy.Target) error { time.Sleep(2 * time.Second); return nil },
		})
	})
	<-producing
	wg.Go(func() { waiter, waitErr = d.Deploy(ctx, app, deploy.Options{IfBusy: spec.PolicyWait}) })
	booted, err := d.Deploy(ctx, app, deploy.Options{IfBusy: spec.PolicyBoot})
	if err != nil {
		t.Fatalf("deploy while the checkpoint is produced: %v", err)
	}
	wg.Wait()
	if firstErr != nil || waitErr != nil {
		t.Fatalf("first deploy: %v; waiting deploy: %v", firstErr, waitErr)
	}
	if booted.Mode != spec.ModeBoot || !strings.Contains(booted.BootReason, "being produced") {
		t.Errorf("busy deploy = mode %q reason %q; want boot because the checkpoint is being produced", booted.Mode, booted.BootReason)
	}
	if !first.Booted || waiter.Booted || waiter.Mode != spec.ModeRestore || waiter.Gen != first.Gen {
		t.Errorf("first = booted %v gen %d; waiter = booted %v mode %s gen %d; want one checkpoint, the waiter restoring it",
			first.Booted, first.Gen, waiter.Booted, waiter.Mode, waiter.Gen)
	}
	if gens, _ := d.Checkpoints().Generations(ctx, app.Name); len(gens) != 1 {
		t.Errorf("generations = %d; want exactly 1", len(gens))
	}
	for _, dep := range []deploy.Deployment{first, waiter, booted} {
		if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, dep), "PING"); err != nil || got != "PONG" {
			t.Errorf("%s (%s): PING = %q, %v", dep.ID, dep.Mode, got, err)
		}
		if err := d.Undeploy(ctx, dep.ID); err != nil {
			t.Errorf("undeploy %s: %v", dep.ID, err)
		}
	}
	n.AssertNothingLeft(t, app.Name, true)
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// TestEnvironmentWithoutGlibc: DMTCP's tools run on the environment's C
// library, so a deploy of an environment that has none (a static busybox)
// fails before launch, saying why, and leaves nothing.
func TestEnvironmentWithoutGlibc(t *testing.T) {
	f := deploytest.NewStaticFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	app := deploytest.BusyboxHTTPApp("static-"+strconv.FormatInt(time.Now().UnixNano()%1e6, 36), f.Env)
	t.Cleanup(func() { f.UndeployAll(t, app.Name) })
	if _, _, err := f.D.Drivers().Check(ctx, app); err != nil {
		t.Fatalf("the node has DMTCP: %v", err)
	}
	start := time.Now()
	_, err := f.D.Deploy(ctx, app, deploy.Options{})
	if !errors.Is(err, spec.ErrInvalidSpec) || !strings.Contains(err.Error(), "no GNU C library") ||
		!strings.Contains(err.Error(), f.Env) || !strings.Contains(hint.Of(err), "--mode boot") {
		t.Fatalf("deploy of an environment without glibc under DMTCP = %v (hint %q); want spec.ErrInvalidSpec naming the environment and the missing glibc, with a hint", err, hint.Of(err))
	}
	t.Logf("refused in %s: %v (hint: %s)", time.Since(start).Round(time.Millisecond), err, hint.Of(err))
	deploytest.AssertNothingLeft(t, f, app.Name, false)
	// The same environment still boots without the engine.
	dep, err := f.D.Deploy(ctx, app, deploy.Options{Mode: spec.ModeBoot})
	if err != nil {
		t.Fatalf("boot of the same environment: %v", err)
	}
	if err := f.D.Undeploy(ctx, dep.ID); err != nil {
		t.Fatal(err)
	}
	deploytest.AssertNothingLeft(t, f, app.Name, false)
}

// tokenServer is a Python HTTP server that draws a random token at boot and
// answers every GET with it: a restored instance answers with the token of
// the checkpointed process, a booted one with a new one.
var tokenServer = []string{"python3", "-c", `import http.server, secrets
token = secrets.token_hex(8).encode()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(token)))
        self.end_headers()
        self.wfile.write(token)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("0.0.0.0", 8000), H).serve_forever()`}

// tokenApp is tokenServer under DMTCP in env, named prefix-<random>.
func tokenApp(prefix, env string) spec.App {
	return spec.App{
		Name: prefix + "-" + strconv.FormatInt(time.Now().UnixNano()%1e6, 36), Env: env, Engine: engine.NameDMTCP,
		Command:        tokenServer,
		Ports:          []spec.Port{{Port: 8000}},
		Ready:          spec.Readiness{Kind: spec.ReadyHTTP, Port: 8000, Path: "/", Timeout: spec.Duration(60 * time.Second)},
		Resources:      spec.Resources{CPUs: 1, Memory: "256M"},
		CheckpointSize: "256M",
	}
}

// getToken returns what the instance of dep answers to GET / on port 8000.
func getToken(t *testing.T, dep deploy.Deployment) string {
	t.Helper()
	addr := dep.Ports[drivers.PortKey(8000, "tcp")]
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatalf("GET %s of %s: %v", addr, dep.ID, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestDMTCPEnvironmentWithOnlyGlibc: an environment with python3 and a
// glibc, without libstdc++6 or libatomic1, boots under DMTCP, checkpoints
// and restores, because the DMTCP container brings what DMTCP needs.
func TestDMTCPEnvironmentWithOnlyGlibc(t *testing.T) {
	f := deploytest.NewPythonFixture(t)
	root := testenv.PythonRootfs(t, testenv.DMTCP)
	for _, lib := range []string{"libstdc++.so.6", "libatomic.so.1"} {
		if m, _ := filepath.Glob(filepath.Join(root, "usr/lib/*/"+lib)); len(m) > 0 {
			t.Fatalf("the test environment has %v: it must have only its app and a glibc (rebuild it: scripts/test-fixtures.sh)", m)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	app := tokenApp("pytoken", f.Env)
	t.Cleanup(func() { f.UndeployAll(t, app.Name); f.RemoveGenerations(t, app.Name) })
	get := func(dep deploy.Deployment) string { return getToken(t, dep) }
	first, err := f.D.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatalf("first deploy (boot, checkpoint, restore) of python3 without libstdc++ and libatomic: %v", err)
	}
	if !first.Booted || first.Mode == spec.ModeBoot {
		t.Fatalf("first deploy: booted=%v mode=%s, want a checkpoint then a restore", first.Booted, first.Mode)
	}
	second, err := f.D.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	plain, err := f.D.Deploy(ctx, app, deploy.Options{Mode: spec.ModeBoot})
	if err != nil {
		t.Fatalf("plain boot: %v", err)
	}
	a, b, c := get(first), get(second), get(plain)
	if len(a) != 16 || a != b || c == a {
		t.Fatalf("tokens: first restore %q, second restore %q, plain boot %q; want the two restores to answer the checkpointed token and the boot another", a, b, c)
	}
	t.Logf("restored instances answer the checkpoint's token %s; a plain boot answers %s", a, c)
}

// TestBootWhenGenerationIncompatible: a node that cannot restore the app's
// generation (checkpointed by another engine version, or on a CPU with a
// feature this one lacks) boots the app instead and says why.
func TestBootWhenGenerationIncompatible(t *testing.T) {
	f := deploytest.NewPythonFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	app := tokenApp("pycompat", f.Env)
	t.Cleanup(func() { f.UndeployAll(t, app.Name); f.RemoveGenerations(t, app.Name) })
	if _, err := f.D.Deploy(ctx, app, deploy.Options{}); err != nil {
		t.Fatal(err)
	}
	gen, err := f.D.Checkpoints().Latest(ctx, app.Name)
	if err != nil || gen.Platform == nil || gen.Platform.Arch == "" || gen.EngineVersion == "" {
		t.Fatalf("generation %+v, %v: want the platform and engine version recorded", gen, err)
	}
	rewrite := func(g spec.Generation) {
		t.Helper()
		raw, _ := json.Marshal(g)
		if err := f.Ceph.SetMeta(ctx, g.CkptSnap.Image, map[string]string{catalog.MetaGeneration: string(raw)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		change func(g *spec.Generation)
		reason string
	}{
		{"cpu feature", func(g *spec.Generation) {
			g.Platform.CPUFlags = append(slices.Clone(g.Platform.CPUFlags), "zz_fogdeploy_absent")
			slices.Sort(g.Platform.CPUFlags)
		}, "needs CPU features this node lacks (zz_fogdeploy_absent)"},
		{"engine version", func(g *spec.Generation) { g.EngineVersion = "0.9-other" }, "checkpointed by dmtcp 0.9-other"},
	} {
		g := gen
		g.Platform = &spec.Platform{Arch: gen.Platform.Arch, Kernel: gen.Platform.Kernel, CPUFlags: gen.Platform.CPUFlags}
		tc.change(&g)
		rewrite(g)
		dep, err := f.D.Deploy(ctx, app, deploy.Options{})
		if err != nil {
			t.Fatalf("%s: deploy: %v", tc.name, err)
		}
		if dep.Mode != spec.ModeBoot || !strings.Contains(dep.BootReason, tc.reason) {
			t.Fatalf("%s: deployment mode %q, reason %q; want a boot saying %q", tc.name, dep.Mode, dep.BootReason, tc.reason)
		}
		t.Logf("%s: booted: %s", tc.name, dep.BootReason)
	}
	rewrite(gen)
	dep, err := f.D.Deploy(ctx, app, deploy.Options{})
	if err != nil || dep.Mode == spec.ModeBoot || dep.Gen != gen.Gen {
		t.Fatalf("with the original record: %+v, %v; want a restore of generation %d", dep, err, gen.Gen)
	}
}

// TestDeployAfterSpecChange: an app removed and created again under its
// name with another command must not restore the old app's checkpoint.
// Its next deploy boots and seals a generation of its own; a deploy of the
// old spec still restores the old generation.
func TestDeployAfterSpecChange(t *testing.T) {
	f, ctx, app := redisFixture(t, "host", engine.NameCRIU, "respec")
	first, err := f.D.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatalf("first deploy: %v", err)
	}
	if err := f.D.Undeploy(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	changed := app
	changed.Command = append(slices.Clone(app.Command), "--maxclients", "1000")
	dep, err := f.D.Deploy(ctx, changed, deploy.Options{})
	if err != nil {
		t.Fatalf("deploy of the changed spec: %v", err)
	}
	if !dep.Booted || dep.Gen == first.Gen {
		t.Errorf("deploy of the changed spec: booted %v, generation %d; want a boot that seals a generation other than %d",
			dep.Booted, dep.Gen, first.Gen)
	}
	if err := f.D.Undeploy(ctx, dep.ID); err != nil {
		t.Fatal(err)
	}
	again, err := f.D.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatalf("deploy of the first spec again: %v", err)
	}
	if again.Booted || again.Gen != first.Gen {
		t.Errorf("deploy of the first spec again: booted %v, generation %d; want a restore of generation %d", again.Booted, again.Gen, first.Gen)
	}
}
