// Package adaptive is the choice of mode auto: boot an app or restore it
// from its checkpoint, whichever has been faster on the node. It is pure
// policy, with no I/O: the agent reads an app's Costs on its node from the
// PoP's state, asks Decide, deploys, and records what the deploy cost with
// Costs.Add.
//
// What a deploy costs is its critical path until the app is ready (Cost):
// clone, map, mount, container and ready of a boot or of a restore. The
// first deploy of an app also boots and checkpoints it; those phases
// (boot.*) are paid once per generation and are not counted.
package adaptive

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// Tunables of the choice.
const (
	// MaxSamples is how many recent runs of each kind are kept.
	MaxSamples = 9
	// MinSamples is how many runs of a kind make a median worth trusting.
	MinSamples = 3
	// ExploreEvery: every ExploreEvery-th choice of mode auto (once both
	// kinds have MinSamples runs) takes the other kind, so that the numbers
	// of the one not chosen are measured again.
	ExploreEvery = 10
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
	// Boot and Restore are the last MaxSamples runs of each kind.
	Boot    Samples `json:"boot_ms,omitempty"`
	Restore Samples `json:"restore_ms,omitempty"`
	// Gen is the checkpoint generation the restore samples are of: a new
	// generation restores another image, so its samples start afresh.
	Gen int `json:"gen,omitempty"`
	// EngineRestore are, for an app of engine auto, the last MaxSamples
	// restores of each engine's generation (EngineGen: the generation
	// they are of); Restore is then unused.
	EngineRestore map[string]Samples `json:"engine_restore_ms,omitempty"`
	EngineGen     map[string]int     `json:"engine_gen,omitempty"`
	// Auto counts the deploys of mode auto recorded (for ExploreEvery).
	Auto    int       `json:"auto,omitempty"`
	Updated time.Time `json:"updated"`
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
		if gen > c.Gen {
			c.Restore, c.Gen = nil, gen
		}
		c.Restore = c.Restore.add(d)
	}
	if auto {
		c.Auto++
	}
}

// AddEngine records one restore of generation gen, checkpointed by eng,
// of an app of engine auto, that cost d. A newer generation of eng
// replaces its samples; an older one is not counted.
func (c *Costs) AddEngine(eng string, gen int, d time.Duration, auto bool) {
	if c.EngineRestore == nil {
		c.EngineRestore, c.EngineGen = map[string]Samples{}, map[string]int{}
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
func (c Costs) ForEngine(eng string) Costs {
	c.Restore = c.EngineRestore[eng]
	return c
}

// ChooseEngine picks, for an app of engine auto, the engine whose
// generation a restore on the node takes, among engines (those with a
// generation the node can restore, in order of preference): first each
// engine with fewer than MinSamples restores measured, to measure it; then
// the one with the lowest median, but every ExploreEvery-th choice (half
// way between those of the mode) the second best, to measure it again.
func ChooseEngine(c Costs, engines []string) (eng string, why Why, reason string) {
	if len(engines) == 0 {
		return "", "", ""
	}
	for _, e := range engines {
		if n := len(c.EngineRestore[e]); n < MinSamples && len(engines) > 1 {
			return e, WhyFirst, fmt.Sprintf("engine %s: measuring its restores (%d of %d on this node)", e, n, MinSamples)
		}
	}
	ranked := slices.Clone(engines)
	slices.SortStableFunc(ranked, func(a, b string) int {
		return cmpDuration(c.EngineRestore[a].Median(), c.EngineRestore[b].Median())
	})
	if len(ranked) == 1 {
		return ranked[0], WhyFaster, "engine " + ranked[0] + ": the only one with a generation this node can restore"
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
		if !strings.HasPrefix(p.Name, "boot.") {
			sum += p.Duration
		}
	}
	return sum
}

// Why classes a Decision (the metrics' label).
type Why string

// Why a decision went as it did.
const (
	// WhyFirst: fewer than MinSamples restores measured; a new app starts
	// by restoring (its first deploy produces the checkpoint).
	WhyFirst Why = "first"
	// WhyLearn: a boot to measure what booting costs.
	WhyLearn Why = "learn"
	// WhyFaster: the kind whose median is lower (restore only when
	// restoring is faster).
	WhyFaster Why = "faster"
	// WhyExplore: the other kind, every ExploreEvery-th choice.
	WhyExplore Why = "explore"
	// WhyCannotBoot: the node cannot boot apps without an engine.
	WhyCannotBoot Why = "cannot_boot"
)

// Decision is the choice for one deploy of mode auto.
type Decision struct {
	// Mode is spec.ModeBoot or spec.ModeRestore.
	Mode spec.Mode `json:"mode"`
	Why  Why       `json:"why"`
	// Reason says it for the deployment's status, e.g. "auto: boot 0.15 s
	// < restore 0.60 s (medians of 5 and 7 runs)".
	Reason string `json:"reason"`
}

// Decide chooses between a boot and a restore from the costs of the app on
// the node. cannotBoot, when not empty, says why the node cannot boot apps
// without an engine: then it restores. Otherwise:
//
//   - fewer than MinSamples restores measured: restore (a new app starts by
//     restoring);
//   - fewer than MinSamples boots: boot to measure it, at once when no boot
//     was measured or booting looks faster so far, else once per
//     MinSamples restores;
//   - both measured: restore only if its median is lower than the boot's;
//     every ExploreEvery-th choice of mode auto takes the other kind.
func Decide(c Costs, cannotBoot string) Decision {
	nb, nr := len(c.Boot), len(c.Restore)
	mb, mr := c.Boot.Median(), c.Restore.Median()
	boot := func(why Why, format string, args ...any) Decision {
		return Decision{Mode: spec.ModeBoot, Why: why, Reason: "auto: " + fmt.Sprintf(format, args...)}
	}
	restore := func(why Why, format string, args ...any) Decision {
		return Decision{Mode: spec.ModeRestore, Why: why, Reason: "auto: " + fmt.Sprintf(format, args...)}
	}
	bootFaster := mb <= mr // restore only when restoring is faster
	// cmp compares both medians, the lower first; runs says of how many.
	cmp := fmt.Sprintf("boot %s %s restore %s", secs(mb), lessOrEqual(mb, mr), secs(mr))
	runs := fmt.Sprintf("medians of %d and %d runs", nb, nr)
	if !bootFaster {
		cmp = fmt.Sprintf("restore %s < boot %s", secs(mr), secs(mb))
		runs = fmt.Sprintf("medians of %d and %d runs", nr, nb)
	}
	switch {
	case cannotBoot != "":
		return restore(WhyCannotBoot, "restore: this node cannot boot apps without an engine (%s)", cannotBoot)
	case nr < MinSamples:
		return restore(WhyFirst, "restore first (%d of %d restores measured on this node)", nr, MinSamples)
	case nb == 0:
		return boot(WhyLearn, "boot to measure it (none measured on this node yet; restore %s, median of %d runs)", secs(mr), nr)
	case nb < MinSamples && bootFaster:
		return boot(WhyLearn, "boot to measure it (so far %s, %s)", cmp, runs)
	case nb < MinSamples && nr >= MinSamples*(nb+1):
		return boot(WhyLearn, "boot to measure it again (so far %s, %s)", cmp, runs)
	case nb < MinSamples:
		return restore(WhyFaster, "%s so far (%s; boot measured again after %d restores)", cmp, runs, MinSamples*(nb+1))
	case (c.Auto+1)%ExploreEvery == 0 && bootFaster:
		return restore(WhyExplore, "restore to measure it again (every %dth choice takes the other; %s, %s)", ExploreEvery, cmp, runs)
	case (c.Auto+1)%ExploreEvery == 0:
		return boot(WhyExplore, "boot to measure it again (every %dth choice takes the other; %s, %s)", ExploreEvery, cmp, runs)
	case bootFaster:
		return boot(WhyFaster, "%s (%s)", cmp, runs)
	}
	return restore(WhyFaster, "%s (%s)", cmp, runs)
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
