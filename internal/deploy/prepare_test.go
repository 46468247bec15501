package deploy_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// TestResumePrepared: a migration's target prepares the resume while the
// instance is being suspended (its container made, waiting for its root
// and checkpoint); the resume takes it and makes no container, the
// instance's key is there after; a prepared resume that no resume takes
// is released, by DropPrepared or by the recovery of a restarted agent.
// On the fakes under each engine.
func TestResumePrepared(t *testing.T) {
	for _, eng := range spec.Engines {
		t.Run(string(eng), func(t *testing.T) {
			u, ctx, app := unitRedis(t, eng)
			resumePrepared(ctx, t, u, app)
		})
	}
}

// TestResumePreparedContainer is TestResumePrepared in the light
// container on Ceph and Docker, with the real entrypoint (-root-later).
func TestResumePreparedContainer(t *testing.T) {
	for _, eng := range spec.Engines {
		t.Run(string(eng), func(t *testing.T) {
			f, ctx, app := redisFixture(t, "container", eng, "prep")
			resumePrepared(ctx, t, f, app)
		})
	}
}

func resumePrepared(ctx context.Context, t *testing.T, n deploytest.Node, app spec.App) {
	d := n.Deployer()
	first, err := d.Deploy(ctx, app, deploy.Options{}) // boot and checkpoint
	if err != nil {
		t.Fatal(err)
	}
	dep, err := d.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, dep), "SET", "k", "moved"); err != nil || got != "OK" {
		t.Fatalf("SET: %q, %v", got, err)
	}

	// Prepared, never taken: released, and so is one a restarted agent
	// finds.
	if _, err := d.Suspensions().PrepareResume(ctx, app, dep.ID, dep.Gen); err != nil {
		t.Fatalf("prepare a resume: %v", err)
	}
	if err := d.Suspensions().DropPrepared(ctx, dep.ID); err != nil || len(d.Suspensions().Prepared()) != 0 {
		t.Fatalf("drop a prepared resume: %v; prepared %v, want none", err, d.Suspensions().Prepared())
	}
	if _, err := d.Suspensions().PrepareResume(ctx, app, dep.ID, dep.Gen); err != nil {
		t.Fatalf("prepare a resume: %v", err)
	}
	d = n.Reopen(t)
	if _, err := d.Pool().RecoverSlots(ctx); err != nil || len(d.Suspensions().Prepared()) != 0 {
		t.Fatalf("recovery after a restart: %v; prepared %v, want none", err, d.Suspensions().Prepared())
	}

	// Prepared while the instance is suspended, then taken by its resume.
	s, err := d.Suspensions().PrepareResume(ctx, app, dep.ID, dep.Gen)
	if err != nil {
		t.Fatalf("prepare a resume: %v", err)
	}
	if _, made := s.Timings.Get(string(deploy.StepContainer)); s.Phase != deploy.SlotPrepared || !made {
		t.Errorf("prepared slot: phase %s, timings %s; want %s with its container made", s.Phase, s.Timings, deploy.SlotPrepared)
	}
	// A migration's: its checkpoint is read into the prepared instance as
	// soon as the hand-over keeps it, before the suspension is sealed, and
	// the resume reads it no more.
	resumed := migratePrepared(ctx, t, d, app, dep.ID, s.ID, nil)
	if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, resumed), "GET", "k"); err != nil || got != "moved" {
		t.Errorf("after a resume into the prepared instance: GET k = %q, %v; want moved", got, err)
	}
	// An early read that fails: the resume reads the checkpoint itself.
	s, err = d.Suspensions().PrepareResume(ctx, app, dep.ID, dep.Gen)
	if err != nil {
		t.Fatalf("prepare a resume: %v", err)
	}
	resumed = migratePrepared(ctx, t, d, app, dep.ID, s.ID, errors.New("the source's agent stopped"))
	if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, resumed), "GET", "k"); err != nil || got != "moved" {
		t.Errorf("after a resume whose early read failed: GET k = %q, %v; want moved", got, err)
	}
	if len(d.Suspensions().Prepared()) != 0 {
		t.Errorf("prepared after the resume: %v; want none", d.Suspensions().Prepared())
	}
	for _, id := range []string{resumed.ID, first.ID} {
		if err := d.Undeploy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	n.AssertNothingLeft(t, app.Name, true)
}

// migratePrepared suspends deployment id for a migration (a hand-over)
// and resumes it into the prepared slot, as its target would: the
// checkpoint read early, as the hand-over keeps it (failing with
// earlyErr, if given), and by the resume only where that failed. It
// checks which read and the resume's slot and phases.
func migratePrepared(ctx context.Context, t *testing.T, d *deploy.Deployer, app spec.App, id, slot string, earlyErr error) deploy.Deployment {
	t.Helper()
	var early, fetched atomic.Int32
	fromHandoff := func(ctx context.Context, dst string) error { return d.Handoffs().CopyTo(ctx, id, dst) }
	susp, err := d.Suspensions().Suspend(ctx, id, app, deploy.SuspendOptions{Handoff: true, Kept: func(h deploy.Handoff, _ spec.Suspension) {
		ok := d.Suspensions().ReadEarly(ctx, id, h.Gen, h.Bytes, func(ctx context.Context, dst string) error {
			early.Add(1)
			if earlyErr != nil {
				return earlyErr
			}
			return fromHandoff(ctx, dst)
		})
		if !ok {
			t.Errorf("the hand-over's checkpoint was not read early into the prepared resume")
		}
	}})
	if err != nil {
		t.Fatalf("suspend for a migration: %v", err)
	}
	if err := d.Suspensions().Forget(id); err != nil { // as the agent does once etcd has the suspension
		t.Fatal(err)
	}
	var phases []string
	resumed, err := d.Resume(ctx, app, id, susp, deploy.Options{Progress: func(p string, _ time.Duration) { phases = append(phases, p) },
		Checkpoint: func(ctx context.Context, dst string, _ func(context.Context) error) error {
			fetched.Add(1)
			return fromHandoff(ctx, dst)
		}})
	if err != nil {
		t.Fatalf("resume into the prepared instance: %v (phases %v)", err, phases)
	}
	d.Handoffs().Finish(ctx, id)
	if resumed.Slot != slot || slices.Contains(phases, string(deploy.StepContainer)) || !slices.Contains(phases, string(deploy.StepFetch)) {
		t.Errorf("resume: slot %s, phases %v; want the prepared slot %s, its checkpoint fetched and no container made", resumed.Slot, phases, slot)
	}
	want := int32(0)
	if earlyErr != nil {
		want = 1
	}
	if early.Load() != 1 || fetched.Load() != want {
		t.Errorf("checkpoint read early %d time(s), by the resume %d; want 1 and %d", early.Load(), fetched.Load(), want)
	}
	// A checkpoint read into memory (DMTCP's, in the light container) is
	// let go once the instance runs.
	if resumed.Handle != nil {
		if left := deploytest.MountsUnder(t, resumed.Handle.CkptPath); len(left) > 0 {
			t.Errorf("after the resume, still in memory: %v; want the checkpoint's memory let go", left)
		}
	}
	return resumed
}
