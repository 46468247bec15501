package state_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
)

// TestFollow: a follower sees each status its agent writes, in order,
// and stops at the first settled one; it gives up at its context's end
// with the last status it read, and fails with ErrNotFound once the
// deployment is withdrawn. The same, reading etcd and following the
// agent's watched view.
func TestFollow(t *testing.T) {
	for _, watched := range []bool{false, true} {
		t.Run(map[bool]string{false: "etcd", true: "watched"}[watched], func(t *testing.T) {
			st := statetest.Store(t)
			if watched {
				ctx, cancel := context.WithCancel(context.Background())
				t.Cleanup(cancel)
				st.Watch(ctx, slog.New(slog.DiscardHandler))
			}
			testFollow(t, st)
		})
	}
}

func testFollow(t *testing.T, st *state.Store) {
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

	// A follower of a deployment made a moment ago (a view may not hold it
	// yet) sees it, then its withdrawal while it waits.
	if err := st.CreateDeployment(ctx, state.Desired{ID: "web-3", App: "web", Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	withdrawn := make(chan error, 1)
	var seen3 []spec.Phase
	go func() {
		_, err := st.Follow(ctx, "web-3", func(d state.Deployment) bool {
			seen3 = append(seen3, d.Status.Phase)
			return false
		})
		withdrawn <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if err := st.DeleteDeployment(ctx, "web-3"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-withdrawn:
		if !errors.Is(err, state.ErrNotFound) || len(seen3) == 0 {
			t.Errorf("Follow of a deployment withdrawn while followed: %v after %v; want ErrNotFound after its Pending status", err, seen3)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("Follow of a deployment withdrawn while followed: still following 10 s later")
	}
	if _, err := st.Follow(ctx, "never-1", func(state.Deployment) bool { return true }); !errors.Is(err, state.ErrNotFound) {
		t.Errorf("Follow of a deployment that never was: %v; want ErrNotFound", err)
	}
}
