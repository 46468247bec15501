//go:build !no_ceph

package layering_test

import (
	"context"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/testenv"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/cephstore"
	"github.com/fogdeploy/fogdeploy/rbd-layering/envtest"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// TestEnvSuiteCeph runs the environment suite on the real cluster, with
// images mapped by the backend the node supports (rbd-fuse + loop here).
func TestEnvSuiteCeph(t *testing.T) {
	testenv.NeedRoot(t)
	// The suite compares the whole pool before and after failing steps.
	c := testenv.PrivatePool(t, testenv.CephCluster(t))
	envtest.RunSuite(t, func(t *testing.T) *envtest.Parts {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		s, err := cephstore.Open(ctx, cephstore.Config{Conf: c.Conf, Keyring: c.Keyring, ID: c.ID, Pool: c.Pool})
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		envtest.UnmountLeft(t, dir)
		mc := mapper.Config{Backend: mapper.BackendAuto, StateDir: dir + "/mapper", CephConf: c.Conf, Keyring: c.Keyring, ID: c.ID}
		lc := layering.DefaultManagerConfig(dir + "/work")
		lc.HostNetwork = true // the suite tries --network=host too
		l, err := envtest.NewParts(ctx, s, c.Pool, mc, lc)
		if err != nil {
			s.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return l
	})
}
