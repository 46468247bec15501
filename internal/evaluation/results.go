// Package evaluation holds the results of fogdeploy's evaluation (make
// bench): boot against restore per app, checkpoint size and time, the
// per-phase breakdown of restores, bytes moved at the OSDs, restore latency
// against the number of simultaneous restores, and the interference of
// deployments with a web server under load. It summarizes repeated
// measurements and writes them as JSON, CSV, Markdown and SVG plots, all
// from the same Results value so that they agree.
package evaluation

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/engine"
)

// ErrNoResults is returned when there is nothing to write.
var ErrNoResults = errors.New("no results")

// Stats summarizes repeated measurements of one quantity.
type Stats struct {
	N      int     `json:"n"`
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
}

// Summarize returns the min, median and max of v. The median of an even
// count is the mean of the two middle values.
func Summarize(v []float64) Stats {
	if len(v) == 0 {
		return Stats{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Stats{N: len(s), Min: s[0], Median: med, Max: s[len(s)-1]}
}

// String is "median (min–max)" with one decimal.
func (s Stats) String() string {
	if s.N == 0 {
		return "–"
	}
	if s.N == 1 || s.Min == s.Max {
		return trim(s.Median)
	}
	return fmt.Sprintf("%s (%s–%s)", trim(s.Median), trim(s.Min), trim(s.Max))
}

func trim(v float64) string {
	switch a := math.Abs(v); {
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// IO is what the OSDs read and wrote during an operation, in MiB, from the
// OSDs' own counters (op_r_out_bytes, op_w_in_bytes).
type IO struct {
	ReadMiB    Stats `json:"read_mib"`
	WrittenMiB Stats `json:"written_mib"`
}

// Phase is one phase of a restore and its durations in ms.
type Phase struct {
	Name string `json:"name"`
	MS   Stats  `json:"ms"`
}

// App is the evaluation of one app of the catalog.
type App struct {
	Name   string      `json:"name"`
	Engine engine.Name `json:"engine"`
	Driver string      `json:"driver"`
	Reps   int         `json:"reps"`
	// PlainBootMS is cold boot-to-ready in a plain container of the same
	// environment (clone, map, mount, container, boot, ready); PlainAppMS
	// the app's own part of it (start to ready).
	PlainBootMS Stats `json:"plain_boot_ms"`
	PlainAppMS  Stats `json:"plain_app_ms"`
	// FirstDeployMS is the first deploy of a PoP: boot under the engine,
	// ready, checkpoint and seal. BootReadyMS is its start-to-ready.
	FirstDeployMS Stats `json:"first_deploy_ms"`
	BootReadyMS   Stats `json:"boot_ready_ms"`
	CheckpointMS  Stats `json:"checkpoint_ms"`
	ImageMiB      Stats `json:"image_mib"`
	// RestoreMS is restore-to-ready of later deploys (clone, map, mount,
	// container, restart, ready); EngineRestartMS the engine's own
	// restart-to-ready inside the instance.
	RestoreMS       Stats `json:"restore_ms"`
	EngineRestartMS Stats `json:"engine_restart_ms"`
	// Speedup is PlainBootMS / RestoreMS (medians).
	Speedup float64 `json:"speedup"`
	// FirstRestoreMS is restore-to-ready on a node that holds no copy of
	// the checkpoint (it fetches it, in parallel with the clone, map and
	// mount of the environment); FirstRestoreIO what the OSDs moved for
	// it. RestoreMS and RestoreIO are of restores on a node that holds
	// it. FirstSpeedup is PlainBootMS / FirstRestoreMS (medians).
	FirstRestoreMS Stats   `json:"first_restore_ms"`
	FirstRestoreIO IO      `json:"first_restore_io"`
	FirstSpeedup   float64 `json:"first_speedup"`
	// PoolHitMS is restore-to-ready when a warm-pool slot was waiting
	// (raise or start, ready, bind); PoolOverheadMS what a hit that
	// restarts the app (PoolRestartMS) adds to the engine's own restart
	// (EngineRestartMS of the same deploys): what the user waits for
	// beyond the engine. PoolRefillMS is provisioning one slot (clone,
	// map, mount, container), done before the user arrives.
	// PoolSpeedup is PlainBootMS / PoolHitMS (medians).
	PoolHitMS      Stats `json:"pool_hit_ms"`
	PoolOverheadMS Stats `json:"pool_overhead_ms"`
	// PoolRestartMS is a pool hit of a slot that waited unstarted
	// (agent.pool_ahead: false): the deploy restarts the app. PoolHitMS is
	// of a slot restored ahead where the node can reweight it (the
	// agent's default), the deploy raising it.
	PoolRestartMS Stats   `json:"pool_restart_ms"`
	PoolRefillMS  Stats   `json:"pool_refill_ms"`
	PoolSpeedup   float64 `json:"pool_speedup"`
	// PoolSlotMiB is the memory one idle pool slot takes: the
	// proportional set size of the processes it runs (its container's
	// shim and waiting entrypoint, its rbd-fuse), measured with 4 slots
	// provisioned.
	PoolSlotMiB float64 `json:"pool_slot_mib"`
	// PoolSlotCPU is the CPU time (ms) one idle pool slot's processes
	// spend per second while they wait, measured with the same slots.
	PoolSlotCPU float64 `json:"pool_slot_cpu_ms_per_s"`
	// SpareMS is restore-to-ready of a restore that found no pool slot of
	// its app and took a spare slot (made for no app: it attaches the
	// app's root, checkpoint, ports and limits, then starts, waits until
	// ready and binds), the checkpoint on the node; SpareOverheadMS what
	// it adds to the engine's own restart (as PoolOverheadMS), and
	// MissOverheadMS what a restore in a slot of its own (RestoreMS)
	// adds. SpareSlotMiB and SpareSlotCPU are an idle spare's memory
	// and CPU, measured as PoolSlotMiB and PoolSlotCPU with 4 spares.
	SpareMS         Stats   `json:"spare_ms"`
	SpareOverheadMS Stats   `json:"spare_overhead_ms"`
	MissOverheadMS  Stats   `json:"miss_overhead_ms"`
	SpareSlotMiB    float64 `json:"spare_slot_mib"`
	SpareSlotCPU    float64 `json:"spare_slot_cpu_ms_per_s"`
	// NoSpare says why the app's restores take no spare slot (it does
	// not fit one); the spare columns are then empty.
	NoSpare string `json:"no_spare,omitempty"`
	// AutoMode is what mode auto's policy chose from the plain boots and
	// the pool hits measured (boot or restore), AutoReason why, AutoMS the
	// time of a deploy as it chose, and AutoSpeedup PlainBootMS / AutoMS
	// (medians).
	AutoMode    string  `json:"auto_mode"`
	AutoReason  string  `json:"auto_reason"`
	AutoMS      Stats   `json:"auto_ms"`
	AutoSpeedup float64 `json:"auto_speedup"`
	// Phases break the restores down, in the order they run.
	Phases       []Phase `json:"phases"`
	CheckpointIO IO      `json:"checkpoint_io"`
	RestoreIO    IO      `json:"restore_io"`
	// StateCheck says what was written before the checkpoint and read
	// back from every restore.
	StateCheck string `json:"state_check"`
}

// RateRun is a web server's throughput under ab while the node deploys and
// undeploys the load app at one rate, as an agent with a warm pool does:
// each deploy takes the waiting slot, and its undeploy gives the instance
// back to the pool (recycled in its container; where that fails, a slot is
// provisioned at the pool's background priority).
type RateRun struct {
	// Rate names the deploy rate (RateNames); IntervalS is the target
	// seconds from one deploy to the next, 0 for back to back.
	Rate      string  `json:"rate"`
	IntervalS float64 `json:"interval_s"`
	// RPS is the median over the repetitions (Interference.Reps),
	// RPSStats all of them.
	RPS      float64 `json:"rps"`
	RPSStats Stats   `json:"rps_stats"`
	// OverheadPct is the loss against the row's BaselineRPS.
	OverheadPct float64 `json:"overhead_pct"`
	// Deploys is how many deploys started during the ab run, PerSecond
	// the rate they reached (starts per second, first to last).
	Deploys   int     `json:"deploys"`
	PerSecond float64 `json:"per_second"`
	// Failed counts failed and non-2xx requests.
	Failed int `json:"failed"`
}

// Deploy rates of the interference test.
const (
	RateHalf = "1/2s" // one deploy every 2 s
	RateOne  = "1/s"  // one every second
	RateMax  = "max"  // back to back: the highest rate the node sustains
)

// InterferenceRow is one concurrency degree of the interference test.
type InterferenceRow struct {
	Concurrency int     `json:"concurrency"`
	BaselineRPS float64 `json:"baseline_rps"`
	// BaselineStats are the runs alone (BaselineRPS is their median).
	BaselineStats Stats `json:"baseline_stats"`
	// BaselineFailed counts failed and non-2xx requests of the run alone.
	BaselineFailed int       `json:"baseline_failed"`
	Runs           []RateRun `json:"runs"`
}

// Run returns the row's run at rate, if any.
func (r InterferenceRow) Run(rate string) (RateRun, bool) {
	for _, x := range r.Runs {
		if x.Rate == rate {
			return x, true
		}
	}
	return RateRun{}, false
}

// DeployCost is what one deploy costs the node, by kind: the CPU time of
// every process of the machine (the agent's work, rbd-fuse, dockerd, the
// engine, the OSD) over the deploy, its undeploy and, on a pool hit, the
// refill of the slot, less what the idle node uses in as long; and the
// bytes the OSDs moved for it.
type DeployCost struct {
	// Kind is DeployPoolRecycled, DeployPoolHit, DeployPoolMiss or
	// DeployBoot.
	Kind        string  `json:"kind"`
	CPUSeconds  Stats   `json:"cpu_seconds"`
	WallMS      Stats   `json:"wall_ms"`
	OSDReadMiB  float64 `json:"osd_read_mib"`
	OSDWroteMiB float64 `json:"osd_wrote_mib"`
	// ByProcess splits CPUSeconds by what ran (the mean over the runs),
	// most first.
	ByProcess []ProcessCPU `json:"by_process,omitempty"`
}

// ProcessCPU is the CPU time of one kind of process.
type ProcessCPU struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
}

// Kinds of deploy (DeployCost.Kind).
const (
	// DeployPoolRecycled: a pool hit whose undeploy recycles the instance
	// into the pool (no refill).
	DeployPoolRecycled = "pool hit, recycled"
	// DeployPoolHit: a pool hit, its undeploy, and a slot provisioned anew.
	DeployPoolHit  = "pool hit, refilled"
	DeployPoolMiss = "pool miss"
	DeployBoot     = "boot"
)

// Interference is throughput of a web server under ab, alone and while the
// same node deploys at stated rates (Table II of the paper), and what one
// deploy costs the node.
type Interference struct {
	Server    string  `json:"server"`
	PageBytes int     `json:"page_bytes"`
	Deploying string  `json:"deploying"`
	Seconds   float64 `json:"seconds"`
	// Reps is how many times each cell ran, alone and at each rate in
	// turn; the rows give medians.
	Reps int `json:"reps,omitempty"`
	// Priority says at what priority the deployment work ran.
	Priority string            `json:"priority"`
	Rows     []InterferenceRow `json:"rows"`
	Costs    []DeployCost      `json:"costs,omitempty"`
}

// RateNames are the deploy rates of the rows, in order of first use.
func (in *Interference) RateNames() []string {
	var names []string
	for _, r := range in.Rows {
		for _, x := range r.Runs {
			if !slices.Contains(names, x.Rate) {
				names = append(names, x.Rate)
			}
		}
	}
	return names
}

// PaperTableII is the paper's Table II: Apache's throughput overhead at
// each concurrency degree while a container deployed beside it.
var PaperTableII = map[int]float64{10: 3.6, 100: 3.8, 200: 5.0, 500: 5.5, 1000: 6.7}

// ConcurrencyRow is restore-to-ready with N simultaneous restores: on a
// pool miss (RestoreMS: every restore provisions its slot) and with a warm
// pool of N slots (PoolHitMS).
type ConcurrencyRow struct {
	N         int   `json:"n"`
	RestoreMS Stats `json:"restore_ms"`
	PoolHitMS Stats `json:"pool_hit_ms"`
	// AheadMS is with a pool of N slots restored ahead (each deploy
	// raises one); PoolHitMS with slots that wait unstarted.
	AheadMS Stats `json:"ahead_ms"`
	// AheadPhases are the phases of those deploys restored ahead, each
	// over the deploys that had it (Stats.N), in the order they run.
	AheadPhases []PhaseStats `json:"ahead_phases,omitempty"`
	// AheadCPUMS is the CPU time the whole node spent per deploy in those
	// rounds, one value per round: what every process and kernel thread
	// used from the first deploy call until the last returned, over N.
	// N times it over the node's CPUs is the least time a round's work
	// takes however the deploys share the CPUs.
	AheadCPUMS Stats `json:"ahead_cpu_ms"`
}

// PhaseStats summarizes one named phase of many deploys, in milliseconds.
type PhaseStats struct {
	Name string `json:"name"`
	MS   Stats  `json:"ms"`
}

// Phases collects the phases of many deploys: for each name, its
// durations in milliseconds, names in the order they first appeared.
type Phases struct {
	order []string
	ms    map[string][]float64
}

// Add records one deploy's phase.
func (p *Phases) Add(name string, ms float64) {
	if p.ms == nil {
		p.ms = map[string][]float64{}
	}
	if _, ok := p.ms[name]; !ok {
		p.order = append(p.order, name)
	}
	p.ms[name] = append(p.ms[name], ms)
}

// Summary is every phase's statistics, in the order the phases appeared.
func (p *Phases) Summary() []PhaseStats {
	var out []PhaseStats
	for _, name := range p.order {
		out = append(out, PhaseStats{Name: name, MS: Summarize(p.ms[name])})
	}
	return out
}

// Concurrency is restore latency against simultaneous restores on one
// node, of one app under one engine.
type Concurrency struct {
	App    string      `json:"app"`
	Engine engine.Name `json:"engine,omitempty"`
	// Rounds is how many rounds of N deploys at once each pool series
	// ran in the row of the largest N; a row of a smaller N ran as many
	// more as give it the same number of deploys (the pool miss runs one).
	Rounds int `json:"rounds,omitempty"`
	// Interleaved says that the rows' rounds alternated (in each of
	// Rounds cycles, one round of the largest N and as many of every
	// other N as make as many deploys), so that the machine's drift over
	// the series weighs on every row alike; runs before it ran each
	// row's rounds one after the other.
	Interleaved bool             `json:"interleaved,omitempty"`
	Rows        []ConcurrencyRow `json:"rows"`
}

// Label is the series' name: "redis (dmtcp)".
func (c *Concurrency) Label() string {
	if c.Engine == "" {
		return c.App
	}
	return c.App + " (" + string(c.Engine) + ")"
}

// Host describes where the evaluation ran.
type Host struct {
	CPUs          int    `json:"cpus"`
	MemoryMiB     int64  `json:"memory_mib"`
	Kernel        string `json:"kernel"`
	Ceph          string `json:"ceph"`
	DMTCP         string `json:"dmtcp,omitempty"`
	CRIU          string `json:"criu,omitempty"`
	Docker        string `json:"docker"`
	OSDs          int    `json:"osds"`
	ObjectStore   string `json:"object_store"`
	Mapper        string `json:"mapper"`
	FogdeployHead string `json:"fogdeploy,omitempty"`
}

// Results is one run of the evaluation.
type Results struct {
	Started      time.Time     `json:"started"`
	Seconds      float64       `json:"seconds"`
	Host         Host          `json:"host"`
	Apps         []App         `json:"apps"`
	Interference *Interference `json:"interference,omitempty"`
	// Concurrency has one series per engine the app ran under.
	Concurrency []*Concurrency `json:"concurrency,omitempty"`
	Lazy        *Lazy          `json:"lazy,omitempty"`
	// Notes say what was left out of this run and why.
	Notes []string `json:"notes,omitempty"`
}

// Lazy compares, for the largest image CRIU can checkpoint in the run, a
// full restore with a lazy one (CRIU's lazy pages): restore-to-ready (the
// first answer) of each, with the node's copy of the checkpoint in the
// page cache (warm) and dropped from it (cold: read from the node's disk).
type Lazy struct {
	App      string      `json:"app"`
	Engine   engine.Name `json:"engine"`
	ImageMiB float64     `json:"image_mib"`
	FullWarm Stats       `json:"full_warm_ms"`
	LazyWarm Stats       `json:"lazy_warm_ms"`
	FullCold Stats       `json:"full_cold_ms"`
	LazyCold Stats       `json:"lazy_cold_ms"`
}
