//go:build !no_ceph

package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// TestFull fills what a deploy writes to. A pool over its quota: a deploy
// and an environment import each fail with an error that names the full
// pool and a hint (free space, or raise the quota); nothing is made; with
// the quota raised the same deploy works. A node whose state directory is
// on a full disk (a small tmpfs): its deploy fails saying so, leaves
// nothing, and works once space is freed.
func TestFull(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p := newPoP(ctx, t, s, "n1")
	app := p.app(ctx, "full", 0)

	// n2 keeps its state on a 16 MiB tmpfs.
	small := filepath.Join(p.dir, "small")
	if err := os.MkdirAll(small, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(ctx, "mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", small).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs: %v\n%s", err, out)
	}
	p.atEnd = append(p.atEnd, func() {
		if out, err := exec.Command("umount", small).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v\n%s", small, err, out)
		}
	})
	p.startAgent(ctx, "n2", filepath.Join(small, "n2"))
	before := p.leaks(ctx, app, small)

	// 1. The pool over its quota.
	if out, err := s.ceph(ctx, "osd", "pool", "set-quota", s.pool, "max_bytes", "1048576"); err != nil {
		t.Fatalf("set-quota: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = s.ceph(context.Background(), "osd", "pool", "set-quota", s.pool, "max_bytes", "0") })
	waitFor(ctx, t, 30*time.Second, "the pool is marked full", func() error { return s.poolFull(ctx, true) })

	out, errOut, code := p.fogctl(ctx, "deploy", app, "--node", "n1", "--mode", "boot", "--wait", "-o", "json")
	t.Logf("fogctl deploy on a full pool: exit %d\n%s%s", code, out, errOut)
	for _, want := range []string{`pool "fogdeploy" is full`, "quota (max_bytes 1.0 MiB)", "Hint: free space in the pool", "ceph osd pool set-quota fogdeploy max_bytes"} {
		if code != 5 || !strings.Contains(errOut, want) {
			t.Errorf("deploy on a full pool = exit %d (want 5, unavailable), without %q:\n%s", code, want, errOut)
		}
	}
	var id string
	for _, d := range p.ps(ctx) {
		id = d.ID
		if d.Status.Phase != spec.PhaseFailed || !strings.Contains(d.Status.Error, "is full") || !strings.Contains(d.Status.Hint, "set-quota") {
			t.Errorf("fogctl ps: %s = %+v; want Failed, the full pool, a hint", d.ID, d.Status)
		}
	}
	if got := p.leaks(ctx, app, small); got != before {
		t.Errorf("after the deploy on a full pool: %+v; at the start: %+v", got, before)
	}
	// An environment import into the full pool (fogctl env import).
	tarFile := filepath.Join(s.dir, "busybox.tar")
	_, errOut, code = p.fogctl(ctx, "env", "import", "full-import", "--tar", tarFile, "--size", "64M")
	t.Logf("fogctl env import into a full pool: exit %d\n%s", code, errOut)
	if code != 5 || !strings.Contains(errOut, `pool "fogdeploy" is full`) || !strings.Contains(errOut, "Hint: free space in the pool") {
		t.Errorf("env import into a full pool = exit %d; want 5 naming the full pool, with a hint", code)
	}
	if out, _, code := p.fogctl(ctx, "env", "ls", "-o", "json"); code != 0 || strings.Contains(out, "full-import") {
		t.Errorf("fogctl env ls after a failed import (exit %d): %s", code, out)
	}

	// Quota raised: the same deploy works.
	if out, err := s.ceph(ctx, "osd", "pool", "set-quota", s.pool, "max_bytes", "0"); err != nil {
		t.Fatalf("set-quota: %v\n%s", err, out)
	}
	waitFor(ctx, t, 30*time.Second, "the pool is no longer full", func() error { return s.poolFull(ctx, false) })
	if _, errOut, code := p.fogctl(ctx, "undeploy", id, "--wait"); code != 0 {
		t.Errorf("fogctl undeploy %s = exit %d\n%s", id, code, errOut)
	}
	if err := serves(ctx, p.deploy(ctx, app, "n1")); err != nil {
		t.Error(err)
	}

	// 2. n2's state directory full.
	mid := p.leaks(ctx, app, small) // n1's instance
	filler := filepath.Join(small, "filler")
	if err := fill(filler); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = p.fogctl(ctx, "deploy", app, "--node", "n2", "--mode", "boot", "--wait")
	t.Logf("fogctl deploy on a node whose state directory is full: exit %d\n%s", code, errOut)
	for _, want := range []string{"node n2: its state directory is full", "no space left on device", "Hint: free space in " + filepath.Join(small, "n2")} {
		if code != 5 || !strings.Contains(errOut, want) {
			t.Errorf("deploy on a node with a full state directory = exit %d (want 5, unavailable), without %q:\n%s", code, want, errOut)
		}
	}
	if got := p.leaks(ctx, app, small); got != mid {
		t.Errorf("after the deploy on n2: %+v; before it (n1's instance): %+v", got, mid)
	}
	if recs, _ := filepath.Glob(filepath.Join(small, "n2", "deploy", "deployments", "*")); len(recs) > 0 {
		t.Errorf("records left on n2: %v", recs)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := serves(ctx, p.deploy(ctx, app, "n2")); err != nil {
		t.Error(err)
	}
	p.undeployAll(ctx)
	if got := p.leaks(ctx, app, small); got != before {
		t.Errorf("left after undeploying: %+v; at the start: %+v", got, before)
	}
}

// poolFull waits for the pool's full flag to be set (or cleared).
func (s *services) poolFull(ctx context.Context, want bool) error {
	out, err := s.ceph(ctx, "osd", "dump", "-f", "json")
	if err != nil {
		return fmt.Errorf("ceph osd dump: %w: %s", err, out)
	}
	var dump struct {
		Pools []struct {
			Name  string `json:"pool_name"`
			Flags string `json:"flags_names"`
		} `json:"pools"`
	}
	if err := json.Unmarshal([]byte(out), &dump); err != nil {
		return err
	}
	for _, p := range dump.Pools {
		if p.Name == s.pool {
			if full := slices.Contains(strings.Split(p.Flags, ","), "full"); full != want {
				return fmt.Errorf("pool %s flags %s", s.pool, p.Flags)
			}
			return nil
		}
	}
	return fmt.Errorf("no pool %s", s.pool)
}

// fill writes file until its filesystem is full.
func fill(file string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return nil
			}
			return err
		}
	}
}
