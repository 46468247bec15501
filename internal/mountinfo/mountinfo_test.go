package mountinfo

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/plain`:                  `/plain`,
		`/with\040space`:          `/with space`,
		`/tab\011and\012newline`:  "/tab\tand\nnewline",
		`/back\134slash`:          `/back\slash`,
		`/not\0xyescape`:          `/not\0xyescape`,
		`/short\04`:               `/short\04`,
		`/mnt/a\040b/c\040d\040e`: `/mnt/a b/c d e`,
	} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestUnder(t *testing.T) {
	got, err := Under("/")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(got, "/") {
		t.Errorf("Under(/) = %v; want the root among them", got)
	}
	if got, err := Under(t.TempDir()); err != nil || len(got) != 0 {
		t.Errorf("Under(a new directory) = %v, %v; want none", got, err)
	}
}

func TestRemoveAll(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sub", "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if out, err := exec.Command("mount", "-t", "tmpfs", "tmpfs", filepath.Join(dir, "sub")).CombinedOutput(); err != nil {
			t.Fatalf("mount: %v: %s", err, out)
		}
		if err := os.WriteFile(filepath.Join(dir, "sub", "kept"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		err := RemoveAll(dir)
		_, serr := os.Stat(filepath.Join(dir, "sub", "kept"))
		if out, uerr := exec.Command("umount", filepath.Join(dir, "sub")).CombinedOutput(); uerr != nil {
			t.Fatalf("umount: %v: %s", uerr, out)
		}
		if !errors.Is(err, ErrMounted) || serr != nil {
			t.Fatalf("RemoveAll with a mount inside = %v, the mounted file: %v; want ErrMounted and the file kept", err, serr)
		}
	}
	if err := RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("after RemoveAll, %s: %v", dir, err)
	}
}

// TestEmpty: what a directory holds goes, read-only directories too, and
// the directory stays; a missing one is empty.
func TestEmpty(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d")
	ro := filepath.Join(dir, "proc")
	if err := os.MkdirAll(filepath.Join(ro, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ro, "sub", "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(ro, 0o555); err != nil {
		t.Fatal(err)
	}
	if err := Empty(dir); err != nil {
		t.Fatal(err)
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		t.Errorf("after Empty, %s holds %v, %v; want it there and empty", dir, ents, err)
	}
	if err := Empty(filepath.Join(dir, "missing")); err != nil {
		t.Errorf("Empty of a missing directory: %v", err)
	}
}
