package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	for i, durable := range []bool{false, true} {
		want := []byte{'v', byte('0' + i)}
		if err := Write(path, want, 0o600, durable); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != string(want) {
			t.Fatalf("read %q, %v; want %q", got, err, want)
		}
		st, _ := os.Stat(path)
		if st.Mode().Perm() != 0o600 {
			t.Errorf("mode %v, want 0600", st.Mode().Perm())
		}
	}
	// A failed write keeps the old content and leaves no temporary file.
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Write(filepath.Join(dir, "sub"), []byte("x"), 0o600, false); err == nil {
		t.Fatal("replacing a directory succeeded")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Errorf("left behind: %v", ents)
	}
	if got, _ := os.ReadFile(path); string(got) != "v1" {
		t.Errorf("old content lost: %q", got)
	}
}
