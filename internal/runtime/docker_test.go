package runtime_test

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/devenv"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/runtime/runtimetest"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

const dockerTestImage = "fogdeploy-test/busybox:runtimetest"

// dockerForTest connects to $DOCKER_HOST, else to the dev dockerd of
// `make dev-up`, or skips (fails when FOGDEPLOY_REQUIRE lists docker).
func dockerForTest(t *testing.T) *runtime.Docker {
	t.Helper()
	testenv.SkipShort(t, testenv.Docker)
	host := devenv.Lookup(devenv.EnvDockerHost, devenv.DockerHost())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := runtime.Dial(ctx, host, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		testenv.Unavailable(t, testenv.Docker, err.Error())
	}
	return d
}

// busyboxImage imports the suite's image from the host's static busybox.
func busyboxImage(t *testing.T, d *runtime.Docker) string {
	t.Helper()
	const bb = "/bin/busybox"
	if _, err := os.Stat(bb); err != nil {
		testenv.Unavailable(t, testenv.Docker, "no static busybox at "+bb+" to build the test image (apt-get install busybox-static)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := runtimetest.ImportBusybox(ctx, d, dockerTestImage, bb); err != nil {
		t.Fatalf("import the busybox image: %v", err)
	}
	return dockerTestImage
}

func TestDockerSuite(t *testing.T) {
	d := dockerForTest(t)
	img := busyboxImage(t, d)
	runtimetest.RunSuite(t, func(t *testing.T) runtimetest.Harness {
		return runtimetest.Harness{Runtime: d, Image: img}
	})
}

func TestDockerImageSuite(t *testing.T) {
	d := dockerForTest(t)
	if _, err := os.Stat("/bin/busybox"); err != nil {
		testenv.Unavailable(t, testenv.Docker, "no static busybox at /bin/busybox to build the test images (apt-get install busybox-static)")
	}
	runtimetest.RunImageSuite(t, d, "/bin/busybox")
}

// TestDockerLimits: a container created with limits runs with them (its
// open files, processes, memory), keeps its output in bounded files, and
// Logs reads at most MaxLogBytes of a larger output.
func TestDockerLimits(t *testing.T) {
	d := dockerForTest(t)
	img := busyboxImage(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	run := func(script string) (string, string) {
		t.Helper()
		spec := runtime.Spec{Deployment: "limits-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36), App: "limits", Image: img,
			Cmd: []string{"sh", "-c", script}, PidsLimit: 64, OpenFiles: 1000, MemoryBytes: 64 << 20, NanoCPUs: 5e8, LogBytes: 2 << 20, LogFiles: 2}
		id, err := d.Create(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Remove(context.Background(), id) })
		if err := d.Start(ctx, id); err != nil {
			t.Fatal(err)
		}
		if code, err := d.Wait(ctx, id); err != nil || code != 0 {
			t.Fatalf("Wait = %d, %v", code, err)
		}
		out, err := d.Logs(ctx, id, 0)
		if err != nil {
			t.Fatal(err)
		}
		return id, out
	}
	_, out := run("ulimit -n; cat /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/pids.max /sys/fs/cgroup/memory.max")
	if f := strings.Fields(out); len(f) != 3 || f[0] != "1000" || f[1] != "64" || f[2] != strconv.Itoa(64<<20) {
		t.Errorf("inside: open files, pids, memory = %q; want 1000, 64, %d", out, 64<<20)
	}
	id, out := run("head -c 3000000 /dev/zero | tr '\\0' a; echo; echo end")
	if len(out) > runtime.MaxLogBytes+200 || !strings.HasPrefix(out, "[fogdeploy: earlier output cut") || !strings.HasSuffix(out, "end\n") {
		t.Errorf("Logs of 3 MB of output: %d bytes, starting %q; want the last %d bytes after a line that says so", len(out), out[:min(len(out), 80)], runtime.MaxLogBytes)
	}
	cmd := exec.CommandContext(ctx, "docker", "inspect", "--format", "{{json .HostConfig.LogConfig}}", id)
	cmd.Env = append(os.Environ(), "DOCKER_HOST="+devenv.Lookup(devenv.EnvDockerHost, devenv.DockerHost()))
	if b, err := cmd.Output(); err != nil || !strings.Contains(string(b), `"max-file":"2"`) || !strings.Contains(string(b), `"max-size":"`+strconv.Itoa(2<<20)+`"`) {
		t.Errorf("the container's log config = %s, %v; want json-file of 2 files of 2 MiB", b, err)
	}
}
