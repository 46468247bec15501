package deploy_test

import (
	"context"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"

	"github.com/fogdeploy/fogdeploy/internal/cgroup"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

func TestSpareSlotDMTCPContainer(t *testing.T) { testSpareSlot(t, engine.NameDMTCP) }
func TestSpareSlotCRIUContainer(t *testing.T)  { testSpareSlot(t, engine.NameCRIU) }

// testSpareSlot is what a spare slot promises: made for no app, it
// answers nothing; a restore of an app without a pool slot of its own
// takes it and runs no clone, map, mount or container of its own, only
// attach, start, ready and bind; the instance has the checkpoint's state,
// its own port, and the normal CPU weight; a restore with no spare left
// provisions its own slot; released spares and undeployed instances leave
// nothing.
func testSpareSlot(t *testing.T, eng engine.Name) {
	f, ctx, app := redisFixture(t, "container", eng, "vacant")
	// Limits of its own, which a spare made with the node's takes when
	// it is assigned.
	app.Resources = spec.Resources{CPUs: 1.5, Memory: "256MiB"}
	d := f.D
	limiter, limErr := cgroup.NewLimiter(cgroup.Paths{})
	t.Cleanup(func() {
		if _, err := d.Pool().ReleaseSpares(context.Background(), "", -1); err != nil {
			t.Errorf("cleanup: release spares: %v", err)
		}
	})
	if err := d.Pool().MakesSpares(ctx, eng); err != nil {
		t.Fatalf("this node makes no spares of %s: %v", eng, err)
	}

	first, err := d.Deploy(ctx, app, deploy.Options{Prepare: func(ctx context.Context, tg deploy.Target) error {
		_, err := testenv.RedisDo(ctx, nil, tg.Ports["6379/tcp"], "SET", "greeting", "from the checkpoint")
		return err
	}})
	if err != nil {
		t.Fatalf("first deploy: %v", err)
	}

	var spares []deploy.Slot
	for range 2 {
		s, err := d.Pool().ProvisionSpare(ctx, eng)
		if err != nil {
			t.Fatalf("provision a spare: %v", err)
		}
		t.Logf("spare %s: %s", s.ID, s.Timings)
		spares = append(spares, s)
	}
	listed, err := d.Pool().SpareSlots()
	if err != nil || len(listed) != 2 || listed[0].Phase != deploy.SlotIdle || listed[0].App != "" || listed[0].Spare.Engine != eng {
		t.Fatalf("spare slots = %+v, %v; want 2 idle of engine %s and no app", listed, err, eng)
	}
	if pool, _ := d.Pool().PoolSlots(); len(pool) != 0 {
		t.Errorf("spares listed as the pool's slots: %+v", pool)
	}
	for _, step := range []deploy.Step{deploy.StepClone, deploy.StepMap, deploy.StepMount, deploy.StepContainer} {
		if !hasPhase(spares[0].Timings, step) {
			t.Errorf("spare %s timings %s lack %q", spares[0].ID, spares[0].Timings, step)
		}
	}
	// Its generic port answers nothing: no app runs in it.
	if addr := spares[0].Handle.Ports["61000/tcp"]; addr == "" {
		t.Errorf("spare %s publishes no generic port: %+v", spares[0].ID, spares[0].Handle.Ports)
	} else if got, err := testenv.RedisDo(ctx, nil, addr, "PING"); err == nil {
		t.Errorf("spare %s answered PING with %q before any deploy", spares[0].ID, got)
	}
	if w := f.Weight(ctx, t, spares[0].Handle.Ref); w != -1 && w != cgroup.Background.CPU {
		t.Errorf("spare %s has CPU weight %d; want %d (background)", spares[0].ID, w, cgroup.Background.CPU)
	}

	var deps []deploy.Deployment
	for i, want := range spares {
		var phases []string
		dep, err := d.Deploy(ctx, app, deploy.Options{Progress: func(p string, _ time.Duration) { phases = append(phases, p) }})
		if err != nil {
			t.Fatalf("restore %d into a spare: %v", i+1, err)
		}
		deps = append(deps, dep)
		t.Logf("restore %d into spare %s: %s (total %s, the engine's restart %.0f ms)", i+1, want.ID, dep.Timings, dep.Total().Round(time.Millisecond), dep.EngineReadyMS)
		if dep.Pool != spec.PoolSpare || dep.Slot != want.ID {
			t.Errorf("restore %d: pool %q slot %s; want the oldest spare %s", i+1, dep.Pool, dep.Slot, want.ID)
		}
		for _, step := range append(slices.Clone(deploy.ProvisionSteps), deploy.StepContainer) {
			if hasPhase(dep.Timings, step) || slices.Contains(phases, string(step)) {
				t.Errorf("restore %d into a spare waited for %q: %s", i+1, step, dep.Timings)
			}
		}
		for _, step := range []deploy.Step{deploy.StepAttach, deploy.StepStart, deploy.StepReady, deploy.StepBind} {
			if !hasPhase(dep.Timings, step) {
				t.Errorf("restore %d timings %s lack %q", i+1, dep.Timings, step)
			}
		}
		if dep.Handle == nil || dep.Handle.Ref != want.Handle.Ref || !slices.Equal(dep.Images, want.Images) {
			t.Errorf("restore %d owns %v (handle %+v); want spare %s's %v", i+1, dep.Images, dep.Handle, want.ID, want.Images)
		}
		if _, ok := dep.Ports["6379/tcp"]; !ok || len(dep.Ports) != 1 {
			t.Errorf("restore %d ports %v; want the app's 6379/tcp only", i+1, dep.Ports)
		}
		addr := deploytest.RedisAddr(t, dep)
		if got, err := testenv.RedisDo(ctx, nil, addr, "GET", "greeting"); err != nil || got != "from the checkpoint" {
			t.Errorf("restore %d: GET greeting = %q, %v; want the checkpoint's", i+1, got, err)
		}
		if _, err := testenv.RedisDo(ctx, nil, addr, "SET", "mine", dep.ID); err != nil {
			t.Errorf("restore %d: SET: %v", i+1, err)
		}
		if w := f.Weight(ctx, t, dep.Handle.Ref); w != -1 && w != cgroup.Normal.CPU {
			t.Errorf("restore %d: CPU weight %d; want %d (normal)", i+1, w, cgroup.Normal.CPU)
		}
		if limErr == nil {
			// The kernel bounds the instance by its app's limits, not the
			// spare's.
			got, err := limiter.Limits(dep.Handle.Pid)
			if err != nil || got.MemoryBytes != 256<<20 || got.CPUs != 1.5 || got.Pids != want.Spare.Limits.Pids {
				t.Errorf("restore %d: its cgroup's limits %+v, %v; want memory 256 MiB, 1.5 CPUs and the node's %d processes", i+1, got, err, want.Spare.Limits.Pids)
			}
		}
		if _, err := d.Pool().LoadSlot(want.ID); !errors.Is(err, deploy.ErrNoSlot) {
			t.Errorf("spare %s still has a record after deployment %s bound it (%v)", want.ID, dep.ID, err)
		}
	}
	// Two instances, one state each.
	for _, dep := range deps {
		if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, dep), "GET", "mine"); err != nil || got != dep.ID {
			t.Errorf("%s: GET mine = %q, %v; want its own", dep.ID, got, err)
		}
	}
	// An instance in a spare keeps its state through a suspend and a
	// resume (its writable image and checkpoint volume are a spare's).
	susp, err := d.Suspensions().Suspend(ctx, deps[0].ID, app, deploy.SuspendOptions{})
	if err != nil {
		t.Fatalf("suspend the instance of a spare: %v", err)
	}
	if err := d.Suspensions().Forget(deps[0].ID); err != nil { // as the agent does once etcd has the suspension
		t.Fatal(err)
	}
	resumed, err := d.Resume(ctx, app, deps[0].ID, susp, deploy.Options{})
	if err != nil {
		t.Fatalf("resume the instance of a spare: %v", err)
	}
	d.Suspensions().DropSuspension(ctx, resumed.ID, susp)
	if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, resumed), "GET", "mine"); err != nil || got != resumed.ID {
		t.Errorf("%s after suspend and resume: GET mine = %q, %v; want its own", resumed.ID, got, err)
	}
	deps[0] = resumed

	// A spare whose container is gone (stopped behind the agent's back):
	// the restore that takes it releases it and provisions its own slot.
	gone, err := d.Pool().ProvisionSpare(ctx, eng)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.RT.Stop(ctx, gone.Handle.Ref, time.Second); err != nil {
		t.Fatal(err)
	}
	fell, err := d.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatalf("restore whose spare's container is gone: %v", err)
	}
	deps = append(deps, fell)
	if fell.Pool != spec.PoolMiss || fell.Slot == gone.ID || !hasPhase(fell.Timings, deploy.StepClone) {
		t.Errorf("restore whose spare's container is gone: pool %q slot %s, timings %s; want a slot of its own", fell.Pool, fell.Slot, fell.Timings)
	}
	if _, err := d.Pool().LoadSlot(gone.ID); !errors.Is(err, deploy.ErrNoSlot) {
		t.Errorf("the spare whose container was gone is still there (%v)", err)
	}
	if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, fell), "GET", "greeting"); err != nil || got != "from the checkpoint" {
		t.Errorf("restore whose spare's container is gone: GET greeting = %q, %v", got, err)
	}

	// No spare left: the next restore provisions its own slot.
	miss, err := d.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	deps = append(deps, miss)
	if miss.Pool != spec.PoolMiss || !hasPhase(miss.Timings, deploy.StepClone) {
		t.Errorf("restore with no spare: pool %q, timings %s; want a miss that provisions", miss.Pool, miss.Timings)
	}

	// A spare made for the other engine is not taken.
	other := engine.NameCRIU
	if eng == engine.NameCRIU {
		other = engine.NameDMTCP
	}
	if d.Pool().MakesSpares(ctx, other) == nil {
		s, err := d.Pool().ProvisionSpare(ctx, other)
		if err != nil {
			t.Fatalf("a spare of %s: %v", other, err)
		}
		dep, err := d.Deploy(ctx, app, deploy.Options{})
		if err != nil {
			t.Fatal(err)
		}
		deps = append(deps, dep)
		if dep.Pool == spec.PoolSpare || dep.Slot == s.ID {
			t.Errorf("a restore under %s took spare %s of %s", eng, s.ID, other)
		}
	}
	if _, err := d.Pool().ReleaseSpares(ctx, "", -1); err != nil {
		t.Fatal(err)
	}

	// A process killed with a spare idle, and another with a spare
	// attached to a deployment not yet running: the next one releases
	// both whole, and the deployment's record says it failed.
	if _, err := d.Pool().ProvisionSpare(ctx, eng); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Pool().ProvisionSpare(ctx, eng); err != nil {
		t.Fatal(err)
	}
	g, err := d.Checkpoints().Latest(ctx, app.Name)
	if err != nil {
		t.Fatal(err)
	}
	attached, err := deploy.AttachSpare(ctx, d, app, g, app.Name+"-cut")
	if err != nil {
		t.Fatalf("attach a spare: %v", err)
	}
	if attached.Phase != deploy.SlotClaimed || attached.Deployment != app.Name+"-cut" {
		t.Errorf("attached spare %s: phase %s deployment %q; want claimed by %s", attached.ID, attached.Phase, attached.Deployment, app.Name+"-cut")
	}
	d2 := f.Reopen(t)
	released, err := d2.Pool().RecoverSlots(ctx)
	if err != nil || len(released) != 2 || !slices.Contains(released, attached.ID) {
		t.Errorf("RecoverSlots = %v, %v; want both spares released, %s among them", released, err, attached.ID)
	}
	if err := d2.Undeploy(ctx, app.Name+"-cut"); err != nil {
		t.Errorf("undeploy the deployment cut short: %v", err)
	}
	d = d2
	for _, dep := range append(deps, first) {
		if err := d.Undeploy(ctx, dep.ID); err != nil {
			t.Errorf("undeploy %s: %v", dep.ID, err)
		}
	}
	f.AssertNothingLeft(t, app.Name, true)
	assertNoSpareLeft(t, f)

	// An app that does not fit the idle spare (more ports than it
	// publishes) takes a slot of its own, and its status says why.
	if _, err := d.Pool().ProvisionSpare(ctx, eng); err != nil {
		t.Fatal(err)
	}
	wide := deploytest.RedisApp("wide-"+app.Name, f.Env, eng)
	for p := range deploy.DefaultSparePorts {
		wide.Ports = append(wide.Ports, spec.Port{Port: 7000 + p})
	}
	t.Cleanup(func() { f.UndeployAll(t, wide.Name); f.RemoveGenerations(t, wide.Name) })
	unfit, err := d.Deploy(ctx, wide, deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if unfit.Pool != spec.PoolMiss || !strings.Contains(unfit.SpareReason, "ports") {
		t.Errorf("restore of an app with more ports than a spare publishes beside an idle spare: pool %q, spare reason %q; want a miss that says why", unfit.Pool, unfit.SpareReason)
	}
	if err := d.Undeploy(ctx, unfit.ID); err != nil {
		t.Error(err)
	}

	// An app that stops with another signal than the spare's container
	// (SIGTERM) takes the spare, and its undeploy stops it with its own.
	sig := deploytest.RedisApp("sig-"+app.Name, f.Env, eng)
	sig.StopSignal = "SIGQUIT"
	t.Cleanup(func() { f.UndeployAll(t, sig.Name); f.RemoveGenerations(t, sig.Name) })
	sigFirst, err := d.Deploy(ctx, sig, deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Undeploy(ctx, sigFirst.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Pool().ProvisionSpare(ctx, eng); err != nil {
		t.Fatal(err)
	}
	quit, err := d.Deploy(ctx, sig, deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if quit.Pool != spec.PoolSpare {
		t.Errorf("restore of an app that stops with SIGQUIT beside an idle spare: pool %q, spare reason %q; want the spare", quit.Pool, quit.SpareReason)
	}
	if quit.Handle == nil {
		t.Fatalf("deployment %s has no instance", quit.ID)
	}
	ref := quit.Handle.Ref
	since := time.Now()
	if err := d.Undeploy(ctx, quit.ID); err != nil {
		t.Error(err)
	}
	if got := stopSignals(ctx, t, ref, since); !slices.Contains(got, "3") {
		t.Errorf("undeploy of an app that stops with SIGQUIT in a spare: its container was sent signals %v; want SIGQUIT (3)", got)
	}
	if _, err := d.Pool().ReleaseSpares(ctx, "", -1); err != nil {
		t.Fatal(err)
	}
	newerThanKnown(ctx, t, f, d, app)
}

// newerThanKnown: a restore into a spare takes the generation that its
// node's last lookup of app gave without looking it up again, and a
// generation sealed since (here by the node's own Checkpoint, which no
// deploy sees) is the one it restores all the same, with its state.
func newerThanKnown(ctx context.Context, t *testing.T, f *deploytest.Fixture, d *deploy.Deployer, app spec.App) {
	t.Helper()
	if _, err := d.Pool().ProvisionSpare(ctx, app.Engine); err != nil {
		t.Fatal(err)
	}
	looked, err := d.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Undeploy(ctx, looked.ID); err != nil {
		t.Fatal(err)
	}
	newer, err := d.Checkpoint(ctx, app, deploy.CheckpointOptions{Prepare: func(ctx context.Context, tg deploy.Target) error {
		_, err := testenv.RedisDo(ctx, nil, tg.Ports["6379/tcp"], "SET", "greeting", "from the newer checkpoint")
		return err
	}})
	if err != nil {
		t.Fatalf("a newer generation: %v", err)
	}
	for range 2 { // the first may be attached to the older one, then released
		if _, err := d.Pool().ProvisionSpare(ctx, app.Engine); err != nil {
			t.Fatal(err)
		}
	}
	dep, err := d.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatalf("restore after generation %d was sealed: %v", newer.Gen, err)
	}
	t.Cleanup(func() { _ = d.Undeploy(context.Background(), dep.ID) })
	if dep.Gen != newer.Gen || dep.Gen == looked.Gen || dep.Pool != spec.PoolSpare {
		t.Errorf("restore after generation %d was sealed (the node last looked up %d): generation %d, pool %q; want the newer one in a spare",
			newer.Gen, looked.Gen, dep.Gen, dep.Pool)
	}
	if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, dep), "GET", "greeting"); err != nil || got != "from the newer checkpoint" {
		t.Errorf("restore after generation %d was sealed: GET greeting = %q, %v; want the newer checkpoint's", newer.Gen, got, err)
	}
	if err := d.Undeploy(ctx, dep.ID); err != nil {
		t.Error(err)
	}
	if _, err := d.Pool().ReleaseSpares(ctx, "", -1); err != nil {
		t.Fatal(err)
	}
	assertNoSpareLeft(t, f)
}

// stopSignals lists the signals dockerd sent container ref since then (its
// kill events), by number.
func stopSignals(ctx context.Context, t *testing.T, ref string, since time.Time) []string {
	t.Helper()
	cli := testenv.DockerClient(t)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	msgs, errs := cli.Events(ctx, events.ListOptions{
		Since: strconv.FormatInt(since.Add(-time.Second).Unix(), 10), Until: strconv.FormatInt(time.Now().Add(time.Second).Unix(), 10),
		Filters: filters.NewArgs(filters.Arg("container", ref), filters.Arg("event", "kill")),
	})
	var sigs []string
	for {
		select {
		case m := <-msgs:
			sigs = append(sigs, m.Actor.Attributes["signal"])
		case err := <-errs:
			if err != nil && !errors.Is(err, io.EOF) {
				t.Fatalf("docker events of %s: %v", ref, err)
			}
			return sigs
		}
	}
}

// assertNoSpareLeft fails t if the node or the pool holds anything of a
// spare slot: an image, a mapping, a mount, a container or a record.
func assertNoSpareLeft(t *testing.T, f *deploytest.Fixture) {
	t.Helper()
	lo := f.Leftovers(t, spec.SpareApp)
	ofSpare := func(xs []string) []string {
		var out []string
		for _, x := range xs {
			if strings.Contains(x, spec.SpareApp+"-s") {
				out = append(out, x)
			}
		}
		return out
	}
	lo.Mappings, lo.Mounts = ofSpare(lo.Mappings), ofSpare(lo.Mounts)
	if slots, _ := f.D.Pool().SpareSlots(); len(slots) > 0 {
		t.Errorf("spare slots left: %+v", slots)
	}
	if !lo.Empty() {
		t.Errorf("left behind of spare slots: %+v", lo)
	}
}

// TestSpareFits: what a spare refuses, each with why.
func TestSpareFits(t *testing.T) {
	c := &drivers.Container{}
	lim := spec.Limits{Pids: 512, OpenFiles: 1024}
	sp := drivers.Spare{ID: "spare-s1", Engine: engine.NameDMTCP, MntPath: "/x/mnt", CtlPath: "/x/ctl", Ports: 2, Limits: lim}
	redis := spec.App{Name: "redis", Engine: engine.NameDMTCP, Ports: []spec.Port{{Port: 6379}}}
	run := func(a spec.App) drivers.Run {
		return drivers.Run{Mode: drivers.RunRestart, ID: "d1", App: a, Limits: lim}
	}
	if err := c.Fits(sp, run(redis)); err != nil {
		t.Fatalf("redis does not fit: %v", err)
	}
	quit := redis
	quit.StopSignal = "SIGQUIT" // stopped with it at undeploy (Handle.StopSignal)
	if err := c.Fits(sp, run(quit)); err != nil {
		t.Fatalf("an app that stops with SIGQUIT does not fit: %v", err)
	}
	for name, a := range map[string]spec.App{
		"engine":  {Name: "a", Engine: engine.NameCRIU, Ports: redis.Ports},
		"network": {Name: "a", Ports: redis.Ports, Network: "shop"},
		"ports":   {Name: "a", Ports: []spec.Port{{Port: 1}, {Port: 2}, {Port: 3}}},
		"udp":     {Name: "a", Ports: []spec.Port{{Port: 53, Proto: "udp"}}},
		"generic": {Name: "a", Ports: []spec.Port{{Port: 61001}}},
		"memory":  {Name: "a", Resources: spec.Resources{Memory: "64MiB"}},
		"cpus":    {Name: "a", Resources: spec.Resources{CPUs: 0.5}},
	} {
		if err := c.Fits(sp, run(a)); !errors.Is(err, drivers.ErrUnfit) {
			t.Errorf("%s: Fits = %v; want ErrUnfit", name, err)
		}
	}
	if err := c.Fits(sp, drivers.Run{Mode: drivers.RunLaunch, App: redis, Limits: lim}); !errors.Is(err, drivers.ErrUnfit) {
		t.Errorf("a launch: Fits = %v; want ErrUnfit", err)
	}
}

// savedFilesServer answers GET / with a token and what it wrote, before
// its checkpoint, into a file it deleted and holds open: DMTCP saves such
// a file beside its checkpoint image (ckpt_*_files/, as PostgreSQL's
// shared memory segments) and puts it back at a restore.
var savedFilesServer = []string{"python3", "-c", `import http.server, os, secrets
token = secrets.token_hex(8).encode()
gone = os.open("/tmp/fog-deleted", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
os.write(gone, token[::-1])
os.unlink("/tmp/fog-deleted")
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = token + b" " + os.pread(gone, 16, 0)
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("0.0.0.0", 8000), H).serve_forever()`}

// TestSpareSlotSavedFiles: an app whose checkpoint carries a file saved
// beside its image (a deleted one it holds open) restores into a spare
// slot as into a slot of its own: the same bytes in the file, and nothing of the spare left after its undeploy. Under
// each engine, on Ceph and Docker.
func TestSpareSlotSavedFiles(t *testing.T) {
	f := deploytest.NewPythonFixture(t)
	for _, eng := range spec.Engines {
		t.Run(string(eng), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			d := f.D
			if err := d.Pool().MakesSpares(ctx, eng); err != nil {
				t.Fatalf("this node makes no spares of %s: %v", eng, err)
			}
			app := tokenApp("saved-"+string(eng), f.Env)
			app.Engine, app.Command = eng, savedFilesServer
			t.Cleanup(func() { f.UndeployAll(t, app.Name); f.RemoveGenerations(t, app.Name) })
			first, err := d.Deploy(ctx, app, deploy.Options{})
			if err != nil {
				t.Fatalf("first deploy (boot, checkpoint, restore): %v", err)
			}
			want := getToken(t, first)
			if tok, rev, ok := strings.Cut(want, " "); !ok || len(tok) != 16 || rev != reverse(tok) {
				t.Fatalf("the first deploy answers %q; want a token and its reverse", want)
			}
			if _, err := d.Pool().ProvisionSpare(ctx, eng); err != nil {
				t.Fatalf("provision a spare: %v", err)
			}
			dep, err := d.Deploy(ctx, app, deploy.Options{})
			if err != nil {
				t.Fatalf("restore into a spare: %v", err)
			}
			if dep.Pool != spec.PoolSpare {
				t.Errorf("restore beside an idle spare: pool %q (spare reason %q); want the spare", dep.Pool, dep.SpareReason)
			}
			if got := getToken(t, dep); got != want {
				t.Errorf("restore into a spare answers %q; want the checkpoint's %q", got, want)
			}
			for _, x := range []deploy.Deployment{dep, first} {
				if err := d.Undeploy(ctx, x.ID); err != nil {
					t.Errorf("undeploy %s: %v", x.ID, err)
				}
			}
			assertNoSpareLeft(t, f)
		})
	}
}

// reverse is s, its bytes in the other order.
func reverse(s string) string {
	b := []byte(s)
	slices.Reverse(b)
	return string(b)
}

// TestReleaseSparesFinishes: a spare whose release fails (its mapping's
// release answered with an error, as a call whose answer was lost) stays
// recorded as Releasing, no idle spare that a restore could take, and the
// next ReleaseSpares of its engine releases it although asked to release
// none: no spare stays half released until the agent's next start.
func TestReleaseSparesFinishes(t *testing.T) {
	f, ctx, _ := redisFixture(t, "container", engine.NameDMTCP, "sparefin")
	eng := engine.NameDMTCP
	hook := &releaseHook{}
	d := f.ReopenMapping(t, func(m deploy.Mapper) deploy.Mapper { hook.Mapper = m; return hook })
	t.Cleanup(func() { _, _ = d.Pool().ReleaseSpares(context.Background(), "", -1) })
	if err := d.Pool().MakesSpares(ctx, eng); err != nil {
		t.Fatalf("this node makes no spares of %s: %v", eng, err)
	}
	s, err := d.Pool().ProvisionSpare(ctx, eng)
	if err != nil {
		t.Fatal(err)
	}
	hook.set(func(rctx context.Context, release func(context.Context) error) error {
		if err := release(rctx); err != nil {
			return err
		}
		return errors.New("the cluster did not answer")
	})
	if ids, err := d.Pool().ReleaseSpares(ctx, eng, -1); err == nil || len(ids) != 0 {
		t.Errorf("ReleaseSpares whose release fails = %v, %v; want the error, nothing released", ids, err)
	}
	if spares, err := d.Pool().SpareSlots(); err != nil || len(spares) != 1 || spares[0].ID != s.ID || spares[0].Phase != deploy.SlotReleasing {
		t.Fatalf("spare slots after a failed release = %+v, %v; want %s Releasing", spares, err, s.ID)
	}
	if ids, err := d.Pool().ReleaseSpares(ctx, engine.NameCRIU, -1); err != nil || len(ids) != 0 {
		t.Errorf("ReleaseSpares of the other engine = %v, %v; want nothing released", ids, err)
	}
	if ids, err := d.Pool().ReleaseSpares(ctx, eng, 0); err != nil || !slices.Equal(ids, []string{s.ID}) {
		t.Errorf("the next ReleaseSpares = %v, %v; want %s, whose release failed, released", ids, err, s.ID)
	}
	assertNoSpareLeft(t, f)
}
