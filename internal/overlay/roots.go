package overlay

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/fogdeploy/fogdeploy/internal/mountinfo"
)

// Roots mounts instances' roots as overlays. Kernel is the kernel's
// overlay file system; Copy stands for it in unit tests, without root.
// Both pass overlaytest.RunSuite.
type Roots interface {
	// Mount mounts the overlay of l at target (made if missing); again
	// at the same target, it is a no-op.
	Mount(ctx context.Context, l Layers, target string) error
	// Unmount unmounts the overlay at target, if one is there.
	Unmount(ctx context.Context, target string) error
	// Mounted reports whether an overlay is mounted at target.
	Mounted(target string) (bool, error)
	// Reset drops what was written into the overlay at target: its
	// merged root is the lower directory again.
	Reset(ctx context.Context, l Layers, target string) error
	// MountShared makes dir a mount point of its own with shared
	// propagation; UnmountShared undoes it.
	MountShared(dir string) error
	UnmountShared(dir string) error
	// BindReadOnly shows directory src, read-only, at target (made if
	// missing); Unbind undoes it (no error if nothing is bound there).
	BindReadOnly(src, target string) error
	Unbind(target string) error
	// MountMemory mounts an empty file system in memory of at most size
	// bytes at dir, an existing directory, with dir's mode and owner (a
	// checkpoint written into memory); Unbind unmounts it, and its files
	// go with its last mount.
	MountMemory(dir string, size int64) error
	// Bind shows directory src at target (made if missing), read and
	// write: what is written at either is at both; Unbind undoes it.
	Bind(src, target string) error
}

// Kernel is Roots over the kernel's overlay file system (the package's
// functions). It needs CAP_SYS_ADMIN.
type Kernel struct{}

var _ Roots = Kernel{}

// Mount implements Roots.
func (Kernel) Mount(ctx context.Context, l Layers, target string) error { return Mount(ctx, l, target) }

// Unmount implements Roots.
func (Kernel) Unmount(ctx context.Context, target string) error { return Unmount(ctx, target) }

// Mounted implements Roots.
func (Kernel) Mounted(target string) (bool, error) { return Mounted(target) }

// Reset implements Roots.
func (Kernel) Reset(ctx context.Context, l Layers, target string) error { return Reset(ctx, l, target) }

// MountShared implements Roots.
func (Kernel) MountShared(dir string) error { return MountShared(dir) }

// UnmountShared implements Roots.
func (Kernel) UnmountShared(dir string) error { return UnmountShared(dir) }

// BindReadOnly implements Roots.
func (Kernel) BindReadOnly(src, target string) error { return BindReadOnly(src, target) }

// Unbind implements Roots.
func (Kernel) Unbind(target string) error { return Unbind(target) }

// MountMemory implements Roots: a tmpfs.
func (Kernel) MountMemory(dir string, size int64) error { return MountMemory(dir, size) }

// Bind implements Roots.
func (Kernel) Bind(src, target string) error { return Bind(src, target) }

// Copy is Roots without a mount, for unit tests that run without root: a
// mount copies the lower directory into the target, then what the upper
// directory kept, and an unmount keeps the target's files in the upper
// directory (all of them: no copy-up) with the lower ones it lacks as a
// list of deletions, then empties the target. Writes reach the upper
// directory at the unmount, not at once; a process that holds the target
// keeps nothing busy. Its zero value is ready to use.
type Copy struct {
	mu      sync.Mutex
	mounted map[string]Layers
	// bound are the targets of BindReadOnly and MountMemory, whose files
	// Unbind removes (the kernel's would show the directory beneath).
	bound map[string]bool
}

// bind records target as bound (on true) or not.
func (c *Copy) bind(target string, on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bound == nil {
		c.bound = map[string]bool{}
	}
	if on {
		c.bound[c.key(target)] = true
	} else {
		delete(c.bound, c.key(target))
	}
}

// isBound reports whether target is bound.
func (c *Copy) isBound(target string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bound[c.key(target)]
}

var _ Roots = (*Copy)(nil)

// deleted lists, in the upper directory's parent, the lower files that the
// merged root no longer has (the kernel's whiteouts).
const deleted = "deleted"

func (c *Copy) key(target string) string {
	abs, _ := filepath.Abs(target)
	return abs
}

// Mount implements Roots.
func (c *Copy) Mount(ctx context.Context, l Layers, target string) error {
	if err := l.validate(target); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.mounted[c.key(target)]; ok {
		return nil
	}
	for _, dir := range []string{l.Upper(), target} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("overlay at %s: %w", target, err)
		}
	}
	if err := copyTree(ctx, l.Lower, target); err != nil {
		return fmt.Errorf("overlay at %s: %w", target, err)
	}
	gone, err := readLines(filepath.Join(l.Disk, Dir, deleted))
	if err != nil {
		return err
	}
	for _, rel := range gone {
		_ = os.RemoveAll(filepath.Join(target, rel))
	}
	if err := copyTree(ctx, l.Upper(), target); err != nil {
		return fmt.Errorf("overlay at %s: %w", target, err)
	}
	if c.mounted == nil {
		c.mounted = map[string]Layers{}
	}
	c.mounted[c.key(target)] = l
	return nil
}

// Unmount implements Roots.
func (c *Copy) Unmount(ctx context.Context, target string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.mounted[c.key(target)]
	if !ok {
		return nil
	}
	if err := keepWrites(ctx, l, target); err != nil {
		return fmt.Errorf("unmount overlay at %s: %w", target, err)
	}
	if err := mountinfo.Empty(target); err != nil {
		return fmt.Errorf("unmount overlay at %s: %w", target, err)
	}
	delete(c.mounted, c.key(target))
	return nil
}

// Mounted implements Roots.
func (c *Copy) Mounted(target string) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.mounted[c.key(target)]
	return ok, nil
}

// Reset implements Roots.
func (c *Copy) Reset(ctx context.Context, l Layers, target string) error {
	if err := l.validate(target); err != nil {
		return err
	}
	if err := c.Unmount(ctx, target); err != nil {
		return err
	}
	if err := os.RemoveAll(filepath.Join(l.Disk, Dir)); err != nil {
		return fmt.Errorf("reset overlay at %s: %w", target, err)
	}
	return c.Mount(ctx, l, target)
}

// MountShared implements Roots: dir is made; nothing is mounted.
func (c *Copy) MountShared(dir string) error { return os.MkdirAll(dir, 0o755) }

// UnmountShared implements Roots.
func (c *Copy) UnmountShared(string) error { return nil }

// BindReadOnly implements Roots: src's files are copied to target, their
// write bits taken off.
func (c *Copy) BindReadOnly(src, target string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return fmt.Errorf("bind %s at %s: %w", src, target, err)
	}
	if err := copyTree(context.Background(), src, target); err != nil {
		return fmt.Errorf("bind %s at %s: %w", src, target, err)
	}
	c.bind(target, true)
	return filepath.WalkDir(target, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Type()&fs.ModeSymlink != 0 {
			return err
		}
		st, err := d.Info()
		if err != nil {
			return err
		}
		return os.Chmod(p, st.Mode().Perm()&^0o222)
	})
}

// Unbind implements Roots: a target bound is emptied.
func (c *Copy) Unbind(target string) error {
	if !c.isBound(target) {
		return nil
	}
	c.bind(target, false)
	if err := os.RemoveAll(target); err != nil {
		return fmt.Errorf("unbind %s: %w", target, err)
	}
	return nil
}

// MountMemory implements Roots: dir is checked; nothing is mounted.
func (c *Copy) MountMemory(dir string, size int64) error {
	if _, err := memoryDir(dir, size); err != nil {
		return err
	}
	c.bind(dir, true)
	return nil
}

// Bind implements Roots: target, an empty directory if it is one, is
// made a symbolic link to src.
func (c *Copy) Bind(src, target string) error {
	if c.isBound(target) {
		return nil
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("bind %s at %s: %w", src, target, err)
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return fmt.Errorf("bind %s at %s: %w", src, target, err)
	}
	if err := os.Symlink(src, target); err != nil {
		return fmt.Errorf("bind %s at %s: %w", src, target, err)
	}
	c.bind(target, true)
	return nil
}

// keepWrites makes l's upper directory the target's files, and the list of
// deletions the lower files the target lacks.
func keepWrites(ctx context.Context, l Layers, target string) error {
	if err := os.RemoveAll(l.Upper()); err != nil {
		return err
	}
	if err := os.MkdirAll(l.Upper(), 0o755); err != nil {
		return err
	}
	if err := copyTree(ctx, target, l.Upper()); err != nil {
		return err
	}
	var gone []string
	err := filepath.WalkDir(l.Lower, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == l.Lower {
			return err
		}
		rel, _ := filepath.Rel(l.Lower, p)
		if _, err := os.Lstat(filepath.Join(target, rel)); err != nil {
			gone = append(gone, rel)
			if d.IsDir() {
				return filepath.SkipDir
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(l.Disk, Dir, deleted), []byte(strings.Join(gone, "\n")), 0o644)
}

// copyTree copies what is under src into dst, keeping modes and links.
func copyTree(ctx context.Context, src, dst string) error {
	out, err := exec.CommandContext(ctx, "cp", "-a", src+"/.", dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("copy %s to %s: %w: %s", src, dst, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func readLines(path string) ([]string, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if sc.Text() != "" {
			lines = append(lines, sc.Text())
		}
	}
	return lines, sc.Err()
}
