package deploytest

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/cgroup"
	"github.com/fogdeploy/fogdeploy/internal/cgroup/cgrouptest"
	"github.com/fogdeploy/fogdeploy/internal/config"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/instancectl"
	"github.com/fogdeploy/fogdeploy/internal/overlay"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/fakestore"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper/fakemapper"
)

// UnitImage and UnitBootImage are the fake DMTCP and boot images of a
// Unit node (the boot image runs apps without an engine).
const (
	UnitImage     = "fogdeploy/dmtcp:fake"
	UnitBootImage = "fogdeploy/boot:fake"
)

// Unit is one node for unit tests of the deploy path: the Deployer over
// the file-backed fake store (fakestore), the fake mapper (fakemapper),
// the fake runtime with its fake DMTCP image (runtime.FakeDMTCP, which
// runs redis-server), in-memory cgroup weights, and instances' roots
// copied instead of mounted as overlays (overlay.Copy). It needs no root
// and no service. Its Env has what the deploy path checks of an
// environment: a glibc.
type Unit struct {
	D        *deploy.Deployer
	Images   *fakestore.Store
	Mapper   *fakemapper.Mapper
	Envs     *layering.Manager
	RT       *runtime.Fake
	Priority *cgrouptest.Fake
	Env      string

	cfg  deploy.Config
	deps deploy.Deps
}

// NewUnit returns a Unit node, and removes what it holds after the test.
func NewUnit(t testing.TB) *Unit {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	store, err := fakestore.New(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	mp := fakemapper.New(store)
	envs, err := layering.NewManager(store, mapper.Mounter{M: mp, Pool: UnitPool}, layering.DefaultManagerConfig(filepath.Join(dir, "work")), log)
	if err != nil {
		t.Fatal(err)
	}
	rt := runtime.NewFake()
	rt.AddLabelledImage(UnitImage, runtime.FakeDMTCP(), runtime.ImageConfig{Labels: map[string]string{
		drivers.DMTCPVersionLabel: "fake", drivers.DMTCPGlibcLabel: "2.36", drivers.CRIUVersionLabel: "fake", drivers.RecycleLabel: "dmtcp,criu", drivers.SourceLaterLabel: "1", drivers.RootLaterLabel: "1"}})
	rt.AddLabelledImage(UnitBootImage, runtime.FakeDMTCP(), runtime.ImageConfig{})
	u := &Unit{Images: store, Mapper: mp, Envs: envs, RT: rt, Priority: cgrouptest.NewFake(), Env: "unit-env"}
	u.Priority.Initial, u.Priority.Alive = u.createdWeights, rt.Alive
	ctr := &drivers.Container{RT: rt, Image: UnitImage, BootImage: UnitBootImage, StopTimeout: 2 * time.Second, Priority: u.Priority, Limiter: u.Priority}
	u.cfg = deploy.Config{StateDir: filepath.Join(dir, "deploy"), Pool: UnitPool, Node: "unit",
		Limits: config.DefaultLimits().Spec()}
	u.deps = deploy.Deps{Store: store, Envs: envs, Mapper: mp, Container: ctr, Roots: &overlay.Copy{}, Log: log}
	if u.D, err = deploy.New(u.cfg, u.deps); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "rootfs")
	libc := filepath.Join(root, "lib", "x86_64-linux-gnu", "libc.so.6")
	if err := os.MkdirAll(filepath.Dir(libc), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(libc, []byte("GNU C Library (Debian GLIBC 2.36-9+deb12u4) stable release version 2.36.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := envs.Import(ctx, u.Env, layering.Source{Dir: root}, layering.ImportOptions{Size: 64 << 20}); err != nil {
		t.Fatalf("import environment %s: %v", u.Env, err)
	}
	return u
}

// UnitPool is the pool name of a Unit node's images.
const UnitPool = "unit"

// Reopen returns a new Deployer over the node's state and components, as
// a restarted agent has.
func (u *Unit) Reopen(t testing.TB) *deploy.Deployer {
	t.Helper()
	return reopen(t, u.cfg, u.deps)
}

// ReopenWith is Reopen with the configuration that change makes.
func (u *Unit) ReopenWith(t testing.TB, change func(*deploy.Config)) *deploy.Deployer {
	t.Helper()
	cfg := u.cfg
	change(&cfg)
	return reopen(t, cfg, u.deps)
}

// ReopenMapping implements Node.
func (u *Unit) ReopenMapping(t testing.TB, wrap func(deploy.Mapper) deploy.Mapper) *deploy.Deployer {
	t.Helper()
	deps := u.deps
	deps.Mapper = wrap(deps.Mapper)
	return reopen(t, u.cfg, deps)
}

// RedisApp is an app of engine eng on the node's environment whose
// command is the fake image's redis-server.
func (u *Unit) RedisApp(name string, eng engine.Name) spec.App { return RedisApp(name, u.Env, eng) }

// createdWeights are the weights of the fake container whose process is
// pid, as it was created: cpu.shares as cgroup v2 maps them to a weight.
func (u *Unit) createdWeights(pid int) cgroup.Weights {
	cs, _ := u.RT.List(context.Background(), nil)
	for _, c := range cs {
		if sp, err := u.RT.SpecOf(c.ID); err == nil && c.Pid == pid && sp.CPUShares > 0 {
			return cgroup.Weights{CPU: int(1 + (sp.CPUShares-2)*9999/262142), IO: cgroup.DefaultWeight}
		}
	}
	return cgroup.Normal
}

// Deployer implements Node.
func (u *Unit) Deployer() *deploy.Deployer { return u.D }

// Store implements Node.
func (u *Unit) Store() layering.Backend { return u.Images }

// StateDir is the deployer's state directory.
func (u *Unit) StateDir() string { return u.cfg.StateDir }

// SlotRecord implements Node.
func (u *Unit) SlotRecord(id string) string {
	return filepath.Join(u.cfg.StateDir, "slots", id+".json")
}

// Weight implements Node.
func (u *Unit) Weight(ctx context.Context, t testing.TB, ref string) int {
	t.Helper()
	st, err := u.RT.Inspect(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	w, err := u.Priority.Get(st.Pid)
	if err != nil {
		t.Fatalf("weights of container %s (pid %d): %v", ref, st.Pid, err)
	}
	return w.CPU
}

// Identity implements Node: the identity file in the instance's control
// directory, which the fake image's entrypoint says it bound where the app
// reads it, as the real one binds it.
func (u *Unit) Identity(_ context.Context, t testing.TB, dep deploy.Deployment, _ string) (spec.Identity, bool) {
	t.Helper()
	if dep.Handle == nil {
		t.Fatalf("deployment %s has no instance", dep.ID)
	}
	b, err := os.ReadFile(filepath.Join(dep.Handle.CtlPath, instancectl.IdentityDir, filepath.Base(spec.IdentityFile)))
	if err != nil {
		t.Fatalf("identity of deployment %s: %v", dep.ID, err)
	}
	var id spec.Identity
	if err := json.Unmarshal(b, &id); err != nil {
		t.Fatalf("identity of deployment %s: %v: %q", dep.ID, err, b)
	}
	return id, true
}

// CheckpointFiles implements Node: the fake image's checkpoint file.
func (u *Unit) CheckpointFiles(engine.Name) string { return runtime.FakeDMTCPImageFile }

// AssertNothingLeft implements Node: no image of app (but its
// generations' with keepGen) or of any instance, no mapping, container,
// deployment record or slot.
func (u *Unit) AssertNothingLeft(t testing.TB, app string, keepGen bool) {
	t.Helper()
	ctx := context.Background()
	// With its generations, the node keeps its copies of their
	// environments.
	lower := map[string]bool{}
	if keepGen {
		lowers, err := u.D.EnvCopies().Lowers()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range lowers {
			lower[l.ID], lower[l.Image] = true, true
		}
	}
	var held []string
	names, err := u.Images.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if strings.HasPrefix(n, catalog.InstancePrefix) && !lower[n] || !keepGen && strings.HasPrefix(n, catalog.GenPrefix+app+"-") {
			held = append(held, "image "+n)
		}
	}
	maps, _ := u.Mapper.List()
	for _, m := range maps {
		if !lower[m.ID] {
			held = append(held, "mapping "+m.ID+" of "+m.Image.String())
		}
	}
	cs, _ := u.RT.List(ctx, nil)
	for _, c := range cs {
		held = append(held, "container "+c.Name)
	}
	deps, _ := u.D.Records().List()
	for _, d := range deps {
		held = append(held, "deployment "+d.ID)
	}
	slots, _ := u.D.Pool().Slots()
	for _, s := range slots {
		held = append(held, "slot "+s.ID)
	}
	if len(held) > 0 {
		t.Errorf("left behind: %v", held)
	}
}
