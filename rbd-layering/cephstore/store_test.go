//go:build !no_ceph

package cephstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/testenv"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/cephstore"
	"github.com/fogdeploy/fogdeploy/rbd-layering/storetest"
)

func open(t *testing.T) *cephstore.Store {
	c := testenv.CephCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := cephstore.Open(ctx, cephstore.Config{Conf: c.Conf, Keyring: c.Keyring, ID: c.ID, Pool: c.Pool})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestSuiteCeph runs the layering behaviour suite on the real cluster.
func TestSuiteCeph(t *testing.T) {
	storetest.RunSuite(t, func(t *testing.T) layering.Backend { return open(t) })
}

// TestUnreachableCluster: a cluster that does not answer gives
// ErrUnavailable within the configured bound instead of a hang.
func TestUnreachableCluster(t *testing.T) {
	conf := t.TempDir() + "/down.conf"
	writeFile(t, conf, "[global]\nmon host = 127.0.0.1:1\nauth cluster required = none\nauth service required = none\nauth client required = none\n")
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := cephstore.Open(ctx, cephstore.Config{Conf: conf, Timeout: 3 * time.Second})
	if !errors.Is(err, layering.ErrUnavailable) {
		t.Fatalf("Open on a dead cluster = %v, want ErrUnavailable", err)
	}
	if el := time.Since(start); el > 20*time.Second {
		t.Fatalf("Open on a dead cluster took %s, want it bounded by the timeout", el)
	}
	if layering.Hint(err) == "" {
		t.Errorf("error %q carries no hint", err)
	}
}

func TestConfigValidate(t *testing.T) {
	err := cephstore.Config{Conf: "/nonexistent/ceph.conf", Keyring: "/nonexistent/keyring", Timeout: -1}.Validate()
	if err == nil {
		t.Fatal("Validate accepted a missing conf")
	}
	for _, want := range []string{"ceph conf /nonexistent/ceph.conf", "ceph keyring /nonexistent/keyring", "timeout"} {
		if !containsStr(err.Error(), want) {
			t.Errorf("Validate() = %q, missing %q", err, want)
		}
	}
}
