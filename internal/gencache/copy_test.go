package gencache_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/gencache"
)

// TestCopyTree: a generation's files are copied whole (one larger than a
// copy's buffer and not a multiple of it, an empty one), with their
// modes, directories and links; a kind of file a checkpoint never holds
// (a FIFO) is refused.
func TestCopyTree(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	big := bytes.Repeat([]byte("0123456789abcdef"), (3<<20+12345)/16)
	files := map[string][]byte{"ckpt_app.dmtcp": big, "sub/pages-1.img": []byte("pages"), "empty": nil}
	for name, b := range files {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("ckpt_app.dmtcp", filepath.Join(src, "latest")); err != nil {
		t.Fatal(err)
	}
	if err := gencache.CopyTree(context.Background(), src, dst); err != nil {
		t.Fatal(err)
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(dst, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s copied: %d bytes, %v; want the %d bytes written", name, len(got), err, len(want))
		}
		if st, err := os.Stat(filepath.Join(dst, name)); err != nil || st.Mode().Perm() != 0o640 {
			t.Errorf("%s copied: mode %v, %v; want 0640", name, st.Mode(), err)
		}
	}
	if l, err := os.Readlink(filepath.Join(dst, "latest")); err != nil || l != "ckpt_app.dmtcp" {
		t.Errorf("link copied: %q, %v; want it to name ckpt_app.dmtcp", l, err)
	}
	if err := syscall.Mkfifo(filepath.Join(src, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := gencache.CopyTree(context.Background(), src, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a tree with a FIFO: %v; want it refused", err)
	}
}
