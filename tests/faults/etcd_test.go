//go:build !no_ceph

package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/state"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// TestEtcdUnavailable stops etcd under 2 agents with 2 instances each and
// a deploy in flight. The instances keep serving, the agents keep running
// and say in /healthz and in their logs that etcd is gone (their node
// leases lapse), fogctl says etcd is unavailable; nothing is undeployed,
// and the deploy in flight finishes. When etcd is back the nodes are Ready
// again, the statuses are right (unchanged, and Running for the deploy
// that finished meanwhile), and a new deploy works.
func TestEtcdUnavailable(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p := newPoP(ctx, t, s, "n1", "n2")
	app := p.app(ctx, "etcd", 0)
	slow := p.app(ctx, "etcd-slow", 4*time.Second) // ready 4 s after it starts
	before, beforeSlow := p.leaks(ctx, app), p.leaks(ctx, slow)
	var deps []state.Deployment
	for _, n := range []string{"n1", "n1", "n2", "n2"} {
		deps = append(deps, p.deploy(ctx, app, n))
	}
	// The deploy in flight: etcd stops while its app starts.
	out, errOut, code := p.fogctl(ctx, "deploy", slow, "--node", "n2", "--mode", "boot", "-o", "json")
	var inflight state.Desired
	if err := json.Unmarshal([]byte(out), &inflight); code != 0 || err != nil {
		t.Fatalf("fogctl deploy %s = exit %d, %v\n%s", slow, code, err, errOut)
	}
	waitFor(ctx, t, 30*time.Second, "the slow app's container starts", func() error {
		d := p.ps(ctx)[inflight.ID]
		if slices.ContainsFunc(d.Status.Timings, func(ph layering.Phase) bool { return ph.Name == "container" }) {
			return nil
		}
		return fmt.Errorf("%s is %s, phases %s", d.ID, d.Status.Phase, d.Status.Timings)
	})
	running := p.nodeLeaks(ctx, app)

	p.stopEtcd()
	lost := time.Now()
	// Every check below runs against the agents and the apps, never etcd.
	everythingRuns := func() error { return p.unchanged(ctx, app, deps, running) }
	degraded := func() error {
		if err := everythingRuns(); err != nil {
			return err
		}
		for _, n := range []string{"n1", "n2"} {
			h, err := p.healthz(ctx, n)
			if err != nil {
				return fmt.Errorf("agent %s: %w", n, err)
			}
			if h.Status != "degraded" || !strings.Contains(h.Etcd, "unavailable") {
				return fmt.Errorf("agent %s: /healthz = %+v; want degraded, etcd unavailable", n, h)
			}
		}
		return nil
	}
	waitFor(ctx, t, 3*leaseTTL*time.Second+10*time.Second, "the agents report etcd unavailable", degraded)
	t.Logf("the agents reported etcd unavailable %s after it stopped", time.Since(lost).Round(100*time.Millisecond))
	// Through several reconcile rounds without etcd.
	holdsFor(ctx, t, 4*reconcileInterval, "agents, instances and /healthz without etcd", degraded)
	for _, n := range []string{"n1", "n2"} {
		if !p.logHas(n, "etcd unavailable") {
			t.Errorf("agent %s logged nothing about etcd being unavailable", n)
		}
	}
	if _, errOut, code := p.fogctl(ctx, "ps"); code != 5 || !strings.Contains(errOut, "etcd") || !strings.Contains(errOut, "Hint:") {
		t.Errorf("fogctl ps without etcd = exit %d; want 5 (unavailable) naming etcd, with a hint:\n%s", code, errOut)
	}

	p.startEtcd(ctx)
	t.Logf("etcd back after %s", time.Since(lost).Round(100*time.Millisecond))
	waitFor(ctx, t, 30*time.Second, "the nodes are Ready and the agents healthy again", func() error {
		nodes, err := p.st.Nodes(ctx)
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if !n.Ready {
				return fmt.Errorf("node %s NotReady", n.Name)
			}
		}
		if len(nodes) != 2 {
			return fmt.Errorf("%d nodes; want 2", len(nodes))
		}
		for _, n := range []string{"n1", "n2"} {
			if h, err := p.healthz(ctx, n); err != nil || h.Status != "ok" {
				return errors.Join(fmt.Errorf("agent %s: /healthz %+v", n, h), err)
			}
		}
		return nil
	})
	for _, n := range []string{"n1", "n2"} {
		if !p.logHas(n, "etcd available again") {
			t.Errorf("agent %s logged nothing about etcd being back", n)
		}
	}
	// The deploy that finished without etcd says so now.
	waitFor(ctx, t, 30*time.Second, "the deploy that finished without etcd is Running", func() error {
		d := p.ps(ctx)[inflight.ID]
		if d.Status.Phase != spec.PhaseRunning {
			return fmt.Errorf("%s is %s", d.ID, d.Status.Phase)
		}
		return serves(ctx, d)
	})
	// The statuses are those of before, and the same instances serve.
	ps := p.ps(ctx)
	for _, d := range deps {
		now := ps[d.ID]
		if now.Status.Phase != spec.PhaseRunning || now.Status.Ports["8080/tcp"] != d.Status.Ports["8080/tcp"] || !now.Status.Updated.Equal(d.Status.Updated) {
			t.Errorf("%s after the outage: %s at %v (updated %s); before: Running at %v (updated %s)", d.ID,
				now.Status.Phase, now.Status.Ports, now.Status.Updated, d.Status.Ports, d.Status.Updated)
		}
		if err := serves(ctx, now); err != nil {
			t.Error(err)
		}
	}
	// A new deploy through fogctl, placed by the scheduler.
	out, errOut, code = p.fogctl(ctx, "deploy", app, "--mode", "boot", "--wait")
	if code != 0 || !strings.Contains(errOut, "Running on n") {
		t.Fatalf("fogctl deploy after the outage = exit %d\n%s%s", code, out, errOut)
	}
	ps = p.ps(ctx)
	if len(ps) != len(deps)+2 {
		t.Errorf("fogctl ps lists %d deployments; want %d", len(ps), len(deps)+2)
	}
	for id, d := range ps {
		if d.Status.Phase != spec.PhaseRunning {
			t.Errorf("%s is %s", id, d.Status.Phase)
		}
	}
	p.undeployAll(ctx)
	if got := p.leaks(ctx, app); got != before {
		t.Errorf("left after undeploying: %+v; at the start: %+v", got, before)
	}
	if got := p.leaks(ctx, slow); got != beforeSlow {
		t.Errorf("left of %s after undeploying: %+v; at the start: %+v", slow, got, beforeSlow)
	}
}
