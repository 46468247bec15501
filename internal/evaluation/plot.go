package evaluation

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Plot writes the SVG plots of r into dir and returns their paths.
func Plot(dir string, r Results) ([]string, error) {
	type figure struct {
		name  string
		plots []*plot.Plot
	}
	var figs []figure
	if len(r.Apps) > 0 {
		figs = append(figs,
			figure{PlotBootRestore, []*plot.Plot{bootRestorePlot(r.Apps)}},
			figure{PlotCheckpoint, checkpointPlots(r.Apps)},
			figure{PlotPhases, []*plot.Plot{phasesPlot(r.Apps)}},
			figure{PlotIO, []*plot.Plot{ioPlot(r.Apps)}})
	}
	if r.Interference != nil && len(r.Interference.Rows) > 0 {
		figs = append(figs, figure{PlotInterference, []*plot.Plot{interferencePlot(r.Interference)}})
	}
	if len(r.Concurrency) > 0 {
		figs = append(figs, figure{PlotConcurrency, []*plot.Plot{concurrencyPlot(r.Concurrency)}})
	}
	var paths []string
	for _, f := range figs {
		p := filepath.Join(dir, f.name)
		if err := save(p, f.plots); err != nil {
			return paths, fmt.Errorf("plot %s: %w", f.name, err)
		}
		paths = append(paths, p)
	}
	return paths, nil
}

// save draws plots side by side into one SVG file.
func save(path string, plots []*plot.Plot) error {
	const h = 4 * vg.Inch
	w := vg.Length(len(plots)) * 5.5 * vg.Inch
	if len(plots) == 1 {
		w = 7 * vg.Inch
	}
	c := vgsvg.New(w, h)
	dc := draw.New(c)
	tiles := draw.Tiles{Rows: 1, Cols: len(plots), PadX: vg.Inch / 4, PadTop: vg.Inch / 8, PadBottom: vg.Inch / 8,
		PadLeft: vg.Inch / 8, PadRight: vg.Inch / 8}
	canvases := plot.Align([][]*plot.Plot{plots}, tiles, dc)
	for i, p := range plots {
		p.Draw(canvases[0][i])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// bars is one series of a grouped bar chart.
type bars struct {
	label  string
	values []float64
}

// grouped draws series side by side at each of names.
func grouped(title, ylabel string, names []string, series []bars) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	p.Legend.Top = true
	w := vg.Points(60 / float64(max(len(series), 1)))
	for i, s := range series {
		b, err := plotter.NewBarChart(plotter.Values(s.values), w)
		if err != nil { // only for NaN or infinite values
			continue
		}
		b.LineStyle.Width = vg.Length(0)
		b.Color = plotutil.Color(i)
		b.Offset = w * vg.Length(2*i-len(series)+1) / 2
		p.Add(b)
		p.Legend.Add(s.label, b)
	}
	p.NominalX(names...)
	frame(p, len(names))
	return p
}

// frame leaves room around n nominal groups, and above the bars for the
// legend.
func frame(p *plot.Plot, n int) {
	p.Add(plotter.NewGrid())
	p.X.Min, p.X.Max = -0.75, float64(n)-0.25
	p.Y.Min = 0
	p.Y.Max *= 1.45
	p.Legend.Left = true
	p.Legend.XOffs, p.Legend.YOffs = vg.Points(8), vg.Points(-4)
}

func appNames(apps []App, label func(App) string) []string {
	n := make([]string, len(apps))
	for i, a := range apps {
		n[i] = a.Name
		if label != nil {
			n[i] += "\n" + label(a)
		}
	}
	return n
}

func medians(apps []App, get func(App) Stats, scale float64) []float64 {
	v := make([]float64, len(apps))
	for i, a := range apps {
		v[i] = get(a).Median * scale
	}
	return v
}

func bootRestorePlot(apps []App) *plot.Plot {
	return grouped("Boot vs restore to ready (median)", "seconds",
		appNames(apps, func(a App) string { return strconv.FormatFloat(a.Speedup, 'f', 1, 64) + "x" }),
		[]bars{
			{"plain boot", medians(apps, func(a App) Stats { return a.PlainBootMS }, 1e-3)},
			{"first deploy (boot + checkpoint)", medians(apps, func(a App) Stats { return a.FirstDeployMS }, 1e-3)},
			{"restore", medians(apps, func(a App) Stats { return a.RestoreMS }, 1e-3)},
			{"restore (pool hit)", medians(apps, func(a App) Stats { return a.PoolHitMS }, 1e-3)},
		})
}

func checkpointPlots(apps []App) []*plot.Plot {
	names := appNames(apps, nil)
	return []*plot.Plot{
		grouped("(a) Checkpoint image size", "MiB", names,
			[]bars{{"image", medians(apps, func(a App) Stats { return a.ImageMiB }, 1)}}),
		grouped("(b) Checkpoint time", "seconds", names,
			[]bars{{"checkpoint", medians(apps, func(a App) Stats { return a.CheckpointMS }, 1e-3)}}),
	}
}

func ioPlot(apps []App) *plot.Plot {
	return grouped("Bytes at the OSDs per operation (median)", "MiB", appNames(apps, nil), []bars{
		{"checkpoint: written", medians(apps, func(a App) Stats { return a.CheckpointIO.WrittenMiB }, 1)},
		{"checkpoint: read", medians(apps, func(a App) Stats { return a.CheckpointIO.ReadMiB }, 1)},
		{"restore: written", medians(apps, func(a App) Stats { return a.RestoreIO.WrittenMiB }, 1)},
		{"restore: read", medians(apps, func(a App) Stats { return a.RestoreIO.ReadMiB }, 1)},
	})
}

// phasesPlot stacks the median of each restore phase per app.
func phasesPlot(apps []App) *plot.Plot {
	p := plot.New()
	p.Title.Text = "Restore phases (median)"
	p.Y.Label.Text = "seconds"
	p.Legend.Top = true
	var order []string
	seen := map[string]bool{}
	for _, a := range apps {
		for _, ph := range a.Phases {
			if !seen[ph.Name] {
				seen[ph.Name] = true
				order = append(order, ph.Name)
			}
		}
	}
	var below *plotter.BarChart
	for i, name := range order {
		v := make(plotter.Values, len(apps))
		for j, a := range apps {
			for _, ph := range a.Phases {
				if ph.Name == name {
					v[j] = ph.MS.Median / 1000
				}
			}
		}
		b, err := plotter.NewBarChart(v, vg.Points(30))
		if err != nil {
			continue
		}
		b.LineStyle.Width = vg.Length(0)
		b.Color = plotutil.Color(i)
		if below != nil {
			b.StackOn(below)
		}
		below = b
		p.Add(b)
		p.Legend.Add(name, b)
	}
	p.NominalX(appNames(apps, nil)...)
	frame(p, len(apps))
	return p
}

func interferencePlot(in *Interference) *plot.Plot {
	names := make([]string, len(in.Rows))
	series := []bars{{"alone", make([]float64, len(in.Rows))}}
	rates := in.RateNames()
	for _, rate := range rates {
		series = append(series, bars{"deploys at " + rate, make([]float64, len(in.Rows))})
	}
	for i, r := range in.Rows {
		names[i] = fmt.Sprintf("c=%d", r.Concurrency)
		series[0].values[i] = r.BaselineRPS
		for j, rate := range rates {
			if x, ok := r.Run(rate); ok {
				series[j+1].values[i] = x.RPS
				names[i] += fmt.Sprintf("\n%s %.1f%%", rate, x.OverheadPct)
			}
		}
	}
	return grouped(fmt.Sprintf("%s throughput under ab (%d-byte page) while %s deploys", in.Server, in.PageBytes, in.Deploying),
		"requests/s", names, series)
}

// concurrencyPlot draws median restore-to-ready with min–max error bars,
// a pool miss and a pool of N for each series.
func concurrencyPlot(cos []*Concurrency) *plot.Plot {
	p := plot.New()
	p.Title.Text = "Restore-to-ready vs simultaneous restores"
	p.X.Label.Text = "simultaneous restores on one node"
	p.Y.Label.Text = "seconds"
	var ticks []plot.Tick
	seen := map[int]bool{}
	type line struct {
		name string
		rows []ConcurrencyRow
		get  func(ConcurrencyRow) Stats
	}
	var lines []line
	for _, co := range cos {
		for _, r := range co.Rows {
			if !seen[r.N] {
				seen[r.N] = true
				ticks = append(ticks, plot.Tick{Value: float64(r.N), Label: strconv.Itoa(r.N)})
			}
		}
		lines = append(lines,
			line{co.Label() + ": pool miss (median)", co.Rows, func(r ConcurrencyRow) Stats { return r.RestoreMS }},
			line{co.Label() + ": pool of N (median)", co.Rows, func(r ConcurrencyRow) Stats { return r.PoolHitMS }},
			line{co.Label() + ": pool of N restored ahead (median)", co.Rows, func(r ConcurrencyRow) Stats { return r.AheadMS }})
	}
	for k, series := range lines {
		var pts plotter.XYs
		var errs plotter.YErrors
		for _, r := range series.rows {
			s := series.get(r)
			if s.N == 0 {
				continue
			}
			pts = append(pts, plotter.XY{X: float64(r.N), Y: s.Median / 1000})
			errs = append(errs, struct{ Low, High float64 }{(s.Median - s.Min) / 1000, (s.Max - s.Median) / 1000})
		}
		if len(pts) == 0 {
			continue
		}
		if line, points, err := plotter.NewLinePoints(pts); err == nil {
			line.Color, points.Color = plotutil.Color(k), plotutil.Color(k)
			p.Add(line, points)
			p.Legend.Add(series.name, line, points)
		}
		if eb, err := plotter.NewYErrorBars(struct {
			plotter.XYs
			plotter.YErrors
		}{pts, errs}); err == nil {
			eb.Color = plotutil.Color(k)
			p.Add(eb)
		}
	}
	p.Title.Text += " (bars: min–max)"
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	maxN := 1.0
	for _, t := range ticks {
		maxN = max(maxN, t.Value)
	}
	p.X.Min, p.X.Max = 0.5, maxN+0.5
	p.Y.Min = 0
	p.Y.Max *= 1.2
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	return p
}
