//go:build !no_ceph

package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// TestChaosSuspend: under DMTCP and under CRIU, the agent of a redis's
// node is SIGKILLed right after each step of a suspend (checkpoint,
// store, seal) and started again: each time the suspend goes on from
// where it stopped, the deployment ends Suspended, and a resume finds the
// key written before; at the end nothing is left (the PoP's cleanup
// checks images, mappings, mounts, containers and records).
func TestChaosSuspend(t *testing.T) {
	for _, eng := range []engine.Name{engine.NameDMTCP, engine.NameCRIU} {
		t.Run(string(eng), func(t *testing.T) { testChaosSuspend(t, eng) })
	}
}

func testChaosSuspend(t *testing.T, eng engine.Name) {
	ctx, p, _, app := redisOnPoP(t, "e2e-chaos-susp", eng, nil, "n1")
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
		undeployWait(ctx, t, p, dep.ID)
	}
}

// startAgain starts node's agent again and returns its API's URL.
func startAgain(t *testing.T, p *pop, node string) string {
	t.Helper()
	p.startAgent(node, "")
	return "http://" + p.apis[node]
}

// TestChaosMigrate: a migration asked of n1 (its caller then gone) goes
// on when an agent is SIGKILLed midway and started again: n1's after its
// suspend's checkpoint step (its checkpoint kept for the hand-over, or
// about to be) and store step and once it is Suspended (before or after
// it asked the resume, its checkpoint on n1 alone), n2's while n1 checkpoints (n2 prepares the resume then),
// and after its resume's fetch step and its mount step. Each time the
// deployment ends Running on n2 alone with the key written before, and
// nothing is left on n1, nor of a prepared instance on n2.
func TestChaosMigrate(t *testing.T) {
	ctx, p, f, app := redisOnPoP(t, "e2e-chaos-mig", engine.NameDMTCP, nil, "n1", "n2")
	client := &http.Client{}
	for _, kill := range []struct {
		node  string
		phase spec.Phase
		step  deploy.Step
	}{{"n1", spec.PhaseSuspending, deploy.StepCheckpoint}, {"n1", spec.PhaseSuspending, deploy.StepStore}, {"n1", spec.PhaseSuspended, ""}, {"n2", spec.PhaseResuming, deploy.StepFetch},
		// The target killed while the source checkpoints (its resume
		// prepared then, or being prepared: its agent's recovery
		// releases it), and once the prepared instance's root is
		// mounted.
		{"n2", spec.PhaseSuspending, deploy.StepCheckpoint}, {"n2", spec.PhaseResuming, deploy.StepMount}} {
		dep := createOn(ctx, t, client, "http://"+p.apis["n1"], app.Name, "n1")
		at := string(kill.step) + " step"
		if kill.step == "" {
			at = string(kill.phase)
		}
		val := "before-" + kill.node + "-" + at
		if _, err := testenv.RedisDo(ctx, nil, dep.Status.Ports[drivers.PortKey(6379, "tcp")], "SET", "k", val); err != nil {
			t.Fatal(err)
		}
		if _, err := p.st.RequestMigrate(ctx, dep.ID, "n2"); err != nil {
			t.Fatal(err)
		}
		killed := false
		d, err := p.st.Follow(ctx, dep.ID, func(d state.Deployment) bool {
			if d.Status.Phase == kill.phase && !killed && (kill.step == "" || slices.ContainsFunc(d.Status.Timings, func(ph layering.Phase) bool { return ph.Name == string(kill.step) })) {
				p.stopAgent(kill.node, syscall.SIGKILL)
				killed = true
				p.startAgent(kill.node, "")
			}
			return d.Status.Phase == spec.PhaseRunning && d.Node == "n2" || d.Status.Phase == spec.PhaseFailed
		})
		if err != nil || d.Status.Phase != spec.PhaseRunning || !killed {
			t.Fatalf("%s killed after %s: %s on %s (%s), killed %v, %v; want Running on n2", kill.node, at, d.Status.Phase, d.Node, d.Status.Error, killed, err)
		}
		if got, err := testenv.RedisDo(ctx, nil, d.Status.Ports[drivers.PortKey(6379, "tcp")], "GET", "k"); err != nil || got != val {
			t.Errorf("%s killed after %s, moved: GET k = %q, %v; want %q", kill.node, at, got, err, val)
		}
		if n := len(containersOf(t, f, app.Name)); n != 1 {
			t.Errorf("%s killed after %s: %d containers of the app; want the one on n2", kill.node, at, n)
		}
		t.Logf("%s killed after %s: Running on n2 with its key", kill.node, at)
		undeployWait(ctx, t, p, dep.ID)
	}

	// The source lost for good once its instance is Suspended, before it
	// asked the resume on the target: the target carries the move on.
	dep := createOn(ctx, t, client, "http://"+p.apis["n1"], app.Name, "n1")
	if _, err := testenv.RedisDo(ctx, nil, dep.Status.Ports[drivers.PortKey(6379, "tcp")], "SET", "k", "source-lost"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.st.RequestSuspend(ctx, dep.ID); err != nil {
		t.Fatal(err)
	}
	if d, err := p.st.Follow(ctx, dep.ID, func(d state.Deployment) bool {
		return d.Status.Phase == spec.PhaseSuspended || d.Status.Phase == spec.PhaseFailed
	}); err != nil || d.Status.Phase != spec.PhaseSuspended {
		t.Fatalf("suspend: %s, %v", d.Status.Phase, err)
	}
	p.stopAgent("n1", syscall.SIGKILL)
	d, err := p.st.Deployment(ctx, dep.ID)
	if err != nil {
		t.Fatal(err)
	}
	d.Move = &state.Move{From: "n1", To: "n2", Started: time.Now().UTC()} // as RequestMigrate writes it
	b, _ := json.Marshal(d.Desired)
	if _, err := p.st.Client().Put(ctx, state.DeploymentsPrefix+dep.ID, string(b)); err != nil {
		t.Fatal(err)
	}
	d, err = p.st.Follow(ctx, dep.ID, func(d state.Deployment) bool {
		return d.Status.Phase == spec.PhaseRunning && d.Node == "n2" || d.Status.Phase == spec.PhaseFailed
	})
	if err != nil || d.Status.Phase != spec.PhaseRunning {
		t.Fatalf("n1 lost with the instance Suspended mid-move: %s on %s (%s), %v; want Running on n2", d.Status.Phase, d.Node, d.Status.Error, err)
	}
	if got, err := testenv.RedisDo(ctx, nil, d.Status.Ports[drivers.PortKey(6379, "tcp")], "GET", "k"); err != nil || got != "source-lost" {
		t.Errorf("n1 lost mid-move, moved: GET k = %q, %v; want source-lost", got, err)
	}
	p.startAgent("n1", "")
	undeployWait(ctx, t, p, dep.ID)
}

// undeployWait withdraws deployments ids and waits until their agents
// have undone them (their statuses gone).
func undeployWait(ctx context.Context, t *testing.T, p *pop, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if err := p.st.DeleteDeployment(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		for ctx.Err() == nil {
			if sts, _ := p.st.Statuses(ctx); sts[id].Phase == "" {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}
