//go:build !no_ceph

package cephstore_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/hint"
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
	if hint.Of(err) == "" {
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

// TestRemoveFinishesHalfRemoved: a removal that a killed process left half
// done (the image's header is gone, the pool's directory still lists it,
// so it cannot be opened) is finished by Remove instead of being reported
// as not found and left in the pool.
func TestRemoveFinishesHalfRemoved(t *testing.T) {
	s := open(t)
	c := testenv.CephCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := "t-half-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	if err := s.Create(ctx, name, 8<<20); err != nil {
		t.Fatal(err)
	}
	ceph := func(tool string, args ...string) string {
		t.Helper()
		full := append([]string{"-c", c.Conf, "--keyring", c.Keyring, "--id", c.ID, "-p", c.Pool}, args...)
		out, err := exec.CommandContext(ctx, tool, full...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", tool, args, err, out)
		}
		return string(out)
	}
	var info struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(ceph("rbd", "info", name, "--format", "json")), &info); err != nil || info.ID == "" {
		t.Fatalf("rbd info %s: id %q, %v", name, info.ID, err)
	}
	ceph("rados", "rm", "rbd_header."+info.ID) // as a removal killed half way leaves it
	if _, err := s.Stat(ctx, name); !errors.Is(err, layering.ErrNotFound) {
		t.Fatalf("Stat of a half-removed image = %v; want ErrNotFound", err)
	}
	if names, _ := s.List(ctx); !slices.Contains(names, name) {
		t.Fatalf("the half-removed image %s is not listed: %v", name, names)
	}
	if err := s.Remove(ctx, name); err != nil {
		t.Fatalf("Remove of a half-removed image: %v", err)
	}
	if names, _ := s.List(ctx); slices.Contains(names, name) {
		t.Fatalf("%s still listed after Remove", name)
	}
	if err := s.Remove(ctx, name); !errors.Is(err, layering.ErrNotFound) {
		t.Fatalf("second Remove = %v; want ErrNotFound", err)
	}
}

// Meta reads an image's metadata from its header object, without opening
// the image, and finds what librbd reports (Stat lists it through librbd).
func TestMetaReadsHeader(t *testing.T) {
	s := open(t)
	ctx := context.Background()
	name := "fdt-headermeta-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := s.Create(ctx, name, 1<<20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Remove(context.Background(), name) })
	want := map[string]string{"fogdeploy.generation": `{"app":"x","gen":3,"spec":{"command":["a b","c"]}}`, "fogdeploy.node": "n1",
		"fogdeploy.long": string(bytes.Repeat([]byte("é"), 3000))}
	if err := s.SetMeta(ctx, name, want); err != nil {
		t.Fatal(err)
	}
	got, ok, err := s.HeaderMeta(name)
	if err != nil || !ok {
		t.Fatalf("header metadata of %s: ok %v, %v; want it read from the header", name, ok, err)
	}
	info, err := s.Stat(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []map[string]string{got, info.Meta} {
		if len(m) != len(want) {
			t.Fatalf("metadata %v, want %v", m, want)
		}
		for k, v := range want {
			if m[k] != v {
				t.Fatalf("metadata %s = %q, want %q", k, m[k], v)
			}
		}
	}
	if _, _, err := s.HeaderMeta(name + "-absent"); !errors.Is(err, layering.ErrNotFound) {
		t.Fatalf("header metadata of a missing image: %v, want ErrNotFound", err)
	}
}
