package agent

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
)

// A migration's source lets its instance run on until the target says its
// resume is prepared, and no longer than that; a move back waits for
// nothing.
func TestAwaitTarget(t *testing.T) {
	st := statetest.Store(t)
	ctx := context.Background()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st.Watch(wctx, slog.New(slog.DiscardHandler))
	a := &agent{st: st, log: slog.New(slog.DiscardHandler), m: newMetrics(prometheus.NewRegistry())}
	dsr := state.Desired{ID: "chat-1", App: "chat", Node: "n1", Suspend: true, Created: time.Now(), Move: &state.Move{From: "n1", To: "n2"}}
	if err := st.CreateDeployment(ctx, dsr); err != nil {
		t.Fatal(err)
	}
	done := make(chan time.Duration, 1)
	start := time.Now()
	go func() {
		a.awaitTarget(ctx, dsr)
		done <- time.Since(start)
	}()
	select {
	case d := <-done:
		t.Fatalf("awaitTarget returned after %s, before its target said it was prepared", d)
	case <-time.After(300 * time.Millisecond):
	}
	marked := time.Now()
	if err := st.MarkPrepared(ctx, dsr.ID, "n2"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
		if after := time.Since(marked); after > time.Second {
			t.Errorf("awaitTarget returned %s after its target said it was prepared", after)
		}
	case <-time.After(prepareWait):
		t.Fatal("awaitTarget still waits after its target said it was prepared")
	}

	back := dsr
	back.Move = &state.Move{From: "n1", To: "n2", Back: true}
	start = time.Now()
	a.awaitTarget(ctx, back)
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("awaitTarget of a move back waited %s", d)
	}
}
