package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// `fogctl pop backup FILE` writes etcd's snapshot (mode 0600) and records
// it for gc; it refuses an existing file without --force, and a missing
// directory, writing nothing.
func TestPopBackup(t *testing.T) {
	run, st := twoNodes(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "pop.db")
	code, out, errOut := run("pop", "backup", file)
	if code != 0 || !strings.Contains(out, file+": etcd at revision ") || !strings.Contains(errOut, "==> snapshot of etcd") {
		t.Fatalf("pop backup = exit %d\n%s%s", code, out, errOut)
	}
	fi, err := os.Stat(file)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Size() == 0 {
		t.Fatalf("the backup: %v, %v; want a file of mode 0600", fi, err)
	}
	last, err := st.LastBackup(context.Background())
	if err != nil || last == nil {
		t.Fatalf("LastBackup after pop backup: %+v, %v", last, err)
	}
	code, out, errOut = run("pop", "backup", file)
	if code == 0 || !strings.Contains(errOut, "exists") || !strings.Contains(errOut, "--force") {
		t.Errorf("pop backup over an existing file = exit %d\n%s%s; want refused with a hint", code, out, errOut)
	}
	code, out, errOut = run("pop", "backup", file, "--force", "-o", "json")
	var got struct {
		File     string `json:"file"`
		Revision int64  `json:"revision"`
		Bytes    int64  `json:"bytes"`
	}
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || got.File != file || got.Revision == 0 || got.Bytes == 0 {
		t.Errorf("pop backup --force -o json = exit %d, %v\n%s%s", code, err, out, errOut)
	}
	code, _, errOut = run("pop", "backup", filepath.Join(dir, "no", "pop.db"))
	if code == 0 || !strings.Contains(errOut, "create the directory") {
		t.Errorf("pop backup into a missing directory = exit %d\n%s", code, errOut)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("the directory holds %d entries; want the backup alone (no temporary file left)", len(ents))
	}
}
