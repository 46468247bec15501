//go:build !no_ceph

package e2e

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// TestMigratePostCopyPoP: a redis holding 96 MiB of random values moves
// under CRIU from n1 to n2. Its target restores it from a hand-over read
// without the pages a lazy restore fetches later, and fetches them from
// n1 once the app answers: each side counts one page session done, n1
// keeps its hand-over until then, and every value is whole at n2. Then it
// is suspended and resumed on n1 from the cluster: its memory is read from
// the suspension's image as the app asks for it, every value whole.
func TestMigratePostCopyPoP(t *testing.T) {
	ctx, p, f, app := redisOnPoP(t, "e2e-pc", engine.NameCRIU, nil, "n1", "n2")
	api := "http://" + p.apis["n1"]
	client := &http.Client{}
	big, dep, src := largeOnN1(ctx, t, p, client, api, app, "-pc", "512M")
	sums := randomBlobs(ctx, t, src, 24)
	done := func(node, side string) float64 {
		return metricCount(t, p.apis[node], fmt.Sprintf(`fogdeploy_migrate_page_sessions_total{result="done",side=%q}`, side))
	}
	srcBefore, dstBefore := done("n1", "source"), done("n2", "target")
	down, moved := migrateUnderPings(ctx, t, client, api, dep.ID, src)
	dst := moved.Ports[drivers.PortKey(6379, "tcp")]
	for k, sum := range sums {
		got, err := testenv.RedisDo(ctx, nil, dst, "GET", k)
		if err != nil || sha256.Sum256([]byte(got)) != sum {
			t.Errorf("after the post-copy migration: GET %s: %d bytes, %v; want the 4 MiB written", k, len(got), err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for done("n1", "source") < srcBefore+1 || done("n2", "target") < dstBefore+1 {
		if time.Now().After(deadline) {
			t.Fatalf("page sessions done: n1 (source) %v, n2 (target) %v; want one more each (the restore fetched its pages from n1)",
				done("n1", "source")-srcBefore, done("n2", "target")-dstBefore)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("96 MiB of values: migrated after the memory, no answer for %s (checkpoint %d bytes)", down.Round(time.Millisecond), moved.Bytes)

	// Suspended on n2 and resumed on n1 from the cluster: the resume
	// copies the checkpoint but its lazy pages, which n1 reads from the
	// suspension's image as the app asks for them.
	susp := suspendWait(t, client, api, dep.ID).Suspension
	if susp == nil {
		t.Fatal("the suspend's status has no suspension")
	}
	served := func() float64 { return metricCount(t, p.apis["n1"], "fogdeploy_checkpoint_pages_served_bytes_total") }
	fetched := func() float64 {
		return metricCount(t, p.apis["n1"], `fogdeploy_checkpoint_fetch_bytes_total{from="cluster"}`)
	}
	servedBefore, fetchedBefore := served(), fetched()
	back := resumeWait(t, client, api, dep.ID, "n1")
	for k, sum := range sums {
		got, err := testenv.RedisDo(ctx, nil, back.Ports[drivers.PortKey(6379, "tcp")], "GET", k)
		if err != nil || sha256.Sum256([]byte(got)) != sum {
			t.Errorf("after a resume from the cluster: GET %s: %d bytes, %v; want the 4 MiB written", k, len(got), err)
		}
	}
	deadline = time.Now().Add(30 * time.Second)
	for served()-servedBefore < 90<<20 {
		if time.Now().After(deadline) {
			t.Fatalf("n1 served %v bytes of pages from the cluster to the resume; want the 96 MiB of values", served()-servedBefore)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if f := fetched() - fetchedBefore; f > 32<<20 {
		t.Errorf("the resume from the cluster copied %v bytes of its checkpoint before it ran; want its memory read on demand", f)
	}
	t.Logf("resumed from the cluster: %v bytes copied before the app ran, %v bytes of pages served after", fetched()-fetchedBefore, served()-servedBefore)
	// Read to its last page, the suspension's checkpoint image goes.
	for deadline = time.Now().Add(30 * time.Second); imageExists(ctx, f, susp.Ckpt.Image); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("30 s after the resume read its pages, the suspension's checkpoint image %s is still there", susp.Ckpt.Image)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	dropLarge(cctx, t, p, f, big, dep.ID)
}

// randomBlobs SETs n values of 4 MiB of random bytes (keys blob0...) in
// the redis at addr, and returns each one's digest by key.
func randomBlobs(ctx context.Context, t *testing.T, addr string, n int) map[string][32]byte {
	t.Helper()
	sums := map[string][32]byte{}
	blob := make([]byte, 4<<20)
	for i := range n {
		_, _ = rand.Read(blob)
		k := "blob" + strconv.Itoa(i)
		if got, err := testenv.RedisDo(ctx, nil, addr, "SET", k, string(blob)); err != nil || got != "OK" {
			t.Fatalf("SET %s: %q, %v", k, got, err)
		}
		sums[k] = sha256.Sum256(blob)
	}
	return sums
}

// TestPostCopySourceLost: the source's agent of a post-copy migration is
// stopped the moment the target says the instance runs there, while the
// target's restore still fetches the app's memory from it, then killed
// for good. The instance is never half there: either its memory had all
// moved (it runs on n2 with every value whole) or the deployment ends
// Failed, lost during migration, with the reason, its instance stopped.
// n1's agent, started again, keeps no hand-over of it.
func TestPostCopySourceLost(t *testing.T) {
	ctx, p, f, app := redisOnPoP(t, "e2e-pcl", engine.NameCRIU, nil, "n1", "n2")
	api := "http://" + p.apis["n1"]
	client := &http.Client{}
	big, dep, src := largeOnN1(ctx, t, p, client, api, app, "-pcl", "512M")
	sums := randomBlobs(ctx, t, src, 32)
	if _, err := p.st.RequestMigrate(ctx, dep.ID, "n2"); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	d, err := p.st.Follow(wctx, dep.ID, func(d state.Deployment) bool {
		return d.Status.Phase == spec.PhaseRunning && d.Status.Node == "n2" || d.Status.Phase == spec.PhaseFailed
	})
	if err != nil || d.Status.Phase != spec.PhaseRunning {
		t.Fatalf("the migration: %s on %s (%s), %v; want Running on n2", d.Status.Phase, d.Status.Node, d.Status.Error, err)
	}
	signal(t, p, "n1", syscall.SIGSTOP)
	p.stopAgent("n1", syscall.SIGKILL)
	// The target's page session ends: cut (the instance is lost), or
	// done before n1 stopped.
	session := func(result string) float64 {
		return metricCount(t, p.apis["n2"], fmt.Sprintf(`fogdeploy_migrate_page_sessions_total{result=%q,side="target"}`, result))
	}
	for session("cut")+session("done") == 0 {
		if wctx.Err() != nil {
			t.Fatal("n2's page session with the lost n1 neither ended nor was cut within 2 minutes")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if session("cut") > 0 {
		d, err = p.st.Follow(wctx, dep.ID, func(d state.Deployment) bool { return d.Status.Phase == spec.PhaseFailed })
	} else {
		err = context.DeadlineExceeded
	}
	switch {
	case err == nil:
		if !strings.Contains(d.Status.Error, "lost during migration: source node n1 failed before its memory had moved") {
			t.Errorf("Failed with %q; want lost during migration, saying why", d.Status.Error)
		}
		t.Logf("n1 lost during the post-copy: Failed: %s", d.Status.Error)
		addr := d.Status.Ports[drivers.PortKey(6379, "tcp")]
		if addr != "" {
			if got, err := testenv.RedisDo(ctx, nil, addr, "PING"); err == nil {
				t.Errorf("the instance that lost its memory still answers at %s: %q", addr, got)
			}
		}
	case errors.Is(err, context.DeadlineExceeded) && session("cut") == 0:
		// Its memory had all moved before n1 stopped: whole on n2.
		d, _ = p.st.Deployment(ctx, dep.ID)
		for k, sum := range sums {
			got, err := testenv.RedisDo(ctx, nil, d.Status.Ports[drivers.PortKey(6379, "tcp")], "GET", k)
			if err != nil || sha256.Sum256([]byte(got)) != sum {
				t.Errorf("running on n2 after n1 was lost: GET %s: %d bytes, %v; want the 4 MiB written", k, len(got), err)
			}
		}
		t.Logf("n1 lost after the post-copy had ended: the instance runs on n2, whole")
	default:
		t.Fatal(err)
	}
	p.startAgent("n1", "")
	hos := filepath.Join(p.dir, "n1", "handoffs")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		ents, _ := os.ReadDir(hos)
		if len(ents) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("n1 started again keeps %d hand-over(s) in %s 30 s later", len(ents), hos)
		}
	}
	dctx, dcancel := context.WithTimeout(ctx, time.Minute)
	defer dcancel()
	dropLarge(dctx, t, p, f, big, dep.ID)
}
