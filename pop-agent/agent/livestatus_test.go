package agent

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
)

// A deploy's live status shows its phases as they come, written behind
// the stages; once stopped, nothing it had pending lands after the status
// the deploy's end writes.
func TestLiveStatus(t *testing.T) {
	st := statetest.Store(t)
	ctx := context.Background()
	a := &agent{st: st, log: slog.New(slog.DiscardHandler), m: newMetrics(prometheus.NewRegistry())}
	if err := st.CreateDeployment(ctx, state.Desired{ID: "chat-1", App: "chat", Node: "n1", Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	live := a.newLiveStatus(ctx, "chat-1", state.Status{Instance: spec.Instance{Phase: spec.PhaseResuming, Node: "n1"}})
	time.Sleep(2 * liveStatusDelay)
	live.progress("clone", 10*time.Millisecond)
	live.progress("map", 5*time.Millisecond)
	names := func() []string {
		d, err := st.Deployment(ctx, "chat-1")
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, p := range d.Status.Timings {
			out = append(out, p.Name)
		}
		return out
	}
	for deadline := time.Now().Add(5 * time.Second); !slices.Equal(names(), []string{"clone", "map"}); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("live status timings %v; want clone, map", names())
		}
	}
	// Changes in a burst, then the end: the final status stays.
	for i := range 50 {
		live.progress("step"+string(rune('a'+i%26)), time.Millisecond)
	}
	live.stop()
	live.stop() // twice is harmless
	if err := a.setStatus(ctx, "chat-1", state.Status{Instance: spec.Instance{Phase: spec.PhaseRunning, Node: "n1"}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if d, err := st.Deployment(ctx, "chat-1"); err != nil || d.Status.Phase != spec.PhaseRunning {
		t.Errorf("status after the live status stopped and the end's was written: %+v, %v; want Running", d.Status, err)
	}
}
