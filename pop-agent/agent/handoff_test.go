package agent

import (
	"testing"
	"time"
)

// TestLogGate: a flood of refused hand-over reads logs one line per
// period, not one per read.
func TestLogGate(t *testing.T) {
	var g logGate
	let := 0
	for range 1000 {
		if g.allow(time.Hour) {
			let++
		}
	}
	if let != 1 {
		t.Errorf("%d lines let through of 1000 within the period; want 1", let)
	}
	g.last.Store(time.Now().Add(-2 * time.Hour).UnixNano())
	if !g.allow(time.Hour) {
		t.Error("a line after the period was held back")
	}
}
