// The mounts of a build step's root, made through descriptors (the mount
// API's fsopen, open_tree and move_mount) so that no path in the root is
// followed, and the pivot into it.

package layering

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/devfs"
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

// mountDev mounts a private /dev on the environment's dev directory
// (devfs.Mount).
func mountDev(rfd int) error {
	target, err := openDirBeneath(rfd, "dev", unix.O_PATH, "/dev")
	if err != nil {
		return err
	}
	defer unix.Close(target)
	if err := devfs.Mount(target); err != nil {
		return fmt.Errorf("the step's /dev: %w", err)
	}
	return nil
}

// bindResolvConf binds src, a file of the node's, read-only, on the
// environment's etc/resolv.conf when that is a regular file (prepareRoot
// made it if it was missing); a link there is left as it is, not
// followed.
func bindResolvConf(rfd int, src string) error {
	etc, err := openBeneath(rfd, "etc", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(etc)
	if t, err := fileType(etc, "resolv.conf"); err != nil || t != unix.S_IFREG {
		return nil
	}
	if err := devfs.BindFile(src, etc, "resolv.conf", unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC); err != nil {
		return fmt.Errorf("bind %s on the step's /etc/resolv.conf: %w", src, err)
	}
	return nil
}
