//go:build !no_ceph

package bench

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// benchApps are the apps of the deploy benchmark: redis, and redis behind a
// boot that does about 5 s of work (perl builds a 3-million-entry index and
// loads a digest of it into redis) before the server is ready.
func benchApps(env string) map[string]deploy.App {
	redis := deploytest.RedisApp("bench-redis", env, engine.NameDMTCP)
	slow := deploytest.RedisApp("bench-slowboot", env, engine.NameDMTCP)
	slow.Command = []string{"sh", "-c", strings.Join(slow.Command, " ") + " & " +
		`perl -e 'my %h; for my $i (1..3000000) { $h{"key$i"} = ($i * 7919) % 100003 } ` +
		`for my $i (1..20000) { print "SET idx:$i $h{qq(key$i)}\r\n" } print "SET warm 1\r\n"' > /tmp/index.txt; ` +
		`until redis-cli ping >/dev/null 2>&1; do sleep 0.05; done; ` +
		`redis-cli --pipe < /tmp/index.txt >/dev/null; rm /tmp/index.txt; wait`}
	slow.Command[2] = strings.Replace(slow.Command[2], "--save  ", "--save '' ", 1)
	slow.Ready.Send, slow.Ready.Expect = "EXISTS warm\r\n", ":1"
	slow.Ready.Timeout = deploy.Duration(2 * time.Minute)
	slow.Resources.Memory = "1G" // the index takes about 400 MiB while it is built
	return map[string]deploy.App{"redis": redis, "slowboot": slow}
}

// BenchmarkDeploy measures, per app, side by side in one run: boot-to-ready
// of the first deploy (clone, map, mount, container, boot under DMTCP,
// ready), restore-to-ready of later deploys (clone, map, mount, container,
// restart, ready), the engine's own restart-to-ready inside the container
// for the same image, and the orchestration overhead (restore-to-ready
// minus the engine's). It reports p50s and the speedup boot/restore.
// APPS=redis,slowboot picks a subset.
func BenchmarkDeploy(b *testing.B) {
	f := deploytest.NewFixture(b, "container")
	apps := benchApps(f.Env)
	names := []string{"redis", "slowboot"}
	if s := os.Getenv("APPS"); s != "" {
		names = strings.Split(s, ",")
	}
	for _, name := range names {
		app, ok := apps[name]
		if !ok {
			b.Fatalf("APPS: unknown app %q (have redis, slowboot)", name)
		}
		b.Run(name, func(b *testing.B) { benchDeploy(b, f, app) })
	}
}

const boots = 3

func benchDeploy(b *testing.B, f *deploytest.Fixture, app deploy.App) {
	ctx := context.Background()
	b.Cleanup(func() { f.UndeployAll(b, app.Name); f.RemoveGenerations(b, app.Name) })
	var bootMS []float64
	for range boots {
		g, err := f.D.Checkpoint(ctx, app, deploy.CheckpointOptions{})
		if err != nil {
			b.Fatal(err)
		}
		bootMS = append(bootMS, ms(sumPhases(g.Timings, "clone", "map", "mount", "container", "ready")))
		b.Logf("boot %d: %s (image %d MiB)", g.Gen, g.Timings, g.Bytes>>20)
	}
	var restoreMS, engineMS, overheadMS []float64
	b.ResetTimer()
	for range b.N {
		dep, err := f.D.Deploy(ctx, app, deploy.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		total := ms(dep.Total())
		restoreMS = append(restoreMS, total)
		engineMS = append(engineMS, dep.EngineReadyMS)
		overheadMS = append(overheadMS, total-dep.EngineReadyMS)
		if err := f.D.Undeploy(ctx, dep.ID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	boot, restore := p50(bootMS), p50(restoreMS)
	b.ReportMetric(boot, "boot-p50-ms")
	b.ReportMetric(restore, "restore-p50-ms")
	b.ReportMetric(p50(engineMS), "engine-restart-p50-ms")
	b.ReportMetric(p50(overheadMS), "overhead-p50-ms")
	b.ReportMetric(boot/restore, "speedup")
	b.Logf("%s: boot-to-ready p50 %.0f ms; restore-to-ready p50 %.0f ms (engine %.0f ms, overhead %.0f ms); speedup %.1fx",
		app.Name, boot, restore, p50(engineMS), p50(overheadMS), boot/restore)
}

func sumPhases(t layering.Timings, names ...string) time.Duration {
	var d time.Duration
	for _, p := range t {
		if slices.Contains(names, p.Name) {
			d += p.Duration
		}
	}
	return d
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func p50(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
