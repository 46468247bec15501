//go:build !no_ceph

package gc_test

import (
	"context"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/testenv"
	"github.com/fogdeploy/fogdeploy/rbd-layering/cephstore"
)

// TestGCCeph runs the same plan and apply against the real pool.
func TestGCCeph(t *testing.T) {
	c := testenv.CephCluster(t)
	s, err := cephstore.Open(context.Background(), cephstore.Config{Conf: c.Conf, Keyring: c.Keyring, ID: c.ID, Pool: c.Pool})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	testGC(t, s)
}
