package state_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
)

// TestFollow: a follower sees each status its agent writes, in order,
// and stops at the first settled one; it gives up at its context's end
// with the last status it read, and fails with ErrNotFound once the
// deployment is withdrawn.
func TestFollow(t *testing.T) {
	st := statetest.Store(t)
	ctx := context.Background()
	if err := st.CreateDeployment(ctx, state.Desired{ID: "web-1", App: "web", Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	go func() {
		for _, p := range []spec.Phase{spec.PhaseCreating, spec.PhaseRunning} {
			time.Sleep(50 * time.Millisecond)
			_ = st.SetStatus(ctx, "web-1", state.Status{Instance: spec.Instance{Phase: p, Ports: map[string]string{"80/tcp": "127.0.0.1:1"}}})
		}
	}()
	var seen []spec.Phase
	d, err := st.Follow(ctx, "web-1", func(d state.Deployment) bool {
		seen = append(seen, d.Status.Phase)
		return state.Settled(d.Status.Phase)
	})
	if err != nil || d.Status.Phase != spec.PhaseRunning || d.Status.Ports["80/tcp"] == "" {
		t.Fatalf("Follow = %+v, %v; want Running with its ports", d.Status, err)
	}
	if seen[len(seen)-1] != spec.PhaseRunning || len(seen) < 2 {
		t.Errorf("phases seen %v; want the ones before Running, then Running", seen)
	}

	if err := st.CreateDeployment(ctx, state.Desired{ID: "web-2", App: "web", Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := st.Follow(short, "web-2", func(d state.Deployment) bool { return state.Settled(d.Status.Phase) }); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Follow of a deployment that never settles: %v; want the context's deadline", err)
	}
	if err := st.DeleteDeployment(ctx, "web-2"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Follow(ctx, "web-2", func(state.Deployment) bool { return false }); !errors.Is(err, state.ErrNotFound) {
		t.Errorf("Follow of a withdrawn deployment: %v; want ErrNotFound", err)
	}
}
