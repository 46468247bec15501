package mapper

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/osthread"
)

// DetachCopies lazily unmounts each of the mount points in every mount
// namespace of the node other than the caller's. A process's private mount
// namespace is a copy of the host's, so it holds a copy of every mount that
// existed when it was made, including other instances' clones; such a copy
// keeps the filesystem alive after the host unmounts it, and its device
// cannot be released. Call it before unmounting on the host. It returns
// the number of copies detached.
func DetachCopies(mountpoints ...string) (int, error) {
	// thread-self, not self: /proc/self is the main thread, which may be
	// a discarded sandbox thread (the runtime parks the main thread
	// instead of ending it) and so in an app's namespace.
	self, err := os.Readlink("/proc/thread-self/ns/mnt")
	if err != nil {
		return 0, err
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	seen := map[string]bool{self: true}
	n := 0
	var errs []error
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		// Every thread: a thread of this very process may sit in an app's
		// namespace (the runtime parks, rather than ends, a main thread
		// that was locked into one).
		tasks, err := os.ReadDir("/proc/" + e.Name() + "/task")
		if err != nil {
			continue
		}
		for _, t := range tasks {
			nsPath := "/proc/" + e.Name() + "/task/" + t.Name() + "/ns/mnt"
			ns, err := os.Readlink(nsPath)
			if err != nil || seen[ns] {
				continue
			}
			seen[ns] = true
			k, err := detachIn(nsPath, mountpoints)
			n += k
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	return n, errors.Join(errs...)
}

// detachIn enters the mount namespace nsPath on a throwaway thread (whose
// root becomes that namespace's root) and detaches the mount points there.
func detachIn(nsPath string, mountpoints []string) (int, error) {
	f, err := os.Open(nsPath)
	if err != nil {
		return 0, nil // gone
	}
	defer f.Close()
	n := 0
	err = osthread.Run(func() error {
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			return fmt.Errorf("unshare fs: %w", err)
		}
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("enter mount namespace %s: %w", nsPath, err)
		}
		for _, m := range mountpoints {
			if m == "" {
				continue
			}
			if err := unix.Unmount(m, unix.MNT_DETACH); err == nil {
				n++
			}
		}
		return nil
	})
	return n, err
}
