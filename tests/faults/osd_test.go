//go:build !no_ceph

package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"

	"github.com/fogdeploy/fogdeploy/internal/state"
)

// failBound bounds a deploy that Ceph stops serving: the readiness wait,
// each mapping step and each librados call are bounded, and what is stuck
// on the cluster is cut off; this is their sum with room to spare.
const failBound = readyTimeout + 4*mapperTimeout + 8*cephTimeout + 60*time.Second

// TestOSDStoppedDuringDeploy stops the cluster's only OSD right after a
// deploy cloned its image. The deploy must fail in bounded time, with an
// error that names the stopped OSD and the step, and a hint; the
// deployment is Failed in `fogctl ps`; nothing is left on the node, and the
// clone goes once the OSD is back; then the same deploy succeeds.
func TestOSDStoppedDuringDeploy(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	p := newPoP(ctx, t, s, "n1")
	app := p.app(ctx, "osd", 0)
	before := p.leaks(ctx, app)

	// Watch the deployment's status, so that the OSD stops the moment the
	// clone is reported, while the deploy maps it (polling `fogctl ps`
	// could see the clone only once the app had started on it, and a
	// process blocked on a dead cluster holds its loop device).
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	cloned := make(chan string, 1)
	events := statetest.Watch(watchCtx, p.st, "status/"+app+"-")

	// The operator's `fogctl deploy --wait`, running while the OSD stops.
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, "fogctl"), "deploy", app, "--node", "n1", "--mode", "boot", "--wait")
	cmd.Env = p.env
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	go func() {
		for kv := range events {
			var st state.Status
			if json.Unmarshal(kv.Value, &st) != nil {
				continue
			}
			for _, ph := range st.Timings {
				if ph.Name == "clone" {
					select {
					case cloned <- strings.TrimPrefix(kv.Key, "status/"):
					default:
					}
					return
				}
			}
		}
	}()
	var id string
	select {
	case id = <-cloned:
	case err := <-done:
		t.Fatalf("fogctl deploy ended before any clone: %v\n%s", err, stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("the deploy cloned nothing within 30 s")
	}
	stopWatch()
	s.stopOSD(t)
	stopped := time.Now()
	t.Logf("osd.0 stopped after the clone of %s", id)

	select {
	case err := <-done:
		t.Logf("fogctl deploy --wait ended %s after the OSD stopped: %v\n%s", time.Since(stopped).Round(time.Second), err, stderr.String())
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 5 {
			t.Errorf("fogctl deploy --wait while the only OSD was down = %v; want exit 5 (unavailable)", err)
		}
	case <-time.After(failBound):
		t.Fatalf("the deploy still runs %s after the OSD stopped (it must fail in bounded time)\n%s", failBound, stderr.String())
	}
	// What the operator reads: first the cause (Ceph: the OSD is down) and
	// the step that failed, then a hint.
	msg := stderr.String()
	var first string
	for _, l := range strings.Split(msg, "\n") {
		if strings.HasPrefix(l, "Error: ") {
			first = l
			break
		}
	}
	for _, want := range []string{"failed on n1", "1 of 1 OSDs down (osd.0)", "step "} {
		if !strings.Contains(first, want) {
			t.Errorf("fogctl deploy --wait: the error line says no %q:\n%s", want, msg)
		}
	}
	if !strings.Contains(msg, "\nHint: start the OSDs again") {
		t.Errorf("fogctl deploy --wait gives no hint to start the OSD:\n%s", msg)
	}
	d, ok := p.ps(ctx)[id]
	if !ok || d.Status.Phase != spec.PhaseFailed || !strings.Contains(d.Status.Error, "osd.0") || d.Status.Hint == "" ||
		d.Status.Cause != state.CauseUnavailable {
		t.Errorf("fogctl ps: %s = %+v; want Failed, naming osd.0, with a hint and cause %q", id, d.Status, state.CauseUnavailable)
	}
	// Nothing is left on the node; the clone cannot be removed while the
	// cluster does not answer.
	if got := p.nodeLeaks(ctx, app); got != (leaks{}) {
		t.Errorf("on the node after the failed deploy: %+v; want nothing", got)
	}

	s.startOSD(ctx, t)
	t.Logf("osd.0 serves again %s after it stopped", time.Since(stopped).Round(time.Second))
	// The agent removes the failed deployment's clone once the cluster
	// answers; the deployment stays Failed until withdrawn.
	waitFor(ctx, t, 2*time.Minute, "the failed deployment's clone is removed", func() error {
		n, err := p.images(ctx, app)
		if err == nil && n != before.Images {
			err = fmt.Errorf("%d images of %s in the pool", n, app)
		}
		return err
	})
	if d := p.ps(ctx)[id]; d.Status.Phase != spec.PhaseFailed {
		t.Errorf("%s is %s after its clean-up; want it to stay Failed until withdrawn", id, d.Status.Phase)
	}

	// The same deploy again.
	again := p.deploy(ctx, app, "n1")
	if err := serves(ctx, again); err != nil {
		t.Error(err)
	}
	p.undeployAll(ctx)
	if got := p.leaks(ctx, app); got != before {
		t.Errorf("left after undeploying: %+v; at the start: %+v", got, before)
	}
}
