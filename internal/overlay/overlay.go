// Package overlay mounts an instance's root as an overlay: a read-only lower directory that every
// instance of a generation on the node shares (one page cache for all of them), and an upper
// directory of the instance's own, where its writes go.
//
//	err := overlay.Mount(ctx, overlay.Layers{Lower: "/var/lib/x/lower/root", Disk: slotDisk}, target)
//	...
//	err = overlay.Unmount(ctx, target)
//
// The deployer mounts through Roots: Kernel (these functions) on a node,
// Copy in unit tests without root (roots.go).
package overlay

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/mountinfo"
)

// ErrInvalid: an argument failed validation.
var ErrInvalid = errors.New("invalid overlay")

// Dir is the directory, inside the instance's own filesystem (Layers.Disk),
// that holds its upper and work directories.
const Dir = ".fogdeploy-overlay"

// Layers are the directories of one overlay.
type Layers struct {
	// Lower is the shared read-only directory.
	Lower string
	// Disk is the root of the instance's own writable filesystem; the
	// upper and work directories are made under Disk/Dir.
	Disk string
}

// Upper is where l's writes go.
func (l Layers) Upper() string { return filepath.Join(l.Disk, Dir, "upper") }

func (l Layers) work() string { return filepath.Join(l.Disk, Dir, "work") }

func (l Layers) validate(target string) error {
	var errs []error
	for _, p := range []struct{ name, path string }{{"lower", l.Lower}, {"disk", l.Disk}, {"target", target}} {
		if !filepath.IsAbs(p.path) {
			errs = append(errs, fmt.Errorf("%s directory %q: give an absolute path: %w", p.name, p.path, ErrInvalid))
		} else if strings.ContainsAny(p.path, ",:\\") {
			// The kernel splits overlay's options at these.
			errs = append(errs, fmt.Errorf("%s directory %q: a path with ',', ':' or '\\' cannot be an overlay layer: %w", p.name, p.path, ErrInvalid))
		}
	}
	return errors.Join(errs...)
}

// Mount mounts the overlay of l at target (made if missing). Mounting it
// again at the same target, as after a crash between the mount and its
// record, is not an error.
func Mount(ctx context.Context, l Layers, target string) error {
	if err := l.validate(target); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if ok, err := Mounted(target); err != nil {
		return err
	} else if ok {
		return nil
	}
	for _, dir := range []string{l.Upper(), l.work(), target} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("overlay at %s: %w", target, err)
		}
	}
	// The upper directory takes the lower root's owner and mode, so that
	// the merged root looks like the lower one.
	if st, err := os.Stat(l.Lower); err == nil {
		_ = os.Chmod(l.Upper(), st.Mode().Perm())
	}
	opts := "lowerdir=" + l.Lower + ",upperdir=" + l.Upper() + ",workdir=" + l.work()
	if err := unix.Mount("overlay", target, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay at %s (lower %s, upper %s): %w", target, l.Lower, l.Upper(), err)
	}
	return nil
}

// BusyWait is how long Unmount retries an overlay that is still busy.
const BusyWait = 10 * time.Second

// Unmount unmounts the overlay at target, if one is mounted there. An
// overlay still busy after BusyWait (or ctx's end) is detached lazily: the
// instance is gone by then, and what still holds it (a process in its
// last exit) lets go on its own.
func Unmount(ctx context.Context, target string) error {
	deadline := time.Now().Add(BusyWait)
	for {
		ok, err := Mounted(target)
		if err != nil || !ok {
			return err
		}
		err = unix.Unmount(target, 0)
		switch {
		case err == nil:
			// Checked again: an earlier crash may have stacked two.
		case errors.Is(err, unix.EBUSY) && (ctx.Err() != nil || time.Now().After(deadline)):
			if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
				return fmt.Errorf("unmount overlay at %s: %w", target, err)
			}
		case errors.Is(err, unix.EBUSY):
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		case errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT):
			return nil // not a mount point any more
		default:
			return fmt.Errorf("unmount overlay at %s: %w", target, err)
		}
	}
}

// Mounted reports whether an overlay is mounted at target.
func Mounted(target string) (bool, error) {
	return findMount(target, func(fields []string) bool {
		for i := 6; i+1 < len(fields); i++ {
			if fields[i] == "-" && fields[i+1] == "overlay" {
				return true
			}
		}
		return false
	})
}

// findMount reports whether a mount at target (made absolute, symbolic
// links resolved) matches: match gets its mountinfo fields
// (ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPER).
func findMount(target string, match func(fields []string) bool) (bool, error) {
	abs, err := filepath.Abs(target)
	if err != nil {
		return false, err
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		abs = r
	}
	f, err := os.Open("/proc/thread-self/mountinfo")
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 7 && mountinfo.Unescape(fields[4]) == abs && match(fields) {
			return true, nil
		}
	}
	return false, sc.Err()
}

// Reset gives the overlay at target an empty upper directory again: the
// instance's writes are dropped and the merged root is the lower one.
// Nothing may use target meanwhile.
func Reset(ctx context.Context, l Layers, target string) error {
	if err := l.validate(target); err != nil {
		return err
	}
	if err := Unmount(ctx, target); err != nil {
		return err
	}
	if err := os.RemoveAll(filepath.Join(l.Disk, Dir)); err != nil {
		return fmt.Errorf("reset overlay at %s: %w", target, err)
	}
	return Mount(ctx, l, target)
}

// MountShared makes dir (created if missing) a mount point of its own
// with shared propagation, so that what is mounted under it later also
// appears where a container binds it with slave propagation. It is
// idempotent.
func MountShared(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("shared mount %s: %w", dir, err)
	}
	ok, err := mountPoint(dir)
	if err != nil {
		return err
	}
	if !ok {
		if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s on itself: %w", dir, err)
		}
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		return fmt.Errorf("make %s shared: %w", dir, err)
	}
	return nil
}

// UnmountShared undoes MountShared, once what was mounted under dir is
// unmounted. A dir that is not a mount point is not an error.
func UnmountShared(dir string) error { return unmountAll(dir) }

// unmountAll unmounts, lazily, whatever is mounted at dir until nothing
// is; nothing there is not an error.
func unmountAll(dir string) error {
	for {
		ok, err := mountPoint(dir)
		if err != nil || !ok {
			return err
		}
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmount %s: %w", dir, err)
		}
	}
}

// BindReadOnly binds directory src at target (made if missing),
// read-only, nosuid and nodev. target already bound is not an error.
func BindReadOnly(src, target string) error {
	if ok, err := mountPoint(target); err != nil || ok {
		return err
	}
	if err := Bind(src, target); err != nil {
		return err
	}
	if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		_ = unix.Unmount(target, unix.MNT_DETACH)
		return fmt.Errorf("bind %s at %s read-only: %w", src, target, err)
	}
	return nil
}

// Unbind unmounts what is bound at target; nothing there is not an error.
func Unbind(target string) error { return unmountAll(target) }

// MountMemory mounts a tmpfs of at most size bytes at dir, an existing
// directory, with dir's mode and owner (nosuid, nodev); a dir that is a
// mount point already (mounted before a crash) is left as it is.
func MountMemory(dir string, size int64) error {
	st, err := memoryDir(dir, size)
	if err != nil {
		return err
	}
	if ok, err := mountPoint(dir); err != nil || ok {
		return err // mounted before a crash: as it is
	}
	data := fmt.Sprintf("size=%d,mode=%o,uid=%d,gid=%d", size, st.Mode&0o7777, st.Uid, st.Gid)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		return fmt.Errorf("memory mount at %s: %w", dir, err)
	}
	return nil
}

// memoryDir checks a memory mount of size bytes at dir, an existing
// directory, and returns dir's mode and owner.
func memoryDir(dir string, size int64) (unix.Stat_t, error) {
	var st unix.Stat_t
	if size <= 0 {
		return st, fmt.Errorf("memory mount at %s: size %d: %w", dir, size, ErrInvalid)
	}
	if err := unix.Stat(dir, &st); err != nil {
		return st, fmt.Errorf("memory mount at %s: %w", dir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return st, fmt.Errorf("memory mount at %s: not a directory", dir)
	}
	return st, nil
}

// Bind binds directory src at target (made if missing), read and write.
// target already a mount point is not an error.
func Bind(src, target string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return fmt.Errorf("bind %s at %s: %w", src, target, err)
	}
	if ok, err := mountPoint(target); err != nil || ok {
		return err
	}
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s at %s: %w", src, target, err)
	}
	return nil
}

// mountPoint reports whether something is mounted at dir.
func mountPoint(dir string) (bool, error) {
	return findMount(dir, func([]string) bool { return true })
}
