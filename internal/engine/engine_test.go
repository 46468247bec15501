package engine_test

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/engine/enginetest"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// newConfig gives each subtest its own state directory and checks that the
// engine removed everything it put there.
func newConfig(t *testing.T) engine.Config {
	dir := t.TempDir()
	t.Cleanup(func() {
		if ents, _ := os.ReadDir(dir); len(ents) > 0 {
			t.Errorf("engine left %d entries in its temp dir %s (first: %s)", len(ents), dir, ents[0].Name())
		}
	})
	return engine.Config{
		TempDir: dir,
		Logger:  slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
}

// TestDMTCP runs the suite against DMTCP; it skips unless DMTCP is
// installed (Config.Prefix, $FOGDEPLOY_DMTCP_PREFIX, /opt/dmtcp, PATH) and
// we are root.
func TestDMTCP(t *testing.T) {
	enginetest.RunSuite(t, func(t *testing.T) engine.Engine { return engine.NewDMTCP(newConfig(t)) })
}

// TestCRIU runs the suite against CRIU; it skips unless criu is installed
// and `criu check` passes.
func TestCRIU(t *testing.T) {
	enginetest.RunSuite(t, func(t *testing.T) engine.Engine { return engine.NewCRIU(newConfig(t)) })
}

// confined is newConfig with Config.Confine, as the host driver's
// engines run: the suite's chrooted apps then run without capabilities,
// with a private /dev.
func confined(t *testing.T) engine.Config {
	c := newConfig(t)
	c.Confine = true
	return c
}

func TestDMTCPConfined(t *testing.T) {
	enginetest.RunSuite(t, func(t *testing.T) engine.Engine { return engine.NewDMTCP(confined(t)) })
}

func TestCRIUConfined(t *testing.T) {
	enginetest.RunSuite(t, func(t *testing.T) engine.Engine { return engine.NewCRIU(confined(t)) })
}

// envPID1 marks the copy of this test binary that TestDMTCPAsPID1 runs.
const envPID1 = "FOGDEPLOY_ENGINE_TEST_PID1"

// TestDMTCPAsPID1 reruns the DMTCP host lifecycle with the test process as
// PID 1 of a fresh PID namespace, as a container entrypoint is. The app's
// parent is then PID 1 at checkpoint time, so dmtcp_restart forks and exits
// at restore, and the engine must adopt the app as a child subreaper.
func TestDMTCPAsPID1(t *testing.T) {
	if os.Getenv(envPID1) != "" {
		t.Skip("already PID 1")
	}
	if os.Geteuid() != 0 {
		testenv.Unavailable(t, testenv.Root, "needs root for a PID namespace")
	}
	if _, err := engine.NewDMTCP(engine.Config{}).Check(context.Background()); err != nil {
		testenv.Unavailable(t, testenv.DMTCP, err.Error())
	}
	unshare := testenv.HostBinary(t, testenv.DMTCP, "unshare")
	testenv.HostBinary(t, testenv.DMTCP, "redis-server") // the lifecycle it reruns
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, unshare, "--pid", "--fork", "--mount-proc", os.Args[0],
		"-test.run", "^TestDMTCP$/^Host$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), envPID1+"=1")
	out, err := cmd.CombinedOutput()
	var summary []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "suite.go") || strings.Contains(l, "--- ") {
			summary = append(summary, strings.TrimSpace(l))
		}
	}
	if err != nil || !strings.Contains(string(out), "--- PASS: TestDMTCP/Host") ||
		!strings.Contains(string(out), "parent was PID 1") {
		t.Fatalf("lifecycle as PID 1: %v\n%s", err, out)
	}
	t.Logf("as PID 1:\n%s", strings.Join(summary, "\n"))
}

// TestDMTCPGzip checkpoints with DMTCP_GZIP=1 and restores the image.
func TestDMTCPGzip(t *testing.T) {
	e := engine.NewDMTCP(newConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := e.Check(ctx); err != nil {
		testenv.Unavailable(t, testenv.DMTCP, err.Error())
	}
	testenv.HostBinary(t, testenv.DMTCP, "redis-server")
	cli := testenv.HostBinary(t, testenv.DMTCP, "redis-cli")
	const port = "6399" // inside the app's own network namespace
	log := engine.NewLogTail(50)
	p, err := e.Launch(ctx, engine.LaunchSpec{Argv: []string{"redis-server", "--port", port, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--jemalloc-bg-thread", "no", "--daemonize", "no"},
		NetNS: true, Compression: "gzip", Stdout: log, Stderr: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(context.Background()) })
	redis := func(p engine.Process, want string, args ...string) {
		t.Helper()
		argv := append([]string{"nsenter", "--net=/proc/" + strconv.Itoa(p.Pid()) + "/ns/net", cli, "-p", port}, args...)
		if _, err := engine.WaitReady(ctx, engine.ExecProbe{Argv: argv, Want: want},
			engine.ReadyOptions{Timeout: 20 * time.Second, Log: log, Process: p}); err != nil {
			t.Fatal(err)
		}
	}
	redis(p, "OK", "set", "k", "gzipped")
	img, err := e.Checkpoint(ctx, p, t.TempDir()+"/gen1")
	if err != nil {
		t.Fatal(err)
	}
	if img.Compression != "gzip" || img.Bytes > 20e6 {
		t.Fatalf("image not compressed: %s, %d bytes (uncompressed is about 35 MB)", img.Compression, img.Bytes)
	}
	q, err := e.Restore(ctx, img, engine.RestoreSpec{NetNS: true, Stdout: log, Stderr: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Stop(context.Background()) })
	redis(q, "gzipped", "get", "k")
	t.Logf("gzip: checkpoint %v, %.1f MB; restore to process %v", img.Write.Round(time.Millisecond),
		float64(img.Bytes)/1e6, q.Timings().Restore.Round(time.Millisecond))
	if err := q.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// suites are the conformance suites of the registry's engines, each run
// on the host and confined (the host driver's): an engine registered
// without its entries here fails TestEveryEngineHasItsSuite.
var suites = map[engine.Name][]func(*testing.T){
	engine.NameDMTCP: {TestDMTCP, TestDMTCPConfined},
	engine.NameCRIU:  {TestCRIU, TestCRIUConfined},
}

// TestEveryEngineHasItsSuite: every engine of the registry has its
// conformance suite (enginetest.RunSuite) on the host and confined, and
// no suite stands for an engine the registry lacks.
func TestEveryEngineHasItsSuite(t *testing.T) {
	for _, eng := range engine.Names() {
		if len(suites[eng]) < 2 {
			t.Errorf("engine %s is registered without its conformance suites: add Test<Engine> and Test<Engine>Confined running enginetest.RunSuite over it, list them in suites, and in .ci/run's must-pass tests", eng)
		}
	}
	for eng := range suites {
		if _, ok := engine.Lookup(eng); !ok {
			t.Errorf("a suite stands for %s, which the registry lacks", eng)
		}
	}
}
