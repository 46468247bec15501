// Package adaptive is the choice of mode auto: boot an app or restore it
// from its checkpoint, whichever serves the user sooner on the node. It is
// pure policy, with no I/O: the agent reads an app's Costs (this node's and
// the PoP's) and its Situation on the node, asks Decide, deploys, and
// records what the deploy cost with Costs.Record.
//
// What a deploy costs is its critical path until the app is ready (Cost):
// clone, map, mount, container and ready of a boot or of a restore. A pool
// hit is recorded apart from restores without a slot (misses): the choice
// between a boot and a restore is made only when no slot waits, so it
// weighs a boot against a miss. The first deploy of an app boots it to
// checkpoint it: that boot, until its app was ready (BootCost), is a boot
// sample like any other.
//
// A user never waits for a measurement: where a slot waits, the deploy
// takes it; where the app has no generation, the deploy makes one (boot,
// checkpoint, seal, restore: the paper's path) unless its restores are
// known to be slower than its boots and it has no pool; otherwise the
// faster of what is known. The kind not chosen is measured again only when
// the two are close (Close), and then in the background (Decision.Measure).
package adaptive

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// Tunables of the choice.
const (
	// MaxSamples is how many recent runs of each kind are kept.
	MaxSamples = 9
	// MinSamples is how many runs of a kind make a median worth trusting.
	MinSamples = 3
	// ExploreEvery: every ExploreEvery-th choice of mode auto asks for
	// the kind not chosen to be measured again, in the background, when
	// the two are Close; for an app of engine auto, every ExploreEvery-th
	// restore takes the second best engine.
	ExploreEvery = 10
	// Close is how much slower than the faster kind the other may be for
	// it to be measured again at all: beyond it, a user never waits for
	// the slower kind, and nobody measures it.
	Close = 1.5
)

// Samples are durations in milliseconds, oldest first.
type Samples []int64

// Median returns the median (0 without samples).
func (s Samples) Median() time.Duration {
	if len(s) == 0 {
		return 0
	}
	v := slices.Clone(s)
	slices.Sort(v)
	n := len(v)
	ms := float64(v[n/2])
	if n%2 == 0 {
		ms = float64(v[n/2-1]+v[n/2]) / 2
	}
	return time.Duration(ms * float64(time.Millisecond))
}

// add appends d and keeps the last MaxSamples.
func (s Samples) add(d time.Duration) Samples {
	s = append(s, d.Milliseconds())
	if len(s) > MaxSamples {
		s = slices.Clone(s[len(s)-MaxSamples:])
	}
	return s
}

// Costs are what deploys of an app cost on one node: the critical path of
// its recent boots and restores. The node's agent keeps them in the PoP's
// state (docs/state.md).
type Costs struct {
	App  string `json:"app"`
	Node string `json:"node"`
	// Boot and Restore are the last MaxSamples runs of each kind: every
	// boot (mode boot, mode auto's, a boot without an engine, and the boot
	// of a deploy that produced a generation, until its app was ready),
	// and every restore that took no pool slot (a miss).
	Boot    Samples `json:"boot_ms,omitempty"`
	Restore Samples `json:"restore_ms,omitempty"`
	// Hit are the last MaxSamples pool hits: restores into a slot that
	// waited on the node.
	Hit Samples `json:"hit_ms,omitempty"`
	// Gen is the checkpoint generation the restore and hit samples are
	// of: a new generation restores another image, so its samples start
	// afresh.
	Gen int `json:"gen,omitempty"`
	// EngineRestore are, for an app of engine auto, the last MaxSamples
	// restores of each engine's generation (EngineGen: the generation
	// they are of); Restore is then unused.
	EngineRestore map[engine.Name]Samples `json:"engine_restore_ms,omitempty"`
	EngineGen     map[engine.Name]int     `json:"engine_gen,omitempty"`
	// Auto counts the deploys of mode auto recorded (for ExploreEvery).
	Auto    int       `json:"auto,omitempty"`
	Updated time.Time `json:"updated"`
}

// Run is one deploy as Costs.Record counts it.
type Run struct {
	// Mode is what ran: spec.ModeBoot or spec.ModeRestore (others are
	// not counted).
	Mode spec.Mode
	// Gen is the generation a restore restored.
	Gen int
	// Cost is its critical path (Cost of its timings).
	Cost time.Duration
	// Hit says that a restore took a pool slot.
	Hit bool
	// Boot is, for a deploy that produced its generation first, its boot
	// until the app was ready (BootCost): a boot sample too.
	Boot time.Duration
	// Engine is, for a restore of an app of engine auto, the engine of
	// its generation: its misses are kept per engine.
	Engine engine.Name
	// Auto says that mode auto chose it.
	Auto bool
}

// Record counts one deploy.
func (c *Costs) Record(r Run) {
	if r.Boot > 0 {
		c.Add(spec.ModeBoot, 0, r.Boot, false)
	}
	switch {
	case r.Mode == spec.ModeRestore && r.Hit:
		c.addHit(r.Gen, r.Cost)
	case r.Mode == spec.ModeRestore && r.Engine != "":
		c.AddEngine(r.Engine, r.Gen, r.Cost, false)
	default:
		c.Add(r.Mode, r.Gen, r.Cost, false)
	}
	if r.Auto {
		c.Auto++
	}
}

// addHit records a pool hit of generation gen that cost d.
func (c *Costs) addHit(gen int, d time.Duration) {
	if gen < c.Gen {
		return
	}
	c.newGen(gen)
	c.Hit = c.Hit.add(d)
}

// newGen starts the samples of generation gen afresh if it is newer than
// those kept.
func (c *Costs) newGen(gen int) {
	if gen > c.Gen {
		c.Restore, c.Hit, c.Gen = nil, nil, gen
	}
}

// Add records one deploy of mode (spec.ModeBoot or spec.ModeRestore;
// others are ignored) that cost d; gen is the generation a restore
// restored. A restore of an older generation than Gen is not counted, and
// one of a newer generation replaces the restore samples. auto says that
// mode auto chose it.
func (c *Costs) Add(mode spec.Mode, gen int, d time.Duration, auto bool) {
	switch mode {
	case spec.ModeBoot:
		c.Boot = c.Boot.add(d)
	case spec.ModeRestore:
		if gen < c.Gen {
			break
		}
		c.newGen(gen)
		c.Restore = c.Restore.add(d)
	}
	if auto {
		c.Auto++
	}
}

// AddEngine records one restore of generation gen, checkpointed by eng,
// of an app of engine auto, that cost d. A newer generation of eng
// replaces its samples; an older one is not counted.
func (c *Costs) AddEngine(eng engine.Name, gen int, d time.Duration, auto bool) {
	if c.EngineRestore == nil {
		c.EngineRestore, c.EngineGen = map[engine.Name]Samples{}, map[engine.Name]int{}
	}
	switch {
	case gen < c.EngineGen[eng]:
	case gen > c.EngineGen[eng]:
		c.EngineRestore[eng], c.EngineGen[eng] = Samples(nil).add(d), gen
	default:
		c.EngineRestore[eng] = c.EngineRestore[eng].add(d)
	}
	if auto {
		c.Auto++
	}
}

// ForEngine is c as mode auto's choice between a boot and a restore sees
// it when the restore would be of engine eng's generation.
func (c Costs) ForEngine(eng engine.Name) Costs {
	c.Restore = c.EngineRestore[eng]
	return c
}

// ChooseEngine picks, for an app of engine auto, the engine whose
// generation a restore on the node takes, among engines (those with a
// generation the node can restore, in order of preference): first each
// engine with fewer than MinSamples restores measured, to measure it; then
// the one with the lowest median, but every ExploreEvery-th choice (half
// way between those of the mode) the second best, to measure it again.
func ChooseEngine(c Costs, engines []engine.Name) (eng engine.Name, why Why, reason string) {
	if len(engines) == 0 {
		return "", "", ""
	}
	for _, e := range engines {
		if n := len(c.EngineRestore[e]); n < MinSamples && len(engines) > 1 {
			return e, WhyFirst, fmt.Sprintf("engine %s: measuring its restores (%d of %d on this node)", e, n, MinSamples)
		}
	}
	ranked := slices.Clone(engines)
	slices.SortStableFunc(ranked, func(a, b engine.Name) int {
		return cmpDuration(c.EngineRestore[a].Median(), c.EngineRestore[b].Median())
	})
	if len(ranked) == 1 {
		return ranked[0], WhyFaster, "engine " + string(ranked[0]) + ": the only one with a generation this node can restore"
	}
	var parts []string
	for _, e := range ranked {
		parts = append(parts, fmt.Sprintf("%s %s", e, secs(c.EngineRestore[e].Median())))
	}
	medians := strings.Join(parts, " < ")
	if (c.Auto+1)%ExploreEvery == ExploreEvery/2 {
		return ranked[1], WhyExplore, fmt.Sprintf("engine %s: to measure it again (every %dth choice; restores %s)", ranked[1], ExploreEvery, medians)
	}
	return ranked[0], WhyFaster, fmt.Sprintf("engine %s: restores %s (medians)", ranked[0], medians)
}

func cmpDuration(a, b time.Duration) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Cost is what a deploy cost the user: the sum of its phases until ready,
// without those of the boot that produced a checkpoint first (boot.*).
func Cost(t layering.Timings) time.Duration {
	var sum time.Duration
	for _, p := range t {
		if !strings.HasPrefix(p.Name, spec.BootTimingPrefix) {
			sum += p.Duration
		}
	}
	return sum
}

// BootCost is what the boot of a deploy that produced its generation first
// cost until its app was ready: its boot.* phases up to the first ready
// (boot.ready, or boot.ENGINE.ready for an app of engine auto), without
// the checkpoint that followed; 0 without one.
func BootCost(t layering.Timings) time.Duration {
	var sum time.Duration
	for _, p := range t {
		if !strings.HasPrefix(p.Name, spec.BootTimingPrefix) {
			continue
		}
		sum += p.Duration
		if p.Name == spec.BootTimingPrefix+"ready" || strings.HasSuffix(p.Name, ".ready") {
			return sum
		}
	}
	return 0
}

// Why classes a Decision (the metrics' label).
type Why string

// Why a decision went as it did.
const (
	// WhyPoolSlot: an idle slot of the app waits on the node: a hit.
	WhyPoolSlot Why = "pool_slot"
	// WhyNoGeneration: the app has no generation this node can restore:
	// the deploy boots, checkpoints and seals one, then restores it.
	WhyNoGeneration Why = "no_generation"
	// WhyFirst: one kind is measured nowhere yet; the deploy restores
	// (the other is measured in the background).
	WhyFirst Why = "first"
	// WhyFaster: the kind whose median is lower (restore only when
	// restoring is faster).
	WhyFaster Why = "faster"
	// WhyCannotBoot: the node cannot boot apps without an engine.
	WhyCannotBoot Why = "cannot_boot"
	// WhyExplore: for an app of engine auto, the second best engine, every
	// ExploreEvery-th choice (ChooseEngine).
	WhyExplore Why = "explore"
)

// Situation is what Decide needs to know of the app on the node besides
// its costs.
type Situation struct {
	// CannotBoot, when set, says why the node cannot boot apps without an
	// engine.
	CannotBoot string
	// SlotWaiting: an idle pool slot of the app waits on the node (idle,
	// or being restored ahead).
	SlotWaiting bool
	// Generation: the app has a generation this node can restore.
	Generation bool
	// Pool is how many idle slots of the app the node keeps.
	Pool int
	// PoP are the app's costs on the other nodes of the PoP: where this
	// node measured a kind nowhere yet, theirs stand in for it.
	PoP []Costs
}

// Decision is the choice for one deploy of mode auto.
type Decision struct {
	// Mode is spec.ModeBoot or spec.ModeRestore.
	Mode spec.Mode `json:"mode"`
	Why  Why       `json:"why"`
	// Reason says it for the deployment's status, e.g. "auto: boot 0.15 s
	// < restore 0.60 s (medians of 5 and 7 runs)".
	Reason string `json:"reason"`
	// Measure, when set, is the kind to measure again in the background
	// (never on a user's request): the one not chosen, when the two are
	// Close and it has fewer than MinSamples runs here, or at every
	// ExploreEvery-th choice.
	Measure spec.Mode `json:"measure,omitempty"`
}

// estimate is the samples of one kind that a decision reads: this node's,
// else the other nodes' (where says which).
type estimate struct {
	s     Samples
	where string
}

func (e estimate) known() bool { return len(e.s) > 0 }

func (e estimate) String() string {
	runs := "runs"
	if len(e.s) == 1 {
		runs = "run"
	}
	return fmt.Sprintf("%s, median of %d %s%s", secs(e.s.Median()), len(e.s), runs, e.where)
}

// estimateOf returns this node's samples of a kind (pick), or, when it has
// none, those of every other node together.
func estimateOf(c Costs, pop []Costs, pick func(Costs) Samples) estimate {
	if s := pick(c); len(s) > 0 {
		return estimate{s: s}
	}
	var all Samples
	for _, o := range pop {
		if o.Node != c.Node {
			all = append(all, pick(o)...)
		}
	}
	if len(all) == 0 {
		return estimate{}
	}
	return estimate{s: all, where: " on other nodes"}
}

// Decide chooses between a boot and a restore of one deploy of mode auto,
// from the app's costs on the node and its situation there. In order:
//
//   - a node that cannot boot restores;
//   - an idle slot of the app waits: restore into it (a hit);
//   - no generation: restore, which boots, checkpoints and seals one
//     first, unless the app keeps no pool and its restores are known to be
//     slower than its boots (MinSamples of each);
//   - either kind measured nowhere in the PoP: restore (the paper's
//     path), and measure a boot in the background;
//   - else the kind with the lower median (this node's, else the PoP's),
//     a restore only when it is faster; the other is measured again in the
//     background only when the two are Close.
func Decide(c Costs, s Situation) Decision {
	boot := func(why Why, format string, args ...any) Decision {
		return Decision{Mode: spec.ModeBoot, Why: why, Reason: "auto: " + fmt.Sprintf(format, args...)}
	}
	restore := func(why Why, format string, args ...any) Decision {
		return Decision{Mode: spec.ModeRestore, Why: why, Reason: "auto: " + fmt.Sprintf(format, args...)}
	}
	b := estimateOf(c, s.PoP, func(c Costs) Samples { return c.Boot })
	r := estimateOf(c, s.PoP, func(c Costs) Samples { return c.Restore })
	mb, mr := b.s.Median(), r.s.Median()
	switch {
	case s.CannotBoot != "":
		return restore(WhyCannotBoot, "restore: this node cannot boot apps without an engine (%s)", s.CannotBoot)
	case s.SlotWaiting:
		hit := ""
		if len(c.Hit) > 0 {
			hit = fmt.Sprintf(" (hits: %s)", estimate{s: c.Hit})
		}
		return restore(WhyPoolSlot, "pool slot: an idle slot of the app waits on this node%s", hit)
	case !s.Generation:
		if s.Pool == 0 && len(b.s) >= MinSamples && len(r.s) >= MinSamples && mr > mb {
			return boot(WhyFaster, "boot %s < restore %s; no generation is made (the app keeps no pool)", b, r)
		}
		why := "no generation of the app this node can restore: boot it, checkpoint it, seal a generation and restore it"
		if s.Pool > 0 {
			why += fmt.Sprintf(" (its pool of %d waits for one)", s.Pool)
		}
		return restore(WhyNoGeneration, "%s", why)
	case !b.known():
		d := restore(WhyFirst, "restore (boot not measured yet: measured in the background)")
		d.Measure = spec.ModeBoot
		return d
	case !r.known():
		d := restore(WhyFirst, "restore (boot %s; restore not measured yet: this one measures it)", b)
		return d
	}
	var d Decision
	other, otherRuns := spec.ModeRestore, len(c.Restore)
	if mb <= mr {
		d = boot(WhyFaster, "boot %s %s restore %s", b, lessOrEqual(mb, mr), r)
	} else {
		d = restore(WhyFaster, "restore %s < boot %s", r, b)
		other, otherRuns = spec.ModeBoot, len(c.Boot)
	}
	lo, hi := min(mb, mr), max(mb, mr)
	if float64(hi) <= Close*float64(lo) && (otherRuns < MinSamples || (c.Auto+1)%ExploreEvery == 0) {
		d.Measure = other
		d.Reason += fmt.Sprintf("; %s measured again in the background (within %.1fx)", other, Close)
	}
	return d
}

// secs says how long d is: in seconds from 0.1 s, in milliseconds below
// (a pool hit restored ahead takes a few: "0.00 s" would hide it).
func secs(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case d >= 100*time.Millisecond:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case ms >= 10:
		return fmt.Sprintf("%.0f ms", ms)
	}
	return fmt.Sprintf("%.1f ms", ms)
}

func lessOrEqual(a, b time.Duration) string {
	if a < b {
		return "<"
	}
	return "="
}
