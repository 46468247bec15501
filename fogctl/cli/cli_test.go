package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/wire"
	"github.com/fogdeploy/fogdeploy/internal/wire/wiretest"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/envtest"
)

// harness runs fogctl commands against one fake store.
type harness struct {
	t *testing.T
	l *wire.Layering
}

func newHarness(t *testing.T) *harness {
	return &harness{t: t, l: wiretest.FakeLayering(t)}
}

// run executes fogctl and returns exit code, stdout and stderr.
func (h *harness) run(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	f := &Factory{In: strings.NewReader(""), Out: &out, ErrOut: &errOut, Global: &GlobalOptions{}}
	f.Layering = func(context.Context) (*wire.Layering, error) { return h.l, nil }
	code := run(context.Background(), f, args)
	return code, out.String(), errOut.String()
}

func TestEnvCommands(t *testing.T) {
	h := newHarness(t)
	rootfs := envtest.BusyboxRootfs(t)
	code, out, errOut := h.run("env", "import", "base", "--dir", rootfs, "--size", "64M")
	if code != 0 || !strings.Contains(out, "Imported base as fdl-") || !strings.Contains(errOut, "==> making an ext4 filesystem") {
		t.Fatalf("import: code %d\nout: %s\nerr: %s", code, out, errOut)
	}

	bdir := t.TempDir()
	os.WriteFile(filepath.Join(bdir, "app.build"), []byte("FROM base\nRUN echo built > /etc/app\n"), 0o644)
	code, out, errOut = h.run("env", "build", "app", "-f", filepath.Join(bdir, "app.build"))
	if code != 0 || !strings.Contains(out, "RUN echo built > /etc/app") || !strings.Contains(out, "Built app as fdl-") {
		t.Fatalf("build: code %d\nout: %s\nerr: %s", code, out, errOut)
	}
	code, out, errOut = h.run("env", "build", "app", "-f", filepath.Join(bdir, "app.build"), "-o", "json")
	var res layering.BuildResult
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || len(res.Steps) != 1 || !res.Steps[0].Cached {
		t.Fatalf("rebuild -o json: code %d, want one cached step\nout: %s\nerr: %s", code, out, errOut)
	}

	code, out, _ = h.run("env", "ls", "-o", "json")
	var envs []layering.EnvInfo
	if code != 0 || json.Unmarshal([]byte(out), &envs) != nil || len(envs) != 2 {
		t.Fatalf("ls -o json: code %d out %s", code, out)
	}
	if envs[0].Name != "app" || envs[0].Depth != 1 || len(envs[0].Chain) != 2 || envs[0].Chain[1] != envs[1].Ref {
		t.Fatalf("ls: app's chain %v does not end at base %v", envs[0].Chain, envs[1].Ref)
	}
	code, out, _ = h.run("env", "ls")
	if code != 0 || !strings.HasPrefix(out, "NAME") || !strings.Contains(out, "app") {
		t.Fatalf("ls table: %s", out)
	}

	code, out, errOut = h.run("env", "exec", "app", "--", "cat", "/etc/app")
	if code != 0 || out != "built\n" || !strings.Contains(errOut, "map+mount") {
		t.Fatalf("exec: code %d out %q err %s", code, out, errOut)
	}
	// Each argument reaches the command as it was given: quoting kept.
	code, out, errOut = h.run("env", "exec", "app", "--", "sh", "-c", "echo \"$0|$1\"", "a b", "it's $HOME")
	if code != 0 || out != "a b|it's $HOME\n" {
		t.Fatalf("exec with quoted arguments: code %d out %q err %s", code, out, errOut)
	}

	// rm base is refused while app is built on it, then works.
	code, _, errOut = h.run("env", "rm", "base")
	if code != ExitConflict || !strings.Contains(errOut, "has clones") || !strings.Contains(errOut, "Hint:") {
		t.Fatalf("rm base with a child: code %d err %s", code, errOut)
	}
	if code, _, errOut = h.run("env", "rm", "app", "base"); code != 0 {
		t.Fatalf("rm app base: code %d err %s", code, errOut)
	}
	if names, _ := h.l.Store.List(context.Background()); len(names) != 0 {
		t.Fatalf("images left after rm: %v", names)
	}
}

func TestExitCodesAndErrors(t *testing.T) {
	h := newHarness(t)
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"env", "import", "Bad/Name", "--dir", "/"}, ExitInvalid, "NAME"},
		{[]string{"env", "import", "x", "--dir", "/nonexistent"}, ExitInvalid, "/nonexistent"},
		{[]string{"env", "import", "x", "--dir", "/", "--size", "-5G"}, ExitInvalid, "--size"},
		{[]string{"env", "import", "x"}, ExitInvalid, "dir"},
		{[]string{"env", "inspect", "nope"}, ExitNotFound, "nope"},
		{[]string{"env", "ls", "-o", "yaml"}, ExitInvalid, "--output"},
		{[]string{"env", "ls", "--timeout", "-1s"}, ExitInvalid, "--timeout"},
		{[]string{"env", "frobnicate"}, ExitInvalid, "unknown command"},
		{[]string{"env", "exec", "x"}, ExitInvalid, "NAME -- COMMAND"},
		{[]string{"env", "exec", "x", "--network", "bridge", "--", "true"}, ExitInvalid, `--network "bridge": use default`},
		{[]string{"env", "prune", "--min-age", "-1m"}, ExitInvalid, "--min-age"},
	}
	for _, c := range cases {
		code, _, errOut := h.run(c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("fogctl %s: code %d, stderr %q; want code %d mentioning %q", strings.Join(c.args, " "), code, errOut, c.code, c.want)
		}
	}
	bf := filepath.Join(t.TempDir(), "bad.build")
	os.WriteFile(bf, []byte("FROM base\nFROB x\n"), 0o644)
	if code, _, errOut := h.run("env", "build", "y", "-f", bf); code != ExitInvalid || !strings.Contains(errOut, `line 2: unknown step "FROB"`) {
		t.Errorf("bad build file: code %d err %s", code, errOut)
	}
}
