//go:build !no_ceph

package cephstore_test

import (
	"bytes"
	"context"
	"errors"
	"strconv"
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

// TestIOCounters: writing and reading an image moves the OSDs' own I/O
// counters by at least the bytes written and read.
func TestIOCounters(t *testing.T) {
	s := open(t)
	ctx := context.Background()
	name := "t-iocount-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	const size = 4 << 20
	if err := s.Create(ctx, name, size); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Remove(context.Background(), name) })
	before, err := s.IOCounters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if before.OSDs < 1 {
		t.Fatalf("IOCounters read %d OSDs, want at least 1", before.OSDs)
	}
	data := bytes.Repeat([]byte{0xfd}, size)
	if err := s.Write(ctx, name, bytes.NewReader(data), size); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, size)
	if _, err := s.ReadAt(ctx, name, got, 0); err != nil {
		t.Fatal(err)
	}
	after, err := s.IOCounters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d := after.Sub(before)
	if d.Written < size || d.Read < size {
		t.Fatalf("after writing and reading %d bytes the OSDs counted %d written and %d read", size, d.Written, d.Read)
	}
}
