package cli

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra/doc"
)

// cliDocs is the reference of fogctl's commands, generated from them.
const cliDocs = "../../docs/cli"

// TestCLIReference: docs/cli/ is what cobra generates from the commands,
// so that the reference cannot drift from them; `make docs` rewrites it
// (FOGDEPLOY_UPDATE_DOCS=1).
func TestCLIReference(t *testing.T) {
	t.Setenv("FOGDEPLOY_CONFIG", "") // a flag's default
	root := NewCmdRoot(&Factory{In: strings.NewReader(""), Out: io.Discard, ErrOut: io.Discard, Global: &GlobalOptions{}})
	root.DisableAutoGenTag = true
	dir := t.TempDir()
	if err := doc.GenMarkdownTree(root, dir); err != nil {
		t.Fatal(err)
	}
	gen, _ := filepath.Glob(filepath.Join(dir, "*.md"))
	if os.Getenv("FOGDEPLOY_UPDATE_DOCS") == "1" {
		old, _ := filepath.Glob(filepath.Join(cliDocs, "*.md"))
		for _, f := range old {
			if err := os.Remove(f); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.MkdirAll(cliDocs, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range gen {
			b, err := os.ReadFile(f)
			if err == nil {
				err = os.WriteFile(filepath.Join(cliDocs, filepath.Base(f)), b, 0o644)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("wrote %d pages into docs/cli", len(gen))
		return
	}
	names := func(files []string) []string {
		var out []string
		for _, f := range files {
			out = append(out, filepath.Base(f))
		}
		slices.Sort(out)
		return out
	}
	have, _ := filepath.Glob(filepath.Join(cliDocs, "*.md"))
	if g, h := names(gen), names(have); !slices.Equal(g, h) {
		t.Fatalf("docs/cli has pages %v; the commands make %v: run `make docs`", h, g)
	}
	for _, f := range gen {
		want, _ := os.ReadFile(f)
		got, _ := os.ReadFile(filepath.Join(cliDocs, filepath.Base(f)))
		if !bytes.Equal(got, want) {
			t.Errorf("docs/cli/%s is not what the commands say: run `make docs`", filepath.Base(f))
		}
	}
}
