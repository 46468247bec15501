// Package testenv decides whether a test that needs a real service runs,
// skips, or fails.
//
// A test that needs Ceph, dockerd, etcd or a checkpoint engine calls
// Unavailable(t, service, reason) when the service cannot be reached. The
// test then skips with the reason, unless the service is listed in
// FOGDEPLOY_REQUIRE (comma separated, or "all"): CI sets it so that a
// skip there fails the run instead of hiding a missing service.
package testenv

import (
	"os"
	"slices"
	"strings"
	"testing"
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

// NeedRoot skips (or fails) a test that mounts or attaches loop devices.
func NeedRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, Root, "the test mounts filesystems and attaches loop devices")
	}
}
