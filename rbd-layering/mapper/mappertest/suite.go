// Package mappertest is the behaviour suite every mapper backend must pass
// (after containerd's snapshots/testsuite and restic's backend/test).
//
// A test file wires a backend into a Harness and calls RunSuite:
//
//	func TestFileBackend(t *testing.T) {
//		mappertest.RunSuite(t, mappertest.Harness{NewMapper: ..., CreateImage: ..., DeleteImage: ...})
//	}
//
// The suite asserts what a user of the node would observe: files written
// through a mount come back after release and remap; after Release or
// Recover there is no mount at the target, no loop device still backed by
// the mapping's file, no rbd-fuse/rbd-nbd process for the image, and no
// record. It needs root.
package mappertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// Harness adapts one backend to the suite.
type Harness struct {
	// Backend is the name Mapper.Choice must report, e.g. "fuse".
	Backend string
	// NewMapper returns a new Mapper whose Config.StateDir is stateDir.
	// The suite calls it again with the same stateDir to act out a
	// restart after a crash.
	NewMapper func(t *testing.T, stateDir string) *mapper.Mapper
	// CreateImage creates a blank (all zero) image of size bytes, named
	// name, and returns it.
	CreateImage func(t *testing.T, name string, size int64) mapper.Image
	// DeleteImage deletes an image made by CreateImage. The suite calls
	// it after releasing every mapping of the image.
	DeleteImage func(t *testing.T, img mapper.Image)
	// Snapshot takes a snapshot named snap of img (not mapped at the
	// time). Nil skips the snapshot test.
	Snapshot func(t *testing.T, img mapper.Image, snap string)
	// SnapshotUnsupported says that mapping a snapshot must fail with
	// mapper.ErrUnsupported and leave nothing behind.
	SnapshotUnsupported bool
	// ImageSize is the size of the images the suite creates; 0 means 64 MiB.
	ImageSize int64
}

// RunSuite runs every behaviour test against h, each as a subtest with its
// own StateDir and images.
func RunSuite(t *testing.T, h Harness) {
	if os.Geteuid() != 0 {
		t.Skip("mapper suite needs root (losetup, mount)")
	}
	if h.ImageSize == 0 {
		h.ImageSize = 64 << 20
	}
	tests := []struct {
		name string
		fn   func(*testing.T, *env)
	}{
		{"Choice", testChoice},
		{"MapFormatMountRemap", testMapFormatMountRemap},
		{"MapThenMount", testMapThenMount},
		{"ReleaseTwice", testReleaseTwice},
		{"ReleaseBusy", testReleaseBusy},
		{"ReleaseMountsInside", testReleaseMountsInside},
		{"MissingImage", testMissingImage},
		{"MissingPool", testMissingPool},
		{"MountFailureRollsBack", testMountFailureRollsBack},
		{"CallerID", testCallerID},
		{"CrashRecover", testCrashRecover},
		{"RecoverStaleRecord", testRecoverStaleRecord},
		{"TwoImages", testTwoImages},
		{"ReadOnly", testReadOnly},
		{"Snapshot", testSnapshot},
		{"FreezeThaw", testFreezeThaw},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newEnv(t, h)) })
	}
}

// env is one subtest's world: a StateDir, mount targets, images.
type env struct {
	h        Harness
	ctx      context.Context
	root     string
	stateDir string
	m        *mapper.Mapper
	images   []mapper.Image
}

func newEnv(t *testing.T, h Harness) *env {
	root := t.TempDir()
	e := &env{h: h, ctx: t.Context(), root: root, stateDir: filepath.Join(root, "state")}
	// One cleanup, so the order is fixed: undo what the test left, then
	// delete the images (an image with watchers cannot be deleted). It
	// runs before t.TempDir's removal, which must never meet a mount.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		m := h.NewMapper(t, e.stateDir)
		if undone, err := m.Recover(ctx); err != nil {
			t.Errorf("cleanup: Recover: %v", err)
		} else if len(undone) > 0 {
			t.Logf("cleanup: recovered %d mapping(s) the test left", len(undone))
		}
		for _, mnt := range slices.Backward(mountsUnder(e.root)) {
			t.Errorf("cleanup: %s still mounted after Recover; lazily unmounting", mnt)
			exec.Command("umount", "-l", mnt).Run()
		}
		for _, img := range e.images {
			h.DeleteImage(t, img)
		}
	})
	e.m = h.NewMapper(t, e.stateDir)
	return e
}

// image creates an image with a name unique to this run.
func (e *env) image(t *testing.T) mapper.Image {
	t.Helper()
	var b [4]byte
	rand.Read(b[:])
	name := "mt-" + strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(name) > 40 {
		name = name[:40]
	}
	name += "-" + hex.EncodeToString(b[:])
	img := e.h.CreateImage(t, name, e.h.ImageSize)
	e.images = append(e.images, img)
	return img
}

func (e *env) target(name string) string { return filepath.Join(e.root, "mnt", name) }

func (e *env) mapAndMount(t *testing.T, m *mapper.Mapper, img mapper.Image, target string, opts mapper.MountOptions) Tracked {
	t.Helper()
	mp, err := m.MapAndMount(e.ctx, img, target, opts)
	if err != nil {
		t.Fatalf("MapAndMount(%s): %v", img, err)
	}
	if mp.Target != target || mp.Device == "" || mp.ID == "" {
		t.Fatalf("MapAndMount(%s) = %+v, want ID, Device and Target %s", img, mp, target)
	}
	if !IsMountPoint(target) {
		t.Fatalf("after MapAndMount(%s), %s is not a mount point", img, target)
	}
	return Track(t, e.stateDir, mp)
}

func (e *env) release(t *testing.T, m *mapper.Mapper, tr Tracked) {
	t.Helper()
	if err := m.Release(e.ctx, tr.Mapping.ID); err != nil {
		t.Fatalf("Release(%s): %v", tr.Mapping.ID, err)
	}
	tr.WaitGone(t, 10*time.Second)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(content); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func noRecords(t *testing.T, e *env, m *mapper.Mapper) {
	t.Helper()
	l, err := m.List()
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(l) != 0 {
		t.Fatalf("List = %+v, want no mappings", l)
	}
	ents, _ := os.ReadDir(filepath.Join(e.stateDir, "mappings"))
	for _, ent := range ents {
		t.Errorf("StateDir still holds %s", ent.Name())
	}
}

func testChoice(t *testing.T, e *env) {
	c := e.m.Choice()
	if c.Backend != e.h.Backend || c.Reason == "" {
		t.Fatalf("Choice() = %+v, want backend %q with a reason", c, e.h.Backend)
	}
}

// A blank image is formatted, mounted, written, released; mapped again it
// shows the file.
func testMapFormatMountRemap(t *testing.T, e *env) {
	img := e.image(t)
	target := e.target("a")
	tr := e.mapAndMount(t, e.m, img, target, mapper.MountOptions{Format: true})
	l, err := e.m.List()
	if err != nil || len(l) != 1 || l[0].ID != tr.Mapping.ID || l[0].Device != tr.Mapping.Device || l[0].Target != target || l[0].Image != img {
		t.Fatalf("List() = %+v, %v; want just %+v", l, err, tr.Mapping)
	}
	writeFile(t, filepath.Join(target, "hello.txt"), "hello from "+img.Name)
	e.release(t, e.m, tr)
	noRecords(t, e, e.m)

	tr = e.mapAndMount(t, e.m, img, target, mapper.MountOptions{Format: true}) // must not reformat
	if got, want := readFile(t, filepath.Join(target, "hello.txt")), "hello from "+img.Name; got != want {
		t.Fatalf("after remap hello.txt = %q, want %q", got, want)
	}
	e.release(t, e.m, tr)
	noRecords(t, e, e.m)
}

// Map and Mount as separate steps, Mount creating a missing target.
func testMapThenMount(t *testing.T, e *env) {
	img := e.image(t)
	mp, err := e.m.Map(e.ctx, img)
	if err != nil {
		t.Fatalf("Map: %v", err)
	}
	if st, err := os.Stat(mp.Device); err != nil || st.Mode()&os.ModeDevice == 0 {
		t.Fatalf("Map returned device %q, not a device node (%v)", mp.Device, err)
	}
	tr := Track(t, e.stateDir, mp)
	target := e.target("deep/er")
	if err := e.m.Mount(e.ctx, mp, target, mapper.MountOptions{Format: true}); err != nil {
		t.Fatalf("Mount: %v", err)
	}
	if mp.Target != target || !IsMountPoint(target) {
		t.Fatalf("Mount: mp.Target = %q, mount point %v; want %s mounted", mp.Target, IsMountPoint(target), target)
	}
	if err := e.m.Mount(e.ctx, mp, e.target("other"), mapper.MountOptions{}); !errors.Is(err, mapper.ErrBusy) {
		t.Fatalf("second Mount of one mapping: %v, want ErrBusy", err)
	}
	tr.Mapping = *mp
	e.release(t, e.m, tr)
}

// The second Release of an ID is ErrNotMapped and changes nothing; so is
// the Release of an ID never mapped.
func testReleaseTwice(t *testing.T, e *env) {
	img := e.image(t)
	tr := e.mapAndMount(t, e.m, img, e.target("a"), mapper.MountOptions{Format: true})
	e.release(t, e.m, tr)
	if err := e.m.Release(e.ctx, tr.Mapping.ID); !errors.Is(err, mapper.ErrNotMapped) {
		t.Fatalf("second Release: %v, want ErrNotMapped", err)
	}
	if err := e.m.Release(e.ctx, "never-mapped"); !errors.Is(err, mapper.ErrNotMapped) {
		t.Fatalf("Release of an unknown ID: %v, want ErrNotMapped", err)
	}
}

// Filesystems mounted inside the mapping's (a build step's /proc and
// /dev, left by a process killed in the step) are unmounted by Release
// with it. An Ephemeral mapping of a process that runs (this one) is not
// abandoned: ReleaseAbandoned leaves it, and List says it is live.
func testReleaseMountsInside(t *testing.T, e *env) {
	img := e.image(t)
	target := e.target("a")
	mp, err := e.m.MapAndMount(e.ctx, img, target, mapper.MountOptions{Format: true}, mapper.Ephemeral())
	if err != nil {
		t.Fatalf("MapAndMount(%s, Ephemeral): %v", img, err)
	}
	tr := Track(t, e.stateDir, mp)
	for _, sub := range []string{"proc", "dev", "dev/pts"} {
		if err := os.MkdirAll(filepath.Join(target, sub), 0o755); err != nil {
			t.Fatal(err)
		}
		run(t, "mount", "-t", "tmpfs", "tmpfs", filepath.Join(target, sub))
	}
	if undone, err := e.m.ReleaseAbandoned(e.ctx); err != nil || len(undone) != 0 {
		t.Fatalf("ReleaseAbandoned with this process's mapping = %+v, %v; want nothing released", undone, err)
	}
	if l, err := e.m.List(); err != nil || len(l) != 1 || !l[0].Ephemeral || !l[0].Live {
		t.Fatalf("List() = %+v, %v; want the one mapping, Ephemeral and Live", l, err)
	}
	e.release(t, e.m, tr)
	if m := mountsUnder(target); len(m) > 0 || IsMountPoint(target) {
		t.Fatalf("after Release, still mounted: %s %v", target, m)
	}
}

// A file open in the mount makes Release fail with ErrBusy and keep
// everything; once it is closed, Release works.
func testReleaseBusy(t *testing.T, e *env) {
	img := e.image(t)
	target := e.target("a")
	tr := e.mapAndMount(t, e.m, img, target, mapper.MountOptions{Format: true})
	f, err := os.Create(filepath.Join(target, "open"))
	if err != nil {
		t.Fatal(err)
	}
	err = e.m.Release(e.ctx, tr.Mapping.ID)
	if !errors.Is(err, mapper.ErrBusy) {
		f.Close()
		t.Fatalf("Release with an open file: %v, want ErrBusy", err)
	}
	if !IsMountPoint(target) || len(tr.Leftovers()) == 0 {
		f.Close()
		t.Fatalf("failed Release tore down the mapping anyway: leftovers %v", tr.Leftovers())
	}
	f.Close()
	e.release(t, e.m, tr)
}

// Mapping a missing image fails with ErrImageNotFound and leaves nothing:
// no record, no mount, no process, no loop device.
func testMissingImage(t *testing.T, e *env) {
	img := e.image(t)
	missing := mapper.Image{Pool: img.Pool, Name: img.Name + "-missing"}
	loopsBefore := allLoops()
	_, err := e.m.MapAndMount(e.ctx, missing, e.target("a"), mapper.MountOptions{Format: true})
	if !errors.Is(err, mapper.ErrImageNotFound) {
		t.Fatalf("MapAndMount(%s): %v, want ErrImageNotFound", missing, err)
	}
	t.Logf("user sees: %v", err)
	if !strings.Contains(err.Error(), missing.Name) {
		t.Errorf("error %q does not name the image", err)
	}
	noRecords(t, e, e.m)
	if m := mountsUnder(e.root); len(m) > 0 {
		t.Errorf("mounts left: %v", m)
	}
	if p := ImageProcesses(missing.Name); len(p) > 0 {
		t.Errorf("processes left: %v", p)
	}
	if added := newLoops(loopsBefore, missing.Name); len(added) > 0 {
		t.Errorf("loop devices attached by the failed map: %v", added)
	}
}

// Mapping from a missing pool fails with ErrImageNotFound and leaves
// nothing.
func testMissingPool(t *testing.T, e *env) {
	missing := mapper.Image{Pool: "mt-no-such-pool", Name: "mt-no-such-image"}
	_, err := e.m.MapAndMount(e.ctx, missing, e.target("a"), mapper.MountOptions{Format: true})
	if !errors.Is(err, mapper.ErrImageNotFound) {
		t.Fatalf("MapAndMount(%s): %v, want ErrImageNotFound", missing, err)
	}
	t.Logf("user sees: %v", err)
	if !strings.Contains(err.Error(), missing.Pool) {
		t.Errorf("error %q does not name the pool", err)
	}
	noRecords(t, e, e.m)
	if m := mountsUnder(e.root); len(m) > 0 {
		t.Errorf("mounts left: %v", m)
	}
	if p := ImageProcesses(missing.Name); len(p) > 0 {
		t.Errorf("processes left: %v", p)
	}
}

// A mount that fails (blank device, no Format) rolls the map back.
func testMountFailureRollsBack(t *testing.T, e *env) {
	img := e.image(t)
	target := e.target("a")
	_, err := e.m.MapAndMount(e.ctx, img, target, mapper.MountOptions{})
	if err == nil {
		t.Fatal("MapAndMount of a blank image without Format succeeded")
	}
	noRecords(t, e, e.m)
	if m := mountsUnder(e.root); len(m) > 0 {
		t.Errorf("mounts left: %v", m)
	}
	if p := ImageProcesses(img.Name); len(p) > 0 {
		t.Errorf("processes left: %v", p)
	}
	// The image is still usable.
	tr := e.mapAndMount(t, e.m, img, target, mapper.MountOptions{Format: true})
	e.release(t, e.m, tr)
}

// A caller-given ID is used, and a second map with it is ErrBusy.
func testCallerID(t *testing.T, e *env) {
	img := e.image(t)
	mp, err := e.m.Map(e.ctx, img, mapper.WithID("suite-id"))
	if err != nil {
		t.Fatalf("Map WithID: %v", err)
	}
	tr := Track(t, e.stateDir, mp)
	if mp.ID != "suite-id" {
		t.Fatalf("Map WithID(suite-id) returned ID %q", mp.ID)
	}
	img2 := e.image(t)
	if _, err := e.m.Map(e.ctx, img2, mapper.WithID("suite-id")); !errors.Is(err, mapper.ErrBusy) {
		t.Fatalf("second Map with the same ID: %v, want ErrBusy", err)
	}
	if p := ImageProcesses(img2.Name); len(p) > 0 {
		t.Errorf("refused Map left processes: %v", p)
	}
	if _, err := e.m.Map(e.ctx, img2, mapper.WithID("../escape")); !errors.Is(err, mapper.ErrInvalid) {
		t.Fatalf("Map WithID(../escape): %v, want ErrInvalid", err)
	}
	e.release(t, e.m, tr)
}

// The Mapper object is dropped with a mapping mounted (a crash as far as
// the Mapper knows): the mapping stays usable, and a new Mapper on the
// same StateDir recovers it completely. The data survives.
func testCrashRecover(t *testing.T, e *env) {
	img := e.image(t)
	target := e.target("a")
	tr := e.mapAndMount(t, e.m, img, target, mapper.MountOptions{Format: true})
	writeFile(t, filepath.Join(target, "before-crash"), "kept")
	e.m = nil // drop it without releasing

	if got := readFile(t, filepath.Join(target, "before-crash")); got != "kept" || !IsMountPoint(target) {
		t.Fatalf("mapping did not outlive its Mapper: mount point %v, file %q", IsMountPoint(target), got)
	}
	if len(tr.Leftovers()) == 0 {
		t.Fatal("dropped mapping holds nothing on the node")
	}
	m2 := e.h.NewMapper(t, e.stateDir)
	if l, err := m2.List(); err != nil || len(l) != 1 || l[0].ID != tr.Mapping.ID {
		t.Fatalf("new Mapper List() = %+v, %v; want the dropped mapping", l, err)
	}
	undone, err := m2.Recover(e.ctx)
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if len(undone) != 1 || undone[0].ID != tr.Mapping.ID {
		t.Fatalf("Recover returned %+v, want the one mapping %s", undone, tr.Mapping.ID)
	}
	tr.WaitGone(t, 10*time.Second)
	noRecords(t, e, m2)
	if undone, err := m2.Recover(e.ctx); err != nil || len(undone) != 0 {
		t.Fatalf("second Recover = %+v, %v; want nothing", undone, err)
	}
	tr = e.mapAndMount(t, m2, img, target, mapper.MountOptions{})
	if got := readFile(t, filepath.Join(target, "before-crash")); got != "kept" {
		t.Fatalf("after recover and remap, file = %q, want %q", got, "kept")
	}
	e.release(t, m2, tr)
}

// A record whose resources were torn down behind the Mapper's back is
// cleaned up by Recover without error, and nothing else is touched.
func testRecoverStaleRecord(t *testing.T, e *env) {
	img := e.image(t)
	target := e.target("a")
	tr := e.mapAndMount(t, e.m, img, target, mapper.MountOptions{Format: true})
	other := e.mapAndMount(t, e.m, e.image(t), e.target("other"), mapper.MountOptions{Format: true})

	run(t, "umount", target)
	if strings.HasPrefix(tr.Mapping.Device, "/dev/loop") {
		run(t, "losetup", "-d", tr.Mapping.Device)
	}
	for _, mnt := range mountsUnder(filepath.Join(e.stateDir, "fuse")) {
		if strings.Contains(mnt, tr.Mapping.ID) {
			// The loop device lets go of the rbd-fuse file a moment
			// after losetup -d returns.
			umountWhenFree(t, mnt)
		}
	}
	waitNoProcesses(t, img.Name)

	if err := e.m.Release(e.ctx, tr.Mapping.ID); err != nil {
		t.Fatalf("Release of a mapping whose resources are gone: %v", err)
	}
	tr.WaitGone(t, 10*time.Second)
	if !IsMountPoint(other.Mapping.Target) || len(other.Leftovers()) == 0 {
		t.Fatal("cleaning a stale record disturbed another mapping")
	}

	// The same through Recover in a new Mapper.
	run(t, "umount", other.Mapping.Target)
	m2 := e.h.NewMapper(t, e.stateDir)
	undone, err := m2.Recover(e.ctx)
	if err != nil || len(undone) != 1 || undone[0].ID != other.Mapping.ID {
		t.Fatalf("Recover of a half-gone mapping = %+v, %v; want %s undone without error", undone, err, other.Mapping.ID)
	}
	other.WaitGone(t, 10*time.Second)
	noRecords(t, e, m2)
}

// Two images mapped at once (concurrently) keep their own data, and
// releasing one leaves the other alone.
func testTwoImages(t *testing.T, e *env) {
	imgs := []mapper.Image{e.image(t), e.image(t)}
	mps := make([]*mapper.Mapping, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range imgs {
		wg.Go(func() {
			mps[i], errs[i] = e.m.MapAndMount(e.ctx, imgs[i], e.target(imgs[i].Name), mapper.MountOptions{Format: true})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent MapAndMount: %v", err)
	}
	a, b := Track(t, e.stateDir, mps[0]), Track(t, e.stateDir, mps[1])
	if a.Mapping.Device == b.Mapping.Device || a.Mapping.ID == b.Mapping.ID {
		t.Fatalf("two mappings share a device or ID: %+v %+v", a.Mapping, b.Mapping)
	}
	writeFile(t, filepath.Join(a.Mapping.Target, "who"), "a")
	writeFile(t, filepath.Join(b.Mapping.Target, "who"), "b")
	e.release(t, e.m, a)
	if got := readFile(t, filepath.Join(b.Mapping.Target, "who")); got != "b" {
		t.Fatalf("second image reads %q after the first was released, want %q", got, "b")
	}
	e.release(t, e.m, b)
	a = e.mapAndMount(t, e.m, imgs[0], e.target("again"), mapper.MountOptions{})
	if got := readFile(t, filepath.Join(a.Mapping.Target, "who")); got != "a" {
		t.Fatalf("first image reads %q after remap, want %q", got, "a")
	}
	e.release(t, e.m, a)
}

// WithReadOnly maps a device that refuses writes; the filesystem mounts
// read-only and shows the data.
func testReadOnly(t *testing.T, e *env) {
	img := e.image(t)
	target := e.target("a")
	tr := e.mapAndMount(t, e.m, img, target, mapper.MountOptions{Format: true})
	writeFile(t, filepath.Join(target, "f"), "data")
	e.release(t, e.m, tr)

	mp, err := e.m.MapAndMount(e.ctx, img, target, mapper.MountOptions{}, mapper.WithReadOnly())
	if err != nil {
		t.Fatalf("MapAndMount WithReadOnly: %v", err)
	}
	tr = Track(t, e.stateDir, mp)
	if !mp.ReadOnly {
		t.Errorf("mapping %+v is not marked read-only", mp)
	}
	if got := readFile(t, filepath.Join(target, "f")); got != "data" {
		t.Fatalf("read-only mount shows %q, want %q", got, "data")
	}
	if err := os.WriteFile(filepath.Join(target, "g"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write to a read-only mapping: %v, want EROFS", err)
	}
	// Writing the first block back unchanged must fail at the device.
	if f, err := os.OpenFile(mp.Device, os.O_RDWR, 0); err == nil {
		buf := make([]byte, 4096)
		_, rerr := f.ReadAt(buf, 0)
		_, werr := f.WriteAt(buf, 0)
		if werr == nil {
			werr = f.Sync()
		}
		f.Close()
		if rerr != nil || werr == nil {
			t.Errorf("device %s of a read-only mapping: read %v, write %v; want the write refused", mp.Device, rerr, werr)
		}
	}
	e.release(t, e.m, tr)
}

// A snapshot maps read-only and shows the data of its time, or, where the
// backend cannot expose snapshots, fails with ErrUnsupported and leaves
// nothing behind.
func testSnapshot(t *testing.T, e *env) {
	if e.h.Snapshot == nil {
		t.Skip("harness has no Snapshot")
	}
	img := e.image(t)
	target := e.target("a")
	tr := e.mapAndMount(t, e.m, img, target, mapper.MountOptions{Format: true})
	writeFile(t, filepath.Join(target, "f"), "at snapshot")
	e.release(t, e.m, tr)
	e.h.Snapshot(t, img, "s1")
	snap := img
	snap.Snap = "s1"

	if e.h.SnapshotUnsupported {
		_, err := e.m.MapAndMount(e.ctx, snap, target, mapper.MountOptions{})
		if !errors.Is(err, mapper.ErrUnsupported) {
			t.Fatalf("MapAndMount(%s): %v, want ErrUnsupported", snap, err)
		}
		noRecords(t, e, e.m)
		if p := ImageProcesses(img.Name); len(p) > 0 {
			t.Errorf("processes left: %v", p)
		}
		return
	}
	tr = e.mapAndMount(t, e.m, snap, target, mapper.MountOptions{})
	if !tr.Mapping.ReadOnly {
		t.Errorf("snapshot mapping %+v is not read-only", tr.Mapping)
	}
	if got := readFile(t, filepath.Join(target, "f")); got != "at snapshot" {
		t.Fatalf("snapshot shows %q, want %q", got, "at snapshot")
	}
	if err := os.WriteFile(filepath.Join(target, "g"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write to a snapshot mount: %v, want EROFS", err)
	}
	e.release(t, e.m, tr)
}

// Freeze blocks writes until Thaw; after Thaw, writes work.
func testFreezeThaw(t *testing.T, e *env) {
	img := e.image(t)
	target := e.target("a")
	tr := e.mapAndMount(t, e.m, img, target, mapper.MountOptions{Format: true})
	if err := mapper.Freeze(e.ctx, target); err != nil {
		t.Fatalf("Freeze: %v", err)
	}
	if err := mapper.Freeze(e.ctx, target); err == nil {
		t.Errorf("second Freeze of a frozen filesystem succeeded")
	}
	if err := mapper.Thaw(e.ctx, target); err != nil {
		t.Fatalf("Thaw: %v", err)
	}
	writeFile(t, filepath.Join(target, "after-thaw"), "ok")
	e.release(t, e.m, tr)
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

// umountWhenFree unmounts mnt, retrying for up to 5 s while it is busy.
func umountWhenFree(t *testing.T, mnt string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, err := exec.Command("umount", mnt).CombinedOutput()
		if err == nil {
			return
		}
		if !strings.Contains(string(out), "busy") || time.Now().After(deadline) {
			t.Fatalf("umount %s: %v: %s", mnt, err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitNoProcesses(t *testing.T, image string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(ImageProcesses(image)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("processes for %s did not exit: %v", image, ImageProcesses(image))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// allLoops maps each attached loop device to its backing file.
func allLoops() map[string]string {
	out := map[string]string{}
	ents, _ := os.ReadDir("/sys/block")
	for _, e := range ents {
		if b, ok := loopBacking(e.Name()); ok && strings.HasPrefix(e.Name(), "loop") {
			out["/dev/"+e.Name()] = b
		}
	}
	return out
}

// newLoops lists loop devices attached since before was taken whose
// backing file names the image (other tests on the machine attach loops
// too).
func newLoops(before map[string]string, image string) []string {
	var out []string
	for dev, b := range allLoops() {
		if before[dev] != b && strings.Contains(b, image) {
			out = append(out, dev+" ("+b+")")
		}
	}
	return out
}
