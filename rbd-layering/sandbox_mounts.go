// The mounts of a build step's root, made through descriptors (the mount
// API's fsopen, open_tree and move_mount) so that no path in the root is
// followed, and the pivot into it.

package layering

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// pivotInto makes the directory rfd (a mount point) the root of this
// thread's mount namespace, and so of the step's init, which shares it,
// and detaches the old root: the host's file systems are then out of the
// namespace.
func pivotInto(rfd int) error {
	if err := unix.Fchdir(rfd); err != nil {
		return fmt.Errorf("enter the build root: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root into the build root: %w", err)
	}
	// The old root is stacked on ".": detach it and everything under it.
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the host's root from the step: %w", err)
	}
	return unix.Chdir("/")
}

// mountDev mounts a private /dev on the environment's dev directory: a
// tmpfs with devNodes bound from the host's, a devpts of its own (with
// ptmx), a /dev/shm tmpfs, and the links fd, stdin, stdout, stderr.
func mountDev(rfd int) error {
	target, err := openDirBeneath(rfd, "dev", unix.O_PATH, "/dev")
	if err != nil {
		return err
	}
	defer unix.Close(target)
	dev, err := newMount("tmpfs", map[string]string{"mode": "0755", "size": "65536k"}, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC, target)
	if err != nil {
		return fmt.Errorf("the step's /dev: %w", err)
	}
	defer unix.Close(dev)
	for _, n := range devNodes {
		fd, err := unix.Openat(dev, n, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o666)
		if err != nil {
			return fmt.Errorf("the step's /dev/%s: %w", n, err)
		}
		unix.Close(fd)
		if err := bindFile("/dev/"+n, dev, n, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC); err != nil {
			return fmt.Errorf("the step's /dev/%s: %w", n, err)
		}
	}
	for _, d := range []struct {
		name string
		mode uint32
	}{{"pts", 0o755}, {"shm", 0o1777}} {
		if err := unix.Mkdirat(dev, d.name, d.mode); err != nil {
			return fmt.Errorf("the step's /dev/%s: %w", d.name, err)
		}
	}
	pts, err := unix.Openat(dev, "pts", unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(pts)
	m, err := newMount("devpts", map[string]string{"newinstance": "", "ptmxmode": "0666", "mode": "0620", "gid": "5"}, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC, pts)
	if err != nil {
		return fmt.Errorf("the step's /dev/pts: %w", err)
	}
	unix.Close(m)
	shm, err := unix.Openat(dev, "shm", unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(shm)
	m, err = newMount("tmpfs", map[string]string{"mode": "1777", "size": "65536k"}, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC, shm)
	if err != nil {
		return fmt.Errorf("the step's /dev/shm: %w", err)
	}
	unix.Close(m)
	for name, to := range map[string]string{"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := unix.Symlinkat(to, dev, name); err != nil {
			return fmt.Errorf("the step's /dev/%s: %w", name, err)
		}
	}
	return nil
}

// bindResolvConf binds the host's /etc/resolv.conf, read-only, on the
// environment's etc/resolv.conf when that is a regular file (prepareRoot
// made it if it was missing); a link there is left as it is, not
// followed.
func bindResolvConf(rfd int) error {
	if _, err := os.Stat("/etc/resolv.conf"); err != nil {
		return nil // the host has none
	}
	etc, err := openBeneath(rfd, "etc", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(etc)
	if t, err := fileType(etc, "resolv.conf"); err != nil || t != unix.S_IFREG {
		return nil
	}
	if err := bindFile("/etc/resolv.conf", etc, "resolv.conf", unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC); err != nil {
		return fmt.Errorf("bind the host's /etc/resolv.conf into the step: %w", err)
	}
	return nil
}

// newMount makes a new file system of fstype with options (an empty
// value: a flag) and mount attributes, and mounts it on the directory
// target (a descriptor: no path is looked up). It returns a descriptor
// of the new mount's root.
func newMount(fstype string, options map[string]string, attrs int, target int) (int, error) {
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

// bindFile binds the host's file src (a path of the host's own) on name,
// a file in the directory dirfd, with mount attributes.
func bindFile(src string, dirfd int, name string, attrs uint64) error {
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
		return fmt.Errorf("%s is not a regular file: %w", name, ErrInvalid)
	}
	if err := unix.MoveMount(tree, "", target, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	return nil
}
