// Package overlaytest is the conformance suite of overlay.Roots: the
// kernel's overlay (overlay.Kernel, as root) and its stand-in for unit
// tests (overlay.Copy) pass it.
package overlaytest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/overlay"
)

// RunSuite runs the suite on the Roots newRoots returns, one per subtest.
func RunSuite(t *testing.T, newRoots func(t *testing.T) overlay.Roots) {
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, overlay.Roots, overlay.Layers, string)
	}{
		{"MergedWritesKeptLowerUntouched", testMerged},
		{"ResetDropsWrites", testReset},
		{"BadLayers", testBadLayers},
		{"BindReadOnly", testBind},
		{"MemoryBound", testMemoryBound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRoots(t)
			dir := t.TempDir()
			l := overlay.Layers{Lower: filepath.Join(dir, "lower"), Disk: filepath.Join(dir, "disk")}
			for _, d := range []string{filepath.Join(l.Lower, "etc"), l.Disk} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for name, body := range map[string]string{"shared": "lower", "etc/kept": "lower"} {
				if err := os.WriteFile(filepath.Join(l.Lower, name), []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			target := filepath.Join(dir, "root")
			t.Cleanup(func() { _ = r.Unmount(context.Background(), target) })
			tc.fn(t, r, l, target)
		})
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "(none)"
	} else if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mount(t *testing.T, r overlay.Roots, l overlay.Layers, target string) {
	t.Helper()
	if err := r.Mount(t.Context(), l, target); err != nil {
		t.Fatal(err)
	}
	if ok, err := r.Mounted(target); err != nil || !ok {
		t.Fatalf("Mounted after Mount = %v, %v", ok, err)
	}
}

// testMerged: the merged root shows the lower directory; writes and
// deletes never reach it; they are there again after an unmount and a new
// mount; a second Mount is a no-op; Unmount leaves none, and twice is not
// an error.
func testMerged(t *testing.T, r overlay.Roots, l overlay.Layers, target string) {
	ctx := t.Context()
	mount(t, r, l, target)
	if err := r.Mount(ctx, l, target); err != nil {
		t.Errorf("second Mount: %v; want a no-op", err)
	}
	if got := read(t, filepath.Join(target, "shared")); got != "lower" {
		t.Errorf("merged file = %q; want the lower one", got)
	}
	if err := os.WriteFile(filepath.Join(target, "own"), []byte("upper"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(target, "shared")); err != nil {
		t.Fatal(err)
	}
	if got := read(t, filepath.Join(l.Lower, "shared")); got != "lower" {
		t.Errorf("a delete in the overlay reached the lower directory: %q", got)
	}
	if got := read(t, filepath.Join(l.Lower, "own")); got != "(none)" {
		t.Errorf("a write in the overlay reached the lower directory: %q", got)
	}
	if err := r.Unmount(ctx, target); err != nil {
		t.Fatal(err)
	}
	if ok, err := r.Mounted(target); err != nil || ok {
		t.Errorf("Mounted after Unmount = %v, %v", ok, err)
	}
	if got := read(t, filepath.Join(target, "own")); got != "(none)" {
		t.Errorf("the target still shows the overlay's files after Unmount: %q", got)
	}
	if err := r.Unmount(ctx, target); err != nil {
		t.Errorf("Unmount of nothing: %v", err)
	}
	mount(t, r, l, target)
	for name, want := range map[string]string{"own": "upper", "shared": "(none)", "etc/kept": "lower"} {
		if got := read(t, filepath.Join(target, name)); got != want {
			t.Errorf("after a new mount, %s = %q; want %q", name, got, want)
		}
	}
	if err := r.Unmount(ctx, target); err != nil {
		t.Fatal(err)
	}
}

// testReset: Reset drops the writes and deletes; the merged root is the
// lower one again, still mounted.
func testReset(t *testing.T, r overlay.Roots, l overlay.Layers, target string) {
	mount(t, r, l, target)
	if err := os.WriteFile(filepath.Join(target, "own"), []byte("upper"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(target, "shared")); err != nil {
		t.Fatal(err)
	}
	if err := r.Reset(t.Context(), l, target); err != nil {
		t.Fatal(err)
	}
	if ok, err := r.Mounted(target); err != nil || !ok {
		t.Errorf("Mounted after Reset = %v, %v; want it mounted", ok, err)
	}
	for name, want := range map[string]string{"own": "(none)", "shared": "lower"} {
		if got := read(t, filepath.Join(target, name)); got != want {
			t.Errorf("after Reset, %s = %q; want %q", name, got, want)
		}
	}
}

// testBadLayers: relative paths and separators the kernel would split at
// are refused, and nothing is mounted.
func testBadLayers(t *testing.T, r overlay.Roots, l overlay.Layers, target string) {
	for _, c := range []struct {
		l      overlay.Layers
		target string
	}{
		{overlay.Layers{Lower: "lower", Disk: l.Disk}, target},
		{overlay.Layers{Lower: l.Lower + ",upperdir=/x", Disk: l.Disk}, target},
		{l, "root"},
	} {
		if err := r.Mount(t.Context(), c.l, c.target); !errors.Is(err, overlay.ErrInvalid) {
			t.Errorf("Mount(%+v, %q) = %v; want ErrInvalid", c.l, c.target, err)
		}
	}
	if ok, _ := r.Mounted(target); ok {
		t.Errorf("a refused Mount left an overlay at %s", target)
	}
}

// testBind: a read-only bind shows its source's files, and no write into
// it reaches the source; after Unbind (twice is not an error) the source is untouched.
func testBind(t *testing.T, r overlay.Roots, l overlay.Layers, _ string) {
	target := filepath.Join(filepath.Dir(l.Lower), "bound", "1")
	if err := r.BindReadOnly(l.Lower, target); err != nil {
		t.Fatalf("BindReadOnly: %v", err)
	}
	if got := read(t, filepath.Join(target, "etc", "kept")); got != "lower" {
		t.Errorf("bound file = %q; want the source's", got)
	}
	// Refused by the kernel's; never reaching the source either way.
	_ = os.WriteFile(filepath.Join(target, "shared"), []byte("written"), 0o644)
	for range 2 {
		if err := r.Unbind(target); err != nil {
			t.Fatalf("Unbind: %v", err)
		}
	}
	if got := read(t, filepath.Join(l.Lower, "shared")); got != "lower" {
		t.Errorf("source after Unbind = %q; want it untouched", got)
	}
	if got := read(t, filepath.Join(target, "shared")); got != "(none)" {
		t.Errorf("target after Unbind still shows %q", got)
	}
}

// testMemoryBound: files written where a memory mount is bound are in
// it, and stay in it once the bind is undone; Unbind of the memory mount
// lets them go.
func testMemoryBound(t *testing.T, r overlay.Roots, l overlay.Layers, _ string) {
	base := filepath.Dir(l.Lower)
	gen, kept := filepath.Join(base, "ckpt", "4"), filepath.Join(base, "handoffs", "d1", "4")
	for _, d := range []string{gen, kept} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.MountMemory(kept, 0); err == nil {
		t.Error("MountMemory of 0 bytes: no error")
	}
	if err := r.MountMemory(filepath.Join(base, "absent"), 1<<20); err == nil {
		t.Error("MountMemory on a missing directory: no error")
	}
	if err := r.MountMemory(kept, 1<<20); err != nil {
		t.Fatalf("MountMemory: %v", err)
	}
	for range 2 {
		if err := r.Bind(kept, gen); err != nil {
			t.Fatalf("Bind: %v", err)
		}
	}
	if err := os.WriteFile(filepath.Join(gen, "ckpt_app.dmtcp"), []byte("image"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.Unbind(gen); err != nil {
		t.Fatalf("Unbind of the bind: %v", err)
	}
	if got := read(t, filepath.Join(kept, "ckpt_app.dmtcp")); got != "image" {
		t.Errorf("file in memory = %q; want the one written where it was bound", got)
	}
	if got := read(t, filepath.Join(gen, "ckpt_app.dmtcp")); got != "(none)" {
		t.Errorf("where it was bound, after Unbind: %q; want nothing", got)
	}
	if err := r.Unbind(kept); err != nil {
		t.Fatalf("Unbind of the memory mount: %v", err)
	}
	if got := read(t, filepath.Join(kept, "ckpt_app.dmtcp")); got != "(none)" {
		t.Errorf("after the memory mount's Unbind: %q; want its files gone", got)
	}
	if err := os.RemoveAll(filepath.Join(base, "handoffs")); err != nil {
		t.Errorf("removing it once unbound: %v", err)
	}
}
