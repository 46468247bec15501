//go:build !no_ceph

// Package deploytest sets up a node for the deploy path's tests and
// benchmarks: a real one (Fixture: the dev Ceph pool, this machine's
// mapper, the dev dockerd with the DMTCP image, and a redis environment
// imported from a rootfs), or one of fakes that needs no root or service
// (Unit, unit.go). Scenarios written against Node (node.go) run on both.
package deploytest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/cgroup"
	"github.com/fogdeploy/fogdeploy/internal/config"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/devenv"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/drivers/drivertest"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/runtime/runtimetest"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
	"github.com/fogdeploy/fogdeploy/internal/wire"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/cephstore"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// Where the tests find what they need; each can be overridden.
const (
	envDMTCPPrefix = "FOGDEPLOY_DMTCP_PREFIX" // installed DMTCP (default /opt/dmtcp)
	testImage      = "fogdeploy/dmtcp:deploytest"
	testBootImage  = "fogdeploy/boot:deploytest"
)

// Fixture is one node of a PoP: the dev Ceph pool, this machine's mapper,
// the dev dockerd, and a redis environment imported from a rootfs.
type Fixture struct {
	D     *deploy.Deployer
	L     *wire.Layering
	RT    *runtime.Docker
	Ceph  *cephstore.Store
	Env   string
	State string
	// Container and Host are the Deployer's drivers (Container is nil
	// unless DMTCP apps run in the container).
	Container *drivers.Container
	Host      *drivers.Host

	cfg  deploy.Config
	deps deploy.Deps
	// named are the slots the fixture's deployer named in its log: the
	// spare slots it made, told apart from another PoP's.
	named *slotNames
}

// slotNames are the slot IDs a log named.
type slotNames struct {
	mu    sync.Mutex
	names map[string]bool
}

func (n *slotNames) has(id string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.names[id]
}

// slotNamer is a log handler that records the "slot" attribute of every
// record into names.
type slotNamer struct {
	slog.Handler
	names *slotNames
}

func (h slotNamer) Handle(ctx context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "slot" {
			h.names.mu.Lock()
			h.names.names[a.Value.String()] = true
			h.names.mu.Unlock()
		}
		return true
	})
	return h.Handler.Handle(ctx, r)
}

func (h slotNamer) WithAttrs(as []slog.Attr) slog.Handler {
	return slotNamer{h.Handler.WithAttrs(as), h.names}
}

func (h slotNamer) WithGroup(g string) slog.Handler {
	return slotNamer{h.Handler.WithGroup(g), h.names}
}

// Reopen returns a new Deployer over the fixture's state and components,
// as a restarted agent has.
func (f *Fixture) Reopen(t testing.TB) *deploy.Deployer {
	t.Helper()
	return reopen(t, f.cfg, f.deps)
}

// reopen is a Deployer over cfg and deps, or t's failure.
func reopen(t testing.TB, cfg deploy.Config, deps deploy.Deps) *deploy.Deployer {
	t.Helper()
	d, err := deploy.New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// ReopenMapping implements Node.
func (f *Fixture) ReopenMapping(t testing.TB, wrap func(deploy.Mapper) deploy.Mapper) *deploy.Deployer {
	t.Helper()
	deps := f.deps
	deps.Mapper = wrap(deps.Mapper)
	return reopen(t, f.cfg, deps)
}

// ReopenWith is Reopen with the deployer's configuration changed by
// change.
func (f *Fixture) ReopenWith(t testing.TB, change func(*deploy.Config)) *deploy.Deployer {
	t.Helper()
	c := f.cfg
	change(&c)
	return reopen(t, c, f.deps)
}

// HostCgroups is the parent cgroup of the fixture's host instances.
const HostCgroups = "fogdeploy-host"

// NewFixture sets up a node whose DMTCP apps run with dmtcpDriver
// ("container" or "host"), with a redis environment.
func NewFixture(t testing.TB, dmtcpDriver string) *Fixture {
	t.Helper()
	testenv.NeedRoot(t)
	c := testenv.CephCluster(t)
	root := testenv.RedisRootfs(t, testenv.DMTCP)
	return newFixture(t, c, dmtcpDriver, "t-redis-", &layering.Source{Dir: root}, true, nil)
}

// NewPythonFixture is NewFixture with an environment that has python3 and
// a glibc, and no libstdc++6 or libatomic1.
func NewPythonFixture(t testing.TB) *Fixture {
	t.Helper()
	testenv.NeedRoot(t)
	c := testenv.CephCluster(t)
	root := testenv.PythonRootfs(t, testenv.DMTCP)
	return newFixture(t, c, "container", "t-python-", &layering.Source{Dir: root}, true, nil)
}

// NewNodeFixture sets up a node whose DMTCP apps run in the DMTCP
// container, over the environments already in the dev pool (it imports
// none): for apps whose environments were built with fogctl.
func NewNodeFixture(t testing.TB) *Fixture {
	t.Helper()
	return NewNodeFixtureWith(t, Options{})
}

// Options changes what NewNodeFixtureWith sets up.
type Options struct {
	// Log is where the node's deployer, drivers and engines log (text,
	// Info and up), as an agent writes its log to a file; nil: the test's
	// output. A benchmark gives a file: a line through the test's output
	// costs the test binary and the go command that relays it a fraction
	// of a millisecond of CPU, as much as a pool hit's own stages.
	Log io.Writer
}

// NewNodeFixtureWith is NewNodeFixture with o.
func NewNodeFixtureWith(t testing.TB, o Options) *Fixture {
	t.Helper()
	testenv.NeedRoot(t)
	c := testenv.CephCluster(t)
	return newFixture(t, c, "container", "", nil, true, o.Log)
}

// NewBootFixture sets up a node without a checkpoint engine: the Container
// driver with the boot image (dmtcp-image/build.sh -b) and no DMTCP image,
// and an environment holding the host's static busybox. It needs Ceph,
// dockerd and root, but no engine, so it runs on every CI machine.
func NewBootFixture(t testing.TB) *Fixture {
	t.Helper()
	return newBusyboxFixture(t, false)
}

// NewStaticFixture is NewBootFixture with the DMTCP image: a node that has
// DMTCP, and an environment without a C library (a static busybox).
func NewStaticFixture(t testing.TB) *Fixture {
	t.Helper()
	return newBusyboxFixture(t, true)
}

func newBusyboxFixture(t testing.TB, withDMTCP bool) *Fixture {
	t.Helper()
	testenv.NeedRoot(t)
	c := testenv.CephCluster(t)
	tb, err := runtimetest.BusyboxTar("/bin/busybox")
	if err != nil {
		testenv.Unavailable(t, testenv.Docker, err.Error())
	}
	return newFixture(t, c, "container", "t-busybox-", &layering.Source{Tar: bytes.NewReader(tb)}, withDMTCP, nil)
}

func newFixture(t testing.TB, c testenv.CephConn, dmtcpDriver, envPrefix string, src *layering.Source, withDMTCP bool, logTo io.Writer) *Fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if logTo == nil {
		logTo = testWriter{t}
	}
	named := &slotNames{names: map[string]bool{}}
	log := slog.New(slotNamer{slog.NewTextHandler(logTo, &slog.HandlerOptions{Level: slog.LevelInfo}), named})

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
		if mounts := MountsUnder(t, state); len(mounts) > 0 {
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

	f := &Fixture{L: l, Ceph: s, State: state, named: named}
	// The limits an agent gives instances whose spec is silent, as on a node.
	dc := deploy.Config{StateDir: state + "/deploy", Pool: c.Pool, Node: "test", Drivers: map[engine.Name]spec.DriverName{engine.NameDMTCP: spec.DriverName(dmtcpDriver), engine.NameCRIU: spec.DriverName(dmtcpDriver)},
		Limits: config.DefaultLimits().Spec()}
	ec := engine.Config{Logger: log, Confine: true}
	f.Host = drivers.NewHost(engine.NewDMTCP(ec), engine.NewCRIU(ec))
	// Host instances are bounded as on a node, where cgroups can be made.
	if os.Geteuid() == 0 {
		if gs, err := cgroup.NewGroups(cgroup.Paths{}, HostCgroups); err == nil {
			f.Host.Groups = gs
		} else {
			t.Logf("host instances without limits: %v", err)
		}
	}
	deps := deploy.Deps{Store: l.Store, Envs: l.Manager, Mapper: l.Mapper, Log: log, Host: f.Host}
	if dmtcpDriver == "container" {
		f.RT = dockerForTest(t, log)
		image := "fogdeploy/dmtcp:absent"
		if withDMTCP {
			buildImage(ctx, t)
			image = testImage
		}
		buildBootImage(ctx, t)
		f.Container = &drivers.Container{RT: f.RT, Image: image, BootImage: testBootImage, StopTimeout: 5 * time.Second}
		// As an agent does: pool slots wait at the lowest weight and are
		// raised when bound, where the node's cgroups allow it.
		if p, err := cgroup.Detect(cgroup.Paths{}); err == nil {
			f.Container.Priority = p
		}
		if l, err := cgroup.NewLimiter(cgroup.Paths{}); err == nil {
			f.Container.Limiter = l
		}
		deps.Container = f.Container
	}
	f.D, err = deploy.New(dc, deps)
	if err != nil {
		t.Fatal(err)
	}
	f.cfg, f.deps = dc, deps

	if src == nil {
		return f
	}
	f.Env = envPrefix + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	start := time.Now()
	if _, err := l.Manager.Import(ctx, f.Env, *src, layering.ImportOptions{}); err != nil {
		t.Fatalf("import environment %s: %v", f.Env, err)
	}
	t.Logf("environment %s imported in %s", f.Env, time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if _, err := l.Manager.Remove(context.Background(), f.Env); err != nil {
			t.Errorf("remove environment %s: %v", f.Env, err)
		}
	})
	return f
}

func dockerForTest(t testing.TB, log *slog.Logger) *runtime.Docker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := runtime.Dial(ctx, devenv.Lookup(devenv.EnvDockerHost, devenv.DockerHost()), log)
	if err != nil {
		testenv.Unavailable(t, testenv.Docker, err.Error())
	}
	return d
}

func buildImage(ctx context.Context, t testing.TB) {
	t.Helper()
	prefix := devenv.Lookup(envDMTCPPrefix, "/opt/dmtcp")
	if _, err := os.Stat(filepath.Join(prefix, "bin", "dmtcp_launch")); err != nil {
		testenv.Unavailable(t, testenv.DMTCP, fmt.Sprintf("no DMTCP install at %s (set %s): %v", prefix, envDMTCPPrefix, err))
	}
	host := devenv.Lookup(devenv.EnvDockerHost, devenv.DockerHost())
	out, err := exec.CommandContext(ctx, "bash", filepath.Join(RepoRoot(), "dmtcp-image", "build.sh"), "-t", testImage, prefix, host).CombinedOutput()
	if err != nil {
		t.Fatalf("dmtcp-image/build.sh: %v\n%s", err, out)
	}
}

func buildBootImage(ctx context.Context, t testing.TB) {
	t.Helper()
	host := devenv.Lookup(devenv.EnvDockerHost, devenv.DockerHost())
	out, err := exec.CommandContext(ctx, "bash", filepath.Join(RepoRoot(), "dmtcp-image", "build.sh"), "-b", "-t", testBootImage, host).CombinedOutput()
	if err != nil {
		t.Fatalf("dmtcp-image/build.sh -b: %v\n%s", err, out)
	}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Mount gives one instance of deployment id what the deploy path gives it,
// for tests of a driver alone: a clone of the fixture's environment and a
// new checkpoint image of 256 MiB (formatted), mapped and mounted as
// fdi-<id>-env and fdi-<id>-ckpt under the fixture's state directory. The
// test's cleanup unmounts, unmaps and removes both.
func (f *Fixture) Mount(t testing.TB, id string) (envPath, ckptPath string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env, err := f.L.Manager.Get(ctx, f.Env)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(f.State, "instances", id)
	paths := map[string]string{"env": filepath.Join(dir, "root"), "ckpt": filepath.Join(dir, "ckpt")}
	for _, kind := range []string{"env", "ckpt"} {
		img := catalog.InstancePrefix + id + "-" + kind
		if kind == "env" {
			err = f.L.Store.Clone(ctx, env.Ref, img)
		} else {
			err = f.L.Store.Create(ctx, img, 256<<20)
		}
		if err != nil {
			t.Fatalf("make image %s: %v", img, err)
		}
		t.Cleanup(func() {
			// Unmapped by then (the cleanups run in reverse), as Undeploy
			// removes a deployment's clones.
			if _, err := f.L.Store.RemoveUnmapped(context.Background(), img); err != nil {
				t.Errorf("remove image %s: %v", img, err)
			}
		})
		mid := id + "-" + kind
		if _, err := f.L.Mapper.MapAndMount(ctx, mapper.Image{Pool: f.L.Pool, Name: img}, paths[kind],
			mapper.MountOptions{Format: kind == "ckpt"}, mapper.WithID(mid)); err != nil {
			t.Fatalf("map and mount %s: %v", img, err)
		}
		t.Cleanup(func() {
			if err := f.L.Mapper.Release(context.Background(), mid); err != nil {
				t.Errorf("release %s: %v", mid, err)
			}
		})
	}
	return paths["env"], paths["ckpt"]
}

// RedisApp is redis-server on port 6379, ready once PING answers PONG
// (drivertest.RedisApp, named name, in environment env).
func RedisApp(name, env string, eng engine.Name) spec.App {
	a := drivertest.RedisApp(eng)
	a.Name, a.Env = name, env
	return a
}

// RedisAddr is where a deployment of RedisApp answers.
func RedisAddr(t testing.TB, dep deploy.Deployment) string {
	t.Helper()
	addr := dep.Ports[drivers.PortKey(6379, "tcp")]
	if addr == "" {
		t.Fatalf("deployment %s publishes no 6379/tcp: %v", dep.ID, dep.Ports)
	}
	return addr
}

// snapshot of what a deployment can leave on the node and in the pool.
// mine says whether what belongs to slot or deployment id of app is the
// fixture's: a spare slot only if its deployer named it (another PoP's
// agents on the same pool and dockerd make spares of their own).
func (f *Fixture) mine(app, id string) bool {
	return app != spec.SpareApp || f.named == nil || f.named.has(id)
}

// Leftovers is what a deployment can leave on the node and in the pool.
type Leftovers struct {
	Images     []string
	Mappings   []string
	Mounts     []string
	Containers []string
	Records    []string
	// Cached are the generations of the app in the node's checkpoint cache.
	Cached []string
	// Lowers are the node's read-only copies of the app's generations'
	// environments (their IDs).
	Lowers []string
}

// Leftovers reports what deployments of app left.
func (f *Fixture) Leftovers(t testing.TB, app string) Leftovers {
	t.Helper()
	ctx := context.Background()
	var lo Leftovers
	names, err := f.L.Store.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if !f.mine(app, strings.TrimSuffix(strings.TrimPrefix(n, catalog.InstancePrefix), "-env")) {
			continue
		}
		if strings.HasPrefix(n, catalog.InstancePrefix+app+"-") || strings.HasPrefix(n, catalog.GenPrefix+app+"-") {
			lo.Images = append(lo.Images, n)
		}
	}
	maps, err := f.L.Mapper.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range maps {
		lo.Mappings = append(lo.Mappings, m.ID)
	}
	lo.Mounts = MountsUnder(t, f.State)
	if f.RT != nil {
		sts, err := f.RT.List(ctx, map[string]string{runtime.LabelApp: app})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range sts {
			if f.mine(app, s.Deployment) {
				lo.Containers = append(lo.Containers, s.Name)
			}
		}
	}
	recs, err := f.D.Records().List()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.App == app {
			lo.Records = append(lo.Records, r.ID+" ("+string(r.Phase)+")")
		}
	}
	slots, err := f.D.Pool().Slots()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		if s.App == app {
			lo.Records = append(lo.Records, "slot "+s.ID+" ("+string(s.Phase)+")")
		}
	}
	// The files a pool slot keeps for the record of its deployment.
	spares, _ := filepath.Glob(filepath.Join(f.State, "deploy", "slots", app+"-*.spare"))
	for _, sp := range spares {
		lo.Records = append(lo.Records, "spare "+filepath.Base(sp))
	}
	cached, err := f.D.Checkpoints().Cached()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range cached {
		if e.App == app {
			lo.Cached = append(lo.Cached, e.Key.String())
		}
	}
	lowers, err := f.D.EnvCopies().Lowers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lowers {
		if l.App == app {
			lo.Lowers = append(lo.Lowers, l.ID)
		}
	}
	return lo
}

// OfLower reports whether a path or a command line is of a node's
// read-only copy of a generation's environment (its mapping, mount, loop
// device or rbd-fuse), which the node keeps while the generation is its
// app's current one: leak counts leave it out (TestSharedEnvReadPath
// checks its life).
func OfLower(s string) bool { return strings.Contains(s, "/"+deploy.LowerIDPrefix) }

// withoutLowers drops from lo what the node's copies of the app's
// generations' environments hold: their images, mappings and mounts.
func (lo Leftovers) withoutLowers(f *Fixture, t testing.TB) Leftovers {
	lowers, err := f.D.EnvCopies().Lowers()
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]bool{}
	for _, l := range lowers {
		if slices.Contains(lo.Lowers, l.ID) {
			held[l.ID], held[l.Image] = true, true
		}
	}
	keep := func(xs []string, ofLower func(string) bool) []string {
		var out []string
		for _, x := range xs {
			if !ofLower(x) {
				out = append(out, x)
			}
		}
		return out
	}
	lo.Images = keep(lo.Images, func(n string) bool { return held[n] })
	lo.Mappings = keep(lo.Mappings, func(id string) bool { return held[id] })
	lo.Mounts = keep(lo.Mounts, func(m string) bool { return held[filepath.Base(m)] })
	lo.Lowers = nil
	return lo
}

// FusePIDs returns the rbd-fuse processes whose command line (its
// arguments, the program first) match says to.
func FusePIDs(match func(argv []string) bool) []int {
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, c := range procs {
		b, _ := os.ReadFile(c)
		argv := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		if filepath.Base(argv[0]) != "rbd-fuse" || !match(argv) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(c))); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// MountsUnder lists the mount points below dir in our mount namespace.
func MountsUnder(t testing.TB, dir string) []string {
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

// Empty reports whether nothing is left.
func (lo Leftovers) Empty() bool {
	return len(lo.Images)+len(lo.Mappings)+len(lo.Mounts)+len(lo.Containers)+len(lo.Records)+len(lo.Cached)+len(lo.Lowers) == 0
}

// AssertNothingLeft fails t if deployments of app left anything (but
// the generation images, with keepGen).
func AssertNothingLeft(t testing.TB, f *Fixture, app string, keepGen bool) {
	t.Helper()
	lo := f.Leftovers(t, app)
	if keepGen {
		var rest []string
		for _, n := range lo.Images {
			if !strings.HasPrefix(n, catalog.GenPrefix) {
				rest = append(rest, n)
			}
		}
		lo.Images, lo.Cached = rest, nil
		// The node keeps its copy of a generation's environment with it.
		lo = lo.withoutLowers(f, t)
	}
	if !lo.Empty() {
		t.Errorf("left behind: %+v", lo)
	}
}

// RepoRoot is the repository's top directory, found from this file.
func RepoRoot() string {
	_, file, _, _ := goruntime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// UndeployAll removes what a failed test left of app's deployments and
// slots.
func (f *Fixture) UndeployAll(t testing.TB, app string) {
	slots, _ := f.D.Pool().Slots()
	for _, s := range slots {
		if s.App == app && s.Deployment == "" {
			if err := f.D.Pool().ReleaseSlot(context.Background(), s.ID); err != nil {
				t.Errorf("cleanup: release slot %s: %v", s.ID, err)
			}
		}
	}
	recs, _ := f.D.Records().List()
	for _, r := range recs {
		if r.App == app {
			if err := f.D.Undeploy(context.Background(), r.ID); err != nil {
				t.Errorf("cleanup: undeploy %s: %v", r.ID, err)
			}
		}
	}
}

// RemoveGenerations removes every checkpoint generation of app, waiting
// (up to a minute, as fogctl checkpoint rm does) while running agents drop
// their copies of a generation's environment.
func (f *Fixture) RemoveGenerations(t testing.TB, app string) {
	gens, _ := f.D.Checkpoints().Generations(context.Background(), app)
	for _, g := range gens {
		err := f.D.Checkpoints().RemoveGeneration(context.Background(), app, g.Gen)
		for start := time.Now(); errors.Is(err, catalog.ErrHeldByNodes) && time.Since(start) < time.Minute; {
			time.Sleep(500 * time.Millisecond)
			err = f.D.Checkpoints().RemoveGeneration(context.Background(), app, g.Gen)
		}
		if err != nil {
			t.Errorf("remove generation %d of %s: %v", g.Gen, app, err)
		}
	}
}

// BusyboxHTTPApp is busybox httpd on port 8080 in a NewBootFixture
// environment. At start it writes /www/index.html into its writable clone
// ("served by <container hostname>"), so each instance answers with its own
// page.
func BusyboxHTTPApp(name, env string) spec.App {
	return spec.App{
		Name: name, Env: env, Engine: engine.NameDMTCP,
		Command: []string{"/bin/sh", "-c",
			`busybox mkdir -p /www && echo "served by $HOSTNAME" > /www/index.html && exec busybox httpd -f -p 8080 -h /www`},
		Ports:     []spec.Port{{Port: 8080}},
		Ready:     spec.Readiness{Kind: spec.ReadyHTTP, Port: 8080, Path: "/", Timeout: spec.Duration(30 * time.Second)},
		Resources: spec.Resources{CPUs: 0.5, Memory: "64M"},
	}
}

// Identity implements Node: the identity file of deployment dep as its
// app reads it (spec.IdentityFile, read by `cat` inside the instance, as
// the app's user).
func (f *Fixture) Identity(ctx context.Context, t testing.TB, dep deploy.Deployment, user string) (spec.Identity, bool) {
	t.Helper()
	if dep.Handle == nil {
		t.Fatalf("deployment %s has no instance", dep.ID)
	}
	var dr drivers.Driver = f.Host
	if dep.Handle.Driver == f.Container.Name() {
		dr = f.Container
	}
	res, err := dr.Exec(ctx, *dep.Handle, drivers.Exec{Argv: []string{"cat", spec.IdentityFile}, User: user})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("cat %s in deployment %s: exit %d, %v: %s", spec.IdentityFile, dep.ID, res.ExitCode, err, res.Output)
	}
	var id spec.Identity
	if err := json.Unmarshal([]byte(res.Output), &id); err != nil {
		t.Fatalf("%s in deployment %s: %v: %q", spec.IdentityFile, dep.ID, err, res.Output)
	}
	return id, true
}

var _ Node = (*Fixture)(nil)

// Deployer implements Node.
func (f *Fixture) Deployer() *deploy.Deployer { return f.D }

// Store implements Node.
func (f *Fixture) Store() layering.Backend { return f.L.Store }

// SlotRecord implements Node.
func (f *Fixture) SlotRecord(id string) string {
	return filepath.Join(f.State, "deploy", "slots", id+".json")
}

// Weight implements Node.
func (f *Fixture) Weight(ctx context.Context, t testing.TB, ref string) int {
	t.Helper()
	if f.Container == nil || f.Container.Priority == nil {
		return -1
	}
	st, err := f.RT.Inspect(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	w, err := f.Container.Priority.Get(st.Pid)
	if err != nil {
		t.Fatalf("weights of container %s (pid %d): %v", ref, st.Pid, err)
	}
	return w.CPU
}

// CheckpointFiles implements Node.
func (f *Fixture) CheckpointFiles(eng engine.Name) string {
	facts, _ := engine.Lookup(eng)
	return facts.ImageFiles
}

// AssertNothingLeft implements Node.
func (f *Fixture) AssertNothingLeft(t testing.TB, app string, keepGen bool) {
	t.Helper()
	AssertNothingLeft(t, f, app, keepGen)
}
