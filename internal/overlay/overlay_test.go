package overlay_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/overlay"
	"github.com/fogdeploy/fogdeploy/internal/overlay/overlaytest"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// TestRootsKernel runs the Roots suite on the kernel's overlay.
func TestRootsKernel(t *testing.T) {
	testenv.NeedRoot(t)
	overlaytest.RunSuite(t, func(*testing.T) overlay.Roots { return overlay.Kernel{} })
}

// TestRootsCopy runs the Roots suite on its stand-in for unit tests.
func TestRootsCopy(t *testing.T) {
	overlaytest.RunSuite(t, func(*testing.T) overlay.Roots { return &overlay.Copy{} })
}

// TestKernelWritesStayUpper: the kernel's overlay keeps the instance's
// writes in the upper directory as they happen.
func TestKernelWritesStayUpper(t *testing.T) {
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
	if err := overlay.Mount(ctx, l, target); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = overlay.Unmount(context.Background(), target) })
	if err := os.WriteFile(filepath.Join(target, "own"), []byte("upper"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(l.Upper(), "own")); err != nil || string(got) != "upper" {
		t.Errorf("upper file = %q, %v", got, err)
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
