package deploy_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/gencache"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// slowFetch holds the mapping of a checkpoint fetch until release is
// closed, then makes it or fails with fail.
type slowFetch struct {
	deploy.Mapper
	release chan struct{}
	fail    error
}

func (m *slowFetch) MapAndMount(ctx context.Context, img mapper.Image, target string, mo mapper.MountOptions, opts ...mapper.MapOption) (*mapper.Mapping, error) {
	if strings.HasPrefix(mapper.SettingsOf(opts...).ID, "fetch-") {
		select {
		case <-m.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if m.fail != nil {
			return nil, m.fail
		}
	}
	return m.Mapper.MapAndMount(ctx, img, target, mo, opts...)
}

// TestRestoreCreatedWhileFetching: a restore on a node that must fetch
// its checkpoint creates its light container while the fetch goes on
// (its container phase ends before its fetch phase), and its app reads
// the whole checkpoint once started: the key written before the
// checkpoint is there. A fetch that fails after the container was made
// fails the deploy and leaves nothing of it. On the fakes;
// TestRestoreCreatedWhileFetchingContainer runs it on the real parts.
func TestRestoreCreatedWhileFetching(t *testing.T) {
	for _, eng := range spec.Engines {
		t.Run(string(eng), func(t *testing.T) {
			u, ctx, app := unitRedis(t, eng)
			restoreWhileFetching(ctx, t, u, app)
		})
	}
}

// TestRestoreCreatedWhileFetchingContainer is TestRestoreCreatedWhileFetching
// in the light container on Ceph and Docker, with the real entrypoint
// (-source-later) under each engine.
func TestRestoreCreatedWhileFetchingContainer(t *testing.T) {
	for _, eng := range spec.Engines {
		t.Run(string(eng), func(t *testing.T) {
			f, ctx, app := redisFixture(t, "container", eng, "late")
			restoreWhileFetching(ctx, t, f, app)
		})
	}
}

func restoreWhileFetching(ctx context.Context, t *testing.T, n deploytest.Node, app spec.App) {
	first, err := n.Deployer().Deploy(ctx, app, deploy.Options{Prepare: func(ctx context.Context, tg deploy.Target) error {
		_, err := testenv.RedisDo(ctx, nil, tg.Ports["6379/tcp"], "SET", "greeting", "before the checkpoint")
		return err
	}})
	if err != nil {
		t.Fatal(err)
	}
	drop := func() {
		t.Helper()
		if _, err := n.Deployer().Checkpoints().TrimCache(func(k gencache.Key) bool { return k.App != app.Name }); err != nil {
			t.Fatal(err)
		}
	}
	drop()
	slow := &slowFetch{release: make(chan struct{})}
	d := n.ReopenMapping(t, func(m deploy.Mapper) deploy.Mapper { slow.Mapper = m; return slow })
	var phases []string
	dep, err := d.Deploy(ctx, app, deploy.Options{Progress: func(p string, _ time.Duration) {
		phases = append(phases, p)
		if p == string(deploy.StepContainer) {
			close(slow.release) // the container is made: the fetch may end
		}
	}})
	if err != nil {
		t.Fatalf("restore while fetching: %v (phases %v)", err, phases)
	}
	c, f := slices.Index(phases, string(deploy.StepContainer)), slices.Index(phases, string(deploy.StepFetch))
	if !dep.Fetched || c < 0 || f < c {
		t.Errorf("restore that fetched: fetched %v, phases %v; want its container made before its fetch ended", dep.Fetched, phases)
	}
	if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, dep), "GET", "greeting"); err != nil || got != "before the checkpoint" {
		t.Errorf("GET greeting after a restore created while fetching = %q, %v", got, err)
	}

	// The fetch fails once the container is made.
	drop()
	failing := &slowFetch{release: make(chan struct{}), fail: errors.New("the cluster went away")}
	d = n.ReopenMapping(t, func(m deploy.Mapper) deploy.Mapper { failing.Mapper = m; return failing })
	made := false
	_, err = d.Deploy(ctx, app, deploy.Options{Progress: func(p string, _ time.Duration) {
		if p == string(deploy.StepContainer) {
			made = true
			close(failing.release)
		}
	}})
	if err == nil || !made || !strings.Contains(err.Error(), "the cluster went away") {
		t.Errorf("restore whose fetch failed after its container: %v (container made %v); want the fetch's error", err, made)
	}
	for _, id := range []string{dep.ID, first.ID} {
		if err := d.Undeploy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	n.AssertNothingLeft(t, app.Name, true)
}

// preforkServer is a Python HTTP server shaped like PostgreSQL or nginx:
// the parent fills 16 MiB with random bytes, then forks three children
// that serve one listening socket; every GET answers the SHA-256 of the
// 16 MiB as the serving process holds them. Its checkpoint holds the
// same pages four times.
var preforkServer = []string{"python3", "-c", `import hashlib, http.server, os, socketserver
data = os.urandom(16 << 20)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = hashlib.sha256(data).hexdigest().encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
srv = socketserver.TCPServer(("0.0.0.0", 8000), H)
for _ in range(3):
    if os.fork() == 0:
        srv.serve_forever()
while True:
    os.wait()`}

// TestFirstRestoreReadsSharedPagesOnce: the first restore on a node of
// an app whose processes share most of their memory (a parent and three
// forked children holding the same 16 MiB) reads from the cluster only
// the blocks of its checkpoint that are neither zero nor repeated (the
// generation's block index), less than half of the checkpoint, and
// every process of the restored instance holds the checkpoint's bytes.
// Under each engine, on Ceph and Docker.
func TestFirstRestoreReadsSharedPagesOnce(t *testing.T) {
	f := deploytest.NewPythonFixture(t)
	for _, eng := range spec.Engines {
		t.Run(string(eng), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			app, _, want := deployPrefork(ctx, t, f, "prefork", eng)
			if _, err := f.D.Checkpoints().TrimCache(func(k gencache.Key) bool { return k.App != app.Name }); err != nil {
				t.Fatal(err)
			}
			before, osdBefore := f.D.Checkpoints().FetchBytes(), cephIO(ctx, t, f)
			dep, err := f.D.Deploy(ctx, app, deploy.Options{})
			if err != nil {
				t.Fatalf("first restore on the node: %v", err)
			}
			after, osd := f.D.Checkpoints().FetchBytes(), cephIO(ctx, t, f)-osdBefore
			size, read := after.Bytes-before.Bytes, after.Read-before.Read
			if !dep.Fetched || size < 4*16<<20 || read <= 0 || read > size/2 {
				t.Errorf("first restore (fetched %v): its checkpoint of %d MiB read %d MiB from the cluster; want at least 64 MiB, less than half of it read",
					dep.Fetched, size>>20, read>>20)
			}
			if osd > uint64(size)*6/10 {
				t.Errorf("first restore: the OSDs read %d MiB for a checkpoint of %d MiB; want the shared blocks read once", osd>>20, size>>20)
			}
			// Each GET is a new connection, served by whichever process
			// accepts it first.
			for i := range 12 {
				if got := getToken(t, dep); len(want) != 64 || got != want {
					t.Fatalf("GET %d of the first restore on the node = %q; want the checkpoint's digest %q", i, got, want)
				}
			}
			t.Logf("%s: checkpoint %d MiB, read %d MiB (the OSDs: %d MiB), %d MiB copied from the node's own blocks, %d MiB zero",
				eng, size>>20, read>>20, osd>>20, (after.Reused-before.Reused)>>20, (after.Zero-before.Zero)>>20)
		})
	}
}

// deployPrefork deploys a preforkServer app of engine eng (named after
// prefix) for the first time (boot, checkpoint, restore), and returns it,
// its deployment and the digest it answers; the app and its generations go
// after the test.
func deployPrefork(ctx context.Context, t *testing.T, f *deploytest.Fixture, prefix string, eng engine.Name) (spec.App, deploy.Deployment, string) {
	t.Helper()
	app := tokenApp(prefix+"-"+string(eng), f.Env)
	app.Engine, app.Command = eng, preforkServer
	app.Resources.Memory, app.CheckpointSize = "512M", "1G"
	t.Cleanup(func() { f.UndeployAll(t, app.Name); f.RemoveGenerations(t, app.Name) })
	first, err := f.D.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatalf("first deploy (boot, checkpoint, restore): %v", err)
	}
	return app, first, getToken(t, first)
}

// cephIO is what the cluster's OSDs have read so far.
func cephIO(ctx context.Context, t *testing.T, f *deploytest.Fixture) uint64 {
	t.Helper()
	c, err := f.Ceph.IOCounters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return c.Read
}
