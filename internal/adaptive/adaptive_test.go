package adaptive

import (
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

func ms(v ...int64) Samples { return Samples(v) }

func TestDecide(t *testing.T) {
	gen := Situation{Generation: true}
	withPool := func(s Situation, n int) Situation { s.Pool = n; return s }
	for _, tc := range []struct {
		name    string
		c       Costs
		s       Situation
		mode    spec.Mode
		why     Why
		reason  string // the whole reason, or a part of it
		measure spec.Mode
	}{
		{"a new app makes its generation", Costs{}, Situation{},
			spec.ModeRestore, WhyNoGeneration, "auto: no generation of the app this node can restore: boot it, checkpoint it, seal a generation and restore it", ""},
		{"a slot waiting is taken, however slow restores were", Costs{Restore: ms(770, 700, 660), Boot: ms(100, 100, 100)}, Situation{SlotWaiting: true, Generation: true},
			spec.ModeRestore, WhyPoolSlot, "auto: pool slot: an idle slot of the app waits on this node", ""},
		{"the hits' median is said", Costs{Hit: ms(4, 5, 6)}, Situation{SlotWaiting: true, Generation: true},
			spec.ModeRestore, WhyPoolSlot, "(hits: 5.0 ms, median of 3 runs)", ""},
		// The 69 s app whose restores take 0.7 s: no boot was measured on
		// this node, but one was in the PoP (its first deploy).
		{"a boot measured on another node stands in", Costs{Node: "n1", Restore: ms(770, 700, 660, 770)},
			Situation{Generation: true, PoP: []Costs{{Node: "n2", Boot: ms(68500)}}},
			spec.ModeRestore, WhyFaster, "auto: restore 0.73 s, median of 4 runs < boot 68.50 s, median of 1 run on other nodes", ""},
		{"no boot measured anywhere: restore, measure a boot in the background", Costs{Restore: ms(600)}, gen,
			spec.ModeRestore, WhyFirst, "boot not measured yet", spec.ModeBoot},
		{"no restore measured anywhere: restore to measure it (the paper's path)", Costs{Boot: ms(5000)}, gen,
			spec.ModeRestore, WhyFirst, "restore not measured yet", ""},
		{"boot faster, far apart: nothing measured again", Costs{Restore: ms(600, 620, 580), Boot: ms(150, 150)}, gen,
			spec.ModeBoot, WhyFaster, "auto: boot 0.15 s, median of 2 runs < restore 0.60 s, median of 3 runs", ""},
		{"restore faster, 10x: a user never waits for a boot again", Costs{Restore: ms(400, 410, 390), Boot: ms(5400), Auto: 9}, gen,
			spec.ModeRestore, WhyFaster, "auto: restore 0.40 s, median of 3 runs < boot 5.40 s, median of 1 run", ""},
		{"close, the other with few runs: measured in the background", Costs{Restore: ms(510), Boot: ms(450, 450, 450)}, gen,
			spec.ModeBoot, WhyFaster, "; restore measured again in the background (within 1.5x)", spec.ModeRestore},
		{"close, both well measured: not again before the 10th choice", Costs{Restore: ms(500, 520, 510), Boot: ms(450, 450, 450), Auto: 3}, gen,
			spec.ModeBoot, WhyFaster, "auto: boot 0.45 s, median of 3 runs < restore 0.51 s, median of 3 runs", ""},
		{"close, the 10th choice: measured again in the background", Costs{Restore: ms(500, 520, 510), Boot: ms(450, 450, 450), Auto: 9}, gen,
			spec.ModeBoot, WhyFaster, "restore measured again", spec.ModeRestore},
		{"milliseconds below 0.1 s", Costs{Restore: ms(20, 30, 20), Boot: ms(690, 700, 710)}, gen,
			spec.ModeRestore, WhyFaster, "auto: restore 20 ms, median of 3 runs < boot 0.70 s", ""},
		{"a tie boots: restore only when it is faster", Costs{Restore: ms(500, 500, 500), Boot: ms(500, 500, 500)}, gen,
			spec.ModeBoot, WhyFaster, "auto: boot 0.50 s, median of 3 runs = restore 0.50 s", ""},
		{"even counts: the mean of the middle two", Costs{Restore: ms(100, 300, 900, 1000), Boot: ms(700, 700, 700)}, gen,
			spec.ModeRestore, WhyFaster, "restore 0.60 s", ""},
		// memcached: a miss is slower than a boot, but the app has a pool:
		// it gets its generation, and then its slots.
		{"no generation, restores slower, but a pool: make it", Costs{Restore: ms(500, 500, 500), Boot: ms(300, 300, 300)}, withPool(Situation{}, 2),
			spec.ModeRestore, WhyNoGeneration, "(its pool of 2 waits for one)", ""},
		{"no generation, restores known slower, no pool: boot", Costs{Restore: ms(500, 500, 500), Boot: ms(300, 300, 300)}, Situation{},
			spec.ModeBoot, WhyFaster, "no generation is made (the app keeps no pool)", ""},
		{"no generation, restores slower but not known well: make it", Costs{Restore: ms(500), Boot: ms(300, 300, 300)}, Situation{},
			spec.ModeRestore, WhyNoGeneration, "no generation", ""},
		{"a generation and a pool, no slot waiting: the faster of boot and miss", Costs{Restore: ms(500, 500, 500), Boot: ms(300, 300, 300)}, withPool(gen, 2),
			spec.ModeBoot, WhyFaster, "auto: boot 0.30 s", ""},
		{"a node that cannot boot restores", Costs{Restore: ms(600, 600, 600), Boot: ms(150, 150, 150)}, Situation{CannotBoot: "no boot image", Generation: true},
			spec.ModeRestore, WhyCannotBoot, "auto: restore: this node cannot boot apps without an engine (no boot image)", ""},
	} {
		d := Decide(tc.c, tc.s)
		if d.Mode != tc.mode || d.Why != tc.why || !strings.Contains(d.Reason, tc.reason) || d.Measure != tc.measure {
			t.Errorf("%s: Decide(%+v, %+v) = %+v; want %s (%s), reason %q, measure %q", tc.name, tc.c, tc.s, d, tc.mode, tc.why, tc.reason, tc.measure)
		}
	}
}

// A new app on a node with a pool of one, whose boot takes 5 s and whose
// restores 0.4 s (a hit 5 ms): the first deploy makes the generation (its
// boot is a sample); every later one takes the slot when one waits and
// restores when none does; a boot never runs on a request, and nothing is
// measured in the background (the two are 12x apart).
func TestDecideSequence(t *testing.T) {
	var c Costs
	var got []string
	hasGen := false
	for i := range 12 {
		s := Situation{Generation: hasGen, Pool: 1, SlotWaiting: hasGen && i%3 != 1}
		d := Decide(c, s)
		if d.Measure != "" {
			t.Errorf("deploy %d: %+v; want nothing measured", i, d)
		}
		choice := string(d.Mode)
		if d.Why == WhyPoolSlot {
			choice = "hit"
		}
		got = append(got, choice)
		switch {
		case d.Mode == spec.ModeBoot:
			c.Record(Run{Mode: spec.ModeBoot, Cost: 5 * time.Second, Auto: true})
		case !hasGen:
			c.Record(Run{Mode: spec.ModeRestore, Gen: 1, Cost: 400 * time.Millisecond, Boot: 5 * time.Second, Auto: true})
			hasGen = true
		default:
			c.Record(Run{Mode: spec.ModeRestore, Gen: 1, Cost: map[bool]time.Duration{true: 5 * time.Millisecond, false: 400 * time.Millisecond}[s.SlotWaiting],
				Hit: s.SlotWaiting, Auto: true})
		}
	}
	want := "restore restore hit hit restore hit hit restore hit hit restore hit"
	if s := strings.Join(got, " "); s != want {
		t.Errorf("choices:\n got %s\nwant %s", s, want)
	}
	if len(c.Boot) != 1 || len(c.Restore) != 5 || len(c.Hit) != 7 || c.Auto != 12 {
		t.Errorf("costs after 12 deploys = %+v; want the first deploy's boot, 5 restores (its own and 4 misses), 7 hits, 12 auto", c)
	}
}

func TestCostsAdd(t *testing.T) {
	var c Costs
	for i := range 12 {
		c.Add(spec.ModeBoot, 0, time.Duration(i+1)*time.Millisecond, false)
	}
	if len(c.Boot) != MaxSamples || c.Boot[0] != 4 || c.Boot[MaxSamples-1] != 12 || c.Auto != 0 {
		t.Errorf("boot samples after 12 = %v (auto %d); want the last %d, 4..12", c.Boot, c.Auto, MaxSamples)
	}
	c.Add(spec.ModeRestore, 2, 500*time.Millisecond, true)
	c.Add(spec.ModeRestore, 2, 700*time.Millisecond, true)
	if c.Gen != 2 || len(c.Restore) != 2 || c.Auto != 2 {
		t.Errorf("after 2 restores of gen 2: %+v", c)
	}
	// A restore of an older generation that ends after a newer one was
	// sealed does not count; a newer generation starts afresh.
	c.Add(spec.ModeRestore, 1, 100*time.Millisecond, false)
	if len(c.Restore) != 2 {
		t.Errorf("a restore of an older generation was counted: %v", c.Restore)
	}
	c.Add(spec.ModeRestore, 3, 300*time.Millisecond, false)
	if c.Gen != 3 || len(c.Restore) != 1 || c.Restore[0] != 300 {
		t.Errorf("a restore of a newer generation: gen %d, %v; want gen 3, [300]", c.Gen, c.Restore)
	}
	c.Add(spec.ModeCheckpoint, 4, time.Second, false)
	if c.Gen != 3 || len(c.Restore) != 1 {
		t.Errorf("a checkpoint refresh was counted: %+v", c)
	}
	// Hits are kept apart from misses, and start afresh with them.
	c.Record(Run{Mode: spec.ModeRestore, Gen: 3, Cost: 4 * time.Millisecond, Hit: true})
	if len(c.Hit) != 1 || len(c.Restore) != 1 {
		t.Errorf("a hit: %+v; want one hit beside the one restore", c)
	}
	c.Record(Run{Mode: spec.ModeRestore, Gen: 5, Cost: 600 * time.Millisecond, Boot: 3 * time.Second, Auto: true})
	if c.Gen != 5 || len(c.Hit) != 0 || len(c.Restore) != 1 || c.Boot[len(c.Boot)-1] != 3000 || c.Auto != 3 {
		t.Errorf("a first deploy of generation 5: %+v; want its boot recorded, the hits of gen 3 dropped", c)
	}
}

func TestCost(t *testing.T) {
	first := layering.Timings{
		{Name: "boot.clone", Duration: 100 * time.Millisecond}, {Name: "boot.ready", Duration: 5 * time.Second},
		{Name: "boot.checkpoint", Duration: time.Second}, {Name: "boot.seal", Duration: 400 * time.Millisecond},
		{Name: "clone", Duration: 100 * time.Millisecond}, {Name: "map", Duration: 80 * time.Millisecond},
		{Name: "mount", Duration: 20 * time.Millisecond}, {Name: "container", Duration: 300 * time.Millisecond},
		{Name: "ready", Duration: 500 * time.Millisecond},
	}
	if got := Cost(first); got != time.Second {
		t.Errorf("Cost of a first deploy = %s; want 1s, its restore only", got)
	}
	if got := BootCost(first); got != 5100*time.Millisecond {
		t.Errorf("BootCost of a first deploy = %s; want 5.1s, its boot until ready", got)
	}
	engineAuto := layering.Timings{{Name: "boot.dmtcp.clone", Duration: time.Second}, {Name: "boot.dmtcp.ready", Duration: time.Second},
		{Name: "boot.dmtcp.checkpoint", Duration: time.Second}, {Name: "boot.criu.ready", Duration: time.Second}}
	if got := BootCost(engineAuto); got != 2*time.Second {
		t.Errorf("BootCost with two engines = %s; want the first engine's boot, 2s", got)
	}
	if got := BootCost(first[4:]); got != 0 {
		t.Errorf("BootCost of a deploy that booted nothing = %s", got)
	}
	if got := (Samples{}).Median(); got != 0 {
		t.Errorf("median of nothing = %s", got)
	}
}

// TestChooseEngine: an app of engine auto measures each engine's restores
// first, then takes the one with the lowest median and says why, and every
// so often the second best, to measure it again.
func TestChooseEngine(t *testing.T) {
	engines := []engine.Name{"dmtcp", "criu"}
	var c Costs
	var got []string
	for i := range 8 {
		eng, why, reason := ChooseEngine(c, engines)
		got = append(got, string(eng))
		if i < 6 && (why != WhyFirst || !strings.Contains(reason, "measuring its restores")) {
			t.Errorf("choice %d: %s, %s, %q; want measuring", i, eng, why, reason)
		}
		cost := map[engine.Name]time.Duration{"dmtcp": 800 * time.Millisecond, "criu": 120 * time.Millisecond}[eng]
		c.AddEngine(eng, map[engine.Name]int{"dmtcp": 1, "criu": 2}[eng], cost, false)
	}
	if s := strings.Join(got, " "); s != "dmtcp dmtcp dmtcp criu criu criu criu criu" {
		t.Errorf("choices = %s; want 3 of each engine measured, then criu (faster)", s)
	}
	if _, why, reason := ChooseEngine(c, engines); why != WhyFaster || reason != "engine criu: restores criu 0.12 s < dmtcp 0.80 s (medians)" {
		t.Errorf("settled: %s, %q", why, reason)
	}
	c.Auto = ExploreEvery/2 - 1
	if eng, why, _ := ChooseEngine(c, engines); eng != "dmtcp" || why != WhyExplore {
		t.Errorf("the explore turn chose %s (%s); want dmtcp, to measure it again", eng, why)
	}
	// A newer generation of an engine measures it afresh; an older one is
	// not counted.
	c.AddEngine("criu", 4, 90*time.Millisecond, true)
	c.AddEngine("criu", 2, time.Second, true)
	if s := c.EngineRestore["criu"]; len(s) != 1 || s[0] != 90 || c.EngineGen["criu"] != 4 || c.Auto != ExploreEvery/2+1 {
		t.Errorf("after generation 4 of criu: %+v", c)
	}
	if eng, why, _ := ChooseEngine(c, engines); eng != "criu" || why != WhyFirst {
		t.Errorf("with 1 restore of criu's new generation: %s (%s); want criu, measuring", eng, why)
	}
	if eng, _, reason := ChooseEngine(c, []engine.Name{"dmtcp"}); eng != "dmtcp" || !strings.Contains(reason, "only one") {
		t.Errorf("one engine: %s, %q", eng, reason)
	}
	if eng, _, _ := ChooseEngine(c, nil); eng != "" {
		t.Errorf("no generation: %q; want none", eng)
	}
	if v := c.ForEngine("dmtcp"); len(v.Restore) != 3 {
		t.Errorf("ForEngine(dmtcp).Restore = %v; want its 3 samples", v.Restore)
	}
}
