package mapper_test

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper/mappertest"
)

// fileStore is a fake image store: one sparse file per image, a copy per
// snapshot, under dir/POOL/NAME[@SNAP].
type fileStore struct{ dir string }

func (s fileStore) path(img mapper.Image) (string, error) {
	p := filepath.Join(s.dir, img.Pool, img.Name)
	if img.Snap != "" {
		p += "@" + img.Snap
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("fake image %s: %w", img, err)
	}
	return p, nil
}

func (s fileStore) config(stateDir string) mapper.Config {
	return mapper.Config{Backend: mapper.BackendFile, StateDir: stateDir, FilePath: s.path}
}

func needLoop(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: losetup and mount")
	}
	for _, tool := range []string{"losetup", "mount", "umount", "mkfs.ext4", "blkid", "fsfreeze"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s in PATH", tool)
		}
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("needs the loop driver (/dev/loop-control)")
	}
}

func fileHarness(t *testing.T) (mappertest.Harness, fileStore) {
	s := fileStore{dir: t.TempDir()}
	return mappertest.Harness{
		Backend: mapper.BackendFile,
		NewMapper: func(t *testing.T, stateDir string) *mapper.Mapper {
			m, err := mapper.New(t.Context(), s.config(stateDir), testLogger(t))
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			return m
		},
		CreateImage: func(t *testing.T, name string, size int64) mapper.Image {
			img := mapper.Image{Pool: "filepool", Name: name}
			p := filepath.Join(s.dir, img.Pool, img.Name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			if err == nil {
				err = errors.Join(f.Truncate(size), f.Close())
			}
			if err != nil {
				t.Fatal(err)
			}
			return img
		},
		DeleteImage: func(t *testing.T, img mapper.Image) {
			matches, _ := filepath.Glob(filepath.Join(s.dir, img.Pool, img.Name+"*"))
			for _, m := range matches {
				if err := os.Remove(m); err != nil && !errors.Is(err, fs.ErrNotExist) {
					t.Error(err)
				}
			}
		},
		Snapshot: func(t *testing.T, img mapper.Image, snap string) {
			src, err := s.path(img)
			if err != nil {
				t.Fatal(err)
			}
			in, err := os.Open(src)
			if err != nil {
				t.Fatal(err)
			}
			defer in.Close()
			out, err := os.Create(src + "@" + snap)
			if err == nil {
				_, err = io.Copy(out, in)
				err = errors.Join(err, out.Close())
			}
			if err != nil {
				t.Fatal(err)
			}
		},
	}, s
}

// TestFileBackendSuite runs the conformance suite against the file
// backend: loop devices over local files.
func TestFileBackendSuite(t *testing.T) {
	needLoop(t)
	h, _ := fileHarness(t)
	mappertest.RunSuite(t, h)
}

// TestFileBackendSurvivesKill: a process that mapped and mounted is killed
// with SIGKILL; the loop device and mount stay, and Recover in this
// process undoes them.
func TestFileBackendSurvivesKill(t *testing.T) {
	needLoop(t)
	h, s := fileHarness(t)
	img := h.CreateImage(t, "killed", 64<<20)
	testSurvivesKill(t, helperSpec{Backend: mapper.BackendFile, FileDir: s.dir, Image: img},
		func(stateDir string) *mapper.Mapper { return h.NewMapper(t, stateDir) }, nil)
}
