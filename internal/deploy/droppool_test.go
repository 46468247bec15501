package deploy_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// TestDropPoolFinishes: a pool slot's release, once started, runs to its
// end when its caller's context ends meanwhile (an agent that shuts down
// while it trims its pool), and a release that failed is finished by the
// next DropPool of its app, whatever that one was asked to drop: no slot
// stays half released until the agent's next start.
func TestDropPoolFinishes(t *testing.T) {
	f, ctx, app := redisFixture(t, "container", engine.NameDMTCP, "dropfin")
	dropPoolFinishes(ctx, t, f, app)
}

// TestDropPoolFinishesUnit is TestDropPoolFinishes on the fakes.
func TestDropPoolFinishesUnit(t *testing.T) {
	u, ctx, app := unitRedis(t, engine.NameDMTCP)
	dropPoolFinishes(ctx, t, u, app)
}

// releaseHook hands the next Release of a mapping, once, to its hook,
// which may release it (release) or not.
type releaseHook struct {
	deploy.Mapper
	mu   sync.Mutex
	hook func(ctx context.Context, release func(context.Context) error) error
}

func (m *releaseHook) set(hook func(ctx context.Context, release func(context.Context) error) error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.hook = hook
}

func (m *releaseHook) Release(ctx context.Context, id string) error {
	m.mu.Lock()
	h := m.hook
	m.hook = nil
	m.mu.Unlock()
	release := func(ctx context.Context) error { return m.Mapper.Release(ctx, id) }
	if h != nil {
		return h(ctx, release)
	}
	return release(ctx)
}

func dropPoolFinishes(ctx context.Context, t *testing.T, n deploytest.Node, app spec.App) {
	hook := &releaseHook{}
	d := n.ReopenMapping(t, func(m deploy.Mapper) deploy.Mapper { hook.Mapper = m; return hook })
	first, err := d.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g, err := d.Checkpoints().Latest(ctx, app.Name)
	if err != nil {
		t.Fatal(err)
	}
	provision := func() deploy.Slot {
		t.Helper()
		s, err := d.Pool().ProvisionPoolSlot(ctx, g)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	left := func(why string, want ...deploy.SlotPhase) {
		t.Helper()
		slots, err := d.Pool().PoolSlots()
		var got []deploy.SlotPhase
		for _, s := range slots {
			got = append(got, s.Phase)
		}
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("pool slots %s: %v, %v; want %v", why, got, err, want)
		}
	}

	// The caller's context ends while the slot is released.
	s := provision()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hook.set(func(rctx context.Context, release func(context.Context) error) error {
		cancel()
		if err := rctx.Err(); err != nil {
			return err
		}
		return release(rctx)
	})
	if ids, err := d.Pool().DropPool(cctx, app.Name, nil); err != nil || !slices.Equal(ids, []string{s.ID}) {
		t.Errorf("DropPool whose context ends during the release = %v, %v; want %s released", ids, err, s.ID)
	}
	left("after a release whose caller went away")

	// A release that fails (here its mapping's, released but answered
	// with an error, as a call whose answer was lost) stays to be done,
	// and the next DropPool of the app does it, although it was asked to
	// drop nothing.
	s = provision()
	hook.set(func(rctx context.Context, release func(context.Context) error) error {
		if err := release(rctx); err != nil {
			return err
		}
		return errors.New("the cluster did not answer")
	})
	if ids, err := d.Pool().DropPool(ctx, app.Name, nil); err == nil || len(ids) != 0 {
		t.Errorf("DropPool whose release fails = %v, %v; want the error, nothing released", ids, err)
	}
	left("after a failed release", deploy.SlotReleasing)
	if ids, err := d.Pool().DropPool(ctx, app.Name, func(deploy.Slot) bool { return false }); err != nil || !slices.Equal(ids, []string{s.ID}) {
		t.Errorf("the next DropPool = %v, %v; want %s, whose release failed, released", ids, err, s.ID)
	}
	left("after the next DropPool")

	if err := d.Undeploy(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	n.AssertNothingLeft(t, app.Name, true)
}
