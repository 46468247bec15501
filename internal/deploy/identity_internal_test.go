package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// TestOverwriteIdentity: a deploy writes its identity over the one a slot
// restored ahead wrote, in place; the file then reads as the new identity
// alone, whatever the old one's length. Where there is no file, or a
// symbolic link, it writes nothing (a new file replaces it).
func TestOverwriteIdentity(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "identity.json")
	if ok, err := overwriteIdentity(file, spec.Identity{Instance: "a"}); ok || err != nil {
		t.Fatalf("overwriteIdentity without a file = %v, %v; want false, nil", ok, err)
	}
	old := spec.Identity{Instance: "slot-" + strings.Repeat("x", 200), App: "redis", Slot: "redis-s01234567", Seed: "00"}
	if err := writeIdentityAs(dir, "identity.json", old); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(file)
	want := spec.Identity{Instance: "redis-0a1b2c3d", App: "redis", Slot: "redis-s01234567", Gen: 2, Seed: "ff"}
	if ok, err := overwriteIdentity(file, want); !ok || err != nil {
		t.Fatalf("overwriteIdentity over a longer file = %v, %v; want true, nil", ok, err)
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

	link := filepath.Join(dir, "link.json")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	if ok, _ := overwriteIdentity(link, want); ok {
		t.Error("overwriteIdentity wrote through a symbolic link")
	}
}
