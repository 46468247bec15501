package deploy

import (
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/instancectl"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// TestWriteIdentityCtl: a deploy writes its identity into the instance's
// control directory: a new file where there is none, else over the one a
// slot restored ahead wrote, in place, which then reads as the new
// identity alone, whatever the old one's length. The app can write into
// that directory: a link it planted, in place of the file or of the
// identity directory, is never followed out of it.
func TestWriteIdentityCtl(t *testing.T) {
	ctl := t.TempDir()
	dir := filepath.Join(ctl, instancectl.IdentityDir)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, path.Base(spec.IdentityFile))
	h := drivers.Handle{CtlPath: ctl}
	old := spec.Identity{Instance: "slot-" + strings.Repeat("x", 200), App: "redis", Slot: "redis-s01234567", Seed: "00"}
	if bound, err := writeIdentityCtl(h, old); err != nil || bound {
		t.Fatalf("writeIdentityCtl without a file = %v, %v; want a new file, not bound", bound, err)
	}
	before, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	want := spec.Identity{Instance: "redis-0a1b2c3d", App: "redis", Slot: "redis-s01234567", Gen: 2, Seed: "ff"}
	if err := os.WriteFile(filepath.Join(ctl, instancectl.IdentityBound), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if bound, err := writeIdentityCtl(h, want); err != nil || !bound {
		t.Fatalf("writeIdentityCtl over a longer file = %v, %v; want it written, bound", bound, err)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var got spec.Identity
	if err := json.Unmarshal(b, &got); err != nil || got != want {
		t.Errorf("identity file after the overwrite = %+v (%v); want %+v", got, err, want)
	}
	if after, _ := os.Stat(file); after.Size() != before.Size() || !os.SameFile(before, after) {
		t.Errorf("identity file: %d bytes (same file %v); want the same file, %d bytes", after.Size(), os.SameFile(before, after), before.Size())
	}

	// The file replaced by a link to a file of the host: the link is
	// replaced, the host's file untouched.
	host := t.TempDir()
	secret := filepath.Join(host, "passwd")
	if err := os.WriteFile(secret, []byte("root:x:0:0"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, file); err != nil {
		t.Fatal(err)
	}
	if _, err := writeIdentityCtl(h, want); err != nil {
		t.Fatalf("writeIdentityCtl over a link: %v", err)
	}
	if b, _ := os.ReadFile(secret); string(b) != "root:x:0:0" {
		t.Fatalf("the host's file was written through the app's link: %q", b)
	}
	if st, err := os.Lstat(file); err != nil || !st.Mode().IsRegular() {
		t.Errorf("identity file after a write over a link: %v, %v; want a regular file", st, err)
	}
	// The identity directory replaced by a link to a directory of the
	// host: refused, nothing written there.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(host, dir); err != nil {
		t.Fatal(err)
	}
	if _, err := writeIdentityCtl(h, want); err == nil {
		t.Error("writeIdentityCtl through a linked identity directory succeeded")
	}
	if _, err := os.Stat(filepath.Join(host, path.Base(spec.IdentityFile))); err == nil {
		t.Error("an identity file was written into the host's directory through the app's link")
	}
}
