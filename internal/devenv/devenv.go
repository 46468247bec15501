// Package devenv knows where the project's development services live.
//
// `make dev-up` (scripts/dev-ceph.sh, scripts/dev-docker.sh) starts a one-node
// Ceph cluster and a dockerd under one state directory. fogctl, pop-agent and
// the tests find them through the functions here when no flag or environment
// variable names another cluster.
package devenv

import (
	"os"
	"path/filepath"
)

// Environment variables understood by every fogdeploy command and test.
const (
	EnvDevDir      = "FOGDEPLOY_DEV_DIR"
	EnvCephConf    = "FOGDEPLOY_CEPH_CONF"
	EnvCephKeyring = "FOGDEPLOY_CEPH_KEYRING"
	EnvCephID      = "FOGDEPLOY_CEPH_ID"
	EnvCephPool    = "FOGDEPLOY_CEPH_POOL"
	EnvDockerHost  = "DOCKER_HOST"
	// EnvTestRootfs names the Debian bookworm root file system with
	// redis-server that the engine and container tests run apps in.
	EnvTestRootfs = "FOGDEPLOY_TEST_ROOTFS"
	// EnvTestPyRootfs names the one with python3 and no libstdc++6 or
	// libatomic1: only the app and a glibc.
	EnvTestPyRootfs = "FOGDEPLOY_TEST_PY_ROOTFS"
)

// Where scripts/test-fixtures.sh (run by `make test`) builds those root
// file systems.
const (
	DefaultTestRootfs   = "/var/cache/fogdeploy/test-rootfs"
	DefaultTestPyRootfs = "/var/cache/fogdeploy/test-rootfs-python"
)

// TestRootfs returns $FOGDEPLOY_TEST_ROOTFS, else DefaultTestRootfs.
func TestRootfs() string { return Lookup(EnvTestRootfs, DefaultTestRootfs) }

// EtcdEndpoint is where the dev etcd (scripts/dev-etcd.sh, the embedded
// etcd of `pop-agent etcd`) listens.
const EtcdEndpoint = "127.0.0.1:23790"

// DefaultPool is the RBD pool that dev-up creates.
const DefaultPool = "fogdeploy"

// Dir returns the development state directory:
// $FOGDEPLOY_DEV_DIR, else $XDG_STATE_HOME/fogdeploy/dev, else
// $HOME/.local/state/fogdeploy/dev. It mirrors scripts/lib.sh.
func Dir() string {
	if d := os.Getenv(EnvDevDir); d != "" {
		return d
	}
	state := os.Getenv("XDG_STATE_HOME")
	if state == "" {
		home, err := os.UserHomeDir()
		if err != nil || home == "" {
			home = "/root"
		}
		state = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(state, "fogdeploy", "dev")
}

// CephConf is the conf file written by dev-up.
func CephConf() string { return filepath.Join(Dir(), "ceph", "ceph.conf") }

// CephKeyring is the admin keyring written by dev-up.
func CephKeyring() string { return filepath.Join(Dir(), "ceph", "ceph.client.admin.keyring") }

// DockerHost is the socket of the dockerd started by dev-up.
func DockerHost() string { return "unix://" + filepath.Join(Dir(), "docker", "docker.sock") }

// Lookup returns the environment variable if set, else def.
func Lookup(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
