//go:build !no_ceph

package cephstore_test

import (
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/testenv"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
	"github.com/fogdeploy/fogdeploy/rbd-layering/storetest"
)

// TestWatchersCeph runs the watcher suite on the real cluster with this
// node's rbd-fuse mappings: a live one (Remove and RemoveUnmapped refuse,
// and it still serves I/O after), and one whose rbd-fuse was killed with
// SIGKILL after writing (Remove refuses for osd_client_watch_timeout;
// RemoveUnmapped evicts the dead watch and removes the image at once).
func TestWatchersCeph(t *testing.T) {
	testenv.NeedRoot(t)
	c := testenv.CephCluster(t)
	newMapper := func(t *testing.T) *mapper.Mapper {
		m, err := mapper.New(t.Context(), mapper.Config{Backend: mapper.BackendFuse, StateDir: t.TempDir(),
			CephConf: c.Conf, Keyring: c.Keyring, ID: c.ID}, slog.New(slog.DiscardHandler))
		if err != nil {
			testenv.Unavailable(t, testenv.Ceph, "rbd-fuse mapper: "+err.Error())
		}
		return m
	}
	// mapAndWrite maps name with rbd-fuse and writes through it, as a
	// deployment does: that is what makes its watch outlive a kill.
	mapAndWrite := func(t *testing.T, m *mapper.Mapper, name string) *mapper.Mapping {
		mp, err := m.Map(t.Context(), mapper.Image{Pool: c.Pool, Name: name})
		if err != nil {
			t.Fatal(err)
		}
		dd(t, "of="+mp.Device, "oflag=direct", "if=/dev/urandom", "bs=1M", "count=4", "seek=8")
		return mp
	}
	storetest.RunWatcherSuite(t, func(t *testing.T) layering.Backend { return open(t) }, storetest.Watchers{
		Live: func(t *testing.T, _ layering.Backend, name string) func() {
			m := newMapper(t)
			mp := mapAndWrite(t, m, name)
			return func() {
				dd(t, "if="+mp.Device, "iflag=direct", "of=/dev/null", "bs=1M", "count=4", "skip=16")
				if err := m.Release(context.Background(), mp.ID); err != nil {
					t.Error(err)
				}
			}
		},
		Dead: func(t *testing.T, _ layering.Backend, name string) {
			m := newMapper(t)
			mp := mapAndWrite(t, m, name)
			if err := m.Abort(t.Context(), mp.ID); err != nil { // SIGKILL rbd-fuse
				t.Fatal(err)
			}
			if err := m.Release(t.Context(), mp.ID); err != nil {
				t.Fatal(err)
			}
			if users, err := m.Users(mapper.Image{Pool: c.Pool, Name: name}); err != nil || len(users) > 0 {
				t.Fatalf("after its rbd-fuse was killed and the mapping released, Users = %q, %v; want none", users, err)
			}
		},
	})
}

func dd(t *testing.T, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "dd", append(args, "status=none")...).CombinedOutput(); err != nil {
		t.Fatalf("dd %v: %v: %s", args, err, out)
	}
}

// TestRemoveUnmappedCtx: RemoveUnmapped of a busy image ends with ctx,
// not with its own bound.
func TestRemoveUnmappedCtx(t *testing.T) {
	testenv.NeedRoot(t)
	c := testenv.CephCluster(t)
	s := open(t)
	m, err := mapper.New(t.Context(), mapper.Config{Backend: mapper.BackendFuse, StateDir: t.TempDir(),
		CephConf: c.Conf, Keyring: c.Keyring, ID: c.ID}, slog.New(slog.DiscardHandler))
	if err != nil {
		testenv.Unavailable(t, testenv.Ceph, "rbd-fuse mapper: "+err.Error())
	}
	name := fmt.Sprintf("t-evictctx-%d", time.Now().UnixNano()%1e9)
	if err := s.Create(t.Context(), name, 16<<20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Remove(context.Background(), name) })
	mp, err := m.Map(t.Context(), mapper.Image{Pool: c.Pool, Name: name})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Release(context.Background(), mp.ID)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = s.RemoveUnmapped(ctx, name)
	if err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("RemoveUnmapped of a mapped image under a 300 ms context = %v after %s; want an error within a few seconds", err, time.Since(start))
	}
}
