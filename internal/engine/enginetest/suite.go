// Package enginetest is the behaviour suite every engine.Engine must pass.
//
// RunSuite boots redis-server under the engine (on the host, and chrooted
// into a root file system when one exists), checkpoints it, restores the
// image twice in a row and three times at once (each in its own network
// namespace, on the same port), checkpoints a restored process and restores
// that, and checks that a stored key survives each step. It then asserts
// that nothing is left: no process below the test, no redis on the test's
// port, no mount that mentions the root or the test's directories. It also
// checks the failure cases users meet first: a missing binary, a non-empty
// checkpoint directory, a directory with no image.
package enginetest

import (
	"context"
	"crypto/rand"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/devenv"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// suiteTimeout bounds each subtest.
const suiteTimeout = 3 * time.Minute

// RunSuite runs the suite against the engines newEngine returns (one per
// subtest). An engine whose Check reports engine.ErrUnavailable is skipped
// with the reason (or fails, if FOGDEPLOY_REQUIRE lists it).
func RunSuite(t *testing.T, newEngine func(t *testing.T) engine.Engine) {
	t.Run("Host", func(t *testing.T) { testLifecycle(t, newEngine, "") })
	t.Run("Chroot", func(t *testing.T) {
		testLifecycle(t, newEngine, testenv.RedisRootfs(t, string(newEngine(t).Name())))
	})
	t.Run("LaunchMissingBinary", func(t *testing.T) { testMissingBinary(t, newEngine) })
	t.Run("CheckpointNonEmptyDir", func(t *testing.T) { testNonEmptyDir(t, newEngine) })
	t.Run("RestoreWithoutImage", func(t *testing.T) { testNoImage(t, newEngine) })
	t.Run("LazyRestore", func(t *testing.T) { testLazy(t, newEngine) })
	t.Run("RemotePages", func(t *testing.T) { testRemotePages(t, newEngine) })
}

// setup returns a checked engine and a bounded context.
func setup(t *testing.T, newEngine func(t *testing.T) engine.Engine) (engine.Engine, context.Context) {
	t.Helper()
	// Registered first, so it runs last: after every Stop below.
	t.Cleanup(func() { assertNoLeftovers(t) })
	e := newEngine(t)
	ctx, cancel := context.WithTimeout(context.Background(), suiteTimeout)
	t.Cleanup(cancel)
	if _, err := e.Check(ctx); err != nil {
		if errors.Is(err, engine.ErrUnavailable) {
			testenv.Unavailable(t, string(e.Name()), err.Error())
		}
		t.Fatalf("%s check: %v", e.Name(), err)
	}
	return e, ctx
}

// needRedis makes sure redis-server can run on the host (root "") or in
// root: it skips, or fails when the engine is required, without it.
func needRedis(t *testing.T, e engine.Engine, root string) {
	t.Helper()
	if root == "" {
		testenv.HostBinary(t, string(e.Name()), "redis-server")
	}
}

func redisArgv(port int) []string {
	return []string{"redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--jemalloc-bg-thread", "no", "--daemonize", "no"}
}

// freePort returns a TCP port that is free on the host's loopback now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// instance is one running redis under test.
type instance struct {
	p      engine.Process
	port   int
	netns  bool
	log    *engine.LogTail
	ready  time.Duration // from the Launch/Restore call until redis answered
	called time.Time
}

func (in *instance) dial() engine.DialFunc {
	if in.netns {
		return engine.NetNSDialer(in.p.Pid())
	}
	return nil
}

func (in *instance) addr() string { return "127.0.0.1:" + strconv.Itoa(in.port) }

// waitReady waits with the TCP probe, then with the exec probe (redis-cli
// ping, through nsenter when the instance has its own network namespace).
func (in *instance) waitReady(t *testing.T, ctx context.Context) {
	t.Helper()
	opt := engine.ReadyOptions{Timeout: 30 * time.Second, Log: in.log, Process: in.p}
	if _, err := engine.WaitReady(ctx, engine.TCPProbe{Addr: in.addr(), Dial: in.dial()}, opt); err != nil {
		t.Fatal(err)
	}
	if cli, err := exec.LookPath("redis-cli"); err == nil {
		argv := []string{cli, "-p", strconv.Itoa(in.port), "ping"}
		if in.netns {
			nsenter, err := exec.LookPath("nsenter")
			if err != nil {
				t.Fatalf("nsenter: %v", err)
			}
			argv = append([]string{nsenter, "--net=/proc/" + strconv.Itoa(in.p.Pid()) + "/ns/net"}, argv...)
		}
		if _, err := engine.WaitReady(ctx, engine.ExecProbe{Argv: argv, Want: "PONG"}, opt); err != nil {
			t.Fatal(err)
		}
	}
	in.ready = time.Since(in.called)
}

func (in *instance) do(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	v, err := testenv.RedisDo(ctx, in.dial(), in.addr(), args...)
	if err != nil {
		t.Fatalf("redis %v on pid %d: %v\n%s", args, in.p.Pid(), err, in.log)
	}
	return v
}

// stop stops the instance and checks that redis shut down cleanly.
func (in *instance) stop(t *testing.T, ctx context.Context) {
	t.Helper()
	if err := in.p.Stop(ctx); err != nil {
		t.Errorf("stop pid %d: %v", in.p.Pid(), err)
	}
	code, err := in.p.Wait(ctx)
	if err != nil || code != 0 {
		t.Errorf("pid %d after SIGTERM: exit %d, %v (redis exits 0)\n%s", in.p.Pid(), code, err, in.log)
	}
}

func stopOnCleanup(t *testing.T, p engine.Process) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = p.Stop(ctx)
	})
}

func launch(t *testing.T, ctx context.Context, e engine.Engine, root string, port int) *instance {
	t.Helper()
	in := &instance{port: port, log: engine.NewLogTail(200), called: time.Now()}
	p, err := e.Launch(ctx, engine.LaunchSpec{Argv: redisArgv(port), Root: root, Stdout: in.log, Stderr: in.log})
	if err != nil {
		t.Fatalf("launch: %v", err)
	}
	in.p = p
	stopOnCleanup(t, p)
	in.waitReady(t, ctx)
	return in
}

func restore(t *testing.T, ctx context.Context, e engine.Engine, img engine.Image, root string, port int) *instance {
	t.Helper()
	in := &instance{port: port, netns: true, log: engine.NewLogTail(200), called: time.Now()}
	p, err := e.Restore(ctx, img, engine.RestoreSpec{Root: root, NetNS: true, Stdout: in.log, Stderr: in.log})
	if err != nil {
		t.Fatalf("restore %s: %v", img.Dir, err)
	}
	in.p = p
	stopOnCleanup(t, p)
	in.waitReady(t, ctx)
	return in
}

// checkpoint checkpoints in into a fresh directory and checks the result.
func checkpoint(t *testing.T, ctx context.Context, e engine.Engine, in *instance, gen int) engine.Image {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "gen"+strconv.Itoa(gen))
	pid := in.p.Pid()
	img, err := e.Checkpoint(ctx, in.p, dir)
	if err != nil {
		t.Fatalf("checkpoint pid %d: %v", pid, err)
	}
	// The app is gone: Wait returns at once, and nothing answers.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := in.p.Wait(wctx); err != nil {
		t.Fatalf("pid %d still running after checkpoint: %v", pid, err)
	}
	if !in.netns {
		if c, err := net.DialTimeout("tcp", in.addr(), time.Second); err == nil {
			c.Close()
			t.Fatalf("something still answers on %s after checkpoint", in.addr())
		}
	}
	if img.Engine != e.Name() || img.Generation != gen || len(img.Files) == 0 || img.Bytes <= 0 || img.Write <= 0 {
		t.Fatalf("unexpected image: %+v", img)
	}
	for _, f := range img.Files {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || st.Size() == 0 {
			t.Fatalf("image file %s: %v (size %v)", f, err, st)
		}
	}
	back, err := engine.ReadImage(dir)
	if err != nil {
		t.Fatalf("read image back: %v", err)
	}
	if back.Engine != img.Engine || strings.Join(back.Files, ",") != strings.Join(img.Files, ",") || back.Generation != gen {
		t.Fatalf("manifest differs: wrote %+v, read %+v", img, back)
	}
	return img
}

func testLifecycle(t *testing.T, newEngine func(t *testing.T) engine.Engine, root string) {
	e, ctx := setup(t, newEngine)
	needRedis(t, e, root)
	port := freePort(t)
	key, val := "fogdeploy:key", "value-"+strconv.FormatInt(time.Now().UnixNano(), 36)

	// First deploy: boot, store a key, checkpoint.
	first := launch(t, ctx, e, root, port)
	if got := first.do(t, ctx, "SET", key, val); got != "OK" {
		t.Fatalf("SET: %q", got)
	}
	img := checkpoint(t, ctx, e, first, 1)
	orphan := ""
	if img.Orphan {
		orphan = " (the app's parent was PID 1)"
	}
	t.Logf("%s root=%q: launch-to-ready %v (launch %v); checkpoint %v, image %.1f MB in %d files%s",
		e.Name(), root, first.ready.Round(time.Millisecond), first.p.Timings().Launch.Round(time.Millisecond),
		img.Write.Round(time.Millisecond), float64(img.Bytes)/1e6, len(img.Files), orphan)

	// Two restores in a row.
	for i := 1; i <= 2; i++ {
		r := restore(t, ctx, e, img, root, port)
		if got := r.do(t, ctx, "GET", key); got != val {
			t.Fatalf("restore %d: GET %s = %q, want %q", i, key, got, val)
		}
		t.Logf("restore %d: restore-to-ready %v (to process %v)", i, r.ready.Round(time.Millisecond),
			r.p.Timings().Restore.Round(time.Millisecond))
		r.stop(t, ctx)
	}

	// Three at once, each in its own network namespace on the same port.
	var wg sync.WaitGroup
	insts := make([]*instance, 3)
	errs := make([]error, 3)
	for i := range insts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in := &instance{port: port, netns: true, log: engine.NewLogTail(200), called: time.Now()}
			p, err := e.Restore(ctx, img, engine.RestoreSpec{Root: root, NetNS: true, Stdout: in.log, Stderr: in.log})
			if err != nil {
				errs[i] = err
				return
			}
			in.p = p
			insts[i] = in
			_, errs[i] = engine.WaitReady(ctx, engine.TCPProbe{Addr: in.addr(), Dial: in.dial()},
				engine.ReadyOptions{Log: in.log, Process: p})
			in.ready = time.Since(in.called)
		}()
	}
	wg.Wait()
	for i, in := range insts {
		if in != nil {
			stopOnCleanup(t, in.p)
		}
		if errs[i] != nil {
			t.Fatalf("concurrent restore %d: %v", i, errs[i])
		}
	}
	pids := map[int]bool{}
	for i, in := range insts {
		if got := in.do(t, ctx, "GET", key); got != val {
			t.Fatalf("concurrent restore %d: GET %s = %q, want %q", i, key, got, val)
		}
		pids[in.p.Pid()] = true
		t.Logf("concurrent restore %d: restore-to-ready %v (to process %v)", i, in.ready.Round(time.Millisecond),
			in.p.Timings().Restore.Round(time.Millisecond))
	}
	if len(pids) != 3 {
		t.Fatalf("three restores share PIDs: %v", pids)
	}
	for _, in := range insts {
		in.stop(t, ctx)
	}

	// A restored process is checkpointed again, and that image restores.
	r := restore(t, ctx, e, img, root, port)
	key2, val2 := "fogdeploy:gen2", "second-"+val
	r.do(t, ctx, "SET", key2, val2)
	img2 := checkpoint(t, ctx, e, r, 2)
	r2 := restore(t, ctx, e, img2, root, port)
	if got := r2.do(t, ctx, "GET", key); got != val {
		t.Fatalf("generation 2: GET %s = %q, want %q", key, got, val)
	}
	if got := r2.do(t, ctx, "GET", key2); got != val2 {
		t.Fatalf("generation 2: GET %s = %q, want %q", key2, got, val2)
	}
	t.Logf("generation 2: checkpoint %v, restore-to-ready %v", img2.Write.Round(time.Millisecond), r2.ready.Round(time.Millisecond))
	r2.stop(t, ctx)
	leftoverPort(t, port)
	leftoverMounts(t, root, filepath.Dir(img.Dir), filepath.Dir(img2.Dir))
}

func testMissingBinary(t *testing.T, newEngine func(t *testing.T) engine.Engine) {
	e, ctx := setup(t, newEngine)
	for _, argv0 := range []string{"fogdeploy-no-such-binary", "/nonexistent/fogdeploy-no-such-binary"} {
		p, err := e.Launch(ctx, engine.LaunchSpec{Argv: []string{argv0, "--flag"}})
		if err == nil {
			stopOnCleanup(t, p)
			t.Fatalf("launch %s: no error", argv0)
		}
		if !errors.Is(err, engine.ErrInvalid) || !strings.Contains(err.Error(), argv0) {
			t.Fatalf("launch %s: error %q should wrap ErrInvalid and name the binary", argv0, err)
		}
		if hint.Of(err) == "" {
			t.Errorf("launch %s: error has no hint: %v", argv0, err)
		}
	}
	if root := devenv.TestRootfs(); dirExists(root) {
		// A binary that exists on the host but not in the root.
		if name := hostOnlyBinary(root); name != "" {
			_, err := e.Launch(ctx, engine.LaunchSpec{Argv: []string{name}, Root: root})
			if !errors.Is(err, engine.ErrInvalid) || !strings.Contains(err.Error(), root) {
				t.Fatalf("launch host-only %s in root: error %q should wrap ErrInvalid and name the root", name, err)
			}
		}
	}
	if _, err := e.Launch(ctx, engine.LaunchSpec{}); !errors.Is(err, engine.ErrInvalid) {
		t.Fatalf("launch with empty argv: %v, want ErrInvalid", err)
	}
}

// hostOnlyBinary names a program in the host's /usr/bin that root lacks.
func hostOnlyBinary(root string) string {
	ents, _ := os.ReadDir("/usr/bin")
	for _, e := range ents {
		if _, err := os.Stat(filepath.Join(root, "usr/bin", e.Name())); err != nil && !e.IsDir() {
			return e.Name()
		}
	}
	return ""
}

func dirExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

func testNonEmptyDir(t *testing.T, newEngine func(t *testing.T) engine.Engine) {
	e, ctx := setup(t, newEngine)
	needRedis(t, e, "")
	port := freePort(t)
	in := launch(t, ctx, e, "", port)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "old-image"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := e.Checkpoint(ctx, in.p, dir)
	if !errors.Is(err, engine.ErrInvalid) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("checkpoint into a non-empty dir: %v, want ErrInvalid naming %s", err, dir)
	}
	// The refusal left the app alone.
	if got := in.do(t, ctx, "PING"); got != "PONG" {
		t.Fatalf("PING after refused checkpoint: %q", got)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("refused checkpoint wrote into %s: %v", dir, ents)
	}
	in.stop(t, ctx)
	leftoverPort(t, port)
}

func testNoImage(t *testing.T, newEngine func(t *testing.T) engine.Engine) {
	e, ctx := setup(t, newEngine)
	dir := t.TempDir()
	if _, err := engine.ReadImage(dir); !errors.Is(err, engine.ErrNoImage) {
		t.Fatalf("ReadImage of an empty dir: %v, want ErrNoImage", err)
	}
	if _, err := e.Restore(ctx, engine.Image{Engine: e.Name(), Dir: dir}, engine.RestoreSpec{NetNS: true}); !errors.Is(err, engine.ErrNoImage) {
		t.Fatalf("restore from an empty dir: %v, want ErrNoImage", err)
	}
	other := engine.NameCRIU
	if e.Name() == other {
		other = engine.NameDMTCP
	}
	if _, err := e.Restore(ctx, engine.Image{Engine: other, Dir: dir, Files: []string{"x"}}, engine.RestoreSpec{}); !errors.Is(err, engine.ErrInvalid) {
		t.Fatalf("restore of a %s image: %v, want ErrInvalid", other, err)
	}
}

// testLazy: a lazy restore (RestoreSpec.Lazy) of an app holding 64 MiB
// of data answers with all of it, and its page server is gone once the
// app is; an engine that cannot restore lazily refuses at once.
func testLazy(t *testing.T, newEngine func(t *testing.T) engine.Engine) {
	e, ctx := setup(t, newEngine)
	port, first, sum := launchFilled(t, ctx, e)
	img := checkpoint(t, ctx, e, first, 1)

	in := &instance{port: port, netns: true, log: engine.NewLogTail(200), called: time.Now()}
	p, err := e.Restore(ctx, img, engine.RestoreSpec{NetNS: true, Lazy: true, Stdout: in.log, Stderr: in.log})
	if e.Name() != engine.NameCRIU {
		if !errors.Is(err, engine.ErrInvalid) {
			t.Fatalf("lazy restore with %s = %v; want ErrInvalid (only CRIU restores lazily)", e.Name(), err)
		}
		return
	}
	if err != nil {
		t.Fatalf("lazy restore: %v", err)
	}
	in.p = p
	stopOnCleanup(t, p)
	in.waitReady(t, ctx)
	t.Logf("lazy restore of %d MiB answered PING after %s", img.Bytes>>20, in.ready.Round(time.Millisecond))
	if got := in.do(t, ctx, "GETRANGE", "blob15", "1000", "1015"); got != sum {
		t.Errorf("blob15 after a lazy restore = %q; want %q", got, sum)
	}
	if got := in.do(t, ctx, "STRLEN", "blob7"); got != strconv.Itoa(blobSize) {
		t.Errorf("STRLEN blob7 = %s; want %d", got, blobSize)
	}
	// Checkpointed again at once (a migration's target suspended again),
	// before its page server may have given it every page: the next
	// generation holds all of its memory.
	img2 := checkpoint(t, ctx, e, in, 2)
	if img2.Bytes < img.Bytes/2 {
		t.Errorf("the checkpoint of a lazily restored app holds %d bytes; its first held %d", img2.Bytes, img.Bytes)
	}
	again := restore(t, ctx, e, img2, "", port)
	for i := range 16 {
		if got := again.do(t, ctx, "STRLEN", "blob"+strconv.Itoa(i)); got != strconv.Itoa(blobSize) {
			t.Errorf("STRLEN blob%d after the lazily restored app's checkpoint = %s; want %d", i, got, blobSize)
		}
	}
	if got := again.do(t, ctx, "GETRANGE", "blob15", "1000", "1015"); got != sum {
		t.Errorf("blob15 after the lazily restored app's checkpoint = %q; want %q", got, sum)
	}
	again.stop(t, ctx)
	assertNoLeftovers(t)
	leftoverPort(t, port)
}

// blobSize is the size of each of launchFilled's 16 values.
const blobSize = 4 << 20

// launchFilled launches redis on the host on a free port and writes 16
// values of blobSize random bytes (blob0 to blob15): it returns the port,
// the instance and 16 bytes of blob15.
func launchFilled(t *testing.T, ctx context.Context, e engine.Engine) (int, *instance, string) {
	t.Helper()
	needRedis(t, e, "")
	port := freePort(t)
	in := launch(t, ctx, e, "", port)
	chunk := make([]byte, blobSize)
	for i := range 16 {
		_, _ = rand.Read(chunk)
		if got := in.do(t, ctx, "SET", "blob"+strconv.Itoa(i), string(chunk)); got != "OK" {
			t.Fatalf("SET blob%d: %q", i, got)
		}
	}
	return port, in, in.do(t, ctx, "GETRANGE", "blob15", "1000", "1015")
}
