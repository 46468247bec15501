// Package appcatalog checks the app catalog of the evaluation (configs/apps,
// configs/envs) without any service: every app spec parses and validates,
// its environment has a build file that parses and whose COPY sources exist
// (Python and JavaScript sources among them parse, where python3 and node
// are installed), and that
// build file installs the Debian package the app comes from.
package appcatalog

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/spec"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// packages are the Debian packages each app of the catalog is.
var packages = map[string][]string{
	"redis":      {"redis-server"},
	"pyhttp":     {"python3"},
	"nginx":      {"nginx"},
	"postgres":   {"postgresql-15"},
	"mariadb":    {"mariadb-server-core"},
	"tomcat":     {"tomcat10", "tomcat10-examples"},
	"pgindex":    {"postgresql-15"},
	"codesearch": {"python3"},
	"routes":     {"nodejs"},
	"fleet":      {"nodejs"},
}

const configs = "../../configs"

func TestCatalog(t *testing.T) {
	specs, err := filepath.Glob(filepath.Join(configs, "apps", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, path := range specs {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		app, err := spec.ParseApp(f)
		f.Close()
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		if err := app.WithDefaults().Validate(); err != nil {
			t.Errorf("%s: %v", path, err)
		}
		if want := strings.TrimSuffix(filepath.Base(path), ".yaml"); app.Name != want {
			t.Errorf("%s: name %q, want %q (the file's name)", path, app.Name, want)
		}
		names = append(names, app.Name)

		build := filepath.Join(configs, "envs", app.Env+".build")
		bf, err := os.Open(build)
		if err != nil {
			t.Errorf("app %s: environment %s has no build file: %v", app.Name, app.Env, err)
			continue
		}
		parsed, err := layering.ParseBuildFile(bf)
		bf.Close()
		if err != nil {
			t.Errorf("%s: %v", build, err)
			continue
		}
		if parsed.From != "debian-bookworm" {
			t.Errorf("%s starts FROM %q, want debian-bookworm (the base every catalog environment shares)", build, parsed.From)
		}
		var runs []string
		for _, s := range parsed.Steps {
			switch s.Kind {
			case layering.StepRun:
				runs = append(runs, strings.Join(s.Args, " "))
			case layering.StepCopy:
				// COPY reads from the build file's directory (the default
				// build context of fogctl env build).
				src := filepath.Join(configs, "envs", s.Args[0])
				if _, err := os.Stat(src); err != nil {
					t.Errorf("%s:%d: COPY %s: %v", build, s.Line, s.Args[0], err)
				} else if strings.HasSuffix(src, ".py") {
					checkPython(t, src)
				} else if strings.HasSuffix(src, ".js") {
					checkNode(t, src)
				}
			}
		}
		pkgs, ok := packages[app.Name]
		if !ok {
			t.Errorf("app %s is not in this test's table of Debian packages: add it", app.Name)
			continue
		}
		for _, p := range pkgs {
			if !slices.ContainsFunc(runs, func(r string) bool {
				return strings.Contains(r, "apt-get install") && slices.Contains(strings.Fields(r), p)
			}) {
				t.Errorf("%s does not apt-get install %s, the package app %s comes from", build, p, app.Name)
			}
		}
	}
	var want []string
	for n := range packages {
		want = append(want, n)
	}
	sort.Strings(want)
	sort.Strings(names)
	if !slices.Equal(names, want) {
		t.Errorf("catalog apps %v, want %v", names, want)
	}
}

// checkNode parses a JavaScript source that an environment copies (node
// --check), where node is installed.
func checkNode(t *testing.T, path string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Logf("%s: not parsed: no node on PATH", path)
		return
	}
	if out, err := exec.Command(node, "--check", path).CombinedOutput(); err != nil {
		t.Errorf("%s does not parse as JavaScript: %v\n%s", path, err, out)
	}
}

// checkPython parses a Python source that an environment copies (without
// writing bytecode), so that a syntax error shows here and not at deploy.
func checkPython(t *testing.T, path string) {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Logf("%s: not parsed: no python3 on PATH", path)
		return
	}
	out, err := exec.Command(py, "-c", "import ast, sys; ast.parse(open(sys.argv[1], 'rb').read(), sys.argv[1])", path).CombinedOutput()
	if err != nil {
		t.Errorf("%s does not parse as Python: %v\n%s", path, err, out)
	}
}
