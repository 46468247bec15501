// Package devfs mounts the private /dev of a sandbox (an instance's root
// under the host driver, a build step's root): a tmpfs with the harmless
// device nodes bound from the host's, a devpts of its own and a /dev/shm,
// so that a process of uid 0 in there finds none of the node's disks,
// memory or consoles. Everything is mounted through descriptors (the mount
// API's fsopen, open_tree and move_mount): no path of the root is followed.
package devfs

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// ErrNotFile is returned by BindFile for a target that is not a regular
// file.
var ErrNotFile = errors.New("not a regular file")

// Nodes are the host's device nodes a private /dev holds (bound).
var Nodes = []string{"null", "zero", "full", "random", "urandom", "tty"}

// Mount mounts a private /dev on the directory target (a descriptor): a
// tmpfs with Nodes bound from the host's, a devpts of its own (with ptmx),
// a /dev/shm tmpfs, and the links fd, stdin, stdout, stderr.
func Mount(target int) error {
	dev, err := NewMount("tmpfs", map[string]string{"mode": "0755", "size": "65536k"}, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC, target)
	if err != nil {
		return fmt.Errorf("/dev: %w", err)
	}
	defer unix.Close(dev)
	for _, n := range Nodes {
		fd, err := unix.Openat(dev, n, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o666)
		if err != nil {
			return fmt.Errorf("/dev/%s: %w", n, err)
		}
		unix.Close(fd)
		if err := BindFile("/dev/"+n, dev, n, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC); err != nil {
			return fmt.Errorf("/dev/%s: %w", n, err)
		}
	}
	for _, d := range []struct {
		name string
		mode uint32
	}{{"pts", 0o755}, {"shm", 0o1777}} {
		if err := unix.Mkdirat(dev, d.name, d.mode); err != nil {
			return fmt.Errorf("/dev/%s: %w", d.name, err)
		}
	}
	pts, err := unix.Openat(dev, "pts", unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(pts)
	m, err := NewMount("devpts", map[string]string{"newinstance": "", "ptmxmode": "0666", "mode": "0620", "gid": "5"}, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC, pts)
	if err != nil {
		return fmt.Errorf("/dev/pts: %w", err)
	}
	unix.Close(m)
	shm, err := unix.Openat(dev, "shm", unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(shm)
	m, err = NewMount("tmpfs", map[string]string{"mode": "1777", "size": "65536k"}, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC, shm)
	if err != nil {
		return fmt.Errorf("/dev/shm: %w", err)
	}
	unix.Close(m)
	for name, to := range map[string]string{"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := unix.Symlinkat(to, dev, name); err != nil {
			return fmt.Errorf("/dev/%s: %w", name, err)
		}
	}
	return nil
}

// MountIn mounts a private /dev (Mount) on root's dev directory, made if
// missing. root's own names are the app's: dev must be a directory of
// root, reached without following a link (openat2 with RESOLVE_BENEATH
// and RESOLVE_NO_SYMLINKS). It returns a descriptor of the new /dev's
// root, for a caller that adds to it (BindFile, Mkdirat).
func MountIn(root string) (int, error) {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open root %s: %w", root, err)
	}
	defer unix.Close(rfd)
	if err := unix.Mkdirat(rfd, "dev", 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, fmt.Errorf("%s/dev: %w", root, err)
	}
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	dir, err := unix.Openat2(rfd, "dev", &how)
	if err != nil {
		return -1, fmt.Errorf("%s/dev (a directory of the root, not a link): %w", root, err)
	}
	defer unix.Close(dir)
	if err := Mount(dir); err != nil {
		return -1, fmt.Errorf("private /dev in %s: %w", root, err)
	}
	dev, err := unix.Openat2(rfd, "dev", &how)
	if err != nil {
		return -1, fmt.Errorf("%s/dev once mounted: %w", root, err)
	}
	return dev, nil
}

// NewMount makes a new file system of fstype with options (an empty
// value: a flag) and mount attributes, and mounts it on the directory
// target (a descriptor: no path is looked up). It returns a descriptor
// of the new mount's root.
func NewMount(fstype string, options map[string]string, attrs int, target int) (int, error) {
	fs, err := unix.Fsopen(fstype, unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen %s: %w", fstype, err)
	}
	defer unix.Close(fs)
	for k, v := range options {
		if v == "" {
			err = unix.FsconfigSetFlag(fs, k)
		} else {
			err = unix.FsconfigSetString(fs, k, v)
		}
		if err != nil {
			return -1, fmt.Errorf("%s option %s=%s: %w", fstype, k, v, err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("create %s: %w", fstype, err)
	}
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, attrs)
	if err != nil {
		return -1, fmt.Errorf("fsmount %s: %w", fstype, err)
	}
	if err := unix.MoveMount(m, "", target, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		unix.Close(m)
		return -1, fmt.Errorf("mount %s: %w", fstype, err)
	}
	return m, nil
}

// BindFile binds the host's file src (a path of the host's own) on name,
// a file in the directory dirfd, with mount attributes.
func BindFile(src string, dirfd int, name string, attrs uint64) error {
	tree, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", src, err)
	}
	defer unix.Close(tree)
	if attrs != 0 {
		if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: attrs}); err != nil {
			return fmt.Errorf("mount attributes of %s: %w", src, err)
		}
	}
	target, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(target)
	var st unix.Stat_t
	if err := unix.Fstat(target, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%s is not a regular file: %w", name, ErrNotFile)
	}
	if err := unix.MoveMount(tree, "", target, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	return nil
}
