package mapper_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/testenv"
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
	testenv.NeedRoot(t)
	for _, tool := range []string{"losetup", "mount", "umount", "mkfs.ext4", "blkid", "fsfreeze"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Unavailable(t, testenv.Root, "needs "+tool+" in PATH")
		}
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		testenv.Unavailable(t, testenv.Root, "needs the loop driver (/dev/loop-control)")
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

// writeRecord plants a record as a crashed process would have left it.
func writeRecord(t *testing.T, stateDir string, rec mapper.Record) {
	t.Helper()
	rec.Version = 1
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stateDir, "mappings", rec.ID+".json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func losetup(t *testing.T, file string) string {
	t.Helper()
	out, err := exec.Command("losetup", "--find", "--show", file).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup %s: %v: %s", file, err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if b, _ := os.ReadFile("/sys/block/" + filepath.Base(dev) + "/loop/backing_file"); strings.TrimSpace(string(b)) == file {
			exec.Command("losetup", "-d", dev).Run()
		}
	})
	return dev
}

// TestFileRecoverVerifiesIdentity: Recover removes records whose loop
// devices it cannot prove its own, without touching those devices: one
// whose loop device now backs another file (reused after a detach), and
// one interrupted between losetup and the record update (a shared file's
// loop devices could belong to anyone).
func TestFileRecoverVerifiesIdentity(t *testing.T) {
	needLoop(t)
	h, s := fileHarness(t)
	a := h.CreateImage(t, "a", 16<<20)
	b := h.CreateImage(t, "b", 16<<20)
	pathA, _ := s.path(a)
	pathB, _ := s.path(b)
	stateDir := filepath.Join(t.TempDir(), "state")
	m := h.NewMapper(t, stateDir)

	devB := losetup(t, pathB) // someone else's loop device
	writeRecord(t, stateDir, mapper.Record{ID: "reused", Backend: mapper.BackendFile, Image: a,
		LoopBacking: pathA, LoopDev: devB, Device: devB})
	writeRecord(t, stateDir, mapper.Record{ID: "intent", Backend: mapper.BackendFile, Image: b, LoopBacking: pathB})

	undone, err := m.Recover(t.Context())
	if err != nil || len(undone) != 2 {
		t.Fatalf("Recover = %+v, %v; want both records undone", undone, err)
	}
	if got, _ := os.ReadFile("/sys/block/" + filepath.Base(devB) + "/loop/backing_file"); strings.TrimSpace(string(got)) != pathB {
		t.Fatalf("Recover detached %s, which was not ours (backing file now %q)", devB, got)
	}
	if l, err := m.List(); err != nil || len(l) != 0 {
		t.Fatalf("List after Recover = %+v, %v", l, err)
	}
}
