package layering

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// The environment's files are its author's: any name in it may be a
// symbolic link to a path of the host (/dev -> /, /tmp -> /etc). Every
// path the builder mounts onto or writes in a mounted environment is
// therefore resolved from a descriptor of the root, one component at a
// time, beneath it and without following a link (openat2 with
// RESOLVE_BENEATH and RESOLVE_NO_SYMLINKS).

// beneath is how every name in an environment is resolved.
const beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// errThroughLink says that a path of the environment goes through one of
// its symbolic links, or that a directory is something else.
var errThroughLink = errors.New("a link of the environment is never followed")

// openRoot opens the directory root (a path of the host's own).
func openRoot(root string) (int, error) {
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: root, Err: err}
	}
	return fd, nil
}

// openBeneath opens rel, a relative path below the directory dirfd, with
// flags, following no symbolic link (a trailing one is refused too, but
// with O_PATH|O_NOFOLLOW, which opens the link itself).
func openBeneath(dirfd int, rel string, flags int, mode uint32) (int, error) {
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: beneath}
	for {
		fd, err := unix.Openat2(dirfd, rel, &how)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue // a rename raced the lookup
		}
		return fd, err
	}
}

// openDirBeneath opens the directory rel below dirfd (flags: O_PATH or
// O_RDONLY). shown is how the path reads in the environment (/dev); a
// link or a non-directory on the way is an error that says which.
func openDirBeneath(dirfd int, rel string, flags int, shown string) (int, error) {
	if rel == "" || rel == "." {
		return dupCloexec(dirfd)
	}
	fd, err := openBeneath(dirfd, rel, flags|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, explainPath(dirfd, rel, shown, err)
	}
	return fd, nil
}

// mkdirAllBeneath makes the directories of rel below dirfd that are
// missing (mode 0755), as mkdir -p, and opens the last (flags: O_PATH or
// O_RDONLY). A component that is a link or not a directory is an error.
func mkdirAllBeneath(dirfd int, rel, shown string, flags int) (int, error) {
	cur, err := dupCloexec(dirfd)
	if err != nil {
		return -1, err
	}
	done := ""
	for _, comp := range strings.Split(rel, "/") {
		if comp == "" || comp == "." {
			continue
		}
		done = path.Join(done, comp)
		if err := unix.Mkdirat(cur, comp, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			unix.Close(cur)
			return -1, fmt.Errorf("mkdir %s: %w", path.Join(shown, done), err)
		}
		next, err := openBeneath(cur, comp, flags|unix.O_DIRECTORY, 0)
		if err != nil {
			err = explainPath(cur, comp, path.Join(shown, done), err)
			unix.Close(cur)
			return -1, err
		}
		unix.Close(cur)
		cur = next
	}
	return cur, nil
}

// explainPath turns the error of a lookup of rel below dirfd into one
// that names the component that is a link (and its target) or not a
// directory. shown is rel as the environment's path.
func explainPath(dirfd int, rel, shown string, err error) error {
	if !errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.ENOTDIR) && !errors.Is(err, unix.EXDEV) {
		return &os.PathError{Op: "open", Path: shown, Err: err}
	}
	comps := strings.Split(rel, "/")
	prefix := strings.TrimSuffix(shown, rel)
	for i := range comps {
		sub := strings.Join(comps[:i+1], "/")
		var st unix.Stat_t
		if unix.Fstatat(dirfd, sub, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
			break
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			continue
		case unix.S_IFLNK:
			buf := make([]byte, 4096)
			n, _ := unix.Readlinkat(dirfd, sub, buf)
			return fmt.Errorf("%s is a symbolic link (to %s): %w: %w", prefix+sub, string(buf[:max(n, 0)]), errThroughLink, ErrInvalid)
		default:
			return fmt.Errorf("%s is not a directory: %w", prefix+sub, ErrInvalid)
		}
	}
	return fmt.Errorf("%s: %w: %w: %w", shown, err, errThroughLink, ErrInvalid)
}

// dupCloexec duplicates fd, close-on-exec.
func dupCloexec(fd int) (int, error) { return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0) }

// fileType returns the type bits (unix.S_IFMT) of name in dirfd, not
// following a link; 0 when it is not there.
func fileType(dirfd int, name string) (uint32, error) {
	var st unix.Stat_t
	err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return st.Mode & unix.S_IFMT, nil
}
