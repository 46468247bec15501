package deploy

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/spec"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// TestHitTurn: at most Config.HitConcurrency pool hits run at once; one
// that waits for its turn says so in its timings (StepQueue), gets it when
// an earlier hit ends, and gives up with its context.
func TestHitTurn(t *testing.T) {
	d := &Deployer{hits: make(chan struct{}, 1)}
	var first, second, third layering.Timings
	done1, err := d.hitTurn(context.Background(), d.stages.newOp(&first, nil))
	if err != nil || len(first) != 0 {
		t.Fatalf("first hit: %v, timings %s; want its turn at once, no queue phase", err, first)
	}
	got := make(chan error, 1)
	go func() {
		done2, err := d.hitTurn(context.Background(), d.stages.newOp(&second, nil))
		if err == nil {
			done2()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("second hit ran beside the first (%v); want it to wait", err)
	case <-time.After(50 * time.Millisecond):
	}
	done1()
	if err := <-got; err != nil {
		t.Fatalf("second hit after the first ended: %v", err)
	}
	if len(second) != 1 || second[0].Name != string(StepQueue) || second[0].Duration < 40*time.Millisecond {
		t.Errorf("second hit timings %s; want one %q phase of about 50ms", second, StepQueue)
	}

	// A hit that waits gives up when its deploy is cancelled.
	done1, _ = d.hitTurn(context.Background(), d.stages.newOp(&first, nil))
	defer done1()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := d.hitTurn(ctx, d.stages.newOp(&third, nil)); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("hit waiting past its deadline: %v; want context.DeadlineExceeded", err)
	}
}

// TestConfigHitConcurrency: a negative concurrency is refused, naming the
// field; 0 takes the default.
func TestConfigHitConcurrency(t *testing.T) {
	cfg := Config{StateDir: "/var/lib/fogdeploy", Pool: "fogdeploy", HitConcurrency: -1}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "hit concurrency") {
		t.Errorf("Validate(HitConcurrency -1) = %v; want an error naming hit concurrency", err)
	}
	cfg.HitConcurrency = 0
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate(HitConcurrency 0) = %v", err)
	}
	if DefaultHitConcurrency() < 2 {
		t.Errorf("DefaultHitConcurrency() = %d; want at least 2 (the CPUs plus one)", DefaultHitConcurrency())
	}
}

// TestUnclaim: a slot claimed by a deploy cancelled before its turn goes
// back to the idle index as it was (its generation included), and the
// next deploy claims it; a claim bound or released meanwhile is not
// given back.
func TestUnclaim(t *testing.T) {
	p := &Pool{idle: map[string]idleSlot{}, claimed: map[string]claimedSlot{}}
	g := &spec.Generation{App: "a", Gen: 3}
	p.offer(&Slot{ID: "s1", App: "a", Gen: 3, Pool: true, Phase: SlotIdle, Mode: drivers.RunRestart, Owned: Owned{Handle: &drivers.Handle{}}}, g)
	s, err := p.claim("a", 3, "dep1")
	if err != nil || s.ID != "s1" || s.Phase != SlotClaimed || s.Deployment != "dep1" {
		t.Fatalf("claim = %+v, %v; want s1 claimed by dep1", s, err)
	}
	if _, err := p.claim("a", 3, "dep2"); !errors.Is(err, ErrNoSlot) {
		t.Fatalf("second claim of the only slot: %v; want ErrNoSlot", err)
	}
	p.unclaim("s1")
	if c, ok := p.idle["s1"]; !ok || c.filled != g || c.slot.Phase != SlotIdle || c.slot.Deployment != "" {
		t.Fatalf("after unclaim the index has %+v, %v; want s1 idle with its generation", c, ok)
	}
	if _, ok := p.claimed["s1"]; ok {
		t.Errorf("after unclaim s1 is still claimed")
	}
	s, err = p.claim("a", 3, "dep2")
	if err != nil || s.ID != "s1" || s.Deployment != "dep2" {
		t.Fatalf("claim after unclaim = %+v, %v; want s1 for dep2", s, err)
	}
	p.forget("s1") // bound
	p.unclaim("s1")
	if _, ok := p.idle["s1"]; ok {
		t.Errorf("unclaim after the slot was bound put it back in the index")
	}
}
