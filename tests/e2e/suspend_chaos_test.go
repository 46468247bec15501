//go:build !no_ceph

package e2e

import (
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// TestChaosSuspend: the agent of a redis's node is SIGKILLed right after
// each step of a suspend (checkpoint, store, seal) and started
// again: each time the suspend goes on from where it stopped, the
// deployment ends Suspended, and a resume finds the key written before;
// at the end nothing is left (the PoP's cleanup checks images, mappings,
// mounts, containers and records).
func TestChaosSuspend(t *testing.T) {
	ctx, p, _, app := redisOnPoP(t, "e2e-chaos-susp", engine.NameDMTCP, nil, "n1")
	api := "http://" + p.apis["n1"]
	client := &http.Client{}
	for _, step := range []deploy.Step{deploy.StepCheckpoint, deploy.StepStore, deploy.StepSeal} {
		dep := createOn(ctx, t, client, api, app.Name, "n1")
		val := "before-" + string(step)
		if _, err := testenv.RedisDo(ctx, nil, dep.Status.Ports[drivers.PortKey(6379, "tcp")], "SET", "k", val); err != nil {
			t.Fatal(err)
		}
		if _, err := p.st.RequestSuspend(ctx, dep.ID); err != nil {
			t.Fatal(err)
		}
		// Killed once the status shows the step done.
		killed := false
		_, err := p.st.Follow(ctx, dep.ID, func(d state.Deployment) bool {
			for _, ph := range d.Status.Timings {
				if ph.Name == string(step) && !killed {
					p.stopAgent("n1", syscall.SIGKILL)
					killed = true
				}
			}
			return killed || d.Status.Phase == spec.PhaseSuspended || d.Status.Phase == spec.PhaseFailed
		})
		if err != nil {
			t.Fatal(err)
		}
		if !killed {
			t.Logf("step %s: the suspend ended before the kill", step)
		} else {
			api = startAgain(t, p, "n1")
		}
		d, err := p.st.Follow(ctx, dep.ID, func(d state.Deployment) bool {
			return d.Status.Phase == spec.PhaseSuspended || d.Status.Phase == spec.PhaseFailed
		})
		if err != nil || d.Status.Phase != spec.PhaseSuspended {
			t.Fatalf("killed after %s: the deployment is %s (%s), %v; want Suspended", step, d.Status.Phase, d.Status.Error, err)
		}
		back := resumeWait(t, client, api, dep.ID, "n1")
		if got, err := testenv.RedisDo(ctx, nil, back.Ports[drivers.PortKey(6379, "tcp")], "GET", "k"); err != nil || got != val {
			t.Errorf("killed after %s, resumed: GET k = %q, %v; want %q", step, got, err, val)
		}
		t.Logf("killed after %s: suspended, resumed with its key", step)
		if err := p.st.DeleteDeployment(ctx, dep.ID); err != nil {
			t.Fatal(err)
		}
		for ctx.Err() == nil {
			if sts, _ := p.st.Statuses(ctx); sts[dep.ID].Phase == "" {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// startAgain starts node's agent again and returns its API's URL.
func startAgain(t *testing.T, p *pop, node string) string {
	t.Helper()
	p.startAgent(node, "")
	return "http://" + p.apis[node]
}
