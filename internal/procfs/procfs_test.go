package procfs

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/osthread"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// The lists hold every /proc path that the vendored moby's own default
// spec (its oci/defaults.go, read from the module the project builds
// with) masks or makes read-only: a moby upgrade that hides more fails
// here until the project hides it too.
func TestListsCoverDockerDefaults(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/docker/docker").Output()
	if err != nil {
		t.Fatalf("go list -m github.com/docker/docker: %v", err)
	}
	file := filepath.Join(strings.TrimSpace(string(out)), "oci", "defaults.go")
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	docker := map[string][]string{} // "Masked" and "ReadOnly": /proc paths
	strs := func(lit *ast.CompositeLit) (paths []string) {
		for _, e := range lit.Elts {
			if b, ok := e.(*ast.BasicLit); ok && b.Kind == token.STRING {
				if p, err := strconv.Unquote(b.Value); err == nil {
					paths = append(paths, p)
				}
			}
		}
		return paths
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt: // maskedPaths := []string{...}
			if id, ok := n.Lhs[0].(*ast.Ident); ok && id.Name == "maskedPaths" && len(n.Rhs) == 1 {
				if lit, ok := n.Rhs[0].(*ast.CompositeLit); ok {
					docker["Masked"] = append(docker["Masked"], strs(lit)...)
				}
			}
		case *ast.KeyValueExpr: // ReadonlyPaths: []string{...}
			if id, ok := n.Key.(*ast.Ident); ok && id.Name == "ReadonlyPaths" {
				if lit, ok := n.Value.(*ast.CompositeLit); ok {
					docker["ReadOnly"] = append(docker["ReadOnly"], strs(lit)...)
				}
			}
		}
		return true
	})
	for name, project := range map[string][]string{"Masked": Masked, "ReadOnly": ReadOnly} {
		n := 0
		for _, p := range docker[name] {
			rel, ok := strings.CutPrefix(p, "/proc/")
			if !ok {
				continue
			}
			n++
			if !slices.Contains(project, rel) {
				t.Errorf("%s lacks %s, which Docker's default spec hides (%s)", name, p, file)
			}
		}
		if n == 0 {
			t.Errorf("found no %s path under /proc in %s: the comparison compared nothing", name, file)
		}
	}
}

// Hidden reads a mount table: a fresh procfs alone leaves every path of
// the running kernel open; covered and read-only mounts close them.
func TestHidden(t *testing.T) {
	fresh := "22 1 0:5 / /proc rw,nosuid,nodev,noexec shared:1 - proc proc rw\n"
	open := Hidden(fresh, "/proc")
	for _, p := range []string{"/proc/sys (not read-only)", "/proc/irq (not read-only)", "/proc/timer_list (not masked)"} {
		if _, err := os.Stat(strings.Fields(p)[0]); err == nil && !slices.Contains(open, p) {
			t.Errorf("Hidden(a fresh procfs) = %v; want %s among them", open, p)
		}
	}
	var b strings.Builder
	b.WriteString(fresh)
	for _, p := range Masked {
		b.WriteString("30 22 0:1 /null /proc/" + p + " rw,nosuid - devtmpfs udev rw\n")
	}
	for _, p := range ReadOnly {
		b.WriteString("31 22 0:5 /" + p + " /proc/" + p + " ro,nosuid,nodev,noexec - proc proc rw\n")
	}
	if open := Hidden(b.String(), "/proc"); len(open) != 0 {
		t.Errorf("Hidden(everything covered) = %v; want none", open)
	}
	// A read-only path bound read-write is still open.
	rw := strings.Replace(b.String(), "/proc/sys ro,", "/proc/sys rw,", 1)
	if open := Hidden(rw, "/proc"); !slices.Contains(open, "/proc/sys (not read-only)") {
		t.Errorf("Hidden(/proc/sys rw) = %v; want it open", open)
	}
}

// Script is valid shell, and names every path.
func TestScript(t *testing.T) {
	s := Script()
	if out, err := exec.Command("sh", "-n", "-c", s).CombinedOutput(); err != nil {
		t.Fatalf("sh -n: %v\n%s\n%s", err, out, s)
	}
	for _, p := range append(slices.Clone(Masked), ReadOnly...) {
		if !strings.Contains(s, `"$PROC/`+p+`"`) {
			t.Errorf("Script does not name %s", p)
		}
	}
}

// Mount and Hide on this machine's kernel: in a mount namespace of its
// own, a fresh procfs mounted in a root has every path of Masked that the
// kernel has covered (reads give nothing) and every path of ReadOnly
// read-only (a write is refused), as its mount table says too.
func TestMountHides(t *testing.T) {
	testenv.NeedRoot(t)
	root := t.TempDir()
	var mi string
	var read map[string]string
	var wrote error
	err := osthread.Run(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			return err
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
			return err
		}
		if err := Mount(root); err != nil {
			return err
		}
		b, err := os.ReadFile("/proc/thread-self/mountinfo")
		mi = string(b)
		read = map[string]string{}
		for _, p := range Masked {
			if st, err := os.Stat(filepath.Join(root, "proc", p)); err == nil && !st.IsDir() {
				got, _ := os.ReadFile(filepath.Join(root, "proc", p))
				read[p] = string(got)
			}
		}
		wrote = os.WriteFile(filepath.Join(root, "proc", "sys", "kernel", "domainname"), []byte("x"), 0)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if open := Hidden(mi, filepath.Join(root, "proc")); len(open) > 0 {
		t.Errorf("a procfs Mount hid leaves open %v", open)
	}
	for p, got := range read {
		if got != "" {
			t.Errorf("/proc/%s reads %d bytes; want none (masked)", p, len(got))
		}
	}
	if len(read) == 0 {
		t.Error("no masked file was found to read: the check read nothing")
	}
	if !errors.Is(wrote, unix.EROFS) {
		t.Errorf("a write to /proc/sys/kernel/domainname: %v; want read-only", wrote)
	}
}
