//go:build !no_ceph

package faults

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// TestDockerdRestart restarts the node's dockerd under 2 running
// instances, twice. With live-restore (what docs/design.md recommends) the
// containers survive: the agent keeps them, and they serve again once
// dockerd is back, on the same ports. Without it, dockerd stops them: the
// agent notices within a reconcile interval and deploys each again under
// the same ID, so that both are Running and serve.
func TestDockerdRestart(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p := newPoP(ctx, t, s, "n1")
	app := p.app(ctx, "docker", 0)
	before := p.leaks(ctx, app)
	deps := []state.Deployment{p.deploy(ctx, app, "n1"), p.deploy(ctx, app, "n1")}
	ids := p.containers(ctx, t, app)

	// 1. live-restore: the same containers serve again, nothing is redeployed.
	s.restartDockerd(ctx, t, true)
	same := func() error {
		if !p.alive("n1") {
			return fmt.Errorf("agent n1 exited")
		}
		ps := p.ps(ctx)
		for _, d := range deps {
			now := ps[d.ID]
			if now.Status.Phase != spec.PhaseRunning || !now.Status.Updated.Equal(d.Status.Updated) {
				return fmt.Errorf("%s is %s, updated %s; want Running as deployed at %s", d.ID, now.Status.Phase, now.Status.Updated, d.Status.Updated)
			}
			if err := serves(ctx, now); err != nil {
				return err
			}
		}
		if got := p.containers(ctx, t, app); !slices.Equal(got, ids) {
			return fmt.Errorf("containers %v; before the restart %v", got, ids)
		}
		return nil
	}
	waitFor(ctx, t, 30*time.Second, "the instances serve again after the restart", same)
	holdsFor(ctx, t, 3*reconcileInterval, "the same instances, not redeployed", same)

	// 2. A dockerd that comes back without live-restore stops them.
	s.restartDockerd(ctx, t, false)
	waitFor(ctx, t, 2*time.Minute, "the agent deploys the stopped instances again", func() error {
		ps := p.ps(ctx)
		for _, d := range deps {
			now := ps[d.ID]
			if now.Status.Phase != spec.PhaseRunning || now.Status.Updated.Equal(d.Status.Updated) {
				return fmt.Errorf("%s is %s, updated %s", d.ID, now.Status.Phase, now.Status.Updated)
			}
			if err := serves(ctx, now); err != nil {
				return err
			}
		}
		got := p.containers(ctx, t, app)
		if len(got) != len(ids) {
			return fmt.Errorf("containers %v; want %d", got, len(ids))
		}
		for _, id := range got {
			if slices.Contains(ids, id) {
				return fmt.Errorf("container %s from before the restart is still there", id)
			}
		}
		return nil
	})
	if !p.logHas("n1", "instance gone: deploying it again") {
		t.Errorf("agent n1 logged nothing about the lost instances")
	}
	p.undeployAll(ctx)
	if got := p.leaks(ctx, app); got != before {
		t.Errorf("left after undeploying: %+v; at the start: %+v", got, before)
	}
}

// containers lists the IDs of app's containers (running or not), sorted.
func (p *pop) containers(ctx context.Context, t *testing.T, app string) []string {
	t.Helper()
	sts, err := p.s.dc.ContainerList(ctx, container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", runtime.LabelApp+"="+app))})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range sts {
		ids = append(ids, c.ID)
	}
	slices.Sort(ids)
	return ids
}
