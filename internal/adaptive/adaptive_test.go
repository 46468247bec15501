package adaptive

import (
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

func ms(v ...int64) Samples { return Samples(v) }

func TestDecide(t *testing.T) {
	for _, tc := range []struct {
		name       string
		c          Costs
		cannotBoot string
		mode       spec.Mode
		why        Why
		reason     string // the whole reason, or a part of it
	}{
		{"a new app restores", Costs{}, "",
			spec.ModeRestore, WhyFirst, "auto: restore first (0 of 3 restores measured on this node)"},
		{"still fewer than 3 restores, even with boots measured", Costs{Restore: ms(600, 700), Boot: ms(100, 100, 100)}, "",
			spec.ModeRestore, WhyFirst, "auto: restore first (2 of 3 restores measured on this node)"},
		{"3 restores and no boot: boot once to measure it", Costs{Restore: ms(600, 500, 700)}, "",
			spec.ModeBoot, WhyLearn, "auto: boot to measure it (none measured on this node yet; restore 0.60 s, median of 3 runs)"},
		{"booting looks faster so far: measure it again at once", Costs{Restore: ms(600, 500, 700), Boot: ms(150)}, "",
			spec.ModeBoot, WhyLearn, "auto: boot to measure it (so far boot 0.15 s < restore 0.60 s, medians of 1 and 3 runs)"},
		{"booting looks slower so far: restore meanwhile", Costs{Restore: ms(400, 400, 400, 400), Boot: ms(5400)}, "",
			spec.ModeRestore, WhyFaster, "auto: restore 0.40 s < boot 5.40 s so far (medians of 4 and 1 runs; boot measured again after 6 restores)"},
		{"after 3 more restores, boot again to measure it", Costs{Restore: ms(400, 400, 400, 400, 400, 400), Boot: ms(5400)}, "",
			spec.ModeBoot, WhyLearn, "auto: boot to measure it again (so far restore 0.40 s < boot 5.40 s, medians of 6 and 1 runs)"},
		{"third boot once 9 restores are kept", Costs{Restore: ms(4, 4, 4, 4, 4, 4, 4, 4, 4), Boot: ms(5400, 5300)}, "",
			spec.ModeBoot, WhyLearn, "again"},
		{"both measured, boot faster", Costs{Restore: ms(600, 620, 580, 700, 590, 610, 650), Boot: ms(150, 140, 160, 155, 145)}, "",
			spec.ModeBoot, WhyFaster, "auto: boot 0.15 s < restore 0.61 s (medians of 5 and 7 runs)"},
		{"both measured, restore faster", Costs{Restore: ms(400, 410, 390, 400, 420, 380, 400), Boot: ms(5400, 5300, 5500, 5400, 5450)}, "",
			spec.ModeRestore, WhyFaster, "auto: restore 0.40 s < boot 5.40 s (medians of 7 and 5 runs)"},
		{"milliseconds below 0.1 s (a pool hit restored ahead)", Costs{Restore: ms(2, 3, 2), Boot: ms(690, 700, 710)}, "",
			spec.ModeRestore, WhyFaster, "auto: restore 2.0 ms < boot 0.70 s (medians of 3 and 3 runs)"},
		{"a tie boots: restore only when it is faster", Costs{Restore: ms(500, 500, 500), Boot: ms(500, 500, 500)}, "",
			spec.ModeBoot, WhyFaster, "auto: boot 0.50 s = restore 0.50 s (medians of 3 and 3 runs)"},
		{"even counts: the mean of the middle two", Costs{Restore: ms(100, 300, 900, 1000), Boot: ms(700, 700, 700)}, "",
			spec.ModeRestore, WhyFaster, "restore 0.60 s < boot 0.70 s"},
		{"every 10th choice explores the other kind (boot faster)", Costs{Restore: ms(600, 600, 600), Boot: ms(150, 150, 150), Auto: 9}, "",
			spec.ModeRestore, WhyExplore, "auto: restore to measure it again (every 10th choice takes the other; boot 0.15 s < restore 0.60 s, medians of 3 and 3 runs)"},
		{"every 10th choice explores the other kind (restore faster)", Costs{Restore: ms(400, 400, 400), Boot: ms(900, 900, 900), Auto: 19}, "",
			spec.ModeBoot, WhyExplore, "auto: boot to measure it again (every 10th choice takes the other; restore 0.40 s < boot 0.90 s"},
		{"the 11th does not explore", Costs{Restore: ms(600, 600, 600), Boot: ms(150, 150, 150), Auto: 10}, "",
			spec.ModeBoot, WhyFaster, "auto: boot 0.15 s < restore 0.60 s"},
		{"no exploring while learning", Costs{Restore: ms(400, 400, 400, 400), Boot: ms(5400), Auto: 9}, "",
			spec.ModeRestore, WhyFaster, "so far"},
		{"a node that cannot boot restores", Costs{Restore: ms(600, 600, 600), Boot: ms(150, 150, 150)}, "no boot image",
			spec.ModeRestore, WhyCannotBoot, "auto: restore: this node cannot boot apps without an engine (no boot image)"},
	} {
		d := Decide(tc.c, tc.cannotBoot)
		if d.Mode != tc.mode || d.Why != tc.why || !strings.Contains(d.Reason, tc.reason) {
			t.Errorf("%s: Decide(%+v) = %+v; want %s (%s), reason %q", tc.name, tc.c, d, tc.mode, tc.why, tc.reason)
		}
	}
}

// A new app on a node: it restores 3 times, then boots until booting is
// measured (when booting looks faster), then settles on the faster kind and
// explores the other one every 10th choice.
func TestDecideSequence(t *testing.T) {
	cost := map[spec.Mode]time.Duration{spec.ModeBoot: 150 * time.Millisecond, spec.ModeRestore: 600 * time.Millisecond}
	var c Costs
	var got []string
	for range 21 {
		d := Decide(c, "")
		got = append(got, string(d.Mode))
		c.Add(d.Mode, 1, cost[d.Mode], true)
	}
	want := "restore restore restore boot boot boot boot boot boot restore boot boot boot boot boot boot boot boot boot restore boot"
	if s := strings.Join(got, " "); s != want {
		t.Errorf("choices:\n got %s\nwant %s", s, want)
	}
	if len(c.Boot) != MaxSamples || len(c.Restore) != 5 || c.Auto != 21 {
		t.Errorf("costs after 21 deploys = %+v; want %d boots kept, 5 restores, 21 auto", c, MaxSamples)
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
	if got := (Samples{}).Median(); got != 0 {
		t.Errorf("median of nothing = %s", got)
	}
}

// TestChooseEngine: an app of engine auto measures each engine's restores
// first, then takes the one with the lowest median and says why, and every
// so often the second best, to measure it again.
func TestChooseEngine(t *testing.T) {
	engines := []string{"dmtcp", "criu"}
	var c Costs
	var got []string
	for i := range 8 {
		eng, why, reason := ChooseEngine(c, engines)
		got = append(got, eng)
		if i < 6 && (why != WhyFirst || !strings.Contains(reason, "measuring its restores")) {
			t.Errorf("choice %d: %s, %s, %q; want measuring", i, eng, why, reason)
		}
		cost := map[string]time.Duration{"dmtcp": 800 * time.Millisecond, "criu": 120 * time.Millisecond}[eng]
		c.AddEngine(eng, map[string]int{"dmtcp": 1, "criu": 2}[eng], cost, false)
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
	if eng, _, reason := ChooseEngine(c, []string{"dmtcp"}); eng != "dmtcp" || !strings.Contains(reason, "only one") {
		t.Errorf("one engine: %s, %q", eng, reason)
	}
	if eng, _, _ := ChooseEngine(c, nil); eng != "" {
		t.Errorf("no generation: %q; want none", eng)
	}
	if v := c.ForEngine("dmtcp"); len(v.Restore) != 3 {
		t.Errorf("ForEngine(dmtcp).Restore = %v; want its 3 samples", v.Restore)
	}
}
