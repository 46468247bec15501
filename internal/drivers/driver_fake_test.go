package drivers_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/drivers/drivertest"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
)

// TestDriverSuiteContainerFake runs the driver suite on the Container
// driver over runtime.Fake and its fake DMTCP image (runtime.FakeDMTCP):
// no service needed, so it runs in every `go test`.
func TestDriverSuiteContainerFake(t *testing.T) {
	drivertest.RunSuite(t, fakeHarness("dmtcp,criu", false))
}

// TestDriverSuiteContainerFakeServesOnce runs the suite with an image
// whose entrypoint recycles CRIU's instances only: the DMTCP restores it
// runs serve once, and Recycle refuses them.
func TestDriverSuiteContainerFakeServesOnce(t *testing.T) {
	drivertest.RunSuite(t, fakeHarness("criu", true))
}

// fakeHarness is the Container driver over runtime.Fake, its fake DMTCP
// image labelled with recycle (drivers.RecycleLabel).
func fakeHarness(recycle string, servesOnce bool) func(t *testing.T) drivertest.Harness {
	return func(t *testing.T) drivertest.Harness {
		rt := runtime.NewFake()
		rt.AddLabelledImage("fogdeploy/dmtcp:fake", runtime.FakeDMTCP(), runtime.ImageConfig{
			Labels: map[string]string{drivers.DMTCPVersionLabel: "fake", drivers.DMTCPGlibcLabel: "2.36", drivers.RecycleLabel: recycle}})
		// The environment needs only what the driver checks before a
		// launch under DMTCP: a glibc.
		env := fakeEnv(t, t.TempDir())
		return drivertest.Harness{
			Driver:      &drivers.Container{RT: rt, StopTimeout: 2 * time.Second},
			Engine:      engine.NameDMTCP,
			EnvPath:     env,
			CkptPath:    t.TempDir(),
			Leftovers:   drivertest.ContainerLeftovers(rt),
			Timeout:     time.Minute,
			NoExec:      "the fake DMTCP image has no shell nor redis-cli to exec (TestDriverSuiteContainer runs it on dockerd)",
			NoProcesses: "the fake runtime runs no processes (TestDriverSuiteContainer reads them on dockerd)",
			// The fake mounts nothing: the root is a directory of its own,
			// and resetting it leaves it as it is.
			ResettableRoot: func(t *testing.T) (string, func(context.Context) error) {
				return fakeEnv(t, filepath.Join(t.TempDir(), "mnt", "root")), func(context.Context) error { return nil }
			},
			ServesOnce: servesOnce,
		}
	}
}

// fakeEnv makes dir an environment with what the driver checks before a
// run under DMTCP: a glibc.
func fakeEnv(t *testing.T, dir string) string {
	t.Helper()
	libc := filepath.Join(dir, "lib", "x86_64-linux-gnu", "libc.so.6")
	if err := os.MkdirAll(filepath.Dir(libc), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(libc, []byte("GNU C Library (Debian GLIBC 2.36-9+deb12u4) stable release version 2.36.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}
