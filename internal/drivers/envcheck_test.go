package drivers

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// writeRoot makes a root file system of files (path -> content) and
// symlinks (path -> "->target").
func writeRoot(t *testing.T, entries map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, c := range entries {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if target, ok := strings.CutPrefix(c, "->"); ok {
			if err := os.Symlink(target, full); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestEnvGlibc(t *testing.T) {
	banner := "\x00GNU C Library (Debian GLIBC 2.36-9+deb12u4) stable release version 2.36.\n\x00GLIBC_2.2.5\x00"
	for _, tc := range []struct {
		name    string
		entries map[string]string
		want    string
	}{
		{"merged usr, absolute lib symlink", map[string]string{
			"lib": "->usr/lib", "usr/lib/x86_64-linux-gnu/libc.so.6": banner}, "2.36"},
		{"absolute symlink stays in the root", map[string]string{
			"lib64/libc.so.6": "->/usr/lib64/libc-2.28.so", "usr/lib64/libc-2.28.so": "x GLIBC_2.2.5 GLIBC_2.28 GLIBC_2.17"}, "2.28"},
		{"dot-dot cannot leave the root", map[string]string{
			"lib/libc.so.6": "->../../../../../../lib/x86_64-linux-gnu/libc.so.6", "lib/x86_64-linux-gnu/libc.so.6": banner}, "2.36"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := EnvGlibc(writeRoot(t, tc.entries))
			if err != nil || got != tc.want {
				t.Fatalf("EnvGlibc = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	// A static busybox environment: no glibc at all.
	if v, err := EnvGlibc(writeRoot(t, map[string]string{"bin/busybox": "\x7fELF static"})); err == nil {
		t.Fatalf("EnvGlibc of a root without libc = %q, want an error", v)
	}
	// A symlink loop does not hang.
	if _, err := EnvGlibc(writeRoot(t, map[string]string{"lib64": "->lib64"})); err == nil {
		t.Fatal("EnvGlibc through a symlink loop: no error")
	}
}

func TestCheckEnvForDMTCP(t *testing.T) {
	root := writeRoot(t, map[string]string{"lib/x86_64-linux-gnu/libc.so.6": "GNU C Library (x) stable release version 2.31.\n"})
	if err := checkEnvForDMTCP(root, "old", "2.31"); err != nil {
		t.Fatalf("same version: %v", err)
	}
	if err := checkEnvForDMTCP(root, "old", ""); err != nil {
		t.Fatalf("no version needed: %v", err)
	}
	err := checkEnvForDMTCP(root, "old", "2.36")
	if !errors.Is(err, spec.ErrInvalidSpec) || !strings.Contains(err.Error(), "glibc 2.31") || !strings.Contains(err.Error(), "2.36") || hint.Of(err) == "" {
		t.Fatalf("older glibc: %v (hint %q), want spec.ErrInvalidSpec naming both versions, with a hint", err, hint.Of(err))
	}
	err = checkEnvForDMTCP(t.TempDir(), "static", "2.36")
	if !errors.Is(err, spec.ErrInvalidSpec) || !strings.Contains(err.Error(), "static") || !strings.Contains(err.Error(), "no GNU C library") {
		t.Fatalf("no glibc: %v, want spec.ErrInvalidSpec naming the environment", err)
	}
	for _, c := range [][2]string{{"2.9", "2.36"}, {"2.36", "2.36.1"}, {"1", "2.0"}} {
		if !versionLess(c[0], c[1]) || versionLess(c[1], c[0]) {
			t.Errorf("versionLess(%s, %s) wrong", c[0], c[1])
		}
	}
}

func TestContainerFindsDMTCPImage(t *testing.T) {
	ctx := context.Background()
	rt := runtime.NewFake()
	c := &Container{RT: rt}
	if _, err := c.Check(ctx, engine.NameDMTCP); !errors.Is(err, ErrDriver) || !strings.Contains(hint.Of(err), "make dmtcp-image") {
		t.Fatalf("no DMTCP image: %v (hint %q), want ErrDriver with a hint to build it", err, hint.Of(err))
	}
	rt.AddImage("fogdeploy/boot:latest", runtime.FakeBusybox(), nil)
	rt.AddLabelledImage("fogdeploy/dmtcp:4.2.0", runtime.FakeBusybox(), runtime.ImageConfig{Labels: map[string]string{DMTCPVersionLabel: "4.2.0", DMTCPGlibcLabel: "2.36"}})
	rt.AddLabelledImage("fogdeploy/dmtcp:5.0", runtime.FakeBusybox(), runtime.ImageConfig{Labels: map[string]string{DMTCPVersionLabel: "5.0"}})
	v, err := c.Check(ctx, engine.NameDMTCP)
	if err != nil || v != "5.0" {
		t.Fatalf("Check = %q, %v; want the newest DMTCP image, 5.0, whatever its tag", v, err)
	}
	if img, err := c.image(ctx); err != nil || img.ref != "fogdeploy/dmtcp:5.0" {
		t.Fatalf("image = %+v, %v", img, err)
	}
	// A configured tag is used as it is, and must be a DMTCP image.
	pinned := &Container{RT: rt, Image: "fogdeploy/dmtcp:4.2.0"}
	if v, err := pinned.Check(ctx, engine.NameDMTCP); err != nil || v != "4.2.0" {
		t.Fatalf("pinned Check = %q, %v", v, err)
	}
	if img, _ := pinned.image(ctx); img.glibc != "2.36" {
		t.Fatalf("pinned image glibc = %q, want 2.36 from its label", img.glibc)
	}
	wrong := &Container{RT: rt, Image: "fogdeploy/boot:latest"}
	if _, err := wrong.Check(ctx, engine.NameDMTCP); !errors.Is(err, ErrDriver) || !strings.Contains(err.Error(), "not a fogdeploy DMTCP image") {
		t.Fatalf("image without the DMTCP label: %v", err)
	}
	missing := &Container{RT: rt, Image: "fogdeploy/dmtcp:4.2.0-nope"}
	if _, err := missing.Check(ctx, engine.NameDMTCP); !errors.Is(err, ErrDriver) || !strings.Contains(err.Error(), "not on this node") {
		t.Fatalf("missing image: %v", err)
	}
	if _, err := c.Check(ctx, engine.NameCRIU); !errors.Is(err, ErrDriver) || !strings.Contains(err.Error(), "carries no criu") {
		t.Fatalf("criu on the container driver with an image without CRIU: %v, want ErrDriver saying so", err)
	}
	if _, err := c.Check(ctx, "podman"); !errors.Is(err, ErrDriver) {
		t.Fatalf("an unknown engine on the container driver: %v, want ErrDriver", err)
	}
}

// TestContainerChecksCRIU: the container driver offers the criu engine
// only with an image that carries CRIU and once a check container with a
// CRIU instance's capabilities passed; the check container is removed,
// and a pass is not checked again.
func TestContainerChecksCRIU(t *testing.T) {
	ctx := context.Background()
	rt := runtime.NewFake()
	rt.AddLabelledImage("fogdeploy/dmtcp:criu", runtime.FakeDMTCP(), runtime.ImageConfig{
		Labels: map[string]string{DMTCPVersionLabel: "4.2.0", CRIUVersionLabel: "4.2"}})
	c := &Container{RT: rt}
	v, err := c.Check(ctx, engine.NameCRIU)
	if err != nil || v != "4.2" {
		t.Fatalf("Check criu = %q, %v; want CRIU's version from the image's label", v, err)
	}
	if sts, err := rt.List(ctx, nil); err != nil || len(sts) != 0 {
		t.Fatalf("containers left after the check: %v, %v", sts, err)
	}
	// A pass stands: no check container runs again, even if one could
	// not be created now.
	if err := rt.RemoveImage(ctx, "fogdeploy/dmtcp:criu"); err != nil {
		t.Fatal(err)
	}
	rt.AddLabelledImage("fogdeploy/dmtcp:criu", runtime.FakeBusybox(), runtime.ImageConfig{
		Labels: map[string]string{DMTCPVersionLabel: "4.2.0", CRIUVersionLabel: "4.2"}})
	if v, err := c.Check(ctx, engine.NameCRIU); err != nil || v != "4.2" {
		t.Fatalf("second Check criu = %q, %v", v, err)
	}
	// An image whose check cannot run (here: no check program) is
	// refused, and nothing is left.
	other := &Container{RT: rt}
	if _, err := other.Check(ctx, engine.NameCRIU); !errors.Is(err, ErrDriver) || !strings.Contains(err.Error(), "criu check") {
		t.Fatalf("a failing check: %v, want ErrDriver naming the criu check", err)
	}
	if sts, err := rt.List(ctx, nil); err != nil || len(sts) != 0 {
		t.Fatalf("containers left after a failed check: %v, %v", sts, err)
	}
}
