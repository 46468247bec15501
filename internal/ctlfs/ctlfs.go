// Package ctlfs reads and writes the files of a directory that an app can
// write into as well: an instance's control directory, which its
// container binds where a process of the app could reach it. Every path
// is resolved beneath the directory without following a symbolic link
// (openat2 with RESOLVE_BENEATH and RESOLVE_NO_SYMLINKS), so that a link
// the app planted never makes the node's agent, which runs as root, read
// or write a file of the host; a file the app replaced by anything but a
// regular file is refused; and a read is bounded.
package ctlfs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// MaxFileBytes bounds a file that ReadFile returns.
const MaxFileBytes = 1 << 20

// ErrNotRegular: a name in the directory is not a regular file (a link,
// a directory, a device the app planted).
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge: a file is larger than its reader reads.
var ErrTooLarge = errors.New("file too large")

// Dir is a control directory, at a path of the node's own (its parents
// are not the app's to change).
type Dir string

// resolve is how every name is resolved.
const resolve = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// openat opens name, a relative path below d, with flags.
func (d Dir) openat(name string, flags int, mode uint32) (*os.File, error) {
	dfd, err := unix.Open(string(d), unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: string(d), Err: err}
	}
	defer unix.Close(dfd)
	how := unix.OpenHow{Flags: uint64(flags | unix.O_NOFOLLOW | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: resolve}
	fd, err := unix.Openat2(dfd, name, &how)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
			err = fmt.Errorf("%w (a symbolic link, or a path out of the directory)", ErrNotRegular)
		}
		return nil, &os.PathError{Op: "open", Path: path.Join(string(d), name), Err: err}
	}
	return os.NewFile(uintptr(fd), path.Join(string(d), name)), nil
}

// ReadFile reads name, a regular file below d, of at most MaxFileBytes.
func (d Dir) ReadFile(name string) ([]byte, error) {
	f, err := d.openat(name, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := regular(f); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxFileBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", f.Name(), MaxFileBytes)
	}
	return b, nil
}

// ReadInRoot reads rel, a regular file of the file system whose root is
// root (an instance's environment or checkpoint: the app's files), of at
// most max bytes. Its links are followed as they would be inside, with
// root as "/" (openat2 with RESOLVE_IN_ROOT), never out of it; anything
// but a regular file (a FIFO that would hang the reader, a device) is
// refused with ErrNotRegular, and a larger file (a sparse one of 64 GiB)
// with ErrTooLarge, before anything is read.
func ReadInRoot(root, rel string, max int64) ([]byte, error) {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(rfd)
	how := unix.OpenHow{Flags: unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS}
	fd, err := unix.Openat2(rfd, rel, &how)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path.Join(root, rel), Err: err}
	}
	f := os.NewFile(uintptr(fd), path.Join(root, rel))
	defer f.Close()
	if err := regular(f); err != nil {
		return nil, err
	}
	if st, err := f.Stat(); err != nil {
		return nil, err
	} else if st.Size() > max {
		return nil, fmt.Errorf("%s: %d bytes: %w (at most %d)", f.Name(), st.Size(), ErrTooLarge, max)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s: %w (at most %d bytes)", f.Name(), ErrTooLarge, max)
	}
	return b, nil
}

// IsFile reports whether name below d is a regular file.
func (d Dir) IsFile(name string) bool {
	f, err := d.openat(name, unix.O_PATH, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	return regular(f) == nil
}

// WriteFile writes b as name below d, whole: into a new file beside it,
// then renamed over it, so that a reader never sees half of it. Whatever
// stood at the temporary name (a link the app planted) is removed first,
// not followed.
func (d Dir) WriteFile(name string, b []byte, mode os.FileMode) error {
	dir, base := path.Split(name)
	parent, err := d.openat(nonEmpty(dir), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer parent.Close()
	pfd := int(parent.Fd())
	tmp := "." + base + "." + strconv.Itoa(os.Getpid()) + "." + strconv.FormatInt(time.Now().UnixNano(), 36) + ".tmp"
	if err := unix.Unlinkat(pfd, tmp, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "remove", Path: path.Join(string(d), dir, tmp), Err: err}
	}
	fd, err := unix.Openat(pfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(mode.Perm()))
	if err != nil {
		return &os.PathError{Op: "create", Path: path.Join(string(d), dir, tmp), Err: err}
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, werr := f.Write(b)
	if werr == nil {
		werr = f.Chmod(mode.Perm()) // the mode asked for, whatever the umask
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = unix.Renameat(pfd, tmp, pfd, base)
	}
	if werr != nil {
		_ = unix.Unlinkat(pfd, tmp, 0)
		return &os.PathError{Op: "write", Path: path.Join(string(d), name), Err: werr}
	}
	return nil
}

// MkdirAll makes directory rel below d and its parents that are missing,
// with mode perm, following no link: a component that is a link (or not
// a directory) is an error.
func (d Dir) MkdirAll(rel string, perm os.FileMode) error {
	dir, err := d.openat(".", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer func() { dir.Close() }()
	for _, comp := range strings.Split(path.Clean(rel), "/") {
		if comp == "." {
			continue
		}
		if err := unix.Mkdirat(int(dir.Fd()), comp, uint32(perm)); err != nil && !errors.Is(err, unix.EEXIST) {
			return &os.PathError{Op: "mkdir", Path: path.Join(dir.Name(), comp), Err: err}
		}
		how := unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolve}
		fd, err := unix.Openat2(int(dir.Fd()), comp, &how)
		if err != nil {
			return &os.PathError{Op: "open", Path: path.Join(dir.Name(), comp), Err: fmt.Errorf("%w (a symbolic link is not followed)", err)}
		}
		next := os.NewFile(uintptr(fd), path.Join(dir.Name(), comp))
		dir.Close()
		dir = next
	}
	return nil
}

// Remove removes name below d (a file, or a link without following it);
// one that is not there is not an error.
func (d Dir) Remove(name string) error {
	dir, base := path.Split(name)
	parent, err := d.openat(nonEmpty(dir), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	defer parent.Close()
	if err := unix.Unlinkat(int(parent.Fd()), base, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "remove", Path: path.Join(string(d), name), Err: err}
	}
	return nil
}

func nonEmpty(dir string) string {
	if dir == "" {
		return "."
	}
	return dir
}

func regular(f *os.File) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s: %w (%s)", f.Name(), ErrNotRegular, st.Mode().Type())
	}
	return nil
}

// OpenFile opens name, a regular file below d, with flags (os.O_WRONLY,
// ...; never O_CREAT: WriteFile makes files).
func (d Dir) OpenFile(name string, flags int) (*os.File, error) {
	f, err := d.openat(name, flags&^unix.O_CREAT|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	if err := regular(f); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
