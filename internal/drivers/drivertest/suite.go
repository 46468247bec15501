// Package drivertest is the behaviour suite every drivers.Driver must pass.
//
// RunSuite checks, through the Driver interface only, what a user of an
// instance observes. It runs redis-server (spec.App RedisApp) from a
// mounted environment:
//
//   - Create does not run the app: Running is false, no process runs in the
//     instance (NetPid 0), the app has printed nothing, and nothing answers
//     on a published address. Create of the same run again returns the same
//     instance, and another run under that ID is ErrExists.
//   - Start runs it: it answers PING on its published port, Running is
//     true, Logs return its output. Start again changes nothing.
//   - Remove of a created and of a running instance leaves nothing
//     (Harness.Leftovers: no container, no process), the port no longer
//     answers, and a second Remove is fine; Start then is ErrNotFound.
//   - Checkpoint after a SET, with a client still connected, then Create
//     and Start in restart mode from the generation written: GET returns
//     the value, the generation numbers follow (Handle.Gen).
//   - A bad run (empty command, unknown or empty mode) is refused at Create
//     with ErrInvalidSpec, and leaves nothing.
//   - With Harness.CheckAppCaps, no process of the instance but its PID 1
//     and CRIU's own holds a capability beyond AppCaps, launched and
//     restored; and on every driver the app sees /proc/sys read-only.
//
// Implementations run it in their tests: TestDriverSuiteContainer (DMTCP in
// the container), TestDriverSuiteContainerCRIU (CRIU in the container) and
// TestDriverSuiteHost (CRIU) on real engines and a mounted RBD clone,
// TestDriverSuiteContainerFake over runtime.Fake.
package drivertest

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/procfs"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// Harness is one driver under test and the node it runs instances on.
type Harness struct {
	// Driver is the implementation under test.
	Driver drivers.Driver
	// Engine is the checkpoint engine of the app (engine.NameDMTCP or
	// engine.NameCRIU), which Driver must be able to run.
	Engine engine.Name
	// EnvPath is a mounted environment with redis-server, CkptPath an
	// empty checkpoint directory beside it: one pair per subtest, as the
	// deploy path gives each instance its own clones.
	EnvPath, CkptPath string
	// Leftovers lists what the instance of deployment id left on the
	// node: containers, processes; nothing is an empty list. The suite
	// retries it for a while (processes take a moment to go).
	Leftovers func(t *testing.T, id string) []string
	// Timeout bounds each subtest; 0 means 3 minutes.
	Timeout time.Duration
	// NoExec, when set, says why Exec cannot be checked here (a fake
	// image with no shell and no redis-cli); the real drivers have none.
	NoExec string
	// NoProcesses, when set, says why the instance's processes cannot be
	// read here (a fake runtime runs none): the checks of their
	// capabilities, mounts and exit are left out; the real drivers have
	// them (a fake PID may be a real process of the machine).
	NoProcesses string
	// CheckAppCaps makes the suite read the effective capabilities of
	// every process below the instance's NetPid (the container driver's
	// promise): none may hold more than AppCaps (names, e.g. "SETUID").
	CheckAppCaps bool
	AppCaps      []string
	// NetPidIsApp says that NetPid is the app's own process in a PID
	// namespace of its own (the host driver): CheckAppCaps then reads
	// every process of that namespace (the app, its wrapper, DMTCP's
	// coordinator) but its placeholder init and criu.
	NetPidIsApp bool
	// User, when set, is the user of the environment the suite's app runs
	// as (App.User): with CheckAppCaps, the suite also checks that a
	// process of the instance runs as a user other than root (in each of
	// its uids), launched and restored.
	User string
	// ResettableRoot, when set, gives a root with the environment that
	// can be reset between two instances (drivers.Run.Resettable: root is
	// the subdirectory of a shared mount directory) and its reset; the
	// suite then checks that a deploy.Recycler serves instance after
	// instance in one instance.
	ResettableRoot func(t *testing.T) (root string, reset func(context.Context) error)
	// ServesOnce says that the driver's restores of Engine serve one
	// deployment even on a resettable root (an image whose entrypoint
	// cannot recycle that engine's instances): the suite then checks that
	// Recycle refuses them. Unset, it requires them to serve again.
	ServesOnce bool
}

// RedisApp is the app the suite runs: redis-server on port 6379 with a
// PING/+PONG readiness probe, under engine eng.
func RedisApp(eng engine.Name) spec.App {
	return spec.App{
		Name: "drivertest-redis", Env: "drivertest", Engine: eng,
		Command: []string{"redis-server", "--port", "6379", "--protected-mode", "no", "--save", "", "--appendonly", "no",
			"--jemalloc-bg-thread", "no", "--daemonize", "no"},
		Ports:          []spec.Port{{Port: 6379}},
		Ready:          spec.Readiness{Kind: spec.ReadyTCP, Port: 6379, Send: "PING\r\n", Expect: "+PONG", Timeout: spec.Duration(30 * time.Second)},
		Resources:      spec.Resources{CPUs: 1, Memory: "256M"},
		CheckpointSize: "256M",
	}.WithDefaults()
}

// readyLine is what redis-server prints once it serves.
const readyLine = "Ready to accept connections"

// RunSuite runs the suite against the harnesses newHarness returns, one
// per subtest.
func RunSuite(t *testing.T, newHarness func(t *testing.T) Harness) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s *suite)
	}{
		{"CreateDoesNotRun", testCreateDoesNotRun},
		{"CreateIsIdempotent", testCreateIdempotent},
		{"StartRunsApp", testStartRunsApp},
		{"CheckpointRestart", testCheckpointRestart},
		{"InvalidRun", testInvalidRun},
		{"ExecRunsInInstance", testExec},
		{"RecycleServesAgain", testRecycle},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			timeout := h.Timeout
			if timeout == 0 {
				timeout = 3 * time.Minute
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			t.Cleanup(cancel)
			app := RedisApp(h.Engine)
			app.User = h.User
			tc.fn(t, &suite{Harness: h, ctx: ctx, app: app})
		})
	}
}

type suite struct {
	Harness
	ctx context.Context
	app spec.App
}

var seq atomic.Int64

// newID returns a deployment ID of its own for each instance.
func newID() string {
	return "dt-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36) + "-" + strconv.FormatInt(seq.Add(1), 10)
}

// run is a run of the suite's app in a new deployment.
func (s *suite) run(t *testing.T, mode drivers.RunMode, gen int) drivers.Run {
	return drivers.Run{Mode: mode, ID: newID(), App: s.app, EnvPath: s.EnvPath, CkptPath: s.CkptPath, Gen: gen, CtlPath: t.TempDir()}
}

// create creates r, and removes its instance when the test ends, in case
// the test stops before it does.
func (s *suite) create(t *testing.T, r drivers.Run) drivers.Handle {
	t.Helper()
	h, err := s.Driver.Create(s.ctx, r)
	if err != nil {
		t.Fatalf("Create %s %s: %v", r.Mode, r.ID, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			if lines, _ := s.Driver.Logs(context.Background(), h, 40); len(lines) > 0 {
				t.Logf("last output of %s:\n  %s", r.ID, strings.Join(lines, "\n  "))
			}
		}
		_ = s.Driver.Remove(context.Background(), h)
	})
	if h.Ref == "" || h.Driver != s.Driver.Name() {
		t.Fatalf("Create %s: handle %+v, want a reference and driver %q", r.ID, h, s.Driver.Name())
	}
	return h
}

// start starts a created instance and returns its redis address.
func (s *suite) start(t *testing.T, h drivers.Handle) (drivers.Handle, string) {
	t.Helper()
	h2, err := s.Driver.Start(s.ctx, h)
	if err != nil {
		t.Fatalf("Start %s: %v", h.Ref, err)
	}
	if h2.Ref != h.Ref {
		t.Errorf("Start changed the reference %q to %q", h.Ref, h2.Ref)
	}
	addr := h2.Ports[drivers.PortKey(6379, "tcp")]
	if addr == "" {
		t.Fatalf("Start %s: no address for 6379/tcp in %v", h.Ref, h2.Ports)
	}
	return h2, addr
}

// waitRedis waits until redis answers PING at addr, and fails early when
// the instance stops running.
func (s *suite) waitRedis(t *testing.T, h drivers.Handle, addr string) {
	t.Helper()
	deadline := time.Now().Add(time.Duration(s.app.Ready.Timeout))
	var last error
	for time.Now().Before(deadline) && s.ctx.Err() == nil {
		got, err := testenv.RedisDo(s.ctx, nil, addr, "PING")
		if err == nil && got == "PONG" {
			return
		}
		last = err
		if ok, err := s.Driver.Running(s.ctx, h); err == nil && !ok {
			t.Fatalf("instance %s stopped before redis answered at %s (last: %v)", h.Ref, addr, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("redis of %s never answered PING at %s: %v", h.Ref, addr, last)
}

// redis runs one command and checks the reply.
func (s *suite) redis(t *testing.T, addr, want string, args ...string) {
	t.Helper()
	got, err := testenv.RedisDo(s.ctx, nil, addr, args...)
	if err != nil || got != want {
		t.Fatalf("redis %v at %s = %q, %v; want %q", args, addr, got, err, want)
	}
}

// answers reports whether something at addr answers PING.
func (s *suite) answers(addr string) bool {
	ctx, cancel := context.WithTimeout(s.ctx, 2*time.Second)
	defer cancel()
	got, err := testenv.RedisDo(ctx, nil, addr, "PING")
	return err == nil && got == "PONG"
}

// assertRunning checks Running against want.
func (s *suite) assertRunning(t *testing.T, h drivers.Handle, want bool) {
	t.Helper()
	ok, err := s.Driver.Running(s.ctx, h)
	if err != nil || ok != want {
		t.Errorf("Running(%s) = %v, %v; want %v", h.Ref, ok, err, want)
	}
}

// eventually retries check for up to 15 s and returns its last findings.
func (s *suite) eventually(check func() []string) []string {
	deadline := time.Now().Add(15 * time.Second)
	for {
		bad := check()
		if len(bad) == 0 || time.Now().After(deadline) || s.ctx.Err() != nil {
			return bad
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// assertNothingLeft fails when instances of the IDs left anything.
func (s *suite) assertNothingLeft(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if left := s.eventually(func() []string { return s.Leftovers(t, id) }); len(left) > 0 {
			t.Errorf("deployment %s left: %s", id, strings.Join(left, "; "))
		}
	}
}

// remove removes h twice (the second is a no-op) and checks that nothing is
// left and that the instance cannot be started any more.
func (s *suite) remove(t *testing.T, h drivers.Handle, id string) {
	t.Helper()
	if err := s.Driver.Remove(s.ctx, h); err != nil {
		t.Fatalf("Remove %s: %v", h.Ref, err)
	}
	s.assertNothingLeft(t, id)
	if err := s.Driver.Remove(s.ctx, h); err != nil {
		t.Errorf("second Remove %s: %v, want nil", h.Ref, err)
	}
	s.assertRunning(t, h, false)
	if _, err := s.Driver.Start(s.ctx, h); !errors.Is(err, spec.ErrNotFound) {
		t.Errorf("Start of removed instance %s: %v, want ErrNotFound", h.Ref, err)
	}
}

// testCreateDoesNotRun: a created instance exists but its app does not run;
// Remove takes it away.
func testCreateDoesNotRun(t *testing.T, s *suite) {
	r := s.run(t, drivers.RunLaunch, 1)
	h := s.create(t, r)
	if h.Gen != 1 || h.EnvPath != r.EnvPath || h.CkptPath != r.CkptPath {
		t.Errorf("Create handle = %+v; want gen 1 and the run's paths", h)
	}
	// Give an app that was started by mistake time to show.
	time.Sleep(500 * time.Millisecond)
	s.assertRunning(t, h, false)
	if pid, err := s.Driver.NetPid(s.ctx, h); err != nil || pid != 0 {
		t.Errorf("NetPid of a created instance = %d, %v; want 0 (nothing runs)", pid, err)
	}
	for key, addr := range h.Ports {
		if addr != "" && s.answers(addr) {
			t.Errorf("%s of a created instance answers at %s before Start", key, addr)
		}
	}
	if lines, err := s.Driver.Logs(s.ctx, h, 100); err != nil {
		t.Errorf("Logs of a created instance: %v", err)
	} else if strings.Contains(strings.Join(lines, "\n"), readyLine) {
		t.Errorf("the app printed %q before Start:\n%s", readyLine, strings.Join(lines, "\n"))
	}
	s.remove(t, h, r.ID)
}

// testCreateIdempotent: Create of the same run twice makes one instance;
// another run under the same ID is refused while it exists.
func testCreateIdempotent(t *testing.T, s *suite) {
	r := s.run(t, drivers.RunLaunch, 1)
	h := s.create(t, r)
	again, err := s.Driver.Create(s.ctx, r)
	if err != nil || again.Ref != h.Ref {
		t.Fatalf("second Create of %s = %+v, %v; want the same instance %s", r.ID, again, err, h.Ref)
	}
	other := r
	other.Gen = 7
	if h2, err := s.Driver.Create(s.ctx, other); !errors.Is(err, spec.ErrExists) {
		_ = s.Driver.Remove(s.ctx, h2)
		t.Errorf("Create of another run under ID %s = %v; want ErrExists", r.ID, err)
	}
	h, addr := s.start(t, again)
	s.waitRedis(t, h, addr)
	// Create of a started instance's run still returns it, running.
	if again, err := s.Driver.Create(s.ctx, r); err != nil || again.Ref != h.Ref {
		t.Errorf("Create of the started %s = %+v, %v; want the same instance", r.ID, again, err)
	}
	s.assertRunning(t, h, true)
	s.remove(t, h, r.ID)
}

// testStartRunsApp: Start runs the app, which answers on its published
// port and prints its output; Remove of the running instance leaves
// nothing.
func testStartRunsApp(t *testing.T, s *suite) {
	r := s.run(t, drivers.RunLaunch, 1)
	created := s.create(t, r)
	h, addr := s.start(t, created)
	s.waitRedis(t, h, addr)
	s.assertRunning(t, h, true)
	if pid, err := s.Driver.NetPid(s.ctx, h); err != nil || pid <= 0 {
		t.Errorf("NetPid of a running instance = %d, %v; want a PID", pid, err)
	}
	var lines []string
	if bad := s.eventually(func() []string {
		lines, _ = s.Driver.Logs(s.ctx, h, 200)
		if strings.Contains(strings.Join(lines, "\n"), readyLine) {
			return nil
		}
		return []string{"no " + readyLine}
	}); len(bad) > 0 {
		t.Errorf("Logs do not show redis's %q:\n%s", readyLine, strings.Join(lines, "\n"))
	}
	s.assertAppCaps(t, h)
	s.assertKernelHidden(t, h)
	s.redis(t, addr, "OK", "SET", "k", "set before the second Start")
	// Start of a running instance is a no-op: the same app, same address.
	h2, addr2 := s.start(t, h)
	if addr2 != addr {
		t.Errorf("second Start moved 6379/tcp from %s to %s", addr, addr2)
	}
	s.redis(t, addr2, "set before the second Start", "GET", "k")
	s.remove(t, h2, r.ID)
	if s.answers(addr) {
		t.Errorf("something still answers at %s after Remove", addr)
	}
}

// testExec: a command runs inside a started instance, reaches its app on
// the instance's own network, gets the variables it is given, and reports
// its exit code; an instance that is not started, or removed, has no Exec.
func testExec(t *testing.T, s *suite) {
	if s.NoExec != "" {
		t.Skip(s.NoExec)
	}
	r := s.run(t, drivers.RunLaunch, 1)
	created := s.create(t, r)
	if _, err := s.Driver.Exec(s.ctx, created, drivers.Exec{Argv: []string{"true"}}); !errors.Is(err, spec.ErrNotFound) {
		t.Errorf("Exec in a created instance = %v; want ErrNotFound", err)
	}
	h, addr := s.start(t, created)
	s.waitRedis(t, h, addr)
	s.redis(t, addr, "OK", "SET", "k", "set from outside")
	res, err := s.Driver.Exec(s.ctx, h, drivers.Exec{User: s.app.User, Env: []string{"FOG_TEST=inside"},
		Argv: []string{"sh", "-c", `redis-cli -p 6379 GET k && echo "$FOG_TEST"`}})
	if err != nil || res.ExitCode != 0 || res.Output != "set from outside\ninside\n" {
		t.Errorf("Exec(redis-cli GET k; echo $FOG_TEST) = %+v, %v; want exit 0 and both lines", res, err)
	}
	if res, err := s.Driver.Exec(s.ctx, h, drivers.Exec{User: s.app.User, Argv: []string{"sh", "-c", "exit 3"}}); err != nil || res.ExitCode != 3 {
		t.Errorf("Exec(exit 3) = %+v, %v; want exit code 3 and no error", res, err)
	}
	if _, err := s.Driver.Exec(s.ctx, h, drivers.Exec{}); !errors.Is(err, spec.ErrInvalidSpec) {
		t.Errorf("Exec without a command = %v; want ErrInvalidSpec", err)
	}
	s.remove(t, h, r.ID)
	if _, err := s.Driver.Exec(s.ctx, h, drivers.Exec{Argv: []string{"true"}}); err == nil {
		t.Errorf("Exec in a removed instance succeeded")
	}
}

// testCheckpointRestart: the state written before a checkpoint is there in
// an instance restarted from it.
func testCheckpointRestart(t *testing.T, s *suite) {
	r := s.run(t, drivers.RunLaunch, 1)
	h, addr := s.start(t, s.create(t, r))
	s.waitRedis(t, h, addr)
	val := "written before the checkpoint " + r.ID
	s.redis(t, addr, "OK", "SET", "greeting", val)
	// A client still connected during the checkpoint: a restored
	// instance has other addresses, and its engine must not fail on it.
	idle, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("connect to %s: %v", addr, err)
	}
	defer idle.Close()
	_ = idle.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 16)
	if _, err := io.WriteString(idle, "PING\r\n"); err != nil {
		t.Fatalf("PING on the connection kept open: %v", err)
	}
	if n, err := idle.Read(buf); err != nil || !strings.HasPrefix(string(buf[:n]), "+PONG") {
		t.Fatalf("PING on the connection kept open: %q, %v", buf[:n], err)
	}
	ck, err := s.Driver.Checkpoint(s.ctx, h)
	if err != nil {
		t.Fatalf("Checkpoint %s: %v", h.Ref, err)
	}
	if ck.Gen != 1 || ck.Bytes <= 0 {
		t.Errorf("Checkpoint = %+v; want generation 1 with bytes", ck)
	}
	// Exited promises that no process of the instance is left (its root
	// can be unmounted at once).
	if st := procField(h.Pid, "State"); s.NoProcesses == "" && ck.Exited && h.Pid > 0 && st != "" && !strings.HasPrefix(st, "Z") {
		t.Errorf("Checkpoint = %+v, but the instance's main process %d is still there (state %s)", ck, h.Pid, st)
	}
	if bad := s.eventually(func() []string {
		if ok, _ := s.Driver.Running(s.ctx, h); ok {
			return []string{"running"}
		}
		return nil
	}); len(bad) > 0 {
		t.Errorf("the app of %s still runs after its checkpoint", h.Ref)
	}
	s.remove(t, h, r.ID)

	rr := s.run(t, drivers.RunRestart, ck.Gen)
	created := s.create(t, rr)
	if created.Gen != ck.Gen+1 {
		t.Errorf("restart handle gen = %d; want %d (its next checkpoint)", created.Gen, ck.Gen+1)
	}
	s.assertRunning(t, created, false)
	h2, addr2 := s.start(t, created)
	s.waitRedis(t, h2, addr2)
	s.redis(t, addr2, val, "GET", "greeting")
	s.assertAppCaps(t, h2)
	s.assertKernelHidden(t, h2)
	s.remove(t, h2, rr.ID)
}

// testRecycle: a Recycler's instance of a resettable root, once its app
// is released, waits again (nothing answers, the root was reset while it
// held no mount there) and serves the next instance from the checkpoint,
// nothing of the one before; an instance that serves once is
// ErrNotRecyclable and keeps running.
func testRecycle(t *testing.T, s *suite) {
	rc, ok := s.Driver.(drivers.Recycler)
	if !ok {
		t.Skipf("driver %s serves each instance once (no Recycle)", s.Driver.Name())
	}
	if s.ResettableRoot == nil {
		t.Skip("the harness gives no resettable root")
	}
	r := s.run(t, drivers.RunLaunch, 1)
	h, addr := s.start(t, s.create(t, r))
	s.waitRedis(t, h, addr)
	val := "written before the checkpoint " + r.ID
	s.redis(t, addr, "OK", "SET", "greeting", val)
	// A launched instance serves once.
	if _, err := rc.Recycle(s.ctx, h, func(context.Context) error { return nil }); !errors.Is(err, drivers.ErrNotRecyclable) {
		t.Errorf("Recycle of a launched instance: %v; want ErrNotRecyclable", err)
	}
	if !s.answers(addr) {
		t.Errorf("the launched instance %s stopped answering after a refused Recycle", h.Ref)
	}
	ck, err := s.Driver.Checkpoint(s.ctx, h)
	if err != nil {
		t.Fatalf("Checkpoint %s: %v", h.Ref, err)
	}
	s.remove(t, h, r.ID)

	root, reset := s.ResettableRoot(t)
	rr := s.run(t, drivers.RunRestart, ck.Gen)
	rr.EnvPath, rr.Resettable = root, true
	h = s.create(t, rr)
	if !h.Recycle && !s.ServesOnce {
		s.remove(t, h, rr.ID)
		t.Fatalf("a %s restore on a resettable root was created to serve once; want an instance that serves again", s.Engine)
	}
	if !h.Recycle {
		h, addr = s.start(t, h)
		s.waitRedis(t, h, addr)
		if _, err := rc.Recycle(s.ctx, h, reset); !errors.Is(err, drivers.ErrNotRecyclable) {
			t.Errorf("Recycle of an instance created to serve once: %v; want ErrNotRecyclable", err)
		}
		s.redis(t, addr, val, "GET", "greeting")
		s.remove(t, h, rr.ID)
		return
	}
	for round := 1; round <= 2; round++ {
		h.Deployment = rr.ID + "-" + strconv.Itoa(round)
		h, addr = s.start(t, h)
		s.waitRedis(t, h, addr)
		s.redis(t, addr, val, "GET", "greeting")
		s.redis(t, addr, "0", "DEL", "scratch") // the instance before set it
		s.assertAppCaps(t, h)
		s.assertKernelHidden(t, h)
		s.redis(t, addr, "OK", "SET", "scratch", h.Deployment)
		resets := 0
		h2, err := rc.Recycle(s.ctx, h, func(ctx context.Context) error { resets++; return reset(ctx) })
		if err != nil {
			t.Fatalf("round %d: Recycle %s: %v", round, h.Ref, err)
		}
		if h2.Ref != h.Ref || h2.Deployment != "" || resets != 1 {
			t.Errorf("round %d: Recycle = %+v after %d resets; want the same instance %s, bound to no deployment, reset once", round, h2, resets, h.Ref)
		}
		if s.answers(addr) {
			t.Errorf("round %d: the recycled instance %s still answers before its next start", round, h.Ref)
		}
		s.assertRunning(t, h2, false)
		h = h2
	}
	s.remove(t, h, rr.ID)
}

// assertAppCaps checks, with Harness.CheckAppCaps, that no process below
// the instance's NetPid (the app, its keeper, DMTCP's coordinator) holds
// an effective capability beyond AppCaps, except CRIU's own: criu itself
// and the placeholder init of a restore's PID namespace (sleep).
func (s *suite) assertAppCaps(t *testing.T, h drivers.Handle) {
	t.Helper()
	if !s.CheckAppCaps {
		return
	}
	allowed, err := runtime.CapMask(s.AppCaps)
	if err != nil {
		t.Fatal(err)
	}
	root, err := s.Driver.NetPid(s.ctx, h)
	if err != nil || root <= 0 {
		t.Fatalf("NetPid of %s = %d, %v", h.Ref, root, err)
	}
	procs := descendants(root)
	if s.NetPidIsApp {
		procs = engine.InPIDNamespace(root)
	}
	seen, users := 0, 0
	for _, pid := range procs {
		comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
		name := strings.TrimSpace(string(comm))
		if name == "criu" || name == "sleep" || name == "" {
			continue
		}
		eff, err := strconv.ParseUint(procField(pid, "CapEff"), 16, 64)
		if err != nil {
			continue // gone meanwhile
		}
		seen++
		if extra := eff &^ allowed; extra != 0 {
			t.Errorf("%s (pid %d) of %s holds capabilities %#x beyond %v", name, pid, h.Ref, extra, s.AppCaps)
		}
		// Real, effective, saved and file-system uid: none is root.
		if uids := strings.Fields(procField(pid, "Uid")); len(uids) == 4 && !slices.Contains(uids, "0") {
			users++
		}
	}
	if seen == 0 {
		t.Errorf("no process below pid %d of %s", root, h.Ref)
	}
	if s.User != "" && users == 0 {
		t.Errorf("no process of %s runs as user %s (every uid not root)", h.Ref, s.User)
	}
}

// assertKernelHidden checks that the app sees the kernel's control surface
// hidden as in any Docker container (internal/procfs): every process of
// the instance that is chrooted into the environment (its mount table has
// /proc/sys) has each of procfs.Masked that this kernel has covered by a
// mount, and each of procfs.ReadOnly read-only; and there is at least one
// such process. It reads the mounts, not whether a write fails: on this
// machine's kernel some paths do not exist, on a node's they do.
func (s *suite) assertKernelHidden(t *testing.T, h drivers.Handle) {
	t.Helper()
	if s.NoProcesses != "" {
		return
	}
	root, err := s.Driver.NetPid(s.ctx, h)
	if err != nil || root <= 0 {
		t.Fatalf("NetPid of %s = %d, %v", h.Ref, root, err)
	}
	seen := 0
	for _, pid := range append([]int{root}, descendants(root)...) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/mountinfo")
		if err != nil || !strings.Contains(string(b), " /proc/sys ") {
			continue
		}
		seen++
		if open := procfs.Hidden(string(b), "/proc"); len(open) > 0 {
			comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
			t.Errorf("%s (pid %d) of %s sees the kernel's %s", strings.TrimSpace(string(comm)), pid, h.Ref, strings.Join(open, ", "))
		}
	}
	if seen == 0 {
		t.Errorf("no process of %s is chrooted with a /proc/sys", h.Ref)
	}
}

// descendants lists the processes below pid (children, theirs, ...).
func descendants(pid int) []int {
	kids := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp, err := strconv.Atoi(procField(p, "PPid")); err == nil {
			kids[pp] = append(kids[pp], p)
		}
	}
	var out []int
	for todo := kids[pid]; len(todo) > 0; {
		p := todo[0]
		todo = append(todo[1:], kids[p]...)
		out = append(out, p)
	}
	return out
}

// procField is a field of /proc/PID/status ("" if unreadable).
func procField(pid int, field string) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// testInvalidRun: runs that cannot start are refused at Create and leave
// nothing.
func testInvalidRun(t *testing.T, s *suite) {
	cases := map[string]func(r *drivers.Run){
		"empty command": func(r *drivers.Run) { r.App.Command = nil },
		"unknown mode":  func(r *drivers.Run) { r.Mode = drivers.RunMode("fork") },
		"no mode":       func(r *drivers.Run) { r.Mode = "" },
	}
	for name, mutate := range cases {
		t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
			r := s.run(t, drivers.RunLaunch, 1)
			mutate(&r)
			h, err := s.Driver.Create(s.ctx, r)
			if !errors.Is(err, spec.ErrInvalidSpec) {
				if err == nil {
					_ = s.Driver.Remove(s.ctx, h)
				}
				t.Errorf("Create with %s = %v; want ErrInvalidSpec", name, err)
			}
			s.assertNothingLeft(t, r.ID)
		})
	}
}
