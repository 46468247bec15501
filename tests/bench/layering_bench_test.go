//go:build !no_ceph

// Package bench holds fogdeploy's benchmarks. They run against the dev
// cluster (`make bench`) and report ratios measured side by side in one
// run, never absolute thresholds.
package bench

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/testenv"
	"github.com/fogdeploy/fogdeploy/internal/wire"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/cephstore"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

const payload = 64 << 20

func openLayering(b *testing.B) *wire.Layering {
	testenv.NeedRoot(b)
	c := testenv.CephCluster(b)
	ctx := context.Background()
	s, err := cephstore.Open(ctx, cephstore.Config{Conf: c.Conf, Keyring: c.Keyring, ID: c.ID, Pool: c.Pool})
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	l, err := wire.NewLayering(ctx, s, c.Pool,
		mapper.Config{Backend: mapper.BackendAuto, StateDir: dir + "/mapper", CephConf: c.Conf, Keyring: c.Keyring, ID: c.ID},
		layering.DefaultManagerConfig(dir+"/work"), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return l
}

// BenchmarkCloneMapMount measures, per deployment of an environment, the
// clone, the map+mount, and cold and warm reads of a 64 MiB file from the
// clone; and, side by side, a full import of the same files. It reports
// p50/p95 of each phase and import/clone+mount as a speedup.
func BenchmarkCloneMapMount(b *testing.B) {
	l := openLayering(b)
	ctx := context.Background()
	rootfs := b.TempDir()
	f, err := os.Create(filepath.Join(rootfs, "data.bin"))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.CopyN(f, rand.Reader, payload); err != nil {
		b.Fatal(err)
	}
	f.Close()
	envName := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	importStart := time.Now()
	env, err := l.Manager.Import(ctx, envName, layering.Source{Dir: rootfs}, layering.ImportOptions{Size: 256 << 20})
	if err != nil {
		b.Fatal(err)
	}
	importTime := time.Since(importStart)
	b.Cleanup(func() { _, _ = l.Manager.Remove(context.Background(), envName) })

	var clone, mount, total, cold, warm []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		child := fmt.Sprintf("fdi-bench-%d-%d", time.Now().UnixNano(), i)
		t0 := time.Now()
		if err := l.Store.Clone(ctx, env.Ref, child); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		target := b.TempDir()
		unmount, err := l.Manager.Mounter().Mount(ctx, child, target, layering.MountOptions{})
		if err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		cold = append(cold, readAll(b, filepath.Join(target, "data.bin")))
		warm = append(warm, readAll(b, filepath.Join(target, "data.bin")))
		clone, mount, total = append(clone, t1.Sub(t0)), append(mount, t2.Sub(t1)), append(total, t2.Sub(t0))
		b.StopTimer()
		if err := unmount(ctx); err != nil {
			b.Fatal(err)
		}
		if err := l.Store.Remove(ctx, child); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	mbps := func(d time.Duration) float64 { return float64(payload) / (1 << 20) / d.Seconds() }
	b.ReportMetric(ms(pct(clone, 50)), "clone-p50-ms")
	b.ReportMetric(ms(pct(clone, 95)), "clone-p95-ms")
	b.ReportMetric(ms(pct(mount, 50)), "mapmount-p50-ms")
	b.ReportMetric(ms(pct(mount, 95)), "mapmount-p95-ms")
	b.ReportMetric(ms(sum(total)), "sum-clone+mount-ms")
	b.ReportMetric(mbps(pct(cold, 50)), "cold-read-MB/s")
	b.ReportMetric(mbps(pct(warm, 50)), "warm-read-MB/s")
	b.ReportMetric(ms(importTime)/ms(pct(total, 50)), "import/clone-speedup")
	b.Logf("%d runs: clone p50 %.1f ms p95 %.1f ms; map+mount p50 %.1f ms p95 %.1f ms; sum %.0f ms; "+
		"64 MiB read from a clone: cold %.0f MB/s, warm %.0f MB/s; full import %.0f ms = %.1fx a clone+mount",
		len(total), ms(pct(clone, 50)), ms(pct(clone, 95)), ms(pct(mount, 50)), ms(pct(mount, 95)), ms(sum(total)),
		mbps(pct(cold, 50)), mbps(pct(warm, 50)), ms(importTime), ms(importTime)/ms(pct(total, 50)))
}

func readAll(b *testing.B, path string) time.Duration {
	t := time.Now()
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	n, err := io.Copy(io.Discard, f)
	if err != nil || n != payload {
		b.Fatalf("read %s: %d bytes, %v", path, n, err)
	}
	return time.Since(t)
}

func pct(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, (len(s)*p+99)/100-1)]
}

func sum(d []time.Duration) (t time.Duration) {
	for _, x := range d {
		t += x
	}
	return t
}
