package testenv

import (
	"context"
	"os"
	"os/exec"
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
	args := []string{"-c", c.Conf, "--id", c.ID, "--connect-timeout", "8"}
	if c.Keyring != "" {
		args = append(args, "--keyring", c.Keyring)
	}
	if out, err := exec.CommandContext(ctx, "ceph", append(args, "health")...).CombinedOutput(); err != nil {
		Unavailable(t, Ceph, "`ceph health` via "+c.Conf+" failed: "+string(out)+err.Error())
	}
	return c
}
