package devfs

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/osthread"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// A private /dev holds the harmless nodes, working, and nothing else of
// the host's /dev.
func TestMount(t *testing.T) {
	testenv.NeedRoot(t)
	dir := t.TempDir()
	var names []string
	var zero [4]byte
	err := osthread.Run(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			return err
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
			return err
		}
		fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := Mount(fd); err != nil {
			return err
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range ents {
			names = append(names, e.Name())
		}
		f, err := os.Open(filepath.Join(dir, "zero"))
		if err != nil {
			return err
		}
		defer f.Close()
		zero = [4]byte{1, 1, 1, 1}
		_, err = f.Read(zero[:])
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := append(slices.Clone(Nodes), "pts", "shm", "ptmx", "fd", "stdin", "stdout", "stderr")
	slices.Sort(want)
	slices.Sort(names)
	if !slices.Equal(names, want) {
		t.Errorf("private /dev holds %v; want %v", names, want)
	}
	if zero != [4]byte{} {
		t.Errorf("/dev/zero read %v; want zeros", zero)
	}
	// Nothing stays mounted outside the namespace.
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("the mount leaked into the test's namespace: %d entries in %s", len(ents), dir)
	}
}
