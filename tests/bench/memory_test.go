//go:build !no_ceph

package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/config"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/ksm"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// poolMemoryCounts are the numbers of slots restored ahead whose memory
// TestPoolMemory measures.
var poolMemoryCounts = []int{1, 2, 4}

// PoolMemory is one app's row of TestPoolMemory: the node's memory held by
// 1, 2 and 4 of its slots restored ahead, without same-page merging and
// with it (agent.memory_merge), in one run.
type PoolMemory struct {
	App    string `json:"app"`
	Engine string `json:"engine"`
	// Plain and Merged are the proportional set sizes (MiB) of all the
	// slots' processes, per count of poolMemoryCounts.
	Plain  []float64 `json:"plain_mib"`
	Merged []float64 `json:"merged_mib"`
	// SettleMS is how long merging took to settle after each slot,
	// ScannerCPUMS the scanner's CPU meanwhile (ksmd).
	SettleMS     []float64 `json:"settle_ms"`
	ScannerCPUMS []float64 `json:"scanner_cpu_ms"`
	// HitMS is a deploy taking the last slot (plain, merged): restore
	// to ready.
	HitMS []float64 `json:"hit_ms"`
	// Skipped says why the app has no row (its slots cannot be restored
	// ahead).
	Skipped string `json:"skipped,omitempty"`
}

// Added is what the 2nd..Nth slot added, each, as a share of the first
// slot's memory (0.25: a quarter).
func (m PoolMemory) Added(mib []float64) float64 {
	n := poolMemoryCounts[len(poolMemoryCounts)-1]
	if len(mib) != len(poolMemoryCounts) || mib[0] <= 0 {
		return 0
	}
	return (mib[len(mib)-1] - mib[0]) / float64(n-1) / mib[0]
}

// TestPoolMemory measures what slots restored ahead cost the node, one to
// four of an app, as they wait for a deploy, with the kernel's same-page
// merging off and on (internal/ksm), and what a deploy that takes one
// waits. `make bench` runs it after the evaluation, into the same
// results directory (FOGDEPLOY_BENCH_OUT): pool-memory.json and .md.
func TestPoolMemory(t *testing.T) {
	if os.Getenv(envRun) != "1" {
		t.Skipf("the evaluation runs from `make bench` (%s=1)", envRun)
	}
	cfg, err := evalConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	out := os.Getenv("FOGDEPLOY_BENCH_OUT")
	if out == "" {
		out = t.TempDir()
	}
	ctx := context.Background()
	agentLog, err := os.Create(filepath.Join(out, "pool-memory-agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = agentLog.Close() })
	f := deploytest.NewNodeFixtureWith(t, deploytest.Options{Log: agentLog})
	scanner := scannerFor(t)
	merging := f.ReopenWith(t, func(c *deploy.Config) { c.MemoryMerge = true })
	var rows []PoolMemory
	for _, name := range cfg.apps {
		app, err := loadApp(name)
		if err != nil {
			t.Fatal(err)
		}
		app.Name = namePrefix + "mem-" + name
		t.Cleanup(func() { f.UndeployAll(t, app.Name); f.RemoveGenerations(t, app.Name) })
		f.UndeployAll(t, app.Name)
		f.RemoveGenerations(t, app.Name)
		row, err := poolMemory(ctx, t, f, merging, scanner, app, name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		rows = append(rows, row)
		f.UndeployAll(t, app.Name)
		f.RemoveGenerations(t, app.Name)
	}
	b, err := json.MarshalIndent(rows, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "pool-memory.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "pool-memory.md"), []byte(poolMemoryTable(rows)), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("pool memory:\n%s", poolMemoryTable(rows))
}

// poolMemory measures one app (name in the catalog).
func poolMemory(ctx context.Context, t *testing.T, f *deploytest.Fixture, merging *deploy.Deployer, scanner ksm.Node, app spec.App, name string) (PoolMemory, error) {
	row := PoolMemory{App: name}
	first, err := f.D.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		return row, fmt.Errorf("first deploy: %w", err)
	}
	if err := f.D.Undeploy(ctx, first.ID); err != nil {
		return row, err
	}
	g, err := f.D.Checkpoints().Latest(ctx, app.Name)
	if err != nil {
		return row, err
	}
	row.Engine = string(g.Engine)
	if err := f.D.Pool().CanStartAhead(g); err != nil {
		row.Skipped = err.Error()
		return row, nil
	}
	for _, d := range []*deploy.Deployer{f.D, merging} {
		merged := d == merging
		var ids []string
		release := func() {
			for _, id := range ids {
				_ = d.Pool().ReleaseSlot(context.Background(), id)
			}
			ids = nil
		}
		for n := 1; n <= poolMemoryCounts[len(poolMemoryCounts)-1]; n++ {
			s, err := d.Pool().ProvisionPoolSlot(ctx, g)
			if err == nil {
				ids = append(ids, s.ID)
				_, err = d.Pool().StartAhead(ctx, g, s.ID)
			}
			if err != nil {
				release()
				return row, fmt.Errorf("slot %d restored ahead (merging %v): %w", n, merged, err)
			}
			if !slices.Contains(poolMemoryCounts, n) {
				continue
			}
			if merged {
				cpu0, t0 := scannerCPU(), time.Now()
				if _, err := scanner.Settle(ctx); err != nil {
					release()
					return row, err
				}
				row.SettleMS = append(row.SettleMS, msSince(t0))
				row.ScannerCPUMS = append(row.ScannerCPUMS, scannerCPU()-cpu0)
			}
			var kb uint64
			for _, id := range ids {
				pids, err := deploytest.InstanceProcs(d, id)
				if err != nil {
					release()
					return row, err
				}
				kb += deploytest.PSSKiB(pids...)
			}
			mib := float64(kb) / 1024
			if merged {
				row.Merged = append(row.Merged, mib)
			} else {
				row.Plain = append(row.Plain, mib)
			}
			t.Logf("  %s: slots restored ahead: %d, merging %v: %.1f MiB", name, n, merged, mib)
		}
		t0 := time.Now()
		dep, err := d.Deploy(ctx, app, deploy.Options{})
		if err != nil {
			release()
			return row, fmt.Errorf("a deploy taking a slot restored ahead (merging %v): %w", merged, err)
		}
		row.HitMS = append(row.HitMS, msSince(t0))
		if dep.Pool != spec.PoolHit {
			t.Errorf("%s: the deploy after %d slots restored ahead was a pool %s", name, len(ids), dep.Pool)
		}
		if err := d.Undeploy(ctx, dep.ID); err != nil {
			release()
			return row, err
		}
		release()
	}
	return row, nil
}

// scannerFor turns the node's scanner on as an agent with
// agent.memory_merge does, and puts its settings back after the test.
func scannerFor(t *testing.T) ksm.Node {
	t.Helper()
	n, err := deploytest.ScannerOn(t, config.MemoryMerge{Enabled: true, PagesToScan: config.DefaultMergePages}.Settings())
	if err != nil {
		t.Fatalf("the node's same-page merging: %v", err)
	}
	return n
}

// scannerCPU is the CPU time (ms) the kernel's ksmd thread used so far.
func scannerCPU() float64 {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if b, _ := os.ReadFile("/proc/" + e.Name() + "/comm"); strings.TrimSpace(string(b)) == "ksmd" {
			if _, v, ok := procCPU(e.Name()); ok {
				return v * 1000
			}
		}
	}
	return 0
}

func msSince(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }

// poolMemoryTable is the Markdown table of rows.
func poolMemoryTable(rows []PoolMemory) string {
	var b strings.Builder
	b.WriteString("| app | engine | 1 / 2 / 4 slots, no merging (MiB) | 1 / 2 / 4 slots, merged (MiB) | each slot after the first, of the first (no merging / merged) | merging settled after each (s) | scanner CPU (s) | a hit (no merging / merged) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		if r.Skipped != "" {
			fmt.Fprintf(&b, "| %s | %s | no slot restored ahead: %s | | | | | |\n", r.App, r.Engine, r.Skipped)
			continue
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %.0f %% / %.0f %% | %s | %s | %s |\n", r.App, r.Engine, joinf(r.Plain, 1, 1), joinf(r.Merged, 1, 1),
			100*r.Added(r.Plain), 100*r.Added(r.Merged), joinf(r.SettleMS, 1e-3, 1), joinf(r.ScannerCPUMS, 1e-3, 2), joinf(r.HitMS, 1, 1)+" ms")
	}
	return b.String()
}

// joinf formats vs scaled by k with prec decimals, joined by " / ".
func joinf(vs []float64, k float64, prec int) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = strconv.FormatFloat(v*k, 'f', prec, 64)
	}
	return strings.Join(s, " / ")
}
