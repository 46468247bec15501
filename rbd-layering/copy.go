package layering

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/hint"
)

// copyInto copies src (a file, a link, or a directory's contents) to dst,
// an absolute path in the environment mounted at root, as
// `cp -a --no-preserve=ownership` would (modes and times kept, owned by
// root, links copied as links), but with no path of the environment
// followed through a link: a COPY whose destination goes through a link
// of the environment is refused, and an entry that the copy replaces (a
// file, a link) is removed first, never written through.
func copyInto(ctx context.Context, src, root, dst string) error {
	st, err := os.Lstat(src)
	if err != nil {
		return fmt.Errorf("COPY source: %w: %w", err, ErrInvalid)
	}
	rfd, err := openRoot(root)
	if err != nil {
		return err
	}
	defer unix.Close(rfd)
	rel := strings.TrimPrefix(path.Clean("/"+dst), "/")
	wrap := func(err error) error {
		if err == nil {
			return nil
		}
		if errors.Is(err, errThroughLink) {
			return hint.With(fmt.Errorf("COPY destination %s: %w", dst, err),
				"write the destination as the path the link leads to in the environment")
		}
		return fmt.Errorf("COPY to %s: %w", dst, err)
	}
	if st.IsDir() {
		dir, err := mkdirAllBeneath(rfd, rel, "/", unix.O_RDONLY)
		if err != nil {
			return wrap(err)
		}
		defer unix.Close(dir)
		return wrap(copyTree(ctx, src, dir, "/"+rel))
	}
	parent, name := path.Split(rel)
	if strings.HasSuffix(dst, "/") || rel == "" {
		parent, name = rel, filepath.Base(src)
	}
	dir, err := mkdirAllBeneath(rfd, parent, "/", unix.O_RDONLY)
	if err != nil {
		return wrap(err)
	}
	defer unix.Close(dir)
	// An existing directory at the destination takes the file inside, as
	// `cp SRC DIR` does; a link there is not followed.
	switch t, err := fileType(dir, name); {
	case err != nil:
		return wrap(err)
	case t == unix.S_IFLNK:
		return wrap(explainPath(dir, name, "/"+path.Join(parent, name), unix.ELOOP))
	case t == unix.S_IFDIR:
		inner, err := openDirBeneath(dir, name, unix.O_RDONLY, "/"+path.Join(parent, name))
		if err != nil {
			return wrap(err)
		}
		defer unix.Close(inner)
		dir, parent, name = inner, path.Join(parent, name), filepath.Base(src)
	}
	return wrap(copyEntry(ctx, src, st, dir, name, "/"+path.Join(parent, name)))
}

// copyTree copies the entries of the directory src into the directory
// dir (shown: its path in the environment).
func copyTree(ctx context.Context, src string, dir int, shown string) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return err
		}
		p := filepath.Join(src, e.Name())
		st, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if err := copyEntry(ctx, p, st, dir, e.Name(), path.Join(shown, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// copyEntry copies src (st: its Lstat) as name in the directory dir. A
// directory merges with one already there (a link there is refused);
// anything else replaces what is there, unless that is a directory.
func copyEntry(ctx context.Context, src string, st os.FileInfo, dir int, name, shown string) error {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: no file status", src)
	}
	mode := sys.Mode & 0o7777
	times := []unix.Timespec{unix.NsecToTimespec(syscall.TimespecToNsec(sys.Atim)), unix.NsecToTimespec(syscall.TimespecToNsec(sys.Mtim))}
	had, err := fileType(dir, name)
	if err != nil {
		return err
	}
	if st.IsDir() {
		switch had {
		case 0:
			if err := unix.Mkdirat(dir, name, 0o700); err != nil {
				return fmt.Errorf("mkdir %s: %w", shown, err)
			}
		case unix.S_IFDIR:
		default:
			return explainPath(dir, name, shown, unix.ENOTDIR)
		}
		sub, err := openDirBeneath(dir, name, unix.O_RDONLY, shown)
		if err != nil {
			return err
		}
		defer unix.Close(sub)
		if err := copyTree(ctx, src, sub, shown); err != nil {
			return err
		}
		if err := unix.Fchmod(sub, mode); err != nil {
			return fmt.Errorf("chmod %s: %w", shown, err)
		}
		return unix.UtimesNanoAt(dir, name, times, unix.AT_SYMLINK_NOFOLLOW)
	}
	switch had {
	case 0:
	case unix.S_IFDIR:
		return fmt.Errorf("%s is a directory in the environment; the build context's %s is not: %w", shown, src, ErrInvalid)
	default:
		if err := unix.Unlinkat(dir, name, 0); err != nil {
			return fmt.Errorf("replace %s: %w", shown, err)
		}
	}
	switch {
	case st.Mode().IsRegular():
		if err := copyFile(src, dir, name, mode); err != nil {
			return fmt.Errorf("copy %s to %s: %w", src, shown, err)
		}
	case st.Mode()&os.ModeSymlink != 0:
		to, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := unix.Symlinkat(to, dir, name); err != nil {
			return fmt.Errorf("link %s: %w", shown, err)
		}
	default: // a FIFO, a socket, a device node
		if err := unix.Mknodat(dir, name, sys.Mode, int(sys.Rdev)); err != nil {
			return fmt.Errorf("mknod %s: %w", shown, err)
		}
	}
	return unix.UtimesNanoAt(dir, name, times, unix.AT_SYMLINK_NOFOLLOW)
}

// copyFile writes the content of the regular file src as the new file
// name in dir, with mode.
func copyFile(src string, dir int, name string, mode uint32) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fd, err := unix.Openat(dir, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	out := os.NewFile(uintptr(fd), name)
	_, err = io.Copy(out, in)
	if err == nil {
		err = unix.Fchmod(fd, mode)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = unix.Unlinkat(dir, name, 0)
	}
	return err
}
