package testenv

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/devenv"
)

// CephConn is what a test needs to reach a cluster.
type CephConn struct {
	Conf, Keyring, ID, Pool string
}

// CephCluster returns the cluster named by FOGDEPLOY_CEPH_* or the one
// `make dev-up` started, after checking within 10 s that it answers.
func CephCluster(t testing.TB) CephConn {
	t.Helper()
	SkipShort(t, Ceph)
	c := CephConn{
		Conf:    devenv.Lookup(devenv.EnvCephConf, devenv.CephConf()),
		Keyring: devenv.Lookup(devenv.EnvCephKeyring, devenv.CephKeyring()),
		ID:      devenv.Lookup(devenv.EnvCephID, "admin"),
		Pool:    devenv.Lookup(devenv.EnvCephPool, devenv.DefaultPool),
	}
	if _, err := os.Stat(c.Conf); err != nil {
		Unavailable(t, Ceph, "no ceph conf at "+c.Conf+": run `make dev-up`")
	}
	if _, err := os.Stat(c.Keyring); err != nil {
		c.Keyring = ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "ceph", append(c.args(), "--connect-timeout", "8", "health")...).CombinedOutput(); err != nil {
		Unavailable(t, Ceph, "`ceph health` via "+c.Conf+" failed: "+string(out)+err.Error())
	}
	return c
}

// args are the CLI arguments that reach the cluster as c does (rbd takes
// no --connect-timeout).
func (c CephConn) args() []string {
	args := []string{"-c", c.Conf, "--id", c.ID}
	if c.Keyring != "" {
		args = append(args, "--keyring", c.Keyring)
	}
	return args
}

// PrivatePool returns c with a pool of the test's own, so that a test which
// compares the whole pool before and after does not see the images of
// other packages' tests running at the same time. It is the pool
// `make dev-up` makes for it ('<pool>-envtest'), when that pool exists
// and is empty: creating or removing a pool while another test unprotects
// a snapshot can stall that test (librbd looks for clones in every pool).
// Otherwise it creates one now and removes it when the test ends. When
// FOGDEPLOY_CEPH_POOL names a pool the test uses that one (a cluster the
// test may not create pools in) and says so.
func PrivatePool(t testing.TB, c CephConn) CephConn {
	t.Helper()
	if os.Getenv(devenv.EnvCephPool) != "" {
		t.Logf("using the pool %s=%s, which other tests may share", devenv.EnvCephPool, c.Pool)
		return c
	}
	run := func(tool string, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, tool, append(c.args(), args...)...).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("%s %s: %w: %s", tool, strings.Join(args, " "), err, bytes.TrimSpace(out))
		}
		return string(out), nil
	}
	test := c.Pool + "-envtest"
	if pools, err := run("ceph", "osd", "pool", "ls"); err == nil && slices.Contains(strings.Fields(pools), test) {
		images, err := run("rbd", "ls", "-p", test)
		if err == nil && strings.TrimSpace(images) == "" {
			c.Pool = test
			return c
		}
		t.Logf("the test pool %s is not empty (%v): the test makes a pool of its own", test, err)
	}
	name := fmt.Sprintf("fdt-%06x", rand.Uint32()&0xffffff)
	if _, err := run("ceph", "osd", "pool", "create", name, "8", "8", "replicated"); err != nil {
		t.Fatalf("creating the test's own pool: %v", err)
	}
	t.Cleanup(func() {
		if _, err := run("ceph", "osd", "pool", "rm", name, name, "--yes-i-really-really-mean-it"); err != nil {
			t.Errorf("removing the test's pool: %v", err)
		}
	})
	if _, err := run("rbd", "pool", "init", name); err != nil {
		t.Fatalf("initializing the test's own pool: %v", err)
	}
	c.Pool = name
	return c
}
