//go:build !no_ceph

package deploy_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/devenv"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
	"github.com/fogdeploy/fogdeploy/internal/wire"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/cephstore"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// Where the tests find what they need; each can be overridden.
const (
	envDMTCPPrefix = "FOGDEPLOY_DMTCP_PREFIX" // installed DMTCP (default /opt/dmtcp)
	envTestRootfs  = "FOGDEPLOY_TEST_ROOTFS"  // bookworm rootfs with redis-server (default /opt/src/rootfs)
	testImage      = "fogdeploy/dmtcp:deploytest"
)

// fixture is one node of a PoP: the dev Ceph pool, this machine's mapper,
// the dev dockerd, and a redis environment imported from a rootfs.
type fixture struct {
	d     *deploy.Deployer
	l     *wire.Layering
	rt    *runtime.Docker
	env   string
	state string
}

var (
	rootfsOnce sync.Once
	rootfsErr  error
)

func redisRootfs(t *testing.T) string {
	t.Helper()
	root := devenv.Lookup(envTestRootfs, "/opt/src/rootfs")
	if _, err := os.Stat(filepath.Join(root, "usr", "bin", "redis-server")); err != nil {
		testenv.Unavailable(t, testenv.DMTCP, fmt.Sprintf("no rootfs with redis-server at %s (set %s, or create one with "+
			"`debootstrap --variant=minbase --include=redis-server bookworm DIR`): %v", root, envTestRootfs, err))
	}
	return root
}

// newFixture sets up a node whose DMTCP apps run with dmtcpDriver
// ("container" or "host").
func newFixture(t *testing.T, dmtcpDriver string) *fixture {
	t.Helper()
	testenv.NeedRoot(t)
	c := testenv.CephCluster(t)
	root := redisRootfs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))

	s, err := cephstore.Open(ctx, cephstore.Config{Conf: c.Conf, Keyring: c.Keyring, ID: c.ID, Pool: c.Pool})
	if err != nil {
		t.Fatal(err)
	}
	// Not t.TempDir: its RemoveAll would walk into a mount that a failed
	// test left, and delete the files of an RBD image through it.
	state, err := os.MkdirTemp("", "fogdeploy-deploytest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if mounts := mountsUnder(t, state); len(mounts) > 0 {
			t.Errorf("mounts left under %s (kept for inspection): %v", state, mounts)
			return
		}
		_ = os.RemoveAll(state)
	})
	mc := mapper.Config{Backend: mapper.BackendAuto, StateDir: state + "/mapper", CephConf: c.Conf, Keyring: c.Keyring, ID: c.ID}
	l, err := wire.NewLayering(ctx, s, c.Pool, mc, layering.DefaultManagerConfig(state+"/work"), log)
	if err != nil {
		s.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })

	f := &fixture{l: l, state: state}
	dc := deploy.Config{StateDir: state + "/deploy", Pool: c.Pool, Node: "test", DMTCPDriver: dmtcpDriver}
	ec := engine.Config{Logger: log}
	deps := deploy.Deps{Store: l.Store, Envs: l.Manager, Mapper: l.Mapper, Log: log,
		Host: deploy.NewHost(engine.NewDMTCP(ec), engine.NewCRIU(ec))}
	if dmtcpDriver == "container" {
		f.rt = dockerForTest(t, log)
		buildImage(ctx, t)
		deps.Container = &deploy.Container{RT: f.rt, Image: testImage, StopTimeout: 5 * time.Second}
	}
	f.d, err = deploy.New(dc, deps)
	if err != nil {
		t.Fatal(err)
	}

	f.env = "t-redis-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	start := time.Now()
	if _, err := l.Manager.Import(ctx, f.env, layering.Source{Dir: root}, layering.ImportOptions{}); err != nil {
		t.Fatalf("import %s: %v", root, err)
	}
	t.Logf("environment %s imported from %s in %s", f.env, root, time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if _, err := l.Manager.Remove(context.Background(), f.env); err != nil {
			t.Errorf("remove environment %s: %v", f.env, err)
		}
	})
	return f
}

func dockerForTest(t *testing.T, log *slog.Logger) *runtime.Docker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := runtime.Dial(ctx, devenv.Lookup(devenv.EnvDockerHost, devenv.DockerHost()), log)
	if err != nil {
		testenv.Unavailable(t, testenv.Docker, err.Error())
	}
	return d
}

func buildImage(ctx context.Context, t *testing.T) {
	t.Helper()
	prefix := devenv.Lookup(envDMTCPPrefix, "/opt/dmtcp")
	if _, err := os.Stat(filepath.Join(prefix, "bin", "dmtcp_launch")); err != nil {
		testenv.Unavailable(t, testenv.DMTCP, fmt.Sprintf("no DMTCP install at %s (set %s): %v", prefix, envDMTCPPrefix, err))
	}
	host := devenv.Lookup(devenv.EnvDockerHost, devenv.DockerHost())
	out, err := exec.CommandContext(ctx, "bash", "../../dmtcp-image/build.sh", "-t", testImage, prefix, host).CombinedOutput()
	if err != nil {
		t.Fatalf("dmtcp-image/build.sh: %v\n%s", err, out)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func redisApp(name, env, eng string) deploy.App {
	return deploy.App{
		Name: name, Env: env, Engine: eng,
		Command: []string{"redis-server", "--port", "6379", "--protected-mode", "no", "--save", "", "--appendonly", "no",
			"--jemalloc-bg-thread", "no", "--daemonize", "no"},
		Ports:          []deploy.Port{{Port: 6379}},
		Ready:          deploy.Readiness{Kind: deploy.ReadyTCP, Port: 6379, Send: "PING\r\n", Expect: "+PONG", Timeout: deploy.Duration(30 * time.Second)},
		Resources:      deploy.Resources{CPUs: 1, Memory: "256M"},
		CheckpointSize: "256M",
	}
}

func redisAddr(t *testing.T, dep deploy.Deployment) string {
	t.Helper()
	addr := dep.Ports[deploy.PortKey(6379, "tcp")]
	if addr == "" {
		t.Fatalf("deployment %s publishes no 6379/tcp: %v", dep.ID, dep.Ports)
	}
	return addr
}

// snapshot of what a deployment can leave on the node and in the pool.
type leftovers struct {
	images     []string
	mappings   []string
	mounts     []string
	containers []string
	records    []string
}

func (f *fixture) leftovers(t *testing.T, app string) leftovers {
	t.Helper()
	ctx := context.Background()
	var lo leftovers
	names, err := f.l.Store.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if strings.HasPrefix(n, deploy.InstancePrefix+app+"-") || strings.HasPrefix(n, deploy.GenPrefix+app+"-") {
			lo.images = append(lo.images, n)
		}
	}
	maps, err := f.l.Mapper.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range maps {
		lo.mappings = append(lo.mappings, m.ID)
	}
	lo.mounts = mountsUnder(t, f.state)
	if f.rt != nil {
		sts, err := f.rt.List(ctx, map[string]string{runtime.LabelApp: app})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range sts {
			lo.containers = append(lo.containers, s.Name)
		}
	}
	recs, err := f.d.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.App == app {
			lo.records = append(lo.records, r.ID+" ("+r.Phase+")")
		}
	}
	return lo
}

func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	mi, err := os.Open("/proc/thread-self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer mi.Close()
	var out []string
	sc := bufio.NewScanner(mi)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			out = append(out, fields[4])
		}
	}
	return out
}

func (lo leftovers) empty() bool {
	return len(lo.images)+len(lo.mappings)+len(lo.mounts)+len(lo.containers)+len(lo.records) == 0
}

func assertNothingLeft(t *testing.T, f *fixture, app string, keepGen bool) {
	t.Helper()
	lo := f.leftovers(t, app)
	if keepGen {
		var rest []string
		for _, n := range lo.images {
			if !strings.HasPrefix(n, deploy.GenPrefix) {
				rest = append(rest, n)
			}
		}
		lo.images = rest
	}
	if !lo.empty() {
		t.Errorf("left behind: %+v", lo)
	}
}

func TestDeployRedisDMTCPContainer(t *testing.T) { testDeployRedis(t, "container", engine.NameDMTCP) }
func TestDeployRedisCRIU(t *testing.T)           { testDeployRedis(t, "host", engine.NameCRIU) }

// testDeployRedis is what an operator checks: the first deploy boots redis,
// a key is written, the checkpoint is sealed in the pool; 5 sequential and
// then 5 concurrent restores each answer GET with the key as distinct
// instances; undeploy leaves nothing.
func testDeployRedis(t *testing.T, driver, eng string) {
	f := newFixture(t, driver)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := f.d.Host().Check(ctx, eng); err != nil && driver == "host" {
		testenv.Unavailable(t, eng, err.Error())
	}
	app := redisApp("redis-"+eng+"-"+strconv.FormatInt(time.Now().UnixNano()%1e6, 36), f.env, eng)
	t.Cleanup(func() {
		gens, _ := f.d.Generations(context.Background(), app.Name)
		for _, g := range gens {
			if err := f.d.RemoveGeneration(context.Background(), app.Name, g.Gen); err != nil {
				t.Errorf("remove generation %d: %v", g.Gen, err)
			}
		}
	})

	t.Cleanup(func() { undeployAll(t, f, app.Name) })

	var phases []string
	first, err := f.d.Deploy(ctx, app, deploy.Options{
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
	g, err := f.d.Latest(ctx, app.Name)
	if err != nil {
		t.Fatal(err)
	}
	if g.Bytes <= 0 || g.Engine != eng {
		t.Errorf("generation = %+v; want a non-empty %s image", g, eng)
	}
	for _, ref := range []layering.SnapRef{g.EnvSnap, g.CkptSnap} {
		info, err := f.l.Store.Stat(ctx, ref.Image)
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
		got, err := testenv.RedisDo(ctx, nil, redisAddr(t, dep), "GET", "greeting")
		if err != nil || got != "written before the checkpoint" {
			t.Errorf("%s: GET greeting = %q, %v", dep.ID, got, err)
		}
	}
	check(first)
	all := []deploy.Deployment{first}

	for i := range 5 {
		dep, err := f.d.Deploy(ctx, app, deploy.Options{})
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
		wg.Go(func() { conc[i], errs[i] = f.d.Deploy(ctx, app, deploy.Options{}) })
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
		addrs[redisAddr(t, dep)] = true
	}
	if len(refs) != len(all) || len(addrs) != len(all) {
		t.Errorf("%d deployments ran as %d instances on %d addresses", len(all), len(refs), len(addrs))
	}
	// Each instance has its own state: a write to one is not seen by another.
	if _, err := testenv.RedisDo(ctx, nil, redisAddr(t, all[1]), "SET", "greeting", "changed"); err != nil {
		t.Fatal(err)
	}
	check(all[2])

	for _, dep := range all {
		if err := f.d.Undeploy(ctx, dep.ID); err != nil {
			t.Errorf("undeploy %s: %v", dep.ID, err)
		}
	}
	assertNothingLeft(t, f, app.Name, true)
	if err := f.d.Undeploy(ctx, first.ID); !errors.Is(err, deploy.ErrNotFound) {
		t.Errorf("second undeploy of %s = %v; want ErrNotFound", first.ID, err)
	}
}

// TestDeployNeverReady: an app that never answers fails with a timeout
// error that shows its last output, and leaves nothing: no generation, no
// clone, mapping, mount, container or record.
func TestDeployNeverReady(t *testing.T) {
	f := newFixture(t, "container")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	app := redisApp("never-"+strconv.FormatInt(time.Now().UnixNano()%1e6, 36), f.env, engine.NameDMTCP)
	app.Command = []string{"sh", "-c", "echo warming up the cache forever; exec sleep 600"}
	app.Ready.Timeout = deploy.Duration(3 * time.Second)
	_, err := f.d.Deploy(ctx, app, deploy.Options{})
	if !errors.Is(err, deploy.ErrNotReady) {
		t.Fatalf("deploy of an app that never listens = %v; want ErrNotReady", err)
	}
	if !strings.Contains(err.Error(), "warming up the cache forever") {
		t.Errorf("the error does not show the app's last lines:\n%v", err)
	}
	assertNothingLeft(t, f, app.Name, false)
}

// TestDeployBadSpec: a bad spec is refused before anything is created.
func TestDeployBadSpec(t *testing.T) {
	f := newFixture(t, "container")
	ctx := context.Background()
	good := redisApp("bad-spec", f.env, engine.NameDMTCP)
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
		if _, err := f.d.Deploy(ctx, a, deploy.Options{}); err == nil {
			t.Errorf("%s: deploy succeeded", name)
		}
	}
	assertNothingLeft(t, f, good.Name, false)
}

// undeployAll removes what a failed test left of app's deployments.
func undeployAll(t *testing.T, f *fixture, app string) {
	recs, _ := f.d.List()
	for _, r := range recs {
		if r.App == app {
			if err := f.d.Undeploy(context.Background(), r.ID); err != nil {
				t.Errorf("cleanup: undeploy %s: %v", r.ID, err)
			}
		}
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
