//go:build !no_ceph

package bench

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/adaptive"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/evaluation"
	"github.com/fogdeploy/fogdeploy/internal/gencache"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/cephstore"
)

// The evaluation's knobs, set by `make bench` (scripts/bench.sh).
const (
	envRun     = "FOGDEPLOY_BENCH"         // 1: run the evaluation
	envApps    = "APPS"                    // comma-separated subset of the catalog
	envReps    = "BENCH_REPS"              // repetitions per measurement (default 5)
	envOut     = "FOGDEPLOY_BENCH_RESULTS" // results root (default bench/results)
	envABSecs  = "BENCH_AB_SECONDS"        // seconds per ab run (default 5)
	namePrefix = "bench-"                  // generations of the evaluation: bench-<app>-g<N>
)

// catalog is the order of the evaluation's apps (configs/apps/<name>.yaml).
var catalog = []string{"redis", "pyhttp", "nginx", "postgres", "mariadb", "tomcat", "pgindex", "codesearch", "routes", "fleet"}

var (
	interferenceConcurrency = []int{10, 100, 200, 500, 1000}
	simultaneous            = []int{1, 2, 4, 8}
)

type evalConfig struct {
	apps   []string
	reps   int
	out    string
	abSecs int
}

func evalConfigFromEnv() (evalConfig, error) {
	c := evalConfig{apps: catalog, reps: 5, out: filepath.Join(deploytest.RepoRoot(), "bench", "results"), abSecs: 5}
	if s := os.Getenv(envApps); s != "" {
		c.apps = nil
		for _, a := range strings.Split(s, ",") {
			a = strings.TrimSpace(a)
			if !slices.Contains(catalog, a) {
				return c, fmt.Errorf("%s: unknown app %q: pick from %s", envApps, a, strings.Join(catalog, ","))
			}
			if !slices.Contains(c.apps, a) {
				c.apps = append(c.apps, a)
			}
		}
	}
	for _, k := range []struct {
		name    string
		dst     *int
		min, mx int
	}{{envReps, &c.reps, 1, 50}, {envABSecs, &c.abSecs, 1, 120}} {
		if s := os.Getenv(k.name); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < k.min || n > k.mx {
				return c, fmt.Errorf("%s=%q: want a whole number from %d to %d", k.name, s, k.min, k.mx)
			}
			*k.dst = n
		}
	}
	if s := os.Getenv(envOut); s != "" {
		c.out = s
	}
	return c, nil
}

func loadApp(name string) (spec.App, error) {
	f, err := os.Open(filepath.Join(deploytest.RepoRoot(), "configs", "apps", name+".yaml"))
	if err != nil {
		return spec.App{}, err
	}
	defer f.Close()
	app, err := spec.ParseApp(f)
	if err != nil {
		return spec.App{}, fmt.Errorf("configs/apps/%s.yaml: %w", name, err)
	}
	return app, nil
}

// TestEvaluation is fogdeploy's evaluation over the app catalog: per app,
// plain boots, first deploys (boot + checkpoint) and restores, with the
// state written before each checkpoint read back from every restore; then
// simultaneous restores and the interference of deployments with nginx
// under ab. It runs from `make bench`, which builds the environments
// first, and writes bench/results/<timestamp>/.
func TestEvaluation(t *testing.T) {
	if os.Getenv(envRun) != "1" {
		t.Skipf("the evaluation runs from `make bench` (%s=1)", envRun)
	}
	cfg, err := evalConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	start := time.Now()
	dir := filepath.Join(cfg.out, start.UTC().Format("20060102-150405"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// The node logs to a file, as an agent does: through the test's
	// output every line would cost the CPU that simultaneous pool hits
	// share.
	agentLog, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = agentLog.Close() })
	t.Logf("the node's log: %s", agentLog.Name())
	f := deploytest.NewNodeFixtureWith(t, deploytest.Options{Log: agentLog})
	res := evaluation.Results{Started: start.UTC(), Host: hostInfo(ctx, t, f)}

	apps := map[string]spec.App{}
	for _, name := range cfg.apps {
		app, err := loadApp(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.L.Manager.Get(ctx, app.Env); err != nil {
			t.Fatalf("app %s: environment %q: %v (make bench builds it: `bin/fogctl env build %s -f configs/envs/%s.build`)",
				name, app.Env, err, app.Env, app.Env)
		}
		app.Name = namePrefix + name
		apps[name] = app
		t.Cleanup(func() { f.UndeployAll(t, app.Name); f.RemoveGenerations(t, app.Name) })
		f.UndeployAll(t, app.Name)
		f.RemoveGenerations(t, app.Name) // from an interrupted run
	}

	for i, name := range cfg.apps {
		t.Logf("[%d/%d] %s", i+1, len(cfg.apps), name)
		a, err := evalApp(ctx, t, f, apps[name], name, cfg.reps)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		res.Apps = append(res.Apps, a)
		t.Logf("[%d/%d] %s: plain boot %s, restore %s: %.1fx; checkpoint %s, %s MiB", i+1, len(cfg.apps), name,
			secs(a.PlainBootMS.Median), secs(a.RestoreMS.Median), a.Speedup, secs(a.CheckpointMS.Median), trimf(a.ImageMiB.Median))
	}

	concApp := cfg.apps[0]
	if slices.Contains(cfg.apps, "redis") {
		concApp = "redis"
	}
	co, err := evalConcurrency(ctx, t, f, apps[concApp], concApp, cfg.reps)
	if err != nil {
		t.Fatalf("simultaneous restores: %v", err)
	}
	res.Concurrency = append(res.Concurrency, co)
	if alt, why := evalConcurrencyCRIU(ctx, t, f, apps[concApp], concApp, cfg.reps); alt != nil {
		res.Concurrency = append(res.Concurrency, alt)
	} else if why != "" {
		res.Notes = append(res.Notes, why)
	}

	if _, ok := apps["nginx"]; ok {
		load := "nginx"
		for _, n := range cfg.apps {
			if n != "nginx" {
				load = n
				break
			}
		}
		in, err := evalInterference(ctx, t, f, apps["nginx"], apps[load], load, cfg.abSecs, cfg.reps)
		if err != nil {
			t.Fatalf("interference: %v", err)
		}
		res.Interference = in
	} else {
		res.Notes = append(res.Notes, "interference (Table II) left out: it needs nginx in APPS")
	}
	if lz, why := evalLazy(ctx, t, f, apps, res.Apps, cfg.reps); lz != nil {
		res.Lazy = lz
	} else {
		res.Notes = append(res.Notes, why)
	}
	if cfg.reps < 5 {
		res.Notes = append(res.Notes, fmt.Sprintf("%d repetitions per measurement (BENCH_REPS); the evaluation's default is 5", cfg.reps))
	}

	res.Seconds = time.Since(start).Seconds()
	paths, err := evaluation.Write(dir, res)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("results in %s (%d files), %.0f s in all", dir, len(paths), res.Seconds)
	latest := filepath.Join(cfg.out, "latest")
	_ = os.Remove(latest)
	_ = os.Symlink(filepath.Base(dir), latest)
}

func secs(ms float64) string { return strconv.FormatFloat(ms/1000, 'f', 2, 64) + " s" }

func trimf(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func sumPhases(t layering.Timings, skip ...string) time.Duration {
	var d time.Duration
	for _, p := range t {
		if !slices.Contains(skip, p.Name) {
			d += p.Duration
		}
	}
	return d
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// evalApp measures one app: plain boots, first deploys and restores.
func evalApp(ctx context.Context, t *testing.T, f *deploytest.Fixture, app spec.App, catalogName string, reps int) (evaluation.App, error) {
	check := stateCheckFor(spec.App{Name: catalogName, Command: app.Command, WorkDir: app.WorkDir, Ports: app.Ports})
	a := evaluation.App{Name: catalogName, Engine: app.WithDefaults().Engine, Reps: reps, StateCheck: "none"}
	if check != nil {
		a.StateCheck = check.String()
	}
	var plain, plainApp []float64
	for i := range reps {
		dep, err := f.D.Boot(ctx, app, deploy.Options{Mode: spec.ModeBoot}, "evaluation: plain boot")
		if err != nil {
			return a, fmt.Errorf("plain boot %d: %w", i+1, err)
		}
		plain = append(plain, ms(dep.Total()))
		appMS := dep.EngineReadyMS
		if appMS == 0 {
			d, _ := dep.Timings.Get("ready")
			appMS = ms(d)
		}
		plainApp = append(plainApp, appMS)
		t.Logf("  %s plain boot %d/%d: %s (%s)", catalogName, i+1, reps, secs(plain[i]), dep.Timings)
		if err := f.D.Undeploy(ctx, dep.ID); err != nil {
			return a, err
		}
	}
	var first, bootReady, ckptMS, image, ckR, ckW []float64
	var last spec.Generation
	for i := range reps {
		before, err := f.Ceph.IOCounters(ctx)
		if err != nil {
			return a, err
		}
		var prepare deploy.PrepareFunc
		if check != nil {
			prepare = check.before
		}
		g, err := f.D.Checkpoint(ctx, app, deploy.CheckpointOptions{Prepare: prepare})
		if err != nil {
			return a, fmt.Errorf("first deploy %d (boot + checkpoint): %w", i+1, err)
		}
		after, err := f.Ceph.IOCounters(ctx)
		if err != nil {
			return a, err
		}
		io := after.Sub(before)
		ckR, ckW = append(ckR, mib(io.Read)), append(ckW, mib(io.Written))
		first = append(first, ms(sumPhases(g.Timings, "prepare")))
		bootReady = append(bootReady, g.BootReadyMS)
		ckptMS = append(ckptMS, g.CheckpointMS)
		image = append(image, mib(uint64(g.Bytes)))
		a.Driver = g.Driver
		t.Logf("  %s first deploy %d/%d: %s, image %.1f MiB, OSDs wrote %.1f MiB (%s)", catalogName, i+1, reps,
			secs(first[i]), image[i], ckW[i], g.Timings)
		if last.Gen != 0 {
			if err := f.D.Checkpoints().RemoveGeneration(ctx, app.Name, last.Gen); err != nil {
				return a, err
			}
		}
		last = g
	}
	// First restores on a node: without its copy of the checkpoint.
	var firstRestore, frR, frW []float64
	for i := range reps {
		if _, err := f.D.Checkpoints().TrimCache(func(k gencache.Key) bool { return k.App != app.Name }); err != nil {
			return a, err
		}
		dep, io, err := deployMeasured(ctx, f, app)
		if err != nil {
			return a, fmt.Errorf("first restore on the node %d: %w", i+1, err)
		}
		if dep.Mode != spec.ModeRestore || !dep.Fetched {
			return a, fmt.Errorf("first restore on the node %d: deploy %s has mode %q, fetched %v; want a restore that fetched the checkpoint",
				i+1, dep.ID, dep.Mode, dep.Fetched)
		}
		firstRestore, frR, frW = append(firstRestore, ms(dep.Total())), append(frR, mib(io.Read)), append(frW, mib(io.Written))
		t.Logf("  %s first restore on the node %d/%d: %s (engine %s), OSDs read %.1f MiB (%s)", catalogName, i+1, reps,
			secs(firstRestore[i]), secs(dep.EngineReadyMS), frR[i], dep.Timings)
		if err := f.D.Undeploy(ctx, dep.ID); err != nil {
			return a, err
		}
	}
	var restore, readyMS, engineMS, rsR, rsW []float64
	phases := map[string][]float64{}
	var order []string
	addPhase := func(name string, ms float64) {
		if _, ok := phases[name]; !ok {
			order = append(order, name)
		}
		phases[name] = append(phases[name], ms)
	}
	for i := range reps {
		dep, io, err := deployMeasured(ctx, f, app)
		if err != nil {
			return a, fmt.Errorf("restore %d: %w", i+1, err)
		}
		if dep.Mode != spec.ModeRestore || dep.Gen != last.Gen || dep.Booted {
			return a, fmt.Errorf("restore %d: deploy %s has mode %q, generation %d, booted %v; want a restore of generation %d",
				i+1, dep.ID, dep.Mode, dep.Gen, dep.Booted, last.Gen)
		}
		rsR, rsW = append(rsR, mib(io.Read)), append(rsW, mib(io.Written))
		if check != nil {
			if err := check.after(ctx, dep); err != nil {
				return a, fmt.Errorf("restore %d does not carry the state written before the checkpoint: %w", i+1, err)
			}
		}
		restore = append(restore, ms(dep.Total()))
		for _, p := range dep.Timings {
			if p.Name == "ready" {
				readyMS = append(readyMS, ms(p.Duration))
				continue
			}
			addPhase(p.Name, ms(p.Duration))
		}
		if dep.EngineReadyMS > 0 {
			engineMS = append(engineMS, dep.EngineReadyMS)
		}
		t.Logf("  %s restore %d/%d: %s (engine %s), OSDs read %.1f MiB (%s)", catalogName, i+1, reps,
			secs(restore[i]), secs(dep.EngineReadyMS), rsR[i], dep.Timings)
		if err := f.D.Undeploy(ctx, dep.ID); err != nil {
			return a, err
		}
	}
	// Pool hits of slots that wait unstarted (the deploy restarts the
	// app: what it waits for beyond the engine's restart), then of slots
	// restored ahead (the agent's default).
	restartHit, overhead, _, err := evalPool(ctx, t, f, app, catalogName, last, check, reps, false)
	if err != nil {
		return a, err
	}
	hit, _, refill, err := evalPool(ctx, t, f, app, catalogName, last, check, reps, true)
	if err != nil {
		return a, err
	}
	a.PoolHitMS, a.PoolOverheadMS, a.PoolRefillMS = evaluation.Summarize(hit), evaluation.Summarize(overhead), evaluation.Summarize(refill)
	a.PoolRestartMS = evaluation.Summarize(restartHit)
	if err := evalAuto(ctx, t, f, app, catalogName, last, plain, hit, &a); err != nil {
		return a, err
	}
	if a.PoolSlotMiB, a.PoolSlotCPU, err = slotCost(ctx, f, poolSlotsMeasured, func() (deploy.Slot, error) { return provisionSlot(ctx, f, last, true) }); err != nil {
		return a, fmt.Errorf("cost of %d idle pool slots: %w", poolSlotsMeasured, err)
	}
	if err := evalSpare(ctx, t, f, app, catalogName, last, check, reps, &a); err != nil {
		return a, err
	}
	t.Logf("  %s: %d idle pool slots take %.1f MiB of the node's memory and %.1f ms of CPU a second each", catalogName, poolSlotsMeasured,
		a.PoolSlotMiB, a.PoolSlotCPU)
	a.PlainBootMS, a.PlainAppMS = evaluation.Summarize(plain), evaluation.Summarize(plainApp)
	a.FirstDeployMS, a.BootReadyMS = evaluation.Summarize(first), evaluation.Summarize(bootReady)
	a.CheckpointMS, a.ImageMiB = evaluation.Summarize(ckptMS), evaluation.Summarize(image)
	a.RestoreMS, a.EngineRestartMS = evaluation.Summarize(restore), evaluation.Summarize(engineMS)
	if len(engineMS) == len(restore) {
		over := make([]float64, len(restore))
		for i := range restore {
			over[i] = max(0, restore[i]-engineMS[i])
		}
		a.MissOverheadMS = evaluation.Summarize(over)
	}
	a.CheckpointIO = evaluation.IO{ReadMiB: evaluation.Summarize(ckR), WrittenMiB: evaluation.Summarize(ckW)}
	a.RestoreIO = evaluation.IO{ReadMiB: evaluation.Summarize(rsR), WrittenMiB: evaluation.Summarize(rsW)}
	a.FirstRestoreMS = evaluation.Summarize(firstRestore)
	a.FirstRestoreIO = evaluation.IO{ReadMiB: evaluation.Summarize(frR), WrittenMiB: evaluation.Summarize(frW)}
	if a.RestoreMS.Median > 0 {
		a.Speedup = a.PlainBootMS.Median / a.RestoreMS.Median
	}
	if a.FirstRestoreMS.Median > 0 {
		a.FirstSpeedup = a.PlainBootMS.Median / a.FirstRestoreMS.Median
	}
	if a.PoolHitMS.Median > 0 {
		a.PoolSpeedup = a.PlainBootMS.Median / a.PoolHitMS.Median
	}
	// The ready phase runs from the container's start to the probe's
	// success. When the engine reported its own restart-to-ready for every
	// restore (it does for tcp probes), it is split into the two.
	if len(engineMS) == len(readyMS) {
		for i := range readyMS {
			addPhase("engine restart", engineMS[i])
			addPhase("ready (probe)", max(0, readyMS[i]-engineMS[i]))
		}
	} else {
		for _, r := range readyMS {
			addPhase("restart + ready", r)
		}
	}
	for _, n := range order {
		a.Phases = append(a.Phases, evaluation.Phase{Name: n, MS: evaluation.Summarize(phases[n])})
	}
	return a, nil
}

// poolSlotsMeasured is how many idle slots poolCost provisions.
const poolSlotsMeasured = 4

// How long poolCost lets the slots settle after their restore, and then
// counts the CPU they spend while they wait.
const (
	poolSettle    = 2 * time.Second
	poolCPUWindow = 5 * time.Second
)

// slotCost provisions n idle slots with provision (pool slots restored
// ahead where the node can, or spares) and returns what each costs while
// it waits: the memory, the
// proportional set size (Pss: private pages, and shared ones split among
// the processes that map them) of the processes that appeared with them
// (per slot, its container's shim, its entrypoint and keeper, the app and
// its DMTCP coordinator, its rbd-fuse, a docker-proxy per published port),
// and the CPU time those processes spend per second, over n. The page
// cache their mounts fill is not counted: the node reclaims it. It removes
// them again.
func slotCost(ctx context.Context, f *deploytest.Fixture, n int, provision func() (deploy.Slot, error)) (mib, cpuMSPerS float64, err error) {
	before := map[string]bool{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, 0, err
	}
	for _, e := range ents {
		before[e.Name()] = true
	}
	var ids []string
	defer func() {
		for _, id := range ids {
			_ = f.D.Pool().ReleaseSlot(context.Background(), id)
		}
	}()
	for range n {
		s, err := provision()
		if err != nil {
			return 0, 0, err
		}
		ids = append(ids, s.ID)
	}
	ents, err = os.ReadDir("/proc")
	if err != nil {
		return 0, 0, err
	}
	var kb uint64
	var pids []string
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || before[e.Name()] {
			continue
		}
		pids = append(pids, e.Name())
		kb += deploytest.PSSKiB(pid)
	}
	time.Sleep(poolSettle)
	c0 := procsCPU(pids)
	time.Sleep(poolCPUWindow)
	c1 := procsCPU(pids)
	return float64(kb) / 1024 / float64(n), (c1 - c0) / poolCPUWindow.Seconds() / float64(n), nil
}

// procsCPU is the CPU time (user and system, ms) pids have used so far;
// a process that exited meanwhile counts for nothing.
func procsCPU(pids []string) float64 {
	var secs float64
	for _, pid := range pids {
		if _, v, ok := procCPU(pid); ok {
			secs += v
		}
	}
	return secs * 1000
}

// evalAuto asks mode auto's policy (internal/adaptive) what an agent with
// a warm pool of one asks: the pool keeper provisions a slot (restored
// ahead), then the policy chooses from the plain boots and the pool hits
// just measured and from what the deployer says waits on the node, and the
// deploy runs as it chose (a pool hit, where the slot waits).
func evalAuto(ctx context.Context, t *testing.T, f *deploytest.Fixture, app spec.App, catalogName string, g spec.Generation,
	boots, hits []float64, a *evaluation.App) error {
	var c adaptive.Costs
	dur := func(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }
	for _, v := range boots {
		c.Record(adaptive.Run{Mode: spec.ModeBoot, Cost: dur(v)})
	}
	for _, v := range hits {
		c.Record(adaptive.Run{Mode: spec.ModeRestore, Gen: g.Gen, Cost: dur(v), Hit: true})
	}
	s, err := provisionSlot(ctx, f, g, true)
	if err != nil {
		return fmt.Errorf("auto: pool slot: %w", err)
	}
	slot := s.ID
	time.Sleep(poolArrival)
	_, waiting := f.D.Pool().WaitingSlot(app, "")
	dec := adaptive.Decide(c, adaptive.Situation{Generation: true, Pool: 1, SlotWaiting: waiting})
	opts := deploy.Options{Mode: dec.Mode, Reason: dec.Reason}
	if dec.Mode != spec.ModeRestore {
		if err := f.D.Pool().ReleaseSlot(ctx, slot); err != nil {
			return err
		}
		slot = ""
	}
	dep, err := f.D.Deploy(ctx, app, opts)
	if err != nil {
		if slot != "" {
			_ = f.D.Pool().ReleaseSlot(ctx, slot)
		}
		return fmt.Errorf("auto (%s): %w", dec.Reason, err)
	}
	a.AutoMode, a.AutoReason, a.AutoMS = string(dep.Mode), dec.Reason, evaluation.Summarize([]float64{ms(dep.Total())})
	if a.AutoMS.Median > 0 {
		a.AutoSpeedup = evaluation.Summarize(boots).Median / a.AutoMS.Median
	}
	t.Logf("  %s auto: %s in %s (%s)", catalogName, dep.Mode, secs(a.AutoMS.Median), dec.Reason)
	return f.D.Undeploy(ctx, dep.ID)
}

// deployMeasured deploys app and returns what the OSDs read and wrote
// meanwhile.
func deployMeasured(ctx context.Context, f *deploytest.Fixture, app spec.App) (deploy.Deployment, cephstore.IOCounters, error) {
	before, err := f.Ceph.IOCounters(ctx)
	if err != nil {
		return deploy.Deployment{}, cephstore.IOCounters{}, err
	}
	dep, err := f.D.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		return dep, cephstore.IOCounters{}, err
	}
	after, err := f.Ceph.IOCounters(ctx)
	return dep, after.Sub(before), err
}

// provisionSlot refills the pool by one slot of g as an agent does: the
// slot is provisioned and, with ahead where the node can reweight it
// (agent.pool_ahead: true, the default), its app restored ahead, waiting at the
// background CPU weight.
func provisionSlot(ctx context.Context, f *deploytest.Fixture, g spec.Generation, ahead bool) (deploy.Slot, error) {
	s, err := f.D.Pool().ProvisionPoolSlot(ctx, g)
	if err != nil || !ahead || f.D.Pool().CanStartAhead(g) != nil {
		return s, err
	}
	return f.D.Pool().StartAhead(ctx, g, s.ID)
}

// startAheadRecycled restores ahead a slot that recycling left unstarted,
// as the agent's next refill does.
func startAheadRecycled(ctx context.Context, f *deploytest.Fixture, g spec.Generation, id string) error {
	if id == "" || f.D.Pool().CanStartAhead(g) != nil {
		return nil
	}
	_, err := f.D.Pool().StartAhead(ctx, g, id)
	return err
}

// poolArrival is how long after a slot's refill a user arrives in the
// evaluation: a pool slot waits for its deploy, and the user does not wait
// for it to settle.
const poolArrival = time.Second

// evalPool measures restores that find a warm-pool slot waiting: per
// repetition, one slot is provisioned (the refill), then a deploy claims
// it. It returns restore-to-ready of the hits, what each added to the
// engine's own restart, and the refills' times.
func evalPool(ctx context.Context, t *testing.T, f *deploytest.Fixture, app spec.App, catalogName string, g spec.Generation,
	check stateCheck, reps int, ahead bool) (hit, overhead, refill []float64, err error) {
	for i := range reps {
		start := time.Now()
		s, err := provisionSlot(ctx, f, g, ahead)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("pool refill %d: %w", i+1, err)
		}
		refill = append(refill, ms(time.Since(start)))
		time.Sleep(poolArrival)
		dep, err := f.D.Deploy(ctx, app, deploy.Options{})
		if err != nil {
			_ = f.D.Pool().ReleaseSlot(ctx, s.ID)
			return nil, nil, nil, fmt.Errorf("pool hit %d: %w", i+1, err)
		}
		if dep.Pool != spec.PoolHit || dep.Slot != s.ID {
			_ = f.D.Undeploy(ctx, dep.ID)
			_ = f.D.Pool().ReleaseSlot(ctx, s.ID)
			return nil, nil, nil, fmt.Errorf("pool hit %d: deploy %s found pool %q in slot %q; want a hit of slot %s", i+1, dep.ID, dep.Pool, dep.Slot, s.ID)
		}
		if check != nil {
			if err := check.after(ctx, dep); err != nil {
				_ = f.D.Undeploy(ctx, dep.ID)
				return nil, nil, nil, fmt.Errorf("pool hit %d does not carry the state written before the checkpoint: %w", i+1, err)
			}
		}
		total := ms(dep.Total())
		hit = append(hit, total)
		if dep.EngineReadyMS > 0 {
			overhead = append(overhead, max(0, total-dep.EngineReadyMS))
		}
		t.Logf("  %s pool hit %d/%d (restored ahead: %v): %s (engine %s), refill %s (%s)", catalogName, i+1, reps, dep.Ahead, secs(total),
			secs(dep.EngineReadyMS), secs(refill[i]), dep.Timings)
		if err := f.D.Undeploy(ctx, dep.ID); err != nil {
			return nil, nil, nil, err
		}
	}
	return hit, overhead, refill, nil
}

// evalSpare measures restores of g that find no pool slot of the app and
// take a spare slot, made for no app just before (as the agent's refill
// does), the checkpoint on the node, and what an idle spare costs.
func evalSpare(ctx context.Context, t *testing.T, f *deploytest.Fixture, app spec.App, catalogName string, g spec.Generation,
	check stateCheck, reps int, a *evaluation.App) error {
	if err := f.D.Pool().MakesSpares(ctx, g.Engine); err != nil {
		t.Logf("  %s: no spare slots: %v", catalogName, err)
		return nil
	}
	var total, overhead []float64
	for i := range reps {
		s, err := f.D.Pool().ProvisionSpare(ctx, g.Engine)
		if err != nil {
			return fmt.Errorf("spare %d: %w", i+1, err)
		}
		time.Sleep(poolArrival)
		dep, err := f.D.Deploy(ctx, app, deploy.Options{})
		if err != nil {
			_ = f.D.Pool().ReleaseSlot(ctx, s.ID)
			return fmt.Errorf("restore into spare %d: %w", i+1, err)
		}
		if i == 0 && dep.Pool != spec.PoolSpare && dep.SpareReason != "" {
			t.Logf("  %s: restores take no spare slot: %s", catalogName, dep.SpareReason)
			a.NoSpare = dep.SpareReason
			return errors.Join(f.D.Undeploy(ctx, dep.ID), f.D.Pool().ReleaseSlot(ctx, s.ID))
		}
		if dep.Pool != spec.PoolSpare || dep.Slot != s.ID || dep.Gen != g.Gen {
			_ = f.D.Undeploy(ctx, dep.ID)
			_ = f.D.Pool().ReleaseSlot(ctx, s.ID)
			return fmt.Errorf("restore into spare %d: deploy %s found pool %q in slot %q (generation %d); want spare %s (generation %d)", i+1, dep.ID, dep.Pool, dep.Slot, dep.Gen, s.ID, g.Gen)
		}
		if check != nil {
			if err := check.after(ctx, dep); err != nil {
				_ = f.D.Undeploy(ctx, dep.ID)
				return fmt.Errorf("restore into spare %d does not carry the state written before the checkpoint: %w", i+1, err)
			}
		}
		total = append(total, ms(dep.Total()))
		if dep.EngineReadyMS > 0 {
			overhead = append(overhead, max(0, total[i]-dep.EngineReadyMS))
		}
		t.Logf("  %s restore into a spare %d/%d: %s (engine %s) (%s)", catalogName, i+1, reps, secs(total[i]), secs(dep.EngineReadyMS), dep.Timings)
		if err := f.D.Undeploy(ctx, dep.ID); err != nil {
			return err
		}
	}
	a.SpareMS, a.SpareOverheadMS = evaluation.Summarize(total), evaluation.Summarize(overhead)
	var err error
	if a.SpareSlotMiB, a.SpareSlotCPU, err = slotCost(ctx, f, poolSlotsMeasured, func() (deploy.Slot, error) { return f.D.Pool().ProvisionSpare(ctx, g.Engine) }); err != nil {
		return fmt.Errorf("cost of %d idle spares: %w", poolSlotsMeasured, err)
	}
	t.Logf("  %s: an idle spare takes %.1f MiB of the node's memory and %.1f ms of CPU a second", catalogName, a.SpareSlotMiB, a.SpareSlotCPU)
	return nil
}

// evalConcurrency restores app 1, 2, 4 and 8 times at once on the node
// (it has a generation from evalApp): with no pool, then with a warm pool
// of as many slots.
// evalConcurrencyCRIU measures simultaneous restores of the same app
// under CRIU too, when its engine is another and CRIU can checkpoint it
// here: the engine's own restore is the work that 8 restores at once
// share the node's cores for. It returns nil and why not otherwise.
func evalConcurrencyCRIU(ctx context.Context, t *testing.T, f *deploytest.Fixture, app spec.App, catalogName string, reps int) (*evaluation.Concurrency, string) {
	if app.Engine == engine.NameCRIU {
		return nil, ""
	}
	if _, _, err := f.D.Drivers().CheckEngine(ctx, engine.NameCRIU); err != nil {
		return nil, "simultaneous restores under CRIU left out: " + hint.Sentence(err)
	}
	alt := app.WithEngine(engine.NameCRIU)
	alt.Name = app.Name + "-conc-criu"
	t.Cleanup(func() { f.UndeployAll(t, alt.Name); f.RemoveGenerations(t, alt.Name) })
	if _, err := f.D.Checkpoint(ctx, alt, deploy.CheckpointOptions{}); err != nil {
		return nil, "simultaneous restores under CRIU left out: CRIU could not checkpoint " + catalogName + ": " + hint.Sentence(err)
	}
	co, err := evalConcurrency(ctx, t, f, alt, catalogName, reps)
	if err != nil {
		t.Fatalf("simultaneous restores under CRIU: %v", err)
	}
	return co, ""
}

func evalConcurrency(ctx context.Context, t *testing.T, f *deploytest.Fixture, app spec.App, catalogName string, reps int) (*evaluation.Concurrency, error) {
	co := &evaluation.Concurrency{App: catalogName, Engine: app.Engine, Rounds: reps, Interleaved: true}
	g, err := f.D.Checkpoints().Latest(ctx, app.Name)
	if err != nil {
		return co, err
	}
	misses := make([][]float64, len(simultaneous))
	for j, n := range simultaneous {
		if misses[j], _, err = restoreAtOnce(ctx, f, app, n, spec.PoolMiss, nil); err != nil {
			return co, fmt.Errorf("%d simultaneous restores: %w", n, err)
		}
	}
	// A pool hit takes milliseconds, and one round of n is at the mercy
	// of whatever else the node does then: every hit of every round is
	// in the statistics, and every row has as many hits behind its
	// median as the last (reps rounds of the most), so that the single
	// deploy the others are compared with is not the median of a
	// handful. The rows' rounds alternate (in each of reps cycles, as
	// many rounds of every n as make the most), so that the machine's
	// drift over the series weighs on every row alike and a ratio of
	// two rows compares deploys made side by side.
	most := simultaneous[len(simultaneous)-1]
	var hits [2][][]float64
	hits[0], hits[1] = make([][]float64, len(simultaneous)), make([][]float64, len(simultaneous))
	aheadPhases := make([]evaluation.Phases, len(simultaneous))
	aheadCPU := make([][]float64, len(simultaneous))
	for k, ahead := range []bool{false, true} {
		if ahead && f.D.Pool().CanStartAhead(g) != nil {
			break
		}
		for range reps {
			for j, n := range simultaneous {
				for range max(1, most/n) {
					var phases *evaluation.Phases
					if ahead {
						phases = &aheadPhases[j]
					}
					round, cpu, err := poolRound(ctx, f, app, g, n, ahead, phases)
					if err != nil {
						return co, err
					}
					hits[k][j] = append(hits[k][j], round...)
					if ahead && cpu > 0 {
						aheadCPU[j] = append(aheadCPU[j], cpu)
					}
				}
			}
		}
	}
	for j, n := range simultaneous {
		row := evaluation.ConcurrencyRow{N: n, RestoreMS: evaluation.Summarize(misses[j]), PoolHitMS: evaluation.Summarize(hits[0][j]),
			AheadMS: evaluation.Summarize(hits[1][j]), AheadPhases: aheadPhases[j].Summary(), AheadCPUMS: evaluation.Summarize(aheadCPU[j])}
		co.Rows = append(co.Rows, row)
		t.Logf("  %d simultaneous restores of %s: %s median, %s max; with a pool of %d: %s median, %s max; restored ahead: %s median, %s max, the node's CPU %.2f ms per deploy", n, co.Label(),
			secs(row.RestoreMS.Median), secs(row.RestoreMS.Max), n, secs(row.PoolHitMS.Median), secs(row.PoolHitMS.Max),
			secs(row.AheadMS.Median), secs(row.AheadMS.Max), row.AheadCPUMS.Median)
	}
	return co, nil
}

// poolRound provisions n slots of generation g (restored ahead, or
// waiting for their order), lets them settle as a user arriving later
// finds them, and deploys app n times at once on them (restoreAtOnce).
// On error the app's pool is dropped.
func poolRound(ctx context.Context, f *deploytest.Fixture, app spec.App, g spec.Generation, n int, ahead bool, phases *evaluation.Phases) ([]float64, float64, error) {
	for i := range n {
		if _, err := provisionSlot(ctx, f, g, ahead); err != nil {
			_, _ = f.D.Pool().DropPool(ctx, app.Name, nil)
			return nil, 0, fmt.Errorf("pool slot %d of %d: %w", i+1, n, err)
		}
	}
	time.Sleep(poolArrival)
	round, cpu, err := restoreAtOnce(ctx, f, app, n, spec.PoolHit, phases)
	if err != nil {
		_, _ = f.D.Pool().DropPool(ctx, app.Name, nil)
		return nil, 0, fmt.Errorf("%d simultaneous restores with a pool of %d (restored ahead: %v): %w", n, n, ahead, err)
	}
	return round, cpu, nil
}

// restoreAtOnce deploys app n times at once, checks that each found the
// pool as want says, undeploys them, and returns their restore-to-ready
// and the node's CPU time per deploy (ms) while they ran, 0 where the
// node does not say; phases, when not nil, gets their phases.
func restoreAtOnce(ctx context.Context, f *deploytest.Fixture, app spec.App, n int, want spec.PoolResult, phases *evaluation.Phases) ([]float64, float64, error) {
	deps := make([]deploy.Deployment, n)
	errs := make([]error, n)
	cpu0, cpuErr := busyCPUSeconds()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { deps[i], errs[i] = f.D.Deploy(ctx, app, deploy.Options{}) })
	}
	wg.Wait()
	cpu1, err := busyCPUSeconds()
	var cpuMS float64
	if cpuErr == nil && err == nil && cpu1 > cpu0 {
		cpuMS = (cpu1 - cpu0) * 1000 / float64(n)
	}
	var restoreMS []float64
	var firstErr error
	for i := range n {
		if errs[i] != nil {
			firstErr = cmpErr(firstErr, errs[i])
			continue
		}
		if deps[i].Pool != want {
			firstErr = cmpErr(firstErr, fmt.Errorf("deploy %s found the pool %q; want %q", deps[i].ID, deps[i].Pool, want))
		}
		restoreMS = append(restoreMS, ms(deps[i].Total()))
		if phases != nil {
			for _, p := range deps[i].Timings {
				phases.Add(p.Name, ms(p.Duration))
			}
		}
		if err := f.D.Undeploy(ctx, deps[i].ID); err != nil {
			firstErr = cmpErr(firstErr, err)
		}
	}
	return restoreMS, cpuMS, firstErr
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// deployRates are the rates of the interference test: one deploy every
// interval (0: back to back, the highest rate the node sustains).
var deployRates = []struct {
	name     string
	interval time.Duration
}{{evaluation.RateHalf, 2 * time.Second}, {evaluation.RateOne, time.Second}, {evaluation.RateMax, 0}}

// evalInterference runs ab against a restored nginx at each concurrency,
// alone and while the node deploys load at each of deployRates as an agent
// with a warm pool does; then it measures what one deploy of load costs.
func evalInterference(ctx context.Context, t *testing.T, f *deploytest.Fixture, server, load spec.App, loadName string, abSecs, reps int) (*evaluation.Interference, error) {
	ab, err := exec.LookPath("ab")
	if err != nil {
		return nil, fmt.Errorf("ab (Debian package apache2-utils) is not installed: %w", err)
	}
	// ab keeps one socket per concurrent request.
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			t.Logf("raise the open-files limit for ab: %v", err)
		}
	}
	srv, err := f.D.Deploy(ctx, server, deploy.Options{})
	if err != nil {
		return nil, fmt.Errorf("deploy %s: %w", server.Name, err)
	}
	defer func() { _ = f.D.Undeploy(context.Background(), srv.ID) }()
	addr, err := port(srv.Ports, server.Ports[0].Port)
	if err != nil {
		return nil, err
	}
	page, err := httpGet(ctx, nil, "http://"+addr+"/")
	if err != nil {
		return nil, err
	}
	loadGen, err := f.D.Checkpoints().Latest(ctx, load.Name)
	if err != nil {
		return nil, fmt.Errorf("%s has no generation to refill a pool with: %w", loadName, err)
	}
	in := &evaluation.Interference{Server: "nginx", PageBytes: len(page), Deploying: loadName, Seconds: float64(abSecs),
		Priority: "The deployment work runs below the server: the pool's slots at the lowest cgroup CPU weight until a " +
			"deploy binds them, rbd-fuse at nice 10 and the lowest best-effort I/O level; the server and ab at normal priority."}
	run := func(c int) (evaluation.AB, error) {
		out, err := exec.CommandContext(ctx, ab, "-q", "-t", strconv.Itoa(abSecs), "-n", "10000000", "-c", strconv.Itoa(c),
			"-s", "30", "http://"+addr+"/").CombinedOutput()
		if err != nil {
			return evaluation.AB{}, fmt.Errorf("ab -c %d: %w: %s", c, err, lastLines(string(out), 5))
		}
		return evaluation.ParseAB(string(out))
	}
	in.Reps = reps
	for _, c := range interferenceConcurrency {
		// reps rounds, each alone and then at every rate, so that the
		// machine's drift spreads over all of them alike.
		var alone []float64
		rps := make([][]float64, len(deployRates))
		perSec := make([][]float64, len(deployRates))
		deploys, failed := make([]int, len(deployRates)), make([]int, len(deployRates))
		baseFailed := 0
		for range reps {
			res, err := run(c)
			if err != nil {
				return in, err
			}
			alone, baseFailed = append(alone, res.RPS), baseFailed+res.Failed+res.Non2xx
			for i, rate := range deployRates {
				res, n, perSecond, err := abWhileDeploying(ctx, f, load, loadGen, rate.interval, func() (evaluation.AB, error) { return run(c) })
				if err != nil {
					return in, fmt.Errorf("ab -c %d while %s deploys at %s: %w", c, loadName, rate.name, err)
				}
				rps[i], perSec[i] = append(rps[i], res.RPS), append(perSec[i], perSecond)
				deploys[i], failed[i] = deploys[i]+n, failed[i]+res.Failed+res.Non2xx
			}
		}
		base := evaluation.Summarize(alone)
		row := evaluation.InterferenceRow{Concurrency: c, BaselineRPS: base.Median, BaselineStats: base, BaselineFailed: baseFailed}
		line := fmt.Sprintf("  ab -c %d: %.0f req/s alone", c, base.Median)
		for i, rate := range deployRates {
			st := evaluation.Summarize(rps[i])
			x := evaluation.RateRun{Rate: rate.name, IntervalS: rate.interval.Seconds(), RPS: st.Median, RPSStats: st, Deploys: deploys[i],
				PerSecond: evaluation.Summarize(perSec[i]).Median, Failed: failed[i]}
			if base.Median > 0 {
				x.OverheadPct = (base.Median - x.RPS) / base.Median * 100
			}
			row.Runs = append(row.Runs, x)
			line += fmt.Sprintf(", %.0f at %s (%d deploys, %.1f%%)", x.RPS, rate.name, x.Deploys, x.OverheadPct)
		}
		in.Rows = append(in.Rows, row)
		t.Log(line)
	}
	in.Costs, err = deployCosts(ctx, t, f, load, loadName, loadGen, reps)
	return in, err
}

// abWhileDeploying runs ab while the node deploys and undeploys app at one
// deploy per interval (0: back to back), as an agent with a warm pool of
// one slot does: a slot waits before the first deploy, each deploy takes
// it, and it is refilled (at the pool's background priority) after the
// undeploy. It returns ab's result, how many deploys started during it,
// and the rate they reached (starts per second, from the first start to
// the last).
func abWhileDeploying(ctx context.Context, f *deploytest.Fixture, app spec.App, g spec.Generation, interval time.Duration,
	ab func() (evaluation.AB, error)) (evaluation.AB, int, float64, error) {
	slot, err := provisionSlot(ctx, f, g, true)
	if err != nil {
		return evaluation.AB{}, 0, 0, fmt.Errorf("pool slot: %w", err)
	}
	free := slot.ID // the waiting slot, "" while none waits
	stop := make(chan struct{})
	var starts []time.Time
	var loopErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		next := time.Now()
		for {
			if wait := time.Until(next); wait > 0 {
				select {
				case <-stop:
					return
				case <-time.After(wait):
				}
			}
			select {
			case <-stop:
				return
			default:
			}
			if next = next.Add(interval); next.Before(time.Now()) {
				next = time.Now() // late: the next deploy starts at once, without a burst to catch up
			}
			starts = append(starts, time.Now())
			dep, err := f.D.Deploy(ctx, app, deploy.Options{})
			if err == nil {
				if dep.Pool == spec.PoolHit {
					free = ""
				}
				err = undeployToPool(ctx, f, dep.ID, &free)
			}
			if err == nil && free == "" {
				var s deploy.Slot
				if s, err = provisionSlot(ctx, f, g, true); err == nil {
					free = s.ID
				}
			} else if err == nil {
				err = startAheadRecycled(ctx, f, g, free)
			}
			if err != nil {
				loopErr = err
				return
			}
		}
	})
	res, err := ab()
	close(stop)
	wg.Wait()
	if free != "" {
		if rerr := f.D.Pool().ReleaseSlot(ctx, free); rerr != nil && err == nil {
			err = rerr
		}
	}
	if err == nil {
		err = loopErr
	}
	var rate float64
	if n := len(starts); n > 1 {
		rate = float64(n-1) / starts[n-1].Sub(starts[0]).Seconds()
	}
	return res, len(starts), rate, err
}

// undeployToPool undeploys id as an agent whose pool lacks a slot does:
// the instance is recycled into the pool (free takes its slot), or, if it
// cannot serve again, removed.
func undeployToPool(ctx context.Context, f *deploytest.Fixture, id string, free *string) error {
	if *free != "" {
		return f.D.Undeploy(ctx, id)
	}
	s, err := f.D.Pool().Recycle(ctx, id)
	if errors.Is(err, drivers.ErrNotRecyclable) {
		return f.D.Undeploy(ctx, id)
	}
	if err == nil {
		*free = s.ID
	}
	return err
}

// deployCosts measures what one deploy of app costs the node, reps times
// per kind: a pool hit (the deploy, its undeploy and the slot's refill), a
// pool miss (deploy and undeploy) and a plain boot (the same).
func deployCosts(ctx context.Context, t *testing.T, f *deploytest.Fixture, app spec.App, name string, g spec.Generation, reps int) ([]evaluation.DeployCost, error) {
	idle, err := idleCPURate(time.Duration(3) * time.Second)
	if err != nil {
		return nil, err
	}
	// A slot a failed hit left idle goes with the rest of the app's pool.
	defer func() { _, _ = f.D.Pool().DropPool(context.Background(), app.Name, nil) }()
	kinds := []struct {
		kind          string
		mode          spec.Mode
		pool, recycle bool
	}{{evaluation.DeployPoolRecycled, "", true, true}, {evaluation.DeployPoolHit, "", true, false},
		{evaluation.DeployPoolMiss, "", false, false}, {evaluation.DeployBoot, spec.ModeBoot, false, false}}
	var costs []evaluation.DeployCost
	for _, k := range kinds {
		// Each kind starts from an empty pool.
		if _, err := f.D.Pool().DropPool(ctx, app.Name, nil); err != nil {
			return costs, err
		}
		var cpu, wall, read, wrote []float64
		byProc := map[string]float64{}
		free := ""
		for i := range reps {
			if k.pool && free == "" { // the slot this deploy takes; a recycled one is reused
				s, err := provisionSlot(ctx, f, g, true)
				if err != nil {
					return costs, err
				}
				free = s.ID
			}
			if k.pool {
				time.Sleep(poolArrival)
			}
			io0, err := f.Ceph.IOCounters(ctx)
			if err != nil {
				return costs, err
			}
			c0, err := busyCPUSeconds()
			if err != nil {
				return costs, err
			}
			p0 := processCPU()
			start := time.Now()
			dep, err := f.D.Deploy(ctx, app, deploy.Options{Mode: k.mode})
			if err != nil {
				return costs, fmt.Errorf("%s %d: %w", k.kind, i+1, err)
			}
			if k.pool && dep.Pool != spec.PoolHit {
				_ = f.D.Undeploy(ctx, dep.ID)
				return costs, fmt.Errorf("%s %d: deploy %s found the pool %q", k.kind, i+1, dep.ID, dep.Pool)
			}
			if k.pool {
				free = ""
			}
			if k.recycle {
				err = undeployToPool(ctx, f, dep.ID, &free)
			} else {
				err = f.D.Undeploy(ctx, dep.ID)
			}
			if err != nil {
				return costs, err
			}
			if k.recycle && free == "" {
				return costs, fmt.Errorf("%s %d: deployment %s was not recycled", k.kind, i+1, dep.ID)
			}
			if k.recycle { // restored ahead again, as the agent's refill does
				if err := startAheadRecycled(ctx, f, g, free); err != nil {
					return costs, err
				}
			}
			if k.pool && !k.recycle { // the refill after the hit
				s, err := provisionSlot(ctx, f, g, true)
				if err != nil {
					return costs, err
				}
				if err := f.D.Pool().ReleaseSlot(ctx, s.ID); err != nil {
					return costs, err
				}
			}
			took := time.Since(start)
			c1, err := busyCPUSeconds()
			if err != nil {
				return costs, err
			}
			idleShare := idle * took.Seconds()
			var accounted float64
			for name, v := range processCPU() {
				if d := v - p0[name]; d > 0.005 {
					byProc[name] += d / float64(reps)
					accounted += d
				}
			}
			byProc["(exited processes, interrupts; less the idle node)"] += (c1 - c0 - accounted - idleShare) / float64(reps)
			io1, err := f.Ceph.IOCounters(ctx)
			if err != nil {
				return costs, err
			}
			io := io1.Sub(io0)
			cpu = append(cpu, max(0, c1-c0-idleShare))
			wall = append(wall, ms(took))
			read, wrote = append(read, mib(io.Read)), append(wrote, mib(io.Written))
		}
		c := evaluation.DeployCost{Kind: k.kind, CPUSeconds: evaluation.Summarize(cpu), WallMS: evaluation.Summarize(wall),
			OSDReadMiB: evaluation.Summarize(read).Median, OSDWroteMiB: evaluation.Summarize(wrote).Median}
		for name, v := range byProc {
			c.ByProcess = append(c.ByProcess, evaluation.ProcessCPU{Name: name, Seconds: v})
		}
		slices.SortFunc(c.ByProcess, func(x, y evaluation.ProcessCPU) int { return cmp.Compare(y.Seconds, x.Seconds) })
		costs = append(costs, c)
		t.Logf("  one %s of %s costs %.2f CPU-seconds (%s from deploy to undeployed), OSDs read %.1f MiB, wrote %.1f MiB",
			k.kind, name, c.CPUSeconds.Median, secs(c.WallMS.Median), c.OSDReadMiB, c.OSDWroteMiB)
	}
	return costs, nil
}

// busyCPUSeconds is the CPU time the whole machine has spent busy since it
// booted: the root cgroup's, every task's to the nanosecond (cpuacct.usage
// under cgroup v1, usage_usec of cpu.stat under v2), else /proc/stat's
// busy ticks (user, nice, system, irq, softirq, steal), which count 10 ms,
// longer than a round of pool hits.
func busyCPUSeconds() (float64, error) {
	for _, p := range []string{"/sys/fs/cgroup/cpuacct/cpuacct.usage", "/sys/fs/cgroup/cpu,cpuacct/cpuacct.usage"} {
		if b, err := os.ReadFile(p); err == nil {
			ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %w", p, err)
			}
			return float64(ns) / 1e9, nil
		}
	}
	if b, err := os.ReadFile("/sys/fs/cgroup/cpu.stat"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
				us, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				if err != nil {
					return 0, fmt.Errorf("/sys/fs/cgroup/cpu.stat: %q: %w", line, err)
				}
				return float64(us) / 1e6, nil
			}
		}
	}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var busy float64
	for i, v := range f[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %q: %w", line, err)
		}
		busy += n
	}
	return busy / 100, nil // USER_HZ
}

// processCPU is the CPU time every process now running has used, in
// seconds, summed by what it is (its command name, kernel threads by kind).
func processCPU() map[string]float64 {
	out := map[string]float64{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if comm, secs, ok := procCPU(e.Name()); ok {
			out[processGroup(comm)] += secs
		}
	}
	return out
}

// procCPU is the command name of process pid and the CPU time (user and
// system, seconds) it has used; ok is false once it is gone.
func procCPU(pid string) (comm string, secs float64, ok bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return "", 0, false
	}
	// pid (comm) state ppid ... utime stime: comm may hold spaces.
	open, close := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || close < open {
		return "", 0, false
	}
	f := strings.Fields(string(b[close+1:]))
	if len(f) < 13 {
		return "", 0, false
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return string(b[open+1 : close]), (ut + st) / 100, true // USER_HZ
}

// processGroup names what a process is for the cost breakdown.
func processGroup(comm string) string {
	for _, g := range []struct{ prefix, name string }{
		{"kworker", "kernel workers"}, {"loop", "loop devices (kernel)"}, {"ksoftirqd", "kernel softirq"},
		{"dmtcp", "DMTCP"}, {"mtcp_restart", "DMTCP"}, {"containerd-shim", "containerd-shim"}, {"runc", "runc"},
		{"bench.test", "the deploying process (agent's work)"}, {"criu", "CRIU"},
	} {
		if strings.HasPrefix(comm, g.prefix) {
			return g.name
		}
	}
	return comm
}

// idleCPURate is the CPU-seconds per second the node spends with nothing
// deploying (the cluster, dockerd, etcd, the instances left running).
func idleCPURate(d time.Duration) (float64, error) {
	c0, err := busyCPUSeconds()
	if err != nil {
		return 0, err
	}
	time.Sleep(d)
	c1, err := busyCPUSeconds()
	return (c1 - c0) / d.Seconds(), err
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// hostInfo describes the machine and the components of the run.
func hostInfo(ctx context.Context, t *testing.T, f *deploytest.Fixture) evaluation.Host {
	h := evaluation.Host{CPUs: goruntime.NumCPU(), Mapper: f.L.Mapper.Choice().Backend}
	var u syscall.Utsname
	if syscall.Uname(&u) == nil {
		h.Kernel = utsString(u.Release[:])
	}
	if raw, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		if _, err := fmt.Sscanf(string(raw), "MemTotal: %d kB", &kb); err == nil {
			h.MemoryMiB = kb / 1024
		}
	}
	if out, err := exec.CommandContext(ctx, "ceph", "--version").Output(); err == nil {
		if fs := strings.Fields(string(out)); len(fs) >= 3 {
			h.Ceph = fs[2]
		}
	}
	if c, err := f.Ceph.IOCounters(ctx); err == nil {
		h.OSDs = c.OSDs
	}
	h.ObjectStore = cephObjectStore(ctx, testenv.CephCluster(t))
	if _, v, err := f.D.Drivers().CheckEngine(ctx, "dmtcp"); err == nil {
		h.DMTCP = v
	}
	if _, v, err := f.D.Drivers().CheckEngine(ctx, "criu"); err == nil {
		h.CRIU = v
	}
	if v, err := testenv.DockerClient(t).ServerVersion(ctx); err == nil {
		h.Docker = v.Version
	}
	if out, err := exec.CommandContext(ctx, "git", "-C", deploytest.RepoRoot(), "describe", "--always", "--dirty").Output(); err == nil {
		h.FogdeployHead = strings.TrimSpace(string(out))
	}
	return h
}

func utsString(b []int8) string {
	var s strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		s.WriteByte(byte(c))
	}
	return s.String()
}

// cephObjectStore is the dev cluster's OSD backend (memstore or bluestore).
func cephObjectStore(ctx context.Context, c testenv.CephConn) string {
	out, err := exec.CommandContext(ctx, "ceph", "-c", c.Conf, "-k", c.Keyring, "--id", c.ID, "osd", "metadata", "0", "-f", "json").Output()
	if err != nil {
		return ""
	}
	const key = `"osd_objectstore":"`
	s := strings.ReplaceAll(string(out), " ", "")
	if i := strings.Index(s, key); i >= 0 {
		rest := s[i+len(key):]
		if j := strings.IndexByte(rest, '"'); j >= 0 {
			return rest[:j]
		}
	}
	return ""
}

// evalLazy compares full and lazy restores (CRIU's lazy pages) of the
// largest image among the run's apps that CRIU can checkpoint: from the order to the first answer (start
// and ready), with the node's copy of the checkpoint in the page cache and
// dropped from it. It returns nil and why when no app qualifies.
func evalLazy(ctx context.Context, t *testing.T, f *deploytest.Fixture, apps map[string]spec.App, evaluated []evaluation.App, reps int) (*evaluation.Lazy, string) {
	ranked := slices.Clone(evaluated)
	slices.SortFunc(ranked, func(a, b evaluation.App) int { return cmp.Compare(b.ImageMiB.Median, a.ImageMiB.Median) })
	var skipped []string
	for _, a := range ranked {
		app := apps[a.Name]
		lz := app.WithEngine(engine.NameCRIU)
		lz.Name = app.Name + "-criu"
		t.Cleanup(func() { f.UndeployAll(t, lz.Name); f.RemoveGenerations(t, lz.Name) })
		check := stateCheckFor(spec.App{Name: a.Name, Command: app.Command, WorkDir: app.WorkDir, Ports: app.Ports})
		var prepare deploy.PrepareFunc
		if check != nil {
			prepare = check.before
		}
		g, err := f.D.Checkpoint(ctx, lz, deploy.CheckpointOptions{Prepare: prepare})
		if err != nil {
			skipped = append(skipped, a.Name+": CRIU could not checkpoint it: "+hint.Sentence(err))
			continue
		}
		run := func(lazy, cold bool) (float64, error) {
			if cold {
				if err := dropFromPageCache(f, lz.Name); err != nil {
					return 0, err
				}
			}
			app := lz
			app.Lazy = lazy
			dep, err := f.D.Deploy(ctx, app, deploy.Options{Mode: spec.ModeRestore})
			if err != nil {
				return 0, err
			}
			defer func() { _ = f.D.Undeploy(ctx, dep.ID) }()
			if check != nil {
				if err := check.after(ctx, dep); err != nil {
					return 0, fmt.Errorf("lazy %v: the restore does not carry the checkpoint's state: %w", lazy, err)
				}
			}
			start, _ := dep.Timings.Get(string(deploy.StepStart))
			ready, _ := dep.Timings.Get(string(deploy.StepReady))
			return ms(start + ready), nil
		}
		var fw, lw, fc, lc []float64
		for i := range reps {
			for _, m := range []struct {
				lazy, cold bool
				into       *[]float64
			}{{false, false, &fw}, {true, false, &lw}, {false, true, &fc}, {true, true, &lc}} {
				v, err := run(m.lazy, m.cold)
				if err != nil {
					return nil, fmt.Sprintf("lazy restore of %s left out: %v", a.Name, err)
				}
				*m.into = append(*m.into, v)
			}
			t.Logf("  lazy restore of %s %d/%d: warm full %s lazy %s; cold full %s lazy %s", a.Name, i+1, reps,
				secs(fw[i]), secs(lw[i]), secs(fc[i]), secs(lc[i]))
		}
		return &evaluation.Lazy{App: a.Name, Engine: engine.NameCRIU, ImageMiB: mib(uint64(g.Bytes)),
			FullWarm: evaluation.Summarize(fw), LazyWarm: evaluation.Summarize(lw),
			FullCold: evaluation.Summarize(fc), LazyCold: evaluation.Summarize(lc)}, ""
	}
	return nil, "lazy restore left out: no app of the run can be checkpointed by CRIU (" + strings.Join(skipped, "; ") + ")"
}

// dropFromPageCache drops the node's copies of app's checkpoints from the
// page cache, so that the next restore reads them from the node's disk.
func dropFromPageCache(f *deploytest.Fixture, app string) error {
	es, err := f.D.Checkpoints().Cached()
	if err != nil {
		return err
	}
	for _, e := range es {
		if e.App != app {
			continue
		}
		err := filepath.WalkDir(e.Dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			fh, err := os.Open(p)
			if err != nil {
				return err
			}
			defer fh.Close()
			return unix.Fadvise(int(fh.Fd()), 0, 0, unix.FADV_DONTNEED)
		})
		if err != nil {
			return err
		}
	}
	return nil
}
