package evaluation_test

import (
	"encoding/csv"
	"encoding/json"
	"encoding/xml"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/evaluation"
)

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want evaluation.Stats
	}{
		{nil, evaluation.Stats{}},
		{[]float64{3}, evaluation.Stats{N: 1, Min: 3, Median: 3, Max: 3}},
		{[]float64{5, 1, 3}, evaluation.Stats{N: 3, Min: 1, Median: 3, Max: 5}},
		{[]float64{4, 1, 3, 2}, evaluation.Stats{N: 4, Min: 1, Median: 2.5, Max: 4}},
	} {
		if got := evaluation.Summarize(tc.in); got != tc.want {
			t.Errorf("Summarize(%v) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

func sample() evaluation.Results {
	s := func(v ...float64) evaluation.Stats { return evaluation.Summarize(v) }
	app := func(name string, boot, restore float64) evaluation.App {
		return evaluation.App{Name: name, Engine: "dmtcp", Driver: "container", Reps: 3,
			PlainBootMS: s(boot, boot*1.1, boot*0.9), PlainAppMS: s(boot / 2), FirstDeployMS: s(boot*2, boot*2.5, boot*1.8),
			BootReadyMS: s(boot / 2), CheckpointMS: s(400, 420, 380), ImageMiB: s(30, 30, 31),
			RestoreMS: s(restore, restore*1.2, restore*0.95), EngineRestartMS: s(restore / 2),
			Speedup:        boot / restore,
			FirstRestoreMS: s(restore * 2), FirstSpeedup: boot / restore / 2,
			FirstRestoreIO: evaluation.IO{ReadMiB: s(31), WrittenMiB: s(0.5)},
			Phases:         []evaluation.Phase{{Name: "clone", MS: s(20, 25, 21)}, {Name: "engine restart", MS: s(restore / 2)}},
			CheckpointIO:   evaluation.IO{ReadMiB: s(1), WrittenMiB: s(31, 32, 30)},
			RestoreIO:      evaluation.IO{ReadMiB: s(29, 30, 31), WrittenMiB: s(0.5)},
			AutoMode:       "restore", AutoReason: "auto: restore 0.10 s < boot 0.70 s", AutoMS: s(100), AutoSpeedup: boot / 100,
			StateCheck: "GET returns the key, " + name}
	}
	return evaluation.Results{
		Started: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC), Seconds: 612,
		Host: evaluation.Host{CPUs: 2, MemoryMiB: 24000, Kernel: "6.1", Ceph: "16.2.15", OSDs: 1, ObjectStore: "memstore", Mapper: "fuse"},
		Apps: []evaluation.App{app("redis", 700, 1200), app("pgindex", 9000, 1500)},
		Interference: &evaluation.Interference{Server: "nginx", PageBytes: 5120, Deploying: "redis", Seconds: 5,
			Priority: "at background priority",
			Rows: []evaluation.InterferenceRow{
				{Concurrency: 10, BaselineRPS: 4000, Runs: []evaluation.RateRun{
					{Rate: evaluation.RateHalf, IntervalS: 2, RPS: 3800, OverheadPct: 5, Deploys: 3, PerSecond: 0.5},
					{Rate: evaluation.RateMax, RPS: 3000, OverheadPct: 25, Deploys: 9, PerSecond: 1.8}}},
				{Concurrency: 100, BaselineRPS: 4200, Runs: []evaluation.RateRun{
					{Rate: evaluation.RateHalf, IntervalS: 2, RPS: 3900, OverheadPct: 7.14, Deploys: 4, PerSecond: 0.5},
					{Rate: evaluation.RateMax, RPS: 3100, OverheadPct: 26.19, Deploys: 8, PerSecond: 1.6, Failed: 2}}}},
			Costs: []evaluation.DeployCost{{Kind: evaluation.DeployPoolHit, CPUSeconds: s(0.31, 0.35, 0.33), WallMS: s(900),
				OSDReadMiB: 0.2, OSDWroteMiB: 1.5, ByProcess: []evaluation.ProcessCPU{{Name: "dockerd", Seconds: 0.2}, {Name: "rbd-fuse", Seconds: 0.1}}}}},
		Concurrency: []*evaluation.Concurrency{{App: "redis", Engine: "dmtcp", Rows: []evaluation.ConcurrencyRow{
			{N: 1, RestoreMS: s(1200)}, {N: 2, RestoreMS: s(1300, 1400)}, {N: 4, RestoreMS: s(1500, 1600, 1700, 1900)}}},
			{App: "redis", Engine: "criu", Rounds: 2, Interleaved: true, Rows: []evaluation.ConcurrencyRow{
				{N: 1, RestoreMS: s(900), PoolHitMS: s(40), AheadMS: s(3),
					AheadPhases: []evaluation.PhaseStats{{Name: "raise", MS: s(0.3)}, {Name: "ready", MS: s(0.6)}}, AheadCPUMS: s(2.5)},
				{N: 8, RestoreMS: s(2000), PoolHitMS: s(70, 80), AheadMS: s(5, 7),
					AheadPhases: []evaluation.PhaseStats{{Name: "queue", MS: s(2.5)}, {Name: "raise", MS: s(0.2, 0.4)}, {Name: "ready", MS: s(1, 1.2)}}, AheadCPUMS: s(1.5, 2.5)}}}},
		Lazy: &evaluation.Lazy{App: "codesearch", Engine: "criu", ImageMiB: 88, FullWarm: s(300), LazyWarm: s(150),
			FullCold: s(900), LazyCold: s(200)},
		Notes: []string{"a note"},
	}
}

// TestWriteAgrees: the JSON, CSV and Markdown carry the same numbers, and
// every plot is a well-formed SVG.
func TestWriteAgrees(t *testing.T) {
	dir := t.TempDir()
	r := sample()
	paths, err := evaluation.Write(dir, r)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{evaluation.FileJSON, evaluation.FileMarkdown, evaluation.FileAppsCSV, evaluation.FilePhasesCSV,
		evaluation.FileInterfCSV, evaluation.FileCostsCSV, evaluation.FileConcurrCSV, evaluation.PlotBootRestore, evaluation.PlotCheckpoint,
		evaluation.PlotPhases, evaluation.PlotIO, evaluation.PlotInterference, evaluation.PlotConcurrency}
	if len(paths) != len(want) {
		t.Errorf("Write wrote %d files, want %d: %v", len(paths), len(want), paths)
	}
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	var back evaluation.Results
	if err := json.Unmarshal(read(evaluation.FileJSON), &back); err != nil {
		t.Fatal(err)
	}
	if back.Apps[1].RestoreMS != r.Apps[1].RestoreMS || back.Interference.Rows[1].Runs[1] != r.Interference.Rows[1].Runs[1] ||
		!reflect.DeepEqual(back.Interference.Costs, r.Interference.Costs) || !reflect.DeepEqual(back.Concurrency, r.Concurrency) {
		t.Errorf("JSON round trip differs: %+v", back.Apps[1].RestoreMS)
	}

	rows, err := csv.NewReader(strings.NewReader(string(read(evaluation.FileAppsCSV)))).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1+len(r.Apps) {
		t.Fatalf("apps.csv has %d rows, want a header and %d", len(rows), len(r.Apps))
	}
	col := func(name string) int {
		for i, h := range rows[0] {
			if h == name {
				return i
			}
		}
		t.Fatalf("apps.csv has no column %s: %v", name, rows[0])
		return -1
	}
	for i, a := range r.Apps {
		for name, v := range map[string]float64{"restore_ms_median": a.RestoreMS.Median, "plain_boot_ms_max": a.PlainBootMS.Max,
			"image_mib_min": a.ImageMiB.Min, "restore_osd_read_mib_median": a.RestoreIO.ReadMiB.Median, "speedup": a.Speedup} {
			got, err := strconv.ParseFloat(rows[i+1][col(name)], 64)
			if err != nil || got-v > 0.001 || v-got > 0.001 {
				t.Errorf("apps.csv %s %s = %q, want %.3f", a.Name, name, rows[i+1][col(name)], v)
			}
		}
	}

	irows, err := csv.NewReader(strings.NewReader(string(read(evaluation.FileInterfCSV)))).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	// A header, then per degree the run alone and one per rate.
	if len(irows) != 1+2*3 || strings.Join(irows[5], ",") != "100,1/2s,2.000,3900.000,7.140,4,0.500,0,3.800" {
		t.Errorf("interference.csv = %v", irows)
	}

	crows, err := csv.NewReader(strings.NewReader(string(read(evaluation.FileConcurrCSV)))).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	// A header, then one row per series and number, the engine beside the app.
	if len(crows) != 1+3+2 || strings.Join(crows[5][:4], ",") != "redis,criu,8,1" {
		t.Errorf("concurrency.csv = %v", crows)
	} else if last := crows[5][len(crows[5])-4:]; crows[0][len(crows[0])-3] != "ahead_cpu_ms_min" || strings.Join(last, ",") != "2,1.500,2.000,2.500" {
		t.Errorf("concurrency.csv: the node's CPU per deploy of 8 restored ahead = %v under %v; want 2 rounds, 1.5-2.5 ms", last, crows[0])
	}

	md := string(read(evaluation.FileMarkdown))
	for _, s := range []string{
		"| redis | dmtcp | 3 | 0.70 (0.63–0.77) s | 1.40 (1.26–1.75) s | 2.40 s | 0.3x | 1.20 (1.14–1.44) s | 0.6x |",
		"| redis | 30.0 (30.0–31.0) | 1.00 | 31.0 (30.0–32.0) | 31.0 | 30.0 (29.0–31.0) | 100 % | 0.50 |",
		"| pgindex | dmtcp | 3 | 9.00 (8.10–9.90) s |", "| 6.0x |",
		"| concurrency | alone (req/s) | deploys at 1/2s (req/s) | loss | deploys at max (req/s) | loss | the paper's loss |",
		"| 100 | 4200 | 3900 (4 deploys, 0.50/s) | 7.1% | 3100 (8 deploys, 1.60/s) | 26.2% | 3.8% |",
		"Failed or non-2xx requests in all these runs: 2.",
		"| pool hit, refilled | 0.33 (0.31–0.35) | 0.90 s | 0.2 MiB | 1.5 MiB |", "- pool hit, refilled: dockerd 0.20, rbd-fuse 0.10",
		"| 4 | 1.65 (1.50–1.90) s |", "## Simultaneous restores of redis (criu) on one node",
		"| 8 | 2.00 s | 2.2x | 75.0 (70.0–80.0) ms | 1.9x |",
		"| simultaneous | raise | ready | queue | node CPU per deploy | round's CPU / 2 CPUs |",
		"| 1 | 0.30 | 0.60 | – | 2.50 | 1.25 |", "| 8 | 0.30 (0.20–0.40) | 1.10 (1.00–1.20) | 2.50 in 1 of 2 | 2.00 (1.50–2.50) | 8.00 |",
		"The pool series ran 2 rounds in the row of the largest N, and in each other row as many rounds as give it as many deploys (each round: N slots provisioned, N deploys at once), the rows' rounds alternating",
		"| restore | 0.10 s | 7.0x |", "- redis: auto: restore 0.10 s < boot 0.70 s",
		"| cold | 0.90 s | 0.20 s | 0.2x |",
		"](" + evaluation.PlotBootRestore + ")", "- a note",
	} {
		if !strings.Contains(md, s) {
			t.Errorf("results.md lacks %q:\n%s", s, md)
		}
	}

	for _, p := range paths {
		if !strings.HasSuffix(p, ".svg") {
			continue
		}
		b := read(filepath.Base(p))
		var doc struct {
			XMLName xml.Name
		}
		if err := xml.Unmarshal(b, &doc); err != nil || doc.XMLName.Local != "svg" {
			t.Errorf("%s is not an SVG document: %v", p, err)
		}
		if !strings.Contains(string(b), "redis") && !strings.Contains(string(b), "nginx") {
			t.Errorf("%s names no app", p)
		}
	}
}

func TestWriteNothing(t *testing.T) {
	if _, err := evaluation.Write(t.TempDir(), evaluation.Results{}); !errors.Is(err, evaluation.ErrNoResults) {
		t.Fatalf("Write of empty results = %v, want ErrNoResults", err)
	}
}

func TestParseAB(t *testing.T) {
	out := `Server Software:        nginx/1.22.1
Document Length:        5120 bytes

Concurrency Level:      100
Time taken for tests:   5.001 seconds
Complete requests:      20873
Failed requests:        2
Non-2xx responses:      1
Requests per second:    4173.52 [#/sec] (mean)
Time per request:       23.960 [ms] (mean)
Time per request:       0.240 [ms] (mean, across all concurrent requests)
`
	got, err := evaluation.ParseAB(out)
	if err != nil {
		t.Fatal(err)
	}
	if want := (evaluation.AB{Complete: 20873, Failed: 2, Non2xx: 1, RPS: 4173.52, MeanMS: 23.96}); got != want {
		t.Errorf("ParseAB = %+v, want %+v", got, want)
	}
	if _, err := evaluation.ParseAB("apr_socket_recv: Connection refused (111)"); !errors.Is(err, evaluation.ErrParse) {
		t.Errorf("ParseAB of an error = %v, want ErrParse", err)
	}
}

// TestPhases: phases of many deploys keep the order they first ran in,
// and each is summarized over the deploys that had it.
func TestPhases(t *testing.T) {
	var p evaluation.Phases
	for _, dep := range [][]string{{"resolve", "raise", "ready", "bind"}, {"resolve", "queue", "raise", "ready", "bind"}} {
		for i, name := range dep {
			p.Add(name, float64(i+1))
		}
	}
	got := p.Summary()
	var names []string
	for _, ph := range got {
		names = append(names, ph.Name)
	}
	if strings.Join(names, ",") != "resolve,raise,ready,bind,queue" {
		t.Fatalf("phases in order %v; want resolve, raise, ready, bind, queue", names)
	}
	if q := got[4].MS; q.N != 1 || q.Median != 2 {
		t.Errorf("queue = %+v; want one deploy of 2 ms", q)
	}
	if r := got[1].MS; r.N != 2 || r.Min != 2 || r.Max != 3 {
		t.Errorf("raise = %+v; want 2 deploys, 2-3 ms", r)
	}
}
