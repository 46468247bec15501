//go:build !no_ceph

package bench

import (
	"cmp"
	"context"
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

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/evaluation"
	"github.com/fogdeploy/fogdeploy/internal/gencache"
	"github.com/fogdeploy/fogdeploy/internal/hint"
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
var catalog = []string{"redis", "pyhttp", "nginx", "postgres", "mariadb", "tomcat", "pgindex", "codesearch"}

var (
	interferenceConcurrency = []int{10, 100, 200, 500, 1000}
	simultaneous            = []int{1, 2, 4, 8}
	// deployLoops deploy and undeploy the load app side by side during the
	// loaded ab runs.
	deployLoops = 2
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

func loadApp(name string) (deploy.App, error) {
	f, err := os.Open(filepath.Join(deploytest.RepoRoot(), "configs", "apps", name+".yaml"))
	if err != nil {
		return deploy.App{}, err
	}
	defer f.Close()
	app, err := deploy.ParseApp(f)
	if err != nil {
		return deploy.App{}, fmt.Errorf("configs/apps/%s.yaml: %w", name, err)
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
	f := deploytest.NewNodeFixture(t)
	res := evaluation.Results{Started: start.UTC(), Host: hostInfo(ctx, t, f)}

	apps := map[string]deploy.App{}
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
	co, err := evalConcurrency(ctx, t, f, apps[concApp], concApp)
	if err != nil {
		t.Fatalf("simultaneous restores: %v", err)
	}
	res.Concurrency = co

	if _, ok := apps["nginx"]; ok {
		load := "nginx"
		for _, n := range cfg.apps {
			if n != "nginx" {
				load = n
				break
			}
		}
		in, err := evalInterference(ctx, t, f, apps["nginx"], apps[load], load, cfg.abSecs)
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
	dir := filepath.Join(cfg.out, start.UTC().Format("20060102-150405"))
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
func evalApp(ctx context.Context, t *testing.T, f *deploytest.Fixture, app deploy.App, catalogName string, reps int) (evaluation.App, error) {
	check := stateCheckFor(deploy.App{Name: catalogName, Command: app.Command, WorkDir: app.WorkDir, Ports: app.Ports})
	a := evaluation.App{Name: catalogName, Engine: app.WithDefaults().Engine, Reps: reps, StateCheck: "none"}
	if check != nil {
		a.StateCheck = check.String()
	}
	var plain, plainApp []float64
	for i := range reps {
		dep, err := f.D.Boot(ctx, app, deploy.Options{Mode: deploy.ModeBoot}, "evaluation: plain boot")
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
	var last deploy.Generation
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
			if err := f.D.RemoveGeneration(ctx, app.Name, last.Gen); err != nil {
				return a, err
			}
		}
		last = g
	}
	// First restores on a node: without its copy of the checkpoint.
	var firstRestore, frR, frW []float64
	for i := range reps {
		if _, err := f.D.TrimCache(func(k gencache.Key) bool { return k.App != app.Name }); err != nil {
			return a, err
		}
		dep, io, err := deployMeasured(ctx, f, app)
		if err != nil {
			return a, fmt.Errorf("first restore on the node %d: %w", i+1, err)
		}
		if dep.Mode != deploy.ModeRestore || !dep.Fetched {
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
		if dep.Mode != deploy.ModeRestore || dep.Gen != last.Gen || dep.Booted {
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
	hit, overhead, refill, err := evalPool(ctx, t, f, app, catalogName, last, check, reps)
	if err != nil {
		return a, err
	}
	a.PoolHitMS, a.PoolOverheadMS, a.PoolRefillMS = evaluation.Summarize(hit), evaluation.Summarize(overhead), evaluation.Summarize(refill)
	a.PlainBootMS, a.PlainAppMS = evaluation.Summarize(plain), evaluation.Summarize(plainApp)
	a.FirstDeployMS, a.BootReadyMS = evaluation.Summarize(first), evaluation.Summarize(bootReady)
	a.CheckpointMS, a.ImageMiB = evaluation.Summarize(ckptMS), evaluation.Summarize(image)
	a.RestoreMS, a.EngineRestartMS = evaluation.Summarize(restore), evaluation.Summarize(engineMS)
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

// deployMeasured deploys app and returns what the OSDs read and wrote
// meanwhile.
func deployMeasured(ctx context.Context, f *deploytest.Fixture, app deploy.App) (deploy.Deployment, cephstore.IOCounters, error) {
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

// poolArrival is how long after a slot's refill a user arrives in the
// evaluation: a pool slot waits for its deploy, and the user does not wait
// for it to settle.
const poolArrival = time.Second

// evalPool measures restores that find a warm-pool slot waiting: per
// repetition, one slot is provisioned (the refill), then a deploy claims
// it. It returns restore-to-ready of the hits, what each added to the
// engine's own restart, and the refills' times.
func evalPool(ctx context.Context, t *testing.T, f *deploytest.Fixture, app deploy.App, catalogName string, g deploy.Generation,
	check stateCheck, reps int) (hit, overhead, refill []float64, err error) {
	for i := range reps {
		start := time.Now()
		s, err := f.D.ProvisionPoolSlot(ctx, g)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("pool refill %d: %w", i+1, err)
		}
		refill = append(refill, ms(time.Since(start)))
		time.Sleep(poolArrival)
		dep, err := f.D.Deploy(ctx, app, deploy.Options{})
		if err != nil {
			_ = f.D.ReleaseSlot(ctx, s.ID)
			return nil, nil, nil, fmt.Errorf("pool hit %d: %w", i+1, err)
		}
		if dep.Pool != deploy.PoolHit || dep.Slot != s.ID {
			_ = f.D.Undeploy(ctx, dep.ID)
			_ = f.D.ReleaseSlot(ctx, s.ID)
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
		t.Logf("  %s pool hit %d/%d: %s (engine %s), refill %s (%s)", catalogName, i+1, reps, secs(total),
			secs(dep.EngineReadyMS), secs(refill[i]), dep.Timings)
		if err := f.D.Undeploy(ctx, dep.ID); err != nil {
			return nil, nil, nil, err
		}
	}
	return hit, overhead, refill, nil
}

// evalConcurrency restores app 1, 2, 4 and 8 times at once on the node
// (it has a generation from evalApp): with no pool, then with a warm pool
// of as many slots.
func evalConcurrency(ctx context.Context, t *testing.T, f *deploytest.Fixture, app deploy.App, catalogName string) (*evaluation.Concurrency, error) {
	co := &evaluation.Concurrency{App: catalogName}
	g, err := f.D.Latest(ctx, app.Name)
	if err != nil {
		return co, err
	}
	for _, n := range simultaneous {
		miss, err := restoreAtOnce(ctx, f, app, n, deploy.PoolMiss)
		if err != nil {
			return co, fmt.Errorf("%d simultaneous restores: %w", n, err)
		}
		for i := range n {
			if _, err := f.D.ProvisionPoolSlot(ctx, g); err != nil {
				_, _ = f.D.DropPool(ctx, app.Name, nil)
				return co, fmt.Errorf("pool slot %d of %d: %w", i+1, n, err)
			}
		}
		time.Sleep(poolArrival)
		hit, err := restoreAtOnce(ctx, f, app, n, deploy.PoolHit)
		if err != nil {
			_, _ = f.D.DropPool(ctx, app.Name, nil)
			return co, fmt.Errorf("%d simultaneous restores with a pool of %d: %w", n, n, err)
		}
		row := evaluation.ConcurrencyRow{N: n, RestoreMS: evaluation.Summarize(miss), PoolHitMS: evaluation.Summarize(hit)}
		co.Rows = append(co.Rows, row)
		t.Logf("  %d simultaneous restores of %s: %s median, %s max; with a pool of %d: %s median, %s max", n, catalogName,
			secs(row.RestoreMS.Median), secs(row.RestoreMS.Max), n, secs(row.PoolHitMS.Median), secs(row.PoolHitMS.Max))
	}
	return co, nil
}

// restoreAtOnce deploys app n times at once, checks that each found the
// pool as want says, undeploys them, and returns their restore-to-ready.
func restoreAtOnce(ctx context.Context, f *deploytest.Fixture, app deploy.App, n int, want deploy.PoolResult) ([]float64, error) {
	deps := make([]deploy.Deployment, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { deps[i], errs[i] = f.D.Deploy(ctx, app, deploy.Options{}) })
	}
	wg.Wait()
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
		if err := f.D.Undeploy(ctx, deps[i].ID); err != nil {
			firstErr = cmpErr(firstErr, err)
		}
	}
	return restoreMS, firstErr
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// evalInterference runs ab against a restored nginx at each concurrency,
// alone and while the node deploys and undeploys load in deployLoops
// loops side by side.
func evalInterference(ctx context.Context, t *testing.T, f *deploytest.Fixture, server, load deploy.App, loadName string, abSecs int) (*evaluation.Interference, error) {
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
	loadGen, err := f.D.Latest(ctx, load.Name)
	if err != nil {
		return nil, fmt.Errorf("%s has no generation to refill a pool with: %w", loadName, err)
	}
	in := &evaluation.Interference{Server: "nginx", PageBytes: len(page), Deploying: loadName, Parallel: deployLoops, Seconds: float64(abSecs)}
	run := func(c int) (evaluation.AB, error) {
		out, err := exec.CommandContext(ctx, ab, "-q", "-t", strconv.Itoa(abSecs), "-n", "10000000", "-c", strconv.Itoa(c),
			"-s", "30", "http://"+addr+"/").CombinedOutput()
		if err != nil {
			return evaluation.AB{}, fmt.Errorf("ab -c %d: %w: %s", c, err, lastLines(string(out), 5))
		}
		return evaluation.ParseAB(string(out))
	}
	for _, c := range interferenceConcurrency {
		alone, err := run(c)
		if err != nil {
			return in, err
		}
		stop := make(chan struct{})
		var mu sync.Mutex
		var deploys int
		var loadErr error
		var wg sync.WaitGroup
		for range deployLoops {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					dep, err := f.D.Deploy(ctx, load, deploy.Options{})
					if err == nil {
						err = f.D.Undeploy(ctx, dep.ID)
					}
					mu.Lock()
					deploys++
					if err != nil && loadErr == nil {
						loadErr = err
					}
					mu.Unlock()
					if err != nil {
						return
					}
				}
			})
		}
		loaded, err := run(c)
		close(stop)
		wg.Wait()
		if err != nil {
			return in, err
		}
		if loadErr != nil {
			return in, fmt.Errorf("deployments of %s during ab -c %d: %w", loadName, c, loadErr)
		}
		refilled, refills, err := abWhileRefilling(ctx, f, loadGen, func() (evaluation.AB, error) { return run(c) })
		if err != nil {
			return in, fmt.Errorf("ab -c %d while a pool of %s refills: %w", c, loadName, err)
		}
		row := evaluation.InterferenceRow{Concurrency: c, BaselineRPS: alone.RPS, LoadedRPS: loaded.RPS, Deploys: deploys,
			Failed:    alone.Failed + loaded.Failed + refilled.Failed + alone.Non2xx + loaded.Non2xx + refilled.Non2xx,
			RefillRPS: refilled.RPS, Refills: refills}
		if alone.RPS > 0 {
			row.OverheadPct = (alone.RPS - loaded.RPS) / alone.RPS * 100
			row.RefillOverheadPct = (alone.RPS - refilled.RPS) / alone.RPS * 100
		}
		in.Rows = append(in.Rows, row)
		t.Logf("  ab -c %d: %.0f req/s alone, %.0f req/s with %d deployments of %s (%.1f%%), %.0f req/s with %d pool slots of it refilled (%.1f%%)",
			c, alone.RPS, loaded.RPS, deploys, loadName, row.OverheadPct, refilled.RPS, refills, row.RefillOverheadPct)
	}
	return in, nil
}

// abWhileRefilling runs ab while the node refills a warm pool of g's app
// as an agent does after hits: one slot at a time, each provisioned at the
// pool's background priority, then released to make room for the next.
func abWhileRefilling(ctx context.Context, f *deploytest.Fixture, g deploy.Generation, ab func() (evaluation.AB, error)) (evaluation.AB, int, error) {
	stop := make(chan struct{})
	var refills int
	var refillErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			s, err := f.D.ProvisionPoolSlot(ctx, g)
			if err == nil {
				refills++
				err = f.D.ReleaseSlot(ctx, s.ID)
			}
			if err != nil {
				refillErr = err
				return
			}
		}
	})
	res, err := ab()
	close(stop)
	wg.Wait()
	if err == nil {
		err = refillErr
	}
	return res, refills, err
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
	if _, v, err := f.D.CheckEngine(ctx, "dmtcp"); err == nil {
		h.DMTCP = v
	}
	if _, v, err := f.D.CheckEngine(ctx, "criu"); err == nil {
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
// largest image among the run's apps that CRIU can checkpoint (those with
// a user run under DMTCP only): from the order to the first answer (start
// and ready), with the node's copy of the checkpoint in the page cache and
// dropped from it. It returns nil and why when no app qualifies.
func evalLazy(ctx context.Context, t *testing.T, f *deploytest.Fixture, apps map[string]deploy.App, evaluated []evaluation.App, reps int) (*evaluation.Lazy, string) {
	ranked := slices.Clone(evaluated)
	slices.SortFunc(ranked, func(a, b evaluation.App) int { return cmp.Compare(b.ImageMiB.Median, a.ImageMiB.Median) })
	var skipped []string
	for _, a := range ranked {
		app := apps[a.Name]
		if why := app.CanCheckpointWith(engine.NameCRIU); why != "" {
			skipped = append(skipped, a.Name+": "+why)
			continue
		}
		lz := app.WithEngine(engine.NameCRIU)
		lz.Name = app.Name + "-criu"
		t.Cleanup(func() { f.UndeployAll(t, lz.Name); f.RemoveGenerations(t, lz.Name) })
		check := stateCheckFor(deploy.App{Name: a.Name, Command: app.Command, WorkDir: app.WorkDir, Ports: app.Ports})
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
			spec := lz
			spec.Lazy = lazy
			dep, err := f.D.Deploy(ctx, spec, deploy.Options{Mode: deploy.ModeRestore})
			if err != nil {
				return 0, err
			}
			defer func() { _ = f.D.Undeploy(ctx, dep.ID) }()
			if check != nil {
				if err := check.after(ctx, dep); err != nil {
					return 0, fmt.Errorf("lazy %v: the restore does not carry the checkpoint's state: %w", lazy, err)
				}
			}
			start, _ := dep.Timings.Get(deploy.StepStart)
			ready, _ := dep.Timings.Get(deploy.StepReady)
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
	es, err := f.D.Cached()
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
