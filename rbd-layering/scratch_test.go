package layering_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/procstat"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/fakestore"
)

// A manager removes, when it starts, the scratch directories of processes
// that are gone (a killed import leaves its unpacked root filesystem and
// filesystem image there): whole for an import, while empty for a mount
// target, never one with a mount in it, one of a process that runs, or
// anything else in the work directory.
func TestScratchOfGoneProcesses(t *testing.T) {
	work := filepath.Join(t.TempDir(), "work")
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	self, ok := procstat.Start(os.Getpid())
	if !ok {
		t.Fatal("no start time for this process")
	}
	mk := func(name string, files bool) string {
		t.Helper()
		dir := filepath.Join(work, name)
		if err := os.MkdirAll(filepath.Join(dir, "rootfs", "etc"), 0o755); err != nil {
			t.Fatal(err)
		}
		if !files {
			if err := os.RemoveAll(filepath.Join(dir, "rootfs")); err != nil {
				t.Fatal(err)
			}
			return dir
		}
		if err := os.WriteFile(filepath.Join(dir, "fs.img"), make([]byte, 4096), 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	gone := []string{
		mk(fmt.Sprintf("import-%d-%d-11", dead.Process.Pid, self), true), // exited
		mk(fmt.Sprintf("import-%d-%d-12", os.Getpid(), self+1), true),    // its PID reused since
		mk(fmt.Sprintf("build-%d-%d-21", dead.Process.Pid, self), false),
		mk(fmt.Sprintf("exec-%d-%d-31", dead.Process.Pid, self), false),
	}
	kept := []string{
		mk(fmt.Sprintf("build-%d-%d-22", dead.Process.Pid, self), true), // a mount target is never emptied
		mk(fmt.Sprintf("import-%d-%d-13", os.Getpid(), self), true),     // this process's
		mk("import-12345", true), // not named by a process
		mk("notes", true),
	}
	if os.Geteuid() == 0 {
		mounted := mk(fmt.Sprintf("import-%d-%d-14", dead.Process.Pid, self), true)
		if out, err := exec.Command("mount", "-t", "tmpfs", "tmpfs", filepath.Join(mounted, "rootfs")).CombinedOutput(); err != nil {
			t.Fatalf("mount: %v: %s", err, out)
		}
		t.Cleanup(func() { _ = exec.Command("umount", filepath.Join(mounted, "rootfs")).Run() })
		kept = append(kept, mounted)
	}
	fs, err := fakestore.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })
	if _, err := layering.NewManager(fs, nil, layering.DefaultManagerConfig(work), nil); err != nil {
		t.Fatal(err)
	}
	for _, d := range gone {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s is still there (%v); its process is gone", filepath.Base(d), err)
		}
	}
	for _, d := range kept {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s was removed: %v", filepath.Base(d), err)
		}
	}
}
