//go:build !no_ceph

package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/state"
)

// TestEtcdWipedFences wipes the PoP's etcd under 2 agents with 2 instances
// each: etcd is stopped and started again, empty, on the same address. An
// agent that acted on it would undeploy every instance. Instead each agent
// keeps every instance running and answering, removes nothing, and says why
// it stopped acting: an error in its log, /healthz 503 "fenced", `fogctl
// node ls`; `fogctl gc` refuses. With the etcd it knew back, the agents
// act again, and everything is as it was.
func TestEtcdWipedFences(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	p := newPoP(ctx, t, s, "n1", "n2")
	app := p.app(ctx, "wipe", 0)
	before := p.leaks(ctx, app)
	var deps []state.Deployment
	for _, n := range []string{"n1", "n1", "n2", "n2"} {
		deps = append(deps, p.deploy(ctx, app, n))
	}
	running := p.nodeLeaks(ctx, app)
	images, err := p.images(ctx, app)
	if err != nil {
		t.Fatal(err)
	}

	// The wipe: the same address, an empty data directory.
	p.stopEtcd()
	data := filepath.Join(p.dir, "etcd")
	if err := os.Rename(data, data+".orig"); err != nil {
		t.Fatal(err)
	}
	p.startEtcd(ctx)
	wiped := time.Now()
	untouched := func() error {
		if err := p.unchanged(ctx, app, deps, running); err != nil {
			return err
		}
		if n, err := p.images(ctx, app); err != nil || n != images {
			return fmt.Errorf("%d images of %s in the pool (%v); before the wipe: %d", n, app, err, images)
		}
		return nil
	}
	fenced := func() error {
		if err := untouched(); err != nil {
			return err
		}
		for _, n := range []string{"n1", "n2"} {
			body, code, err := get(ctx, "http://"+p.agents[n].api+"/healthz")
			if err != nil {
				return err
			}
			var h health
			if err := json.Unmarshal([]byte(body), &h); err != nil || code != 503 || h.Status != "fenced" || !strings.Contains(h.Etcd, "no PoP record") {
				return fmt.Errorf("agent %s: /healthz HTTP %d %s; want 503, fenced, naming the missing PoP record", n, code, body)
			}
		}
		return nil
	}
	waitFor(ctx, t, 60*time.Second, "the agents fence themselves", fenced)
	t.Logf("both agents fenced %s after the wipe", time.Since(wiped).Round(100*time.Millisecond))
	holdsFor(ctx, t, 4*reconcileInterval, "every instance and image through reconcile rounds on the empty etcd", fenced)
	for _, n := range []string{"n1", "n2"} {
		if !p.logHas(n, "control plane fenced") {
			t.Errorf("agent %s logged nothing about its fence", n)
		}
		if p.logHas(n, "msg=undeployed") {
			t.Errorf("agent %s undeployed an instance on the empty etcd", n)
		}
	}
	waitFor(ctx, t, 30*time.Second, "fogctl node ls shows the fence", func() error {
		out, errOut, code := p.fogctl(ctx, "node", "ls")
		if code != 0 || strings.Count(out, "Fenced") < 2 {
			return fmt.Errorf("fogctl node ls = exit %d:\n%s%s", code, out, errOut)
		}
		return nil
	})
	if out, errOut, code := p.fogctl(ctx, "gc", "--min-age", "0s"); code == 0 || !strings.Contains(errOut, "fenced") {
		t.Errorf("fogctl gc on the wiped etcd = exit %d; want a refusal naming the fence:\n%s%s", code, out, errOut)
	}
	if err := untouched(); err != nil {
		t.Errorf("after gc: %v", err)
	}

	// The etcd the agents knew, back: they act again, and nothing was lost.
	p.stopEtcd()
	if err := os.RemoveAll(data); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(data+".orig", data); err != nil {
		t.Fatal(err)
	}
	p.startEtcd(ctx)
	waitFor(ctx, t, 60*time.Second, "the agents are healthy again", func() error {
		for _, n := range []string{"n1", "n2"} {
			if h, err := p.healthz(ctx, n); err != nil || h.Status != "ok" {
				return fmt.Errorf("agent %s: %+v, %v", n, h, err)
			}
		}
		return untouched()
	})
	ps := p.ps(ctx)
	for _, d := range deps {
		if now := ps[d.ID]; now.Status.Phase != d.Status.Phase || now.Status.Ports["8080/tcp"] != d.Status.Ports["8080/tcp"] {
			t.Errorf("%s after etcd came back: %s at %v; before: %s at %v", d.ID, now.Status.Phase, now.Status.Ports, d.Status.Phase, d.Status.Ports)
		}
	}
	p.undeployAll(ctx)
	if got := p.leaks(ctx, app); got != before {
		t.Errorf("left after undeploying: %+v; at the start: %+v", got, before)
	}
}
