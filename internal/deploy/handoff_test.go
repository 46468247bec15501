package deploy_test

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// TestHandoff: a suspend for a migration keeps the checkpoint on the node
// (Pending there), shows it to no one without its secret, and a resume
// from what the hand-over holds finds the instance's key; once its
// deployment runs, the hand-over is over (its image and files go).
// Suspended again, its target never coming, the node's next run writes
// the durable copy, after which a resume from the cluster finds the key.
// On the fakes under each engine.
func TestHandoff(t *testing.T) {
	for _, eng := range spec.Engines {
		t.Run(string(eng), func(t *testing.T) {
			u, ctx, app := unitRedis(t, eng)
			handoff(ctx, t, u, app, 0)
		})
	}
}

// TestHandoffContainer is TestHandoff in the light container on Ceph and
// Docker.
func TestHandoffContainer(t *testing.T) {
	for _, eng := range spec.Engines {
		t.Run(string(eng), func(t *testing.T) {
			f, ctx, app := redisFixture(t, "container", eng, "handoff")
			handoff(ctx, t, f, app, 40<<20) // beyond deploy.LazyResumeBytes
		})
	}
}

// handoff runs TestHandoff on n, with a value of big bytes written too (0:
// none, the fakes' redis takes no large value).
func handoff(ctx context.Context, t *testing.T, n deploytest.Node, app spec.App, big int) {
	d := n.Deployer()
	first, err := d.Deploy(ctx, app, deploy.Options{}) // boot and checkpoint
	if err != nil {
		t.Fatal(err)
	}
	dep, err := d.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, dep), "SET", "k", "handed-over"); err != nil {
		t.Fatal(err)
	}
	value := make([]byte, big)
	_, _ = rand.Read(value)
	if big > 0 {
		if _, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, dep), "SET", "big", string(value)); err != nil {
			t.Fatal(err)
		}
	}
	susp, err := d.Suspensions().Suspend(ctx, dep.ID, app, deploy.SuspendOptions{Handoff: true})
	if err != nil {
		t.Fatalf("suspend for a migration: %v", err)
	}
	if err := d.Suspensions().Forget(dep.ID); err != nil { // as the agent does once etcd has it
		t.Fatal(err)
	}
	if susp.Pending == "" || susp.Pending != susp.Node {
		t.Errorf("suspension pending on %q; want the node that suspended it, %q", susp.Pending, susp.Node)
	}
	h, err := d.Handoffs().Get(dep.ID)
	if err != nil || h.Ckpt != susp.Ckpt.Image || len(h.Token) < 32 || h.Bytes != susp.Bytes {
		t.Fatalf("hand-over %+v, %v; want one of %s with a secret", h, err, susp.Ckpt.Image)
	}
	if big > 0 {
		// In the light container, with no memory bound and a node with
		// room: written into memory.
		_, dir, done, err := d.Handoffs().Open(dep.ID, h.Token)
		if err != nil {
			t.Fatal(err)
		}
		var fs unix.Statfs_t
		if err := unix.Statfs(dir, &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
			t.Errorf("the hand-over's files in %s: file system %#x, %v; want them in memory (tmpfs)", dir, fs.Type, err)
		}
		done()
	}
	for _, token := range []string{"", "0123456789abcdef0123456789abcdef0123456789abcdef"} {
		if _, _, _, err := d.Handoffs().Open(dep.ID, token); !errors.Is(err, deploy.ErrNoHandoff) {
			t.Errorf("hand-over opened with the secret %q: %v; want ErrNoHandoff", token, err)
		}
	}
	fromHandoff := func(ctx context.Context, dst string, _ func(context.Context) error) error {
		return d.Handoffs().CopyTo(ctx, dep.ID, dst)
	}
	resumed, err := d.Resume(ctx, app, dep.ID, susp, deploy.Options{Checkpoint: fromHandoff})
	if err != nil {
		t.Fatalf("resume from the hand-over: %v", err)
	}
	d.Suspensions().DropSuspension(ctx, resumed.ID, susp)
	if want := engine.Of(susp.Engine).LazyRestore && susp.Bytes >= deploy.LazyResumeBytes; resumed.Handle == nil || resumed.Handle.Lazy != want {
		t.Errorf("resumed from %d bytes with handle %+v; want lazy %v (a resume restores lazily where its engine can, from %d bytes)",
			susp.Bytes, resumed.Handle, want, deploy.LazyResumeBytes)
	}
	if big > 0 {
		if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, resumed), "GETRANGE", "big", "1000", "1015"); err != nil || got != string(value[1000:1016]) {
			t.Errorf("resumed from the hand-over: GETRANGE big = %q, %v; want what was written", got, err)
		}
	}
	if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, resumed), "GET", "k"); err != nil || got != "handed-over" {
		t.Errorf("resumed from the hand-over: GET k = %q, %v; want handed-over", got, err)
	}
	d.Handoffs().Finish(ctx, dep.ID)
	if _, err := n.Store().Stat(ctx, susp.Ckpt.Image); !errors.Is(err, layering.ErrNotFound) {
		t.Errorf("the hand-over's image after it is over: %v; want it gone", err)
	}
	if hos, err := d.Handoffs().List(); err != nil || len(hos) != 0 {
		t.Errorf("hand-overs after it is over: %v, %v; want none", hos, err)
	}

	// Its target never comes; the agent stops and starts again.
	susp, err = d.Suspensions().Suspend(ctx, resumed.ID, app, deploy.SuspendOptions{Handoff: true})
	if err != nil {
		t.Fatalf("suspend for a migration, again: %v", err)
	}
	if err := d.Suspensions().Forget(resumed.ID); err != nil {
		t.Fatal(err)
	}
	d = n.Reopen(t)
	if hos, err := d.Handoffs().List(); err != nil || len(hos) != 1 || hos[0].ID != resumed.ID {
		t.Fatalf("hand-overs a restarted node finds: %v, %v; want %s's", hos, err, resumed.ID)
	}
	again := storeAndResume(ctx, t, d, app, resumed.ID, susp, "after a restart")

	// Its durable copy asked of the agent that suspended it, without a
	// restart between: its image, made at the suspend, is mapped and
	// written then.
	susp, err = d.Suspensions().Suspend(ctx, again.ID, app, deploy.SuspendOptions{Handoff: true})
	if err != nil {
		t.Fatalf("suspend for a migration, a third time: %v", err)
	}
	if err := d.Suspensions().Forget(again.ID); err != nil {
		t.Fatal(err)
	}
	last := storeAndResume(ctx, t, d, app, again.ID, susp, "without a restart")
	d.Handoffs().Wait()
	for _, id := range []string{last.ID, first.ID} {
		if err := d.Undeploy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	n.AssertNothingLeft(t, app.Name, true)
}

// storeAndResume has d write the durable copy of hand-over id (suspension
// susp) and resumes the deployment from the cluster's copy, as etcd
// records it once durable; the hand-over then ends. when says which round.
func storeAndResume(ctx context.Context, t *testing.T, d *deploy.Deployer, app spec.App, id string, susp spec.Suspension, when string) deploy.Deployment {
	t.Helper()
	durable := make(chan deploy.Handoff, 1)
	d.Handoffs().Store(ctx, id, func(_ context.Context, h deploy.Handoff, _ time.Duration) { durable <- h })
	select {
	case h := <-durable:
		if !h.Durable || h.Ckpt != susp.Ckpt.Image {
			t.Errorf("%s: durable hand-over %+v; want %s's, durable", when, h, susp.Ckpt.Image)
		}
	case <-ctx.Done():
		t.Fatalf("%s: the durable copy was not written", when)
	}
	// Its files gone, its record says so (what a restarted agent reads).
	if h, err := d.Handoffs().Get(id); err != nil || !h.Durable {
		t.Errorf("%s: the durable hand-over's record: %+v, %v; want it durable", when, h, err)
	} else if _, _, _, err := d.Handoffs().Open(id, h.Token); !errors.Is(err, deploy.ErrDurable) {
		t.Errorf("%s: a durable hand-over opened: %v; want ErrDurable (read it from the cluster)", when, err)
	}
	susp.Pending = "" // as etcd records it once durable
	dep, err := d.Resume(ctx, app, id, susp, deploy.Options{})
	if err != nil {
		t.Fatalf("%s: resume from the durable copy: %v", when, err)
	}
	d.Suspensions().DropSuspension(ctx, dep.ID, susp)
	if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, dep), "GET", "k"); err != nil || got != "handed-over" {
		t.Errorf("%s: resumed from the durable copy: GET k = %q, %v; want handed-over", when, got, err)
	}
	d.Handoffs().Finish(ctx, dep.ID)
	return dep
}

// TestSweepHandoffFiles: at a node's start, the checkpoint directories
// that no hand-over owns go (a suspend a crash cut short that did not go
// on), but not those of a hand-over, nor of a suspend still under way.
func TestSweepHandoffFiles(t *testing.T) {
	u, ctx, app := unitRedis(t, engine.NameDMTCP)
	d := u.Deployer()
	if _, err := d.Deploy(ctx, app, deploy.Options{}); err != nil { // boot and checkpoint
		t.Fatal(err)
	}
	dep, err := d.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Suspensions().Suspend(ctx, dep.ID, app, deploy.SuspendOptions{Handoff: true}); err != nil {
		t.Fatal(err)
	}
	dir := func(id string) string { return filepath.Join(u.StateDir(), "handoffs", id) }
	for _, id := range []string{"orphan", "busy"} {
		if err := os.MkdirAll(filepath.Join(dir(id), "2"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir(id), "2", "ckpt_redis.dmtcp"), []byte("image"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d.Handoffs().SweepFiles(func(id string) bool { return id == "busy" })
	if _, err := os.Stat(dir("orphan")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a checkpoint directory no hand-over owns after the sweep: %v; want it gone", err)
	}
	for _, id := range []string{"busy", dep.ID} {
		if _, err := os.Stat(dir(id)); err != nil {
			t.Errorf("the checkpoint directory of %s after the sweep: %v; want it kept", id, err)
		}
	}
	if _, err := d.Handoffs().Get(dep.ID); err != nil {
		t.Errorf("the hand-over after the sweep: %v; want it kept", err)
	}
}
