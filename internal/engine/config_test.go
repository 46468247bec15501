package engine

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/ctlfs"
	"github.com/fogdeploy/fogdeploy/internal/hint"
)

func fakePrefix(t *testing.T, dir string, bins ...string) string {
	t.Helper()
	for _, b := range bins {
		p := filepath.Join(dir, "bin", b)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestLocateOrder(t *testing.T) {
	bins := []string{"dmtcp_launch", "dmtcp_restart"}
	configured := fakePrefix(t, t.TempDir(), bins...)
	fromEnv := fakePrefix(t, t.TempDir(), bins...)
	partial := fakePrefix(t, t.TempDir(), "dmtcp_launch")
	t.Setenv(EnvDMTCPPrefix, fromEnv)
	t.Setenv("PATH", "")

	if p, paths, err := locate(configured, EnvDMTCPPrefix, "/nonexistent", bins); err != nil || p != configured ||
		paths["dmtcp_restart"] != filepath.Join(configured, "bin", "dmtcp_restart") {
		t.Fatalf("configured prefix: %q %v %v", p, paths, err)
	}
	if p, _, err := locate(partial, EnvDMTCPPrefix, "/nonexistent", bins); err != nil || p != fromEnv {
		t.Fatalf("incomplete configured prefix should fall through to $%s: %q %v", EnvDMTCPPrefix, p, err)
	}
	t.Setenv(EnvDMTCPPrefix, "")
	_, _, err := locate("", EnvDMTCPPrefix, "/nonexistent", bins)
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "/nonexistent") {
		t.Fatalf("nothing installed: %v, want ErrUnavailable naming where it looked", err)
	}
}

func TestResolveArgv0InRoot(t *testing.T) {
	root := t.TempDir()
	fakePrefix(t, filepath.Join(root, "usr"), "app")
	env := []string{"PATH=/usr/local/bin:/usr/bin"}
	if p, err := resolveArgv0(root, "app", env); err != nil || p != "/usr/bin/app" {
		t.Fatalf("resolve in root: %q, %v", p, err)
	}
	if p, err := resolveArgv0(root, "/usr/bin/app", env); err != nil || p != "/usr/bin/app" {
		t.Fatalf("absolute in root: %q, %v", p, err)
	}
	for _, argv0 := range []string{"sh-not-in-root", "/bin/sh", "bin/app"} {
		_, err := resolveArgv0(root, argv0, env)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), argv0) {
			t.Errorf("%s: %v, want ErrInvalid naming it", argv0, err)
		}
	}
	_, err := resolveArgv0(root, "missing", env)
	if hint.Of(err) == "" || !strings.Contains(err.Error(), root) {
		t.Fatalf("error should name the root and carry a hint: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	err := Config{Prefix: "opt/dmtcp", TempDir: "tmp", Timeout: -time.Second}.Validate()
	for _, want := range []string{"opt/dmtcp", "tmp", "negative"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate error lacks %q: %v", want, err)
		}
	}
	if err := (Config{}).Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestEmptyDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "gen1")
	if err := emptyDir(dir); err != nil {
		t.Fatalf("missing dir should be created: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "ckpt_old.dmtcp"), nil, 0o644)
	err := emptyDir(dir)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "ckpt_old.dmtcp") || hint.Of(err) == "" {
		t.Fatalf("non-empty dir: %v", err)
	}
}

func TestImageManifest(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "pages-1.img"), make([]byte, 1000), 0o644)
	img := Image{Engine: NameCRIU, Dir: dir, Files: []string{"pages-1.img"}, Generation: 2,
		Stdio: map[int]string{1: "pipe:[7]"}, Write: time.Second}
	if err := img.writeManifest(); err != nil {
		t.Fatal(err)
	}
	back, err := ReadImage(dir)
	if err != nil {
		t.Fatal(err)
	}
	if back.Dir != dir || back.Bytes < 1000 || back.Generation != 2 || back.Stdio[1] != "pipe:[7]" || back.Write != time.Second {
		t.Fatalf("round trip: %+v", back)
	}
	if err := back.check(NameDMTCP); !errors.Is(err, ErrInvalid) {
		t.Fatalf("check against the other engine: %v", err)
	}
	os.Remove(filepath.Join(dir, "pages-1.img"))
	if _, err := ReadImage(dir); !errors.Is(err, ErrNoImage) {
		t.Fatalf("missing image file: %v, want ErrNoImage", err)
	}
	if _, err := ReadImage(t.TempDir()); !errors.Is(err, ErrNoImage) || hint.Of(err) == "" {
		t.Fatalf("no manifest: %v, want ErrNoImage with a hint", err)
	}
	// The app can write its checkpoint volume: a manifest that is a FIFO
	// (a reader would hang), a sparse file of 64 GiB, or a link out of the
	// directory is refused, not read.
	fifo := t.TempDir()
	if err := unix.Mkfifo(filepath.Join(fifo, ManifestName), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadImage(fifo); !errors.Is(err, ctlfs.ErrNotRegular) {
		t.Errorf("a FIFO as the manifest: %v; want ErrNotRegular", err)
	}
	sparse := t.TempDir()
	if f, err := os.Create(filepath.Join(sparse, ManifestName)); err != nil {
		t.Fatal(err)
	} else if err := errors.Join(f.Truncate(64<<30), f.Close()); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadImage(sparse); !errors.Is(err, ctlfs.ErrTooLarge) {
		t.Errorf("a 64 GiB manifest: %v; want ErrTooLarge", err)
	}
	outside := filepath.Join(t.TempDir(), "manifest.json")
	if err := os.WriteFile(outside, []byte(`{"engine":"criu","files":["x"]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	linked := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(linked, ManifestName)); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadImage(linked); !errors.Is(err, ErrNoImage) {
		t.Errorf("a manifest linked out of its directory: %v; want it not found there (ErrNoImage)", err)
	}
}
