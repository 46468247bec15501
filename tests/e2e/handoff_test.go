//go:build !no_ceph

package e2e

import (
	"context"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/ckptstream"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// TestMigrateHandoff: a migration's checkpoint goes node to node. With
// the target's agent paused (SIGSTOP, within its lease) so that the
// hand-over waits, the source serves the checkpoint to no one but the
// node etcd places the migration on, with the secret etcd holds for it:
// a caller without it, with another's, or naming another node is refused
// (403); the target's own read gets the whole checkpoint. Resumed, the
// target runs the instance with its key, and the hand-over is over (read
// again: refused), its image gone. Then the source is lost for good
// (SIGKILL, not started again) while its checkpoint is on it alone: the
// target finds its node NotReady and the deployment ends Failed, "lost
// during migration".
func TestMigrateHandoff(t *testing.T) {
	ctx, p, f, app := redisOnPoP(t, "e2e-handoff", engine.NameCRIU, nil, "n1", "n2")
	client := &http.Client{}
	api := "http://" + p.apis["n1"]
	dep := createOn(ctx, t, client, api, app.Name, "n1")
	if _, err := testenv.RedisDo(ctx, nil, dep.Status.Ports[drivers.PortKey(6379, "tcp")], "SET", "k", "handed-over"); err != nil {
		t.Fatal(err)
	}
	migratePaused(ctx, t, p, dep.ID)
	susp := pendingOn(ctx, t, p, dep.ID, "n1", "n2")
	h, err := p.st.Handoff(ctx, dep.ID)
	if err != nil || h.Node != "n1" || h.Ckpt != susp.Ckpt.Image || len(h.Token) < 32 {
		t.Fatalf("hand-over in etcd: %+v, %v; want n1's, of %s, with a secret", h, err, susp.Ckpt.Image)
	}
	for _, c := range []struct{ why, token, node string }{
		{"no secret", "", "n2"}, {"another secret", strings.Repeat("0", len(h.Token)), "n2"}, {"another node", h.Token, "n3"},
	} {
		code, body := getHandoff(ctx, t, p.apis["n1"], dep.ID, c.token, c.node)
		if code != http.StatusForbidden {
			t.Errorf("hand-over read with %s: %d %s; want 403", c.why, code, body)
		}
		// Nor are its pages served (a post-copy's page session).
		if code, body := getPages(ctx, t, p.apis["n1"], dep.ID, c.token, c.node); code != http.StatusForbidden {
			t.Errorf("page session asked with %s: %d %s; want 403", c.why, code, body)
		}
	}
	dir := t.TempDir()
	if n := readHandoff(ctx, t, p.apis["n1"], dep.ID, h.Token, "n2", dir); n < susp.Bytes*9/10 || n > susp.Bytes+susp.Bytes/8+1<<20 {
		t.Errorf("the target's read of the hand-over: %d bytes; the checkpoint has %d", n, susp.Bytes)
	}
	signal(t, p, "n2", syscall.SIGCONT)
	d, err := p.st.Follow(ctx, dep.ID, func(d state.Deployment) bool {
		return d.Status.Phase == spec.PhaseRunning && d.Node == "n2" || d.Status.Phase == spec.PhaseFailed
	})
	if err != nil || d.Status.Phase != spec.PhaseRunning {
		t.Fatalf("after the hand-over: %s on %s (%s), %v; want Running on n2", d.Status.Phase, d.Node, d.Status.Error, err)
	}
	if got, err := testenv.RedisDo(ctx, nil, d.Status.Ports[drivers.PortKey(6379, "tcp")], "GET", "k"); err != nil || got != "handed-over" {
		t.Errorf("moved: GET k = %q, %v; want handed-over", got, err)
	}
	over := time.Now().Add(30 * time.Second)
	for {
		code, _ := getHandoff(ctx, t, p.apis["n1"], dep.ID, h.Token, "n2")
		_, gone := p.st.Handoff(ctx, dep.ID)
		if code == http.StatusForbidden && gone != nil && !imageExists(ctx, f, susp.Ckpt.Image) {
			break
		}
		if time.Now().After(over) {
			t.Fatalf("30 s after the move, the hand-over is not over: a read answers %d, etcd's record %v, its image exists %v", code, gone, imageExists(ctx, f, susp.Ckpt.Image))
		}
		time.Sleep(200 * time.Millisecond)
	}
	undeployWait(ctx, t, p, dep.ID)

	// The source lost for good with the checkpoint on it alone.
	dep = createOn(ctx, t, client, api, app.Name, "n1")
	migratePaused(ctx, t, p, dep.ID)
	pendingOn(ctx, t, p, dep.ID, "n1", "n2")
	p.stopAgent("n1", syscall.SIGKILL)
	signal(t, p, "n2", syscall.SIGCONT)
	start := time.Now()
	d, err = p.st.Follow(ctx, dep.ID, func(d state.Deployment) bool {
		return d.Status.Phase == spec.PhaseRunning || d.Status.Phase == spec.PhaseFailed
	})
	if err != nil || d.Status.Phase != spec.PhaseFailed || !strings.Contains(d.Status.Error, "lost during migration: source node n1 failed before its checkpoint had moved") {
		t.Fatalf("n1 lost during the hand-over: %s on %s (%q), %v; want Failed, lost during migration", d.Status.Phase, d.Node, d.Status.Error, err)
	}
	t.Logf("n1 lost during the hand-over: Failed %s later: %s", time.Since(start).Round(time.Millisecond), d.Status.Error)
	p.startAgent("n1", "")
	undeployWait(ctx, t, p, dep.ID)
}

// migratePaused asks deployment id's migration to n2 and pauses n2's
// agent (SIGSTOP) once it has said the resume is prepared: its source then
// checkpoints at once, while n2's lease still holds (a source that waited
// for a paused target would find its lease gone, and move the instance
// back), and n2 reads nothing until it is continued.
func migratePaused(ctx context.Context, t *testing.T, p *pop, id string) {
	t.Helper()
	if _, err := p.st.RequestMigrate(ctx, id, "n2"); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	d, err := p.st.Follow(wctx, id, func(d state.Deployment) bool { return d.Move == nil || d.Move.Prepared == "n2" })
	if err != nil || d.Move == nil {
		t.Fatalf("migration of %s to n2: %+v, %v; want n2 to say its resume is prepared", id, d.Move, err)
	}
	signal(t, p, "n2", syscall.SIGSTOP)
}

// signal sends sig to node's agent; one stopped (SIGSTOP) is continued
// at the test's end if it still is.
func signal(t *testing.T, p *pop, node string, sig syscall.Signal) {
	t.Helper()
	proc := p.agents[node].Process
	if err := proc.Signal(sig); err != nil {
		t.Fatal(err)
	}
	if sig == syscall.SIGSTOP {
		t.Cleanup(func() { _ = proc.Signal(syscall.SIGCONT) })
	}
}

// pendingOn waits until deployment id is Suspended with its checkpoint
// pending on node (a migration's hand-over) and placed on target (its
// status Suspended, or Pending there), and returns its suspension.
func pendingOn(ctx context.Context, t *testing.T, p *pop, id, node, target string) spec.Suspension {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	d, err := p.st.Follow(wctx, id, func(d state.Deployment) bool {
		s := d.Status.Suspension
		placed := d.Status.Phase == spec.PhaseSuspended || d.Status.Phase == spec.PhasePending // asked of the target
		return d.Status.Phase == spec.PhaseFailed || placed && s != nil && s.Pending != "" && d.Node == target
	})
	if err != nil || d.Status.Suspension == nil || d.Status.Suspension.Pending != node || d.Node != target {
		t.Fatalf("migration of %s: %s on %q (%s), %v; want Suspended, its checkpoint pending on %s, placed on %s", id, d.Status.Phase, d.Node, d.Status.Error, err, node, target)
	}
	return *d.Status.Suspension
}

// getHandoff asks api for deployment id's hand-over as node with token,
// and returns the status and the body's start.
func getHandoff(ctx context.Context, t *testing.T, api, id, token, node string) (int, string) {
	t.Helper()
	resp := handoffRequest(ctx, t, api, id, token, node)
	defer resp.Body.Close()
	b := make([]byte, 512)
	n, _ := resp.Body.Read(b)
	return resp.StatusCode, string(b[:n])
}

// readHandoff reads deployment id's hand-over into dir as the target
// would, and returns the bytes of its files.
func readHandoff(ctx context.Context, t *testing.T, api, id, token, node, dir string) int64 {
	t.Helper()
	resp := handoffRequest(ctx, t, api, id, token, node)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the target's read of the hand-over: %s", resp.Status)
	}
	n, err := ckptstream.Read(ctx, resp.Body, dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) == 0 {
		t.Fatal("the hand-over held no file")
	}
	return n
}

// getPages asks api for deployment id's page session as node with token
// (upgrading, as a target's relay does), and returns the status and the
// body's start.
func getPages(ctx context.Context, t *testing.T, api, id, token, node string) (int, string) {
	t.Helper()
	resp := handoffRequest(ctx, t, api, id+"/pages", token, node, "Connection", "Upgrade", "Upgrade", "fogdeploy-criu-pages")
	defer resp.Body.Close()
	b := make([]byte, 512)
	n, _ := resp.Body.Read(b)
	return resp.StatusCode, string(b[:n])
}

// handoffRequest asks api for hand-over path (a deployment's ID) as node
// with token, with the header pairs kv.
func handoffRequest(ctx context.Context, t *testing.T, api, path, token, node string, kv ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+api+"/v1/handoffs/"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Set(kv[i], kv[i+1])
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Fogdeploy-Node", node)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// imageExists reports whether the PoP's pool holds image img.
func imageExists(ctx context.Context, f *deploytest.Fixture, img string) bool {
	_, err := f.Ceph.Stat(ctx, img)
	return err == nil
}
