// Package procfs mounts the /proc an app sees in its root, with the
// kernel's control surface hidden as Docker's default profile hides it:
// the paths in Masked are covered (an empty read-only tmpfs over a
// directory, /dev/null over a file) and those in ReadOnly are bound
// read-only. A fresh procfs has none of that, and an app running as uid 0
// could otherwise read the kernel's keys and timers, write
// /proc/sysrq-trigger (which needs no capability on distribution kernels)
// or the node's interrupt affinities.
//
// The lists serve three mounters: Mount (the light container's entrypoint
// and the host driver's sandbox) and Script (the shell init of a CRIU
// restore's PID namespace), so that each mounts the same.
package procfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Masked are the paths below /proc that an app must neither read nor
// write: Docker's default masked paths under /proc.
// /proc/interrupts shows every CPU's interrupt counts, a side channel on
// other tenants' activity (GHSA-6fw5-f8r9-fgfm).
var Masked = []string{"asound", "acpi", "interrupts", "kcore", "keys", "latency_stats", "timer_list", "timer_stats", "sched_debug", "scsi"}

// ReadOnly are the paths below /proc that an app may read but not write:
// Docker's default read-only paths.
var ReadOnly = []string{"bus", "fs", "irq", "sys", "sysrq-trigger"}

// Mount mounts a fresh procfs on root/proc (made if missing) and hides
// Masked and ReadOnly in it. Paths that the running kernel does not have
// are skipped. It needs CAP_SYS_ADMIN in the caller's mount namespace,
// which must be private (or a slave): the mounts stay in it.
func Mount(root string) error {
	proc := filepath.Join(root, "proc")
	if err := os.MkdirAll(proc, 0o755); err != nil {
		return fmt.Errorf("mount point %s: %w", proc, err)
	}
	if err := unix.Mount("proc", proc, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount proc on %s: %w", proc, err)
	}
	return Hide(proc)
}

// Hide covers Masked and binds ReadOnly read-only in the procfs mounted
// at proc.
func Hide(proc string) error {
	var errs []error
	for _, p := range Masked {
		dst := filepath.Join(proc, p)
		st, err := os.Lstat(dst)
		switch {
		case errors.Is(err, os.ErrNotExist):
			continue
		case err != nil:
			errs = append(errs, err)
		case st.IsDir():
			if err := unix.Mount("tmpfs", dst, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=0,mode=0555"); err != nil {
				errs = append(errs, fmt.Errorf("mask %s: %w", dst, err))
			}
		default:
			if err := unix.Mount("/dev/null", dst, "", unix.MS_BIND, ""); err != nil {
				errs = append(errs, fmt.Errorf("mask %s: %w", dst, err))
			}
		}
	}
	for _, p := range ReadOnly {
		dst := filepath.Join(proc, p)
		if _, err := os.Lstat(dst); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := unix.Mount(dst, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			errs = append(errs, fmt.Errorf("bind %s: %w", dst, err))
			continue
		}
		if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			errs = append(errs, fmt.Errorf("remount %s read-only: %w", dst, err))
		}
	}
	return errors.Join(errs...)
}

// Script is a POSIX shell fragment that does what Hide does for the
// procfs mounted at "$PROC" (the caller sets the variable), with
// busybox's or util-linux's mount. Its commands fail the script under
// `set -e`.
func Script() string {
	var b strings.Builder
	for _, p := range Masked {
		fmt.Fprintf(&b, "if [ -d \"$PROC/%[1]s\" ]; then mount -t tmpfs -o ro,nosuid,nodev,noexec,size=0,mode=0555 tmpfs \"$PROC/%[1]s\"; "+
			"elif [ -e \"$PROC/%[1]s\" ]; then mount -o bind /dev/null \"$PROC/%[1]s\"; fi\n", p)
	}
	for _, p := range ReadOnly {
		fmt.Fprintf(&b, "if [ -e \"$PROC/%[1]s\" ]; then mount -o rbind \"$PROC/%[1]s\" \"$PROC/%[1]s\"; "+
			"mount -o remount,bind,ro,nosuid,nodev,noexec \"$PROC/%[1]s\"; fi\n", p)
	}
	return b.String()
}

// Hidden reads a process's mount table (the contents of
// /proc/PID/mountinfo) and returns, for each path of Masked and ReadOnly
// that exists below hostProc (the running kernel has it), whether the app
// sees it hidden at /proc/PATH: a mount there, read-only for ReadOnly. It
// reports the paths that are not.
func Hidden(mountinfo, hostProc string) (open []string) {
	top := map[string]string{} // mount point -> options of the topmost
	for _, l := range strings.Split(mountinfo, "\n") {
		if f := strings.Fields(l); len(f) > 5 {
			top[f[4]] = f[5]
		}
	}
	for _, p := range Masked {
		if _, err := os.Lstat(filepath.Join(hostProc, p)); err != nil {
			continue
		}
		if _, ok := top["/proc/"+p]; !ok {
			open = append(open, "/proc/"+p+" (not masked)")
		}
	}
	for _, p := range ReadOnly {
		if _, err := os.Lstat(filepath.Join(hostProc, p)); err != nil {
			continue
		}
		if opts, ok := top["/proc/"+p]; !ok || !strings.HasPrefix(opts, "ro") {
			open = append(open, "/proc/"+p+" (not read-only)")
		}
	}
	return open
}
