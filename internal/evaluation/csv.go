// The evaluation's CSV files.

package evaluation

import (
	"encoding/csv"
	"io"
	"strconv"
)

func statsCols(prefix string) []string {
	return []string{prefix + "_min", prefix + "_median", prefix + "_max"}
}

func statsVals(s Stats) []string {
	return []string{num(s.Min), num(s.Median), num(s.Max)}
}

func num(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }

// WriteAppsCSV writes one row per app with min/median/max of each quantity.
func WriteAppsCSV(w io.Writer, apps []App) error {
	c := csv.NewWriter(w)
	head := []string{"app", "engine", "driver", "reps"}
	for _, col := range appColumns {
		head = append(head, statsCols(col.name)...)
	}
	head = append(head, "speedup", "first_speedup", "pool_speedup", "pool_slot_mib", "pool_slot_cpu_ms_per_s", "spare_slot_mib", "spare_slot_cpu_ms_per_s", "auto_mode", "auto_speedup", "state_check")
	if err := c.Write(head); err != nil {
		return err
	}
	for _, a := range apps {
		row := []string{a.Name, string(a.Engine), a.Driver, strconv.Itoa(a.Reps)}
		for _, col := range appColumns {
			row = append(row, statsVals(col.get(a))...)
		}
		row = append(row, num(a.Speedup), num(a.FirstSpeedup), num(a.PoolSpeedup), num(a.PoolSlotMiB), num(a.PoolSlotCPU), num(a.SpareSlotMiB), num(a.SpareSlotCPU), a.AutoMode, num(a.AutoSpeedup), a.StateCheck)
		if err := c.Write(row); err != nil {
			return err
		}
	}
	c.Flush()
	return c.Error()
}

// WritePhasesCSV writes the per-phase breakdown of restores.
func WritePhasesCSV(w io.Writer, apps []App) error {
	c := csv.NewWriter(w)
	if err := c.Write(append([]string{"app", "phase", "n"}, statsCols("ms")...)); err != nil {
		return err
	}
	for _, a := range apps {
		for _, p := range a.Phases {
			if err := c.Write(append([]string{a.Name, p.Name, strconv.Itoa(p.MS.N)}, statsVals(p.MS)...)); err != nil {
				return err
			}
		}
	}
	c.Flush()
	return c.Error()
}

// WriteInterferenceCSV writes the interference runs: one line per
// concurrency degree and deploy rate, the first of each degree alone.
func WriteInterferenceCSV(w io.Writer, in *Interference) error {
	c := csv.NewWriter(w)
	if err := c.Write([]string{"concurrency", "rate", "interval_s", "rps", "overhead_pct", "deploys", "deploys_per_s",
		"failed", "paper_overhead_pct"}); err != nil {
		return err
	}
	for _, r := range in.Rows {
		paper := ""
		if v, ok := PaperTableII[r.Concurrency]; ok {
			paper = num(v)
		}
		if err := c.Write([]string{strconv.Itoa(r.Concurrency), "none", "", num(r.BaselineRPS), "0", "0", "0",
			strconv.Itoa(r.BaselineFailed), paper}); err != nil {
			return err
		}
		for _, x := range r.Runs {
			if err := c.Write([]string{strconv.Itoa(r.Concurrency), x.Rate, num(x.IntervalS), num(x.RPS), num(x.OverheadPct),
				strconv.Itoa(x.Deploys), num(x.PerSecond), strconv.Itoa(x.Failed), paper}); err != nil {
				return err
			}
		}
	}
	c.Flush()
	return c.Error()
}

// WriteCostsCSV writes what one deploy costs the node, by kind.
func WriteCostsCSV(w io.Writer, costs []DeployCost) error {
	c := csv.NewWriter(w)
	head := append(append([]string{"kind", "n"}, statsCols("cpu_seconds")...), statsCols("wall_ms")...)
	if err := c.Write(append(head, "osd_read_mib", "osd_wrote_mib")); err != nil {
		return err
	}
	for _, k := range costs {
		row := append(append([]string{k.Kind, strconv.Itoa(k.CPUSeconds.N)}, statsVals(k.CPUSeconds)...), statsVals(k.WallMS)...)
		if err := c.Write(append(row, num(k.OSDReadMiB), num(k.OSDWroteMiB))); err != nil {
			return err
		}
	}
	c.Flush()
	return c.Error()
}

// WriteConcurrencyCSV writes restore latency against simultaneous
// restores, one row per series and number.
func WriteConcurrencyCSV(w io.Writer, cos []*Concurrency) error {
	c := csv.NewWriter(w)
	head := append([]string{"app", "engine", "simultaneous", "n"}, statsCols("restore_ms")...)
	head = append(append(head, "pool_n"), statsCols("pool_hit_ms")...)
	head = append(append(head, "ahead_n"), statsCols("ahead_ms")...)
	if err := c.Write(append(append(head, "ahead_rounds"), statsCols("ahead_cpu_ms")...)); err != nil {
		return err
	}
	for _, co := range cos {
		for _, r := range co.Rows {
			row := append([]string{co.App, string(co.Engine), strconv.Itoa(r.N), strconv.Itoa(r.RestoreMS.N)}, statsVals(r.RestoreMS)...)
			row = append(append(row, strconv.Itoa(r.PoolHitMS.N)), statsVals(r.PoolHitMS)...)
			row = append(append(row, strconv.Itoa(r.AheadMS.N)), statsVals(r.AheadMS)...)
			if err := c.Write(append(append(row, strconv.Itoa(r.AheadCPUMS.N)), statsVals(r.AheadCPUMS)...)); err != nil {
				return err
			}
		}
	}
	c.Flush()
	return c.Error()
}
