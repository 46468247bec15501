package agent

import (
	"errors"
	"maps"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/engine"
)

// TestSpareWants: a node keeps agent.spare_slots idle spares of each
// engine it can make them of; an engine whose spares cannot be made now
// (a check that failed for a moment) keeps those it has, up to that
// number, instead of releasing them, and makes none; a cordoned node
// (want 0) keeps none.
func TestSpareWants(t *testing.T) {
	busy := errors.New("Cannot connect to the Docker daemon")
	engs := []engine.Name{"dmtcp", "criu"}
	for _, c := range []struct {
		name   string
		want   int
		cannot map[engine.Name]error
		idle   map[engine.Name]int
		wants  map[engine.Name]int
	}{
		{"both can", 1, nil, map[engine.Name]int{"dmtcp": 0, "criu": 3}, map[engine.Name]int{"dmtcp": 1, "criu": 1}},
		{"criu's check failed: its spare stays", 1, map[engine.Name]error{"criu": busy}, map[engine.Name]int{"dmtcp": 1, "criu": 1}, map[engine.Name]int{"dmtcp": 1, "criu": 1}},
		{"criu's check failed: none made", 2, map[engine.Name]error{"criu": busy}, map[engine.Name]int{"criu": 1}, map[engine.Name]int{"dmtcp": 2, "criu": 1}},
		{"criu's check failed: extra ones still go", 1, map[engine.Name]error{"criu": busy}, map[engine.Name]int{"criu": 3}, map[engine.Name]int{"dmtcp": 1, "criu": 1}},
		{"cordoned", 0, map[engine.Name]error{"criu": busy}, map[engine.Name]int{"dmtcp": 1, "criu": 1}, map[engine.Name]int{"dmtcp": 0, "criu": 0}},
	} {
		got, size := spareWants(c.want, engs, c.cannot, c.idle)
		sum := 0
		for _, n := range c.wants {
			sum += n
		}
		if !maps.Equal(got, c.wants) || size != sum {
			t.Errorf("%s: wants %v (size %d); want %v (%d)", c.name, got, size, c.wants, sum)
		}
	}
}
