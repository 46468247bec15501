// Package testenv decides whether a test that needs a real service runs,
// skips, or fails.
//
// A test that needs Ceph, dockerd, etcd or a checkpoint engine calls
// Unavailable(t, service, reason) when the service cannot be reached. The
// test then skips with the reason, unless the service is listed in
// FOGDEPLOY_REQUIRE (comma separated, or "all"): CI sets it so that a
// skip there fails the run instead of hiding a missing service. Under
// `go test -short` every such test skips (SkipShort): what is left are
// the unit tests.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/devenv"
)

// EnvRequire lists the services whose tests must not skip.
const EnvRequire = "FOGDEPLOY_REQUIRE"

// Services understood by Unavailable.
const (
	Ceph   = "ceph"
	Docker = "docker"
	Etcd   = "etcd"
	Root   = "root"
	DMTCP  = "dmtcp"
	CRIU   = "criu"
)

// Required reports whether service is listed in FOGDEPLOY_REQUIRE.
func Required(service string) bool {
	list := strings.Split(os.Getenv(EnvRequire), ",")
	for i := range list {
		list[i] = strings.TrimSpace(list[i])
	}
	return slices.Contains(list, service) || slices.Contains(list, "all")
}

// Unavailable skips the test with the reason, or fails it when the service
// is required.
func Unavailable(t testing.TB, service, reason string) {
	t.Helper()
	if Required(service) {
		t.Fatalf("%s is required here (%s=%s) but unavailable: %s", service, EnvRequire, os.Getenv(EnvRequire), reason)
	}
	t.Skipf("%s unavailable: %s (set %s=%s to make this a failure)", service, reason, EnvRequire, service)
}

// SkipShort skips, under `go test -short` (the unit tests: no root, no
// service), a test that needs service, whatever FOGDEPLOY_REQUIRE says.
func SkipShort(t testing.TB, service string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("needs %s: not a unit test (-short)", service)
	}
}

// NeedRoot skips (or fails) a test that mounts or attaches loop devices.
func NeedRoot(t testing.TB) {
	t.Helper()
	SkipShort(t, Root)
	if os.Geteuid() != 0 {
		Unavailable(t, Root, "the test mounts filesystems and attaches loop devices")
	}
}

// RedisRootfs returns the Debian bookworm root file system with
// redis-server that engine and container tests run apps in
// (devenv.TestRootfs: $FOGDEPLOY_TEST_ROOTFS, else the one
// scripts/test-fixtures.sh builds for `make test`). When it is missing the
// test skips, or fails when service is required.
func RedisRootfs(t testing.TB, service string) string {
	t.Helper()
	return fixtureRootfs(t, service, devenv.TestRootfs(), devenv.EnvTestRootfs, "redis-server")
}

// PythonRootfs returns the Debian bookworm root file system with python3
// and no libstdc++6 or libatomic1 ($FOGDEPLOY_TEST_PY_ROOTFS, else the one
// scripts/test-fixtures.sh builds); like RedisRootfs when it is missing.
func PythonRootfs(t testing.TB, service string) string {
	t.Helper()
	return fixtureRootfs(t, service, devenv.Lookup(devenv.EnvTestPyRootfs, devenv.DefaultTestPyRootfs), devenv.EnvTestPyRootfs, "python3")
}

func fixtureRootfs(t testing.TB, service, root, env, app string) string {
	t.Helper()
	SkipShort(t, service)
	if _, err := os.Stat(filepath.Join(root, "usr", "bin", app)); err != nil {
		Unavailable(t, service, fmt.Sprintf("no root file system with %s at %s: run `bash scripts/test-fixtures.sh` "+
			"(make test does) or set %s: %v", app, root, env, err))
	}
	return root
}

// HostBinary returns the path of a program the test runs on the host; when
// it is not installed the test skips, or fails when service is required.
// scripts/test-fixtures.sh installs the ones the tests use.
func HostBinary(t testing.TB, service, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Unavailable(t, service, fmt.Sprintf("%s is not installed on the host: run `bash scripts/test-fixtures.sh` (make test does)", name))
	}
	return p
}
