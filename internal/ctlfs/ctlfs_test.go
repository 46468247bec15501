package ctlfs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A control directory where an app planted links: to a file of the host,
// over a temporary name, and in place of a subdirectory. Nothing outside
// the directory is read or written; the app's regular files are.
func TestLinksAreNeverFollowed(t *testing.T) {
	host := t.TempDir()
	secret := filepath.Join(host, "shadow")
	if err := os.WriteFile(secret, []byte("root:secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctl := t.TempDir()
	d := Dir(ctl)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink(secret, filepath.Join(ctl, "timings.json")))
	must(os.Symlink(host, filepath.Join(ctl, "identity")))
	// Both temporary directories are in the test's own: from ctl, "../"
	// is their parent.
	must(os.Symlink("../"+filepath.Base(host)+"/shadow", filepath.Join(ctl, "relative.json")))
	for _, name := range []string{"timings.json", "relative.json", "identity/shadow"} {
		// Each link reaches the secret when followed: refusing to read it
		// is the directory's doing, not a dangling link's.
		if b, err := os.ReadFile(filepath.Join(ctl, name)); err != nil || string(b) != "root:secret" {
			t.Fatalf("the link %s does not reach the host's file (%q, %v): the test would prove nothing", name, b, err)
		}
	}

	for _, name := range []string{"timings.json", "relative.json", "identity/shadow"} {
		if b, err := d.ReadFile(name); err == nil || strings.Contains(string(b), "secret") {
			t.Errorf("ReadFile(%s) = %q, %v; want an error, nothing of the host", name, b, err)
		}
		if d.IsFile(name) {
			t.Errorf("IsFile(%s) through a link", name)
		}
	}
	// Writing over a link replaces the link, not its target.
	must(d.WriteFile("timings.json", []byte(`{"ok":true}`), 0o644))
	if b, _ := os.ReadFile(secret); string(b) != "root:secret" {
		t.Fatalf("the host's file was written through a link: %q", b)
	}
	if b, err := d.ReadFile("timings.json"); err != nil || string(b) != `{"ok":true}` {
		t.Errorf("ReadFile after WriteFile = %q, %v", b, err)
	}
	// A subdirectory replaced by a link is refused.
	if err := d.WriteFile("identity/identity.json", []byte("{}"), 0o644); err == nil {
		t.Errorf("WriteFile through a linked directory succeeded")
	}
	if _, err := os.Stat(filepath.Join(host, "identity.json")); err == nil {
		t.Fatalf("a file was written into the host's directory through a link")
	}
	// Remove removes the link, not the target.
	must(d.Remove("relative.json"))
	if _, err := os.Stat(secret); err != nil {
		t.Fatalf("Remove followed a link: %v", err)
	}
	must(d.Remove("nothing-there"))
	// A real subdirectory works, and a directory is not a file.
	must(os.Mkdir(filepath.Join(ctl, "sub"), 0o755))
	must(d.WriteFile("sub/a.json", []byte("1"), 0o644))
	if !d.IsFile("sub/a.json") || d.IsFile("sub") {
		t.Errorf("IsFile: sub/a.json %v, sub %v; want a file and not a file", d.IsFile("sub/a.json"), d.IsFile("sub"))
	}
	if _, err := d.ReadFile("sub"); !errors.Is(err, ErrNotRegular) {
		t.Errorf("ReadFile(a directory) = %v; want ErrNotRegular", err)
	}
	// A FIFO the app planted does not block a read.
	if err := unix.Mkfifo(filepath.Join(ctl, "fifo.json"), 0o644); err == nil {
		if _, err := d.ReadFile("fifo.json"); !errors.Is(err, ErrNotRegular) {
			t.Errorf("ReadFile(a FIFO) = %v; want ErrNotRegular", err)
		}
	}
	// Large files are refused.
	must(os.WriteFile(filepath.Join(ctl, "big.json"), make([]byte, MaxFileBytes+1), 0o644))
	if _, err := d.ReadFile("big.json"); err == nil {
		t.Errorf("ReadFile of more than MaxFileBytes succeeded")
	}
}

// MkdirAll makes what is missing and refuses a link on the way.
func TestMkdirAll(t *testing.T) {
	root, host := t.TempDir(), t.TempDir()
	d := Dir(root)
	if err := d.MkdirAll("run/fogdeploy", 0o755); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Lstat(filepath.Join(root, "run", "fogdeploy")); err != nil || !st.IsDir() || st.Mode().Perm() != 0o755 {
		t.Errorf("run/fogdeploy = %v, %v; want a directory of mode 0755", st, err)
	}
	if err := d.MkdirAll("run/fogdeploy", 0o755); err != nil {
		t.Errorf("MkdirAll of what exists: %v", err)
	}
	if err := os.Symlink(host, filepath.Join(root, "var")); err != nil {
		t.Fatal(err)
	}
	if err := d.MkdirAll("var/lib", 0o755); err == nil {
		t.Error("MkdirAll through a link succeeded")
	}
	if _, err := os.Stat(filepath.Join(host, "lib")); err == nil {
		t.Error("a directory was made in the host's directory through a link")
	}
}

// ReadInRoot reads an app's file as the app's root resolves it: a link
// that points out of the root (absolute or through "..") lands inside it,
// a FIFO is refused at once instead of blocking, and a sparse file larger
// than the bound is refused before anything is read.
func TestReadInRoot(t *testing.T) {
	root, host := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "secret"), []byte("the node's"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, host), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, host, "secret"), []byte("the app's"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"abs": filepath.Join(host, "secret"), "up": "../../../../../../.." + filepath.Join(host, "secret")} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
		if b, err := ReadInRoot(root, name, 1<<10); err != nil || string(b) != "the app's" {
			t.Errorf("ReadInRoot(link %s -> %s) = %q, %v; want the root's own file", name, target, b, err)
		}
	}
	if err := unix.Mkfifo(filepath.Join(root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := ReadInRoot(root, "fifo", 1<<10); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrNotRegular) {
			t.Errorf("ReadInRoot(a FIFO) = %v; want ErrNotRegular", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ReadInRoot(a FIFO) blocked")
	}
	f, err := os.Create(filepath.Join(root, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(64 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := ReadInRoot(root, "sparse", 32<<20); !errors.Is(err, ErrTooLarge) {
		t.Errorf("ReadInRoot(a sparse 64 GiB file) = %v; want ErrTooLarge", err)
	}
}
