package runtime_test

import (
	"context"
	"log/slog"
	"os"
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
