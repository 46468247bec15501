// Package house holds the rules that keep the code's rooms walled, as
// tests: who may reach etcd, who may tell engines apart by name, how many
// methods a type of the deploy path may carry.
package house

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
)

// goFiles parses every Go file of the repository (test files with tests).
func goFiles(t *testing.T, tests bool) map[string]*ast.File {
	t.Helper()
	root := deploytest.RepoRoot()
	fset := token.NewFileSet()
	out := map[string]*ast.File{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "bin" || d.Name() == "bench") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || (!tests && strings.HasSuffix(path, "_test.go")) {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		out[filepath.ToSlash(rel)] = f
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestEtcdOnlyInState: only internal/state (its test helpers included)
// imports the etcd client; every other package calls the state's named
// operations, and no one else builds a key.
func TestEtcdOnlyInState(t *testing.T) {
	for path, f := range goFiles(t, true) {
		for _, im := range f.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			if strings.HasPrefix(p, "go.etcd.io/etcd/client/") && !strings.HasPrefix(path, "internal/state/") {
				t.Errorf("%s imports %s: call internal/state's operations (or statetest's, in a test) instead", path, p)
			}
		}
	}
}

// TestEngineNamesOnlyInEngine: outside internal/engine, no code tells the
// engines apart by name (engine.NameDMTCP, engine.NameCRIU): it reads the
// registry's facts, so that an engine is added in one place.
func TestEngineNamesOnlyInEngine(t *testing.T) {
	for path, f := range goFiles(t, false) {
		if strings.HasPrefix(path, "internal/engine/") || strings.Contains(path, "test/") {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if se, ok := n.(*ast.SelectorExpr); ok {
				if x, ok := se.X.(*ast.Ident); ok && x.Name == "engine" && (se.Sel.Name == "NameDMTCP" || se.Sel.Name == "NameCRIU") {
					t.Errorf("%s uses engine.%s: read the engine's facts (engine.Of) instead", path, se.Sel.Name)
				}
			}
			return true
		})
	}
}

// TestDeployTypesStaySmall: no type of the deploy path carries more than
// 40 methods; one that grows past it holds two concerns.
func TestDeployTypesStaySmall(t *testing.T) {
	count := map[string]int{}
	for path, f := range goFiles(t, false) {
		if !strings.HasPrefix(path, "internal/deploy/") || strings.Count(path, "/") != 2 {
			continue
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil {
				continue
			}
			typ := fn.Recv.List[0].Type
			if st, ok := typ.(*ast.StarExpr); ok {
				typ = st.X
			}
			if id, ok := typ.(*ast.Ident); ok {
				count[id.Name]++
			}
		}
	}
	var names []string
	for n := range count {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if count[n] > 40 {
			t.Errorf("deploy.%s has %d methods; split it by concern (at most 40)", n, count[n])
		}
	}
	if count["Deployer"] == 0 || count["Pool"] == 0 {
		t.Fatalf("found no method of Deployer or Pool: %v", count)
	}
}
