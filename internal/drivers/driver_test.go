//go:build !no_ceph

package drivers_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/drivers/drivertest"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/overlay"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
	"golang.org/x/sys/unix"
)

// TestDriverSuiteContainer runs the driver suite on the Container driver:
// redis under DMTCP in the DMTCP container on the dev dockerd, from mounted
// clones of a redis environment in the dev pool.
func TestDriverSuiteContainer(t *testing.T) {
	f := deploytest.NewFixture(t, "container")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := f.Container.Check(ctx, engine.NameDMTCP); err != nil {
		testenv.Unavailable(t, testenv.DMTCP, err.Error())
	}
	drivertest.RunSuite(t, func(t *testing.T) drivertest.Harness {
		env, ckpt := f.Mount(t, mountID())
		return drivertest.Harness{Driver: f.Container, Engine: engine.NameDMTCP, EnvPath: env, CkptPath: ckpt,
			Leftovers: drivertest.ContainerLeftovers(f.RT), CheckAppCaps: true, ResettableRoot: resettableRoot(env)}
	})
}

// TestDriverSuiteContainerCRIU runs the driver suite on the Container
// driver with the criu engine: redis under CRIU in the light container,
// whose entrypoint runs criu check, dump and restore itself.
func TestDriverSuiteContainerCRIU(t *testing.T) { containerCRIUSuite(t, "") }

// TestDriverSuiteContainerCRIUUser runs the driver suite on the Container
// driver with the criu engine and an app that runs as a user of its
// environment (redis): launched, checkpointed, restored and recycled, it
// runs as that user and holds no capability.
func TestDriverSuiteContainerCRIUUser(t *testing.T) { containerCRIUSuite(t, "redis") }

// containerCRIUSuite runs the driver suite under CRIU in the light
// container, the app as user ("": root, keeping a root daemon's
// capabilities).
func containerCRIUSuite(t *testing.T, user string) {
	f := deploytest.NewFixture(t, "container")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := f.Container.Check(ctx, engine.NameCRIU); err != nil {
		testenv.Unavailable(t, testenv.CRIU, err.Error())
	}
	var caps []string
	if user == "" {
		caps = runtime.CRIUAppCapabilities()
	}
	drivertest.RunSuite(t, func(t *testing.T) drivertest.Harness {
		env, ckpt := f.Mount(t, mountID())
		return drivertest.Harness{Driver: f.Container, Engine: engine.NameCRIU, EnvPath: env, CkptPath: ckpt,
			Leftovers: drivertest.ContainerLeftovers(f.RT), CheckAppCaps: true, AppCaps: caps, User: user,
			ResettableRoot: resettableRoot(env)}
	})
}

// TestDriverSuiteHost runs the driver suite on the Host driver: redis
// under CRIU, chrooted into mounted clones of a redis environment in the
// dev pool; no process of the instance holds a capability.
func TestDriverSuiteHost(t *testing.T) { hostSuite(t, engine.NameCRIU) }

// TestDriverSuiteHostDMTCP is TestDriverSuiteHost under DMTCP.
func TestDriverSuiteHostDMTCP(t *testing.T) { hostSuite(t, engine.NameDMTCP) }

func hostSuite(t *testing.T, eng engine.Name) {
	f := deploytest.NewFixture(t, "host")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := f.Host.Check(ctx, eng); err != nil {
		testenv.Unavailable(t, string(eng), err.Error())
	}
	drivertest.RunSuite(t, func(t *testing.T) drivertest.Harness {
		env, ckpt := f.Mount(t, mountID())
		// After Mount: the mapper's own processes are not the driver's.
		return drivertest.Harness{Driver: f.Host, Engine: eng, EnvPath: env, CkptPath: ckpt,
			Leftovers: drivertest.ProcessLeftovers(), CheckAppCaps: true, NetPidIsApp: true}
	})
}

// resettableRoot binds env at a root under a shared mount directory, as
// a slot's overlay root is mounted; its reset unmounts and binds it again,
// which an instance that binds the directory with slave propagation sees.
func resettableRoot(env string) func(t *testing.T) (string, func(context.Context) error) {
	return func(t *testing.T) (string, func(context.Context) error) {
		mnt := filepath.Join(t.TempDir(), "mnt")
		if err := overlay.MountShared(mnt); err != nil {
			t.Fatal(err)
		}
		root := filepath.Join(mnt, "root")
		bind := func() error {
			if err := os.MkdirAll(root, 0o755); err != nil {
				return err
			}
			return unix.Mount(env, root, "", unix.MS_BIND, "")
		}
		if err := bind(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = unix.Unmount(root, unix.MNT_DETACH)
			_ = overlay.UnmountShared(mnt)
		})
		return root, func(context.Context) error {
			if err := unix.Unmount(root, 0); err != nil {
				return err
			}
			return bind()
		}
	}
}

var mounts atomic.Int64

// mountID names the clones of one subtest of the driver suite.
func mountID() string {
	return "dts-" + strconv.FormatInt(time.Now().UnixNano()%1e8, 36) + "-" + strconv.FormatInt(mounts.Add(1), 10)
}

// driverSuites are the drivers' behaviour suites of each engine of the
// registry: in the light container and on the host.
var driverSuites = map[engine.Name]struct{ container, host func(*testing.T) }{
	engine.NameDMTCP: {TestDriverSuiteContainer, TestDriverSuiteHostDMTCP},
	engine.NameCRIU:  {TestDriverSuiteContainerCRIU, TestDriverSuiteHost},
}

// TestEveryEngineHasDriverSuites: every engine of the registry runs the
// drivers' behaviour suite in the light container and on the host.
func TestEveryEngineHasDriverSuites(t *testing.T) {
	for _, eng := range engine.Names() {
		if s := driverSuites[eng]; s.container == nil || s.host == nil {
			t.Errorf("engine %s is registered without the drivers' suite in the container and on the host: add both (drivertest.RunSuite), list them in driverSuites and in .ci/run's must-pass tests", eng)
		}
	}
}
