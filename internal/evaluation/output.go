package evaluation

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Files are the names Write creates in its directory.
const (
	FileJSON         = "results.json"
	FileMarkdown     = "results.md"
	FileAppsCSV      = "apps.csv"
	FilePhasesCSV    = "phases.csv"
	FileInterfCSV    = "interference.csv"
	FileCostsCSV     = "deploy_costs.csv"
	FileConcurrCSV   = "concurrency.csv"
	PlotBootRestore  = "boot_vs_restore.svg"
	PlotCheckpoint   = "checkpoint.svg"
	PlotPhases       = "restore_phases.svg"
	PlotIO           = "osd_io.svg"
	PlotInterference = "interference.svg"
	PlotConcurrency  = "concurrency.svg"
)

// Write writes r into dir (created if needed) as JSON, CSV, Markdown and
// SVG plots, and returns the paths it wrote.
func Write(dir string, r Results) ([]string, error) {
	if len(r.Apps) == 0 && r.Interference == nil && len(r.Concurrency) == 0 {
		return nil, ErrNoResults
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var written []string
	put := func(name string, fn func(io.Writer) error) error {
		p := filepath.Join(dir, name)
		f, err := os.Create(p)
		if err != nil {
			return err
		}
		if err := fn(f); err != nil {
			f.Close()
			return fmt.Errorf("write %s: %w", p, err)
		}
		if err := f.Close(); err != nil {
			return err
		}
		written = append(written, p)
		return nil
	}
	steps := []struct {
		name string
		fn   func(io.Writer) error
		skip bool
	}{
		{FileJSON, func(w io.Writer) error { return WriteJSON(w, r) }, false},
		{FileAppsCSV, func(w io.Writer) error { return WriteAppsCSV(w, r.Apps) }, len(r.Apps) == 0},
		{FilePhasesCSV, func(w io.Writer) error { return WritePhasesCSV(w, r.Apps) }, len(r.Apps) == 0},
		{FileInterfCSV, func(w io.Writer) error { return WriteInterferenceCSV(w, r.Interference) }, r.Interference == nil},
		{FileCostsCSV, func(w io.Writer) error { return WriteCostsCSV(w, r.Interference.Costs) }, r.Interference == nil || len(r.Interference.Costs) == 0},
		{FileConcurrCSV, func(w io.Writer) error { return WriteConcurrencyCSV(w, r.Concurrency) }, len(r.Concurrency) == 0},
		{FileMarkdown, func(w io.Writer) error { return WriteMarkdown(w, r) }, false},
	}
	for _, s := range steps {
		if s.skip {
			continue
		}
		if err := put(s.name, s.fn); err != nil {
			return written, err
		}
	}
	plots, err := Plot(dir, r)
	return append(written, plots...), err
}

// WriteJSON writes r as indented JSON.
func WriteJSON(w io.Writer, r Results) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// appColumns are the Stats columns of apps.csv, in order.
var appColumns = []struct {
	name string
	get  func(App) Stats
}{
	{"plain_boot_ms", func(a App) Stats { return a.PlainBootMS }},
	{"plain_app_ms", func(a App) Stats { return a.PlainAppMS }},
	{"first_deploy_ms", func(a App) Stats { return a.FirstDeployMS }},
	{"boot_ready_ms", func(a App) Stats { return a.BootReadyMS }},
	{"checkpoint_ms", func(a App) Stats { return a.CheckpointMS }},
	{"image_mib", func(a App) Stats { return a.ImageMiB }},
	{"first_restore_ms", func(a App) Stats { return a.FirstRestoreMS }},
	{"restore_ms", func(a App) Stats { return a.RestoreMS }},
	{"engine_restart_ms", func(a App) Stats { return a.EngineRestartMS }},
	{"pool_hit_ms", func(a App) Stats { return a.PoolHitMS }},
	{"pool_overhead_ms", func(a App) Stats { return a.PoolOverheadMS }},
	{"pool_restart_ms", func(a App) Stats { return a.PoolRestartMS }},
	{"pool_refill_ms", func(a App) Stats { return a.PoolRefillMS }},
	{"spare_ms", func(a App) Stats { return a.SpareMS }},
	{"spare_overhead_ms", func(a App) Stats { return a.SpareOverheadMS }},
	{"miss_overhead_ms", func(a App) Stats { return a.MissOverheadMS }},
	{"checkpoint_osd_read_mib", func(a App) Stats { return a.CheckpointIO.ReadMiB }},
	{"checkpoint_osd_written_mib", func(a App) Stats { return a.CheckpointIO.WrittenMiB }},
	{"first_restore_osd_read_mib", func(a App) Stats { return a.FirstRestoreIO.ReadMiB }},
	{"first_restore_osd_written_mib", func(a App) Stats { return a.FirstRestoreIO.WrittenMiB }},
	{"restore_osd_read_mib", func(a App) Stats { return a.RestoreIO.ReadMiB }},
	{"restore_osd_written_mib", func(a App) Stats { return a.RestoreIO.WrittenMiB }},
	{"auto_ms", func(a App) Stats { return a.AutoMS }},
}

// seconds renders ms as seconds: "1.23 s", with min–max when they differ.
func seconds(s Stats) string {
	if s.N == 0 {
		return "–"
	}
	if s.Max < 100 {
		return millis(s) // a pool hit: 0.00 s says nothing
	}
	sec := Stats{N: s.N, Min: s.Min / 1000, Median: s.Median / 1000, Max: s.Max / 1000}
	return sec.String() + " s"
}

// millis renders ms: "12.3 ms", with min–max when they differ.
func millis(s Stats) string {
	if s.N == 0 {
		return "–"
	}
	return s.String() + " ms"
}

// ratio renders v/base as "1.8x", or "–" without a base.
func ratio(v, base float64) string {
	if base <= 0 || v <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.1fx", v/base)
}

// WriteMarkdown writes the tables of r, with links to the plots.
func WriteMarkdown(w io.Writer, r Results) error {
	var b strings.Builder
	writeHost(&b, r)
	if len(r.Apps) > 0 {
		writeApps(&b, r.Apps)
	}
	if in := r.Interference; in != nil {
		writeInterference(&b, in)
	}
	writeConcurrency(&b, r)
	if lz := r.Lazy; lz != nil {
		writeLazy(&b, lz)
	}
	if len(r.Notes) > 0 {
		b.WriteString("## Notes\n\n")
		for _, n := range r.Notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeHost is the report's title and the machine it ran on.
func writeHost(b *strings.Builder, r Results) {
	fmt.Fprintf(b, "# fogdeploy evaluation, %s\n\n", r.Started.UTC().Format("2006-01-02 15:04 UTC"))
	h := r.Host
	fmt.Fprintf(b, "%d CPUs, %d MiB RAM, Linux %s; Ceph %s (%d OSD, %s), mapped with %s; Docker %s",
		h.CPUs, h.MemoryMiB, h.Kernel, h.Ceph, h.OSDs, h.ObjectStore, h.Mapper, h.Docker)
	if h.DMTCP != "" {
		fmt.Fprintf(b, "; DMTCP %s", h.DMTCP)
	}
	if h.CRIU != "" {
		fmt.Fprintf(b, "; CRIU %s", h.CRIU)
	}
	fmt.Fprintf(b, ". The run took %.0f s. Values are median (min–max) over the repetitions.\n\n", r.Seconds)
}

// writeApps is the per-app tables: boot against restore, the warm pool,
// checkpoints, bytes at the OSDs, restore phases, the state carried.
func writeApps(b *strings.Builder, apps []App) {
	b.WriteString("## Boot against restore (Table I)\n\n")
	b.WriteString("| app | engine | reps | plain boot | first deploy (boot + checkpoint) | first restore on a node | speedup | restore (checkpoint local) | speedup | engine restart |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, a := range apps {
		fmt.Fprintf(b, "| %s | %s | %d | %s | %s | %s | %.1fx | %s | %.1fx | %s |\n", a.Name, a.Engine, a.Reps,
			seconds(a.PlainBootMS), seconds(a.FirstDeployMS), seconds(a.FirstRestoreMS), a.FirstSpeedup,
			seconds(a.RestoreMS), a.Speedup, seconds(a.EngineRestartMS))
	}
	fmt.Fprintf(b, "\nPlain boot is a deploy that boots the app in a plain container of a clone of the same environment. "+
		"A first restore on a node fetches the checkpoint to the node (while the environment is cloned, mapped and mounted); "+
		"later restores there read the node's copy. Speedup = plain boot / restore.\n\n![boot vs restore](%s)\n\n", PlotBootRestore)

	b.WriteString("## Spare slots: restores without a pool slot of their app\n\n")
	b.WriteString("| app | restore (a slot of its own) | beyond the engine's restart | restore (a spare slot) | beyond the engine's restart | speedup (spare against own) | memory of an idle spare | CPU of an idle spare |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, a := range apps {
		if a.NoSpare != "" {
			fmt.Fprintf(b, "| %s | %s | %s | %s | – | – | – | – |\n", a.Name, seconds(a.RestoreMS), millis(a.MissOverheadMS), a.NoSpare)
			continue
		}
		speedup := 0.0
		if a.SpareMS.Median > 0 {
			speedup = a.RestoreMS.Median / a.SpareMS.Median
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %.1fx | %.1f MiB | %.1f ms/s |\n", a.Name, seconds(a.RestoreMS), millis(a.MissOverheadMS),
			seconds(a.SpareMS), millis(a.SpareOverheadMS), speedup, a.SpareSlotMiB, a.SpareSlotCPU)
	}
	b.WriteString("\nBoth restore with the checkpoint on the node. A slot of its own is cloned, mapped, mounted and its container created " +
		"for the deploy; a spare slot (agent.spare_slots) was made before for no app, and the deploy only attaches the app to it " +
		"(its root over the node's copy of the environment, its checkpoint, its ports and limits). Beyond the engine's restart: " +
		"the restore's time less the engine's own restart-to-ready, as the entrypoint measured it. The memory and CPU of an idle " +
		"spare are measured as those of an idle pool slot, with 4 spares (shim, waiting entrypoint, rbd-fuse, and port proxies where dockerd runs them).\n\n")

	b.WriteString("## Warm pool: restores that find a slot waiting\n\n")
	b.WriteString("| app | restore (pool miss) | pool hit, restart on request | pool hit (restored ahead) | beyond the engine's restart | speedup (pool hit) | refilling one slot | memory of an idle slot | CPU of an idle slot | auto chose | auto | speedup (auto) |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|\n")
	for _, a := range apps {
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %.1fx | %s | %.1f MiB | %.1f ms/s | %s | %s | %.1fx |\n", a.Name, seconds(a.RestoreMS), seconds(a.PoolRestartMS), seconds(a.PoolHitMS),
			millis(a.PoolOverheadMS), a.PoolSpeedup, seconds(a.PoolRefillMS), a.PoolSlotMiB, a.PoolSlotCPU, a.AutoMode, seconds(a.AutoMS), a.AutoSpeedup)
	}
	b.WriteString("\nA pool hit runs only start, ready and bind: the slot's clone, mapping, mount and container were made before " +
		"the deploy (refilling one slot), at the lowest CPU weight. A slot restored ahead (the agent's default, agent.pool_ahead) " +
		"also ran the engine's restart before the deploy and waited at that weight: the hit raises it; its refill includes the restart, and its memory the app's. " +
		"The memory and CPU of an idle slot are those of the processes 4 slots restored ahead added (shim, entrypoint, app, " +
		"coordinator, rbd-fuse, and port proxies where dockerd runs them), per slot; the CPU is counted over 5 s once they have settled. " +
		"Speedup = plain boot / pool hit (restored ahead). Auto is mode auto: " +
		"its policy chose from the plain boots and pool hits above (restore only when restoring is faster), and one deploy " +
		"ran as it chose.\n\n")
	for _, a := range apps {
		if a.AutoReason != "" {
			fmt.Fprintf(b, "- %s: %s\n", a.Name, a.AutoReason)
		}
	}
	b.WriteString("\n")

	b.WriteString("## Checkpoints (Fig. 7)\n\n| app | image (MiB) | checkpoint time | app boot under the engine |\n|---|---:|---:|---:|\n")
	for _, a := range apps {
		fmt.Fprintf(b, "| %s | %s | %s | %s |\n", a.Name, a.ImageMiB, seconds(a.CheckpointMS), seconds(a.BootReadyMS))
	}
	fmt.Fprintf(b, "\n![checkpoint size and time](%s)\n\n", PlotCheckpoint)

	b.WriteString("## Bytes at the OSDs (Fig. 8)\n\nFrom the OSDs' own counters (`op_r_out_bytes`, `op_w_in_bytes`), per operation.\n\n")
	b.WriteString("| app | image MiB | checkpoint: read MiB | checkpoint: written MiB | first restore on a node: read MiB | restore (checkpoint local): read MiB | of the image | restore: written MiB |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, a := range apps {
		share := "-"
		if a.ImageMiB.Median > 0 {
			share = fmt.Sprintf("%.0f %%", 100*a.RestoreIO.ReadMiB.Median/a.ImageMiB.Median)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", a.Name, a.ImageMiB, a.CheckpointIO.ReadMiB, a.CheckpointIO.WrittenMiB,
			a.FirstRestoreIO.ReadMiB, a.RestoreIO.ReadMiB, share, a.RestoreIO.WrittenMiB)
	}
	fmt.Fprintf(b, "\n![OSD bytes](%s)\n\n", PlotIO)

	b.WriteString("## Restore phases\n\n| app | phase | ms |\n|---|---|---:|\n")
	for _, a := range apps {
		for _, p := range a.Phases {
			fmt.Fprintf(b, "| %s | %s | %s |\n", a.Name, p.Name, p.MS)
		}
	}
	fmt.Fprintf(b, "\n![restore phases](%s)\n\n", PlotPhases)

	b.WriteString("## State carried by the checkpoint\n\n")
	for _, a := range apps {
		fmt.Fprintf(b, "- %s: %s\n", a.Name, a.StateCheck)
	}
	b.WriteString("\n")
}

// writeConcurrency is the tables of simultaneous restores.
func writeConcurrency(b *strings.Builder, r Results) {
	for _, co := range r.Concurrency {
		fmt.Fprintf(b, "## Simultaneous restores of %s on one node\n\n| simultaneous | restore-to-ready (pool miss) | ratio to one | pool of N, restart on request | ratio to one | pool of N restored ahead | ratio to one |\n|---:|---:|---:|---:|---:|---:|---:|\n", co.Label())
		var one, onePool, oneAhead float64
		for _, row := range co.Rows {
			if row.N == 1 {
				one, onePool, oneAhead = row.RestoreMS.Median, row.PoolHitMS.Median, row.AheadMS.Median
			}
			fmt.Fprintf(b, "| %d | %s | %s | %s | %s | %s | %s |\n", row.N, seconds(row.RestoreMS), ratio(row.RestoreMS.Median, one),
				seconds(row.PoolHitMS), ratio(row.PoolHitMS.Median, onePool), seconds(row.AheadMS), ratio(row.AheadMS.Median, oneAhead))
		}
		b.WriteString("\n")
		writeAheadPhases(b, co, r.Host.CPUs)
		if co.Rounds > 1 {
			order := ""
			if co.Interleaved {
				order = ", the rows' rounds alternating so that the machine's drift weighs on every row alike"
			}
			fmt.Fprintf(b, "The pool series ran %d rounds in the row of the largest N, and in each other row as many rounds as give it as many deploys (each round: N slots provisioned, N deploys at once)%s; medians and ranges are over every deploy of every round.\n\n", co.Rounds, order)
		}
	}
	if len(r.Concurrency) > 0 {
		fmt.Fprintf(b, "![latency vs concurrency](%s)\n\n", PlotConcurrency)
	}
}

// writeLazy is the lazy restore's table.
func writeLazy(b *strings.Builder, lz *Lazy) {
	fmt.Fprintf(b, "## Lazy restore: time to the first answer\n\n%s (%s, %.0f MiB image), from the order to the first answer (start + ready), a full restore against CRIU's lazy pages, "+
		"with the node's copy of the checkpoint in the page cache (warm) and dropped from it (cold).\n\n", lz.App, lz.Engine, lz.ImageMiB)
	b.WriteString("| | full restore | lazy restore | ratio |\n|---|---:|---:|---:|\n")
	fmt.Fprintf(b, "| warm | %s | %s | %s |\n", seconds(lz.FullWarm), seconds(lz.LazyWarm), ratio(lz.LazyWarm.Median, lz.FullWarm.Median))
	fmt.Fprintf(b, "| cold | %s | %s | %s |\n\n", seconds(lz.FullCold), seconds(lz.LazyCold), ratio(lz.LazyCold.Median, lz.FullCold.Median))
}

// repsNote says how the interference cells were repeated.
func repsNote(reps int) string {
	if reps < 2 {
		return ""
	}
	return fmt.Sprintf(" Each cell is the median of %d runs, alone and at each rate in turn, round after round; deploys are their sum.", reps)
}

// writeInterference renders Table II: throughput alone and at each deploy
// rate, its loss, and the paper's loss beside it; then what a deploy costs.
func writeInterference(b *strings.Builder, in *Interference) {
	rates := in.RateNames()
	fmt.Fprintf(b, "## Interference (Table II)\n\n%s serving a %d-byte page under `ab` (%.0f s per run), alone and while the "+
		"same node deploys and undeploys %s at a stated rate, as an agent with a warm pool of one slot does: each deploy "+
		"takes the waiting slot, and its undeploy gives the instance back to the pool, recycled in its container (a slot is "+
		"provisioned anew only where that fails). %s%s\n\n", in.Server, in.PageBytes, in.Seconds, in.Deploying, in.Priority, repsNote(in.Reps))
	b.WriteString("| concurrency | alone (req/s) |")
	sep := "|---:|---:|"
	for _, rate := range rates {
		fmt.Fprintf(b, " deploys at %s (req/s) | loss |", rate)
		sep += "---:|---:|"
	}
	b.WriteString(" the paper's loss |\n" + sep + "---:|\n")
	for _, row := range in.Rows {
		fmt.Fprintf(b, "| %d | %.0f |", row.Concurrency, row.BaselineRPS)
		for _, rate := range rates {
			if x, ok := row.Run(rate); ok {
				fmt.Fprintf(b, " %.0f (%d deploys, %.2f/s) | %.1f%% |", x.RPS, x.Deploys, x.PerSecond, x.OverheadPct)
			} else {
				b.WriteString(" – | – |")
			}
		}
		if v, ok := PaperTableII[row.Concurrency]; ok {
			fmt.Fprintf(b, " %.1f%% |\n", v)
		} else {
			b.WriteString(" – |\n")
		}
	}
	var failed int
	for _, row := range in.Rows {
		failed += row.BaselineFailed
		for _, x := range row.Runs {
			failed += x.Failed
		}
	}
	fmt.Fprintf(b, "\nFailed or non-2xx requests in all these runs: %d.\n\n![interference](%s)\n\n", failed, PlotInterference)
	if len(in.Costs) > 0 {
		fmt.Fprintf(b, "What one deploy of %s costs the node: CPU time of every process of the machine (agent work, rbd-fuse, "+
			"dockerd, the engine, the OSD) over the deploy and its undeploy (recycled: the instance goes back to the pool; "+
			"refilled: it is removed and a slot provisioned anew), less what the "+
			"idle node uses in as long; and what the OSDs moved for it.\n\n"+
			"| deploy | CPU-seconds | wall time (deploy to undeployed) | OSD read | OSD written |\n|---|---:|---:|---:|---:|\n", in.Deploying)
		for _, k := range in.Costs {
			fmt.Fprintf(b, "| %s | %.2f (%.2f–%.2f) | %s | %.1f MiB | %.1f MiB |\n", k.Kind, k.CPUSeconds.Median, k.CPUSeconds.Min,
				k.CPUSeconds.Max, seconds(k.WallMS), k.OSDReadMiB, k.OSDWroteMiB)
		}
		b.WriteString("\nWhere the CPU time goes (CPU-seconds per deploy, the mean of the runs; the six largest):\n\n")
		for _, k := range in.Costs {
			var parts []string
			for i, p := range k.ByProcess {
				if i == 6 {
					break
				}
				parts = append(parts, fmt.Sprintf("%s %.2f", p.Name, p.Seconds))
			}
			fmt.Fprintf(b, "- %s: %s\n", k.Kind, strings.Join(parts, ", "))
		}
		b.WriteString("\n")
	}
}

// writeAheadPhases tabulates the phases of the deploys that took slots
// restored ahead, per number of simultaneous deploys: where their time
// went (a phase that not every deploy had, such as queue, says in how
// many), and, where it was measured, the node's CPU time per deploy and
// what a round of them needs of the node's cpus.
func writeAheadPhases(b *strings.Builder, co *Concurrency, cpus int) {
	var names []string
	withCPU := false
	for _, row := range co.Rows {
		for _, p := range row.AheadPhases {
			if !slices.Contains(names, p.Name) {
				names = append(names, p.Name)
			}
		}
		withCPU = withCPU || (row.AheadCPUMS.N > 0 && len(row.AheadPhases) > 0)
	}
	if len(names) == 0 {
		return
	}
	cols := slices.Clone(names)
	if withCPU {
		cols = append(cols, "node CPU per deploy", fmt.Sprintf("round's CPU / %d CPUs", max(cpus, 1)))
	}
	fmt.Fprintf(b, "Phases of the deploys restored ahead (ms, median (min–max); a phase that not every deploy had says in how many):\n\n| simultaneous | %s |\n|---:|%s\n",
		strings.Join(cols, " | "), strings.Repeat("---:|", len(cols)))
	for _, row := range co.Rows {
		if len(row.AheadPhases) == 0 {
			continue
		}
		cells := make([]string, len(names), len(cols))
		for i, name := range names {
			cells[i] = "–"
			for _, p := range row.AheadPhases {
				if p.Name == name {
					cells[i] = p.MS.String()
					if p.MS.N < row.AheadMS.N {
						cells[i] += fmt.Sprintf(" in %d of %d", p.MS.N, row.AheadMS.N)
					}
				}
			}
		}
		if withCPU {
			least := "–"
			if row.AheadCPUMS.N > 0 {
				least = trim(float64(row.N) * row.AheadCPUMS.Median / float64(max(cpus, 1)))
			}
			cells = append(cells, row.AheadCPUMS.String(), least)
		}
		fmt.Fprintf(b, "| %d | %s |\n", row.N, strings.Join(cells, " | "))
	}
	b.WriteString("\n")
	if withCPU {
		b.WriteString("Node CPU per deploy: the CPU time the whole node spent (every process and kernel thread) from the first deploy of a round until the last returned, over N; median (min–max) over the rounds. " +
			"N times it over the node's CPUs is the least time a round's work takes, however its deploys share the CPUs: where it nears the single deploy's time, simultaneous deploys wait for the CPUs, not for each other.\n\n")
	}
}
