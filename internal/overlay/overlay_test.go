package overlay_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/overlay"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// TestMountWritesStayUpper: the merged root shows the lower directory;
// writes and deletes land in the upper directory and never in the lower
// one; a second Mount is a no-op, and Unmount leaves no mount.
func TestMountWritesStayUpper(t *testing.T) {
	testenv.NeedRoot(t)
	ctx := context.Background()
	dir := t.TempDir()
	l := overlay.Layers{Lower: filepath.Join(dir, "lower"), Disk: filepath.Join(dir, "disk")}
	target := filepath.Join(dir, "root")
	for _, d := range []string{l.Lower, l.Disk} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(l.Lower, "shared"), []byte("lower"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := overlay.Mount(ctx, l, target); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = overlay.Unmount(context.Background(), target) })
	if err := overlay.Mount(ctx, l, target); err != nil {
		t.Errorf("second Mount: %v; want a no-op", err)
	}
	if got, err := os.ReadFile(filepath.Join(target, "shared")); err != nil || string(got) != "lower" {
		t.Errorf("merged file = %q, %v", got, err)
	}
	if err := os.WriteFile(filepath.Join(target, "own"), []byte("upper"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(target, "shared")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(l.Lower, "shared")); err != nil {
		t.Errorf("a delete in the overlay reached the lower directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(l.Lower, "own")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a write in the overlay reached the lower directory: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(l.Upper(), "own")); err != nil || string(got) != "upper" {
		t.Errorf("upper file = %q, %v", got, err)
	}
	if err := overlay.Unmount(ctx, target); err != nil {
		t.Fatal(err)
	}
	if ok, err := overlay.Mounted(target); err != nil || ok {
		t.Errorf("Mounted after Unmount = %v, %v", ok, err)
	}
	if err := overlay.Unmount(ctx, target); err != nil {
		t.Errorf("Unmount of nothing: %v", err)
	}
}

// TestBusyUnmountDetaches: an overlay that a process still holds is
// detached once the wait is over, instead of staying mounted.
func TestBusyUnmountDetaches(t *testing.T) {
	testenv.NeedRoot(t)
	dir := t.TempDir()
	l := overlay.Layers{Lower: filepath.Join(dir, "lower"), Disk: filepath.Join(dir, "disk")}
	target := filepath.Join(dir, "root")
	_ = os.MkdirAll(l.Lower, 0o755)
	_ = os.MkdirAll(l.Disk, 0o755)
	if err := overlay.Mount(context.Background(), l, target); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(target, "held"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no waiting
	if err := overlay.Unmount(ctx, target); err != nil {
		t.Fatalf("Unmount of a busy overlay: %v", err)
	}
	if ok, err := overlay.Mounted(target); err != nil || ok {
		t.Errorf("Mounted after a busy Unmount = %v, %v; want it detached", ok, err)
	}
}

// TestBadLayers: relative paths and separators the kernel would split at
// are refused with the field named.
func TestBadLayers(t *testing.T) {
	for _, c := range []struct {
		l      overlay.Layers
		target string
	}{
		{overlay.Layers{Lower: "lower", Disk: "/d"}, "/t"},
		{overlay.Layers{Lower: "/l,upperdir=/x", Disk: "/d"}, "/t"},
		{overlay.Layers{Lower: "/l", Disk: "/d"}, "t"},
	} {
		if err := overlay.Mount(context.Background(), c.l, c.target); !errors.Is(err, overlay.ErrInvalid) {
			t.Errorf("Mount(%+v, %q) = %v; want ErrInvalid", c.l, c.target, err)
		}
	}
}
