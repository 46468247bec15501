package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/ctlfs"
	"github.com/fogdeploy/fogdeploy/internal/devfs"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/instancectl"
	"github.com/fogdeploy/fogdeploy/internal/procfs"
)

// prepareRoot makes cfg.root usable as the app's root, inside the
// container's private mount namespace:
//
//	proc        -> <root>/proc       (fresh procfs of the container's PID namespace;
//	                                  its sys/ bound read-only over itself)
//	devfs       -> <root>/dev        (a /dev of the instance's own, internal/devfs:
//	                                  the harmless nodes bound, its own devpts and
//	                                  shm, and the container's /dev/mqueue bound)
//	tmpfs       -> <root>/tmp        (mode 1777; DMTCP's --tmpdir)
//	<prefix>    -> <root>/<prefix>   (read-only bind: DMTCP at the same path inside)
//	<ckpt>      -> <root>/<ckpt>     (bind: images are written by the app itself)
//	<ctl>/identity -> <root>/run/fogdeploy (read-only bind, with -wait: the
//	                                  instance's identity, written by the host
//	                                  on a node-local file system; bindIdentity)
//
// In boot mode (no checkpoint engine) and under CRIU (whose dump and restore
// run outside the root) only proc, /dev and /tmp are mounted.
// The mount points are created in the clone when missing; each is a
// directory of the root reached without following a link (the root's
// names are the app's: /tmp -> / must not mount over the container's).
// /dev is new for every instance: whatever an app made of its /dev goes
// with the instance, and a recycled container's next instance never sees
// it. Nothing here
// propagates to the host: the namespace is made a recursive slave first,
// so that what the host mounts where it bound a directory with slave
// propagation still shows up here (a recycled container's root, unmounted
// and mounted again between two instances; a checkpoint generation's
// directory the host mounts in memory before a migration's checkpoint).
func prepareRoot(cfg *config) error {
	st, err := os.Stat(cfg.root)
	if err != nil {
		return fmt.Errorf("environment clone at %s: %w (bind-mount it with -v CLONE:%s)", cfg.root, err, cfg.root)
	}
	if !st.IsDir() {
		return fmt.Errorf("environment clone %s is not a directory", cfg.root)
	}
	if _, err := os.Stat(filepath.Join(cfg.root, "bin")); err != nil {
		return fmt.Errorf("environment clone %s has no /bin: is the clone mounted? (%w)", cfg.root, err)
	}
	boot := cfg.mode == modeBoot || engine.Of(cfg.engine).DumpsFromOutside
	if !boot {
		if err := os.MkdirAll(cfg.ckpt, 0o755); err != nil {
			return fmt.Errorf("checkpoint dir %s: %w", cfg.ckpt, err)
		}
	}
	// A slave receives and sends nothing: the host's mounts come in only
	// where a bind is a slave already (the root's directory of a recycled
	// or root-later container, a checkpoint volume bound so).
	if err := mount("(make-rslave)", "/", "", syscall.MS_REC|syscall.MS_SLAVE, ""); err != nil {
		return err
	}
	steps := []struct {
		src, dst, fstype string
		flags            uintptr
		data             string
		readOnly         bool
		engine           bool // only when a checkpoint engine runs
	}{
		{"tmpfs", "/tmp", "tmpfs", syscall.MS_NOSUID | syscall.MS_NODEV, "mode=1777", false, false},
		{cfg.prefix, cfg.prefix, "", syscall.MS_BIND | syscall.MS_REC, "", true, true},
		{cfg.ckpt, cfg.ckpt, "", syscall.MS_BIND | syscall.MS_REC, "", false, true},
	}
	root := ctlfs.Dir(cfg.root)
	if err := root.MkdirAll("proc", 0o755); err != nil {
		return fmt.Errorf("mount point of /proc: %w", err)
	}
	// A fresh procfs shows the kernel's control surface (its keys and
	// timers, /proc/sysrq-trigger, /proc/sys, /proc/irq) that Docker's
	// default profile hides: it is hidden as there.
	if err := procfs.Mount(cfg.root); err != nil {
		return err
	}
	if err := mountDev(cfg.root); err != nil {
		return err
	}
	for _, s := range steps {
		if boot && s.engine {
			continue
		}
		if err := root.MkdirAll(strings.TrimPrefix(s.dst, "/"), 0o755); err != nil {
			return fmt.Errorf("mount point of %s: %w", s.dst, err)
		}
		dst := filepath.Join(cfg.root, s.dst)
		if err := mount(s.src, dst, s.fstype, s.flags, s.data); err != nil {
			return err
		}
		if s.readOnly {
			if err := mount("(remount read-only)", dst, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY|syscall.MS_REC, ""); err != nil {
				return err
			}
		}
	}
	bindIdentity(cfg)
	return nil
}

// mountDev mounts the instance's own /dev on root/dev (devfs.MountIn),
// with the container's /dev/mqueue bound in it: POSIX message queues
// belong to the container's IPC namespace, which a recycle clears.
func mountDev(root string) error {
	dev, err := devfs.MountIn(root)
	if err != nil {
		if errors.Is(err, syscall.EPERM) {
			return fmt.Errorf("%w (%w)", errNeedSysAdmin, err)
		}
		return err
	}
	defer unix.Close(dev)
	if _, err := os.Stat("/dev/mqueue"); err != nil {
		return nil // none to bind
	}
	if err := unix.Mkdirat(dev, "mqueue", 0o1777); err != nil {
		return fmt.Errorf("/dev/mqueue in %s: %w", root, err)
	}
	return mount("/dev/mqueue", filepath.Join(root, "dev", "mqueue"), "", syscall.MS_BIND, "")
}

// identityDir is where, inside the root, the app reads its identity
// (spec.IdentityFile's directory); the control directory's
// instancectl.IdentityDir is bound there.
const identityDir = "run/fogdeploy"

// bindIdentity binds the control directory's identity/ (-wait's
// directory) read-only at <root>/run/fogdeploy and says so in the control
// directory: the host then writes an instance's identity there, on its own
// file system, instead of through the root's. Where the root's /run or
// /run/fogdeploy is not a directory (a symbolic link, which is not
// followed), nothing is bound and the host writes into the root.
func bindIdentity(cfg *config) {
	if cfg.wait == "" {
		return
	}
	ctl := filepath.Dir(cfg.wait)
	marker := filepath.Join(ctl, instancectl.IdentityBound)
	_ = os.Remove(marker)
	src := filepath.Join(ctl, instancectl.IdentityDir)
	if st, err := os.Lstat(src); err != nil || !st.IsDir() {
		return
	}
	dst := cfg.root
	for _, comp := range strings.Split(identityDir, "/") {
		dst = filepath.Join(dst, comp)
		if err := os.Mkdir(dst, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return
		}
		if st, err := os.Lstat(dst); err != nil || !st.IsDir() {
			return
		}
	}
	if mount(src, dst, "", syscall.MS_BIND, "") != nil {
		return
	}
	if mount("(remount read-only)", dst, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY|syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "") != nil {
		_ = syscall.Unmount(dst, syscall.MNT_DETACH)
		return
	}
	_ = os.WriteFile(marker, nil, 0o644)
}

func mount(src, dst, fstype string, flags uintptr, data string) error {
	sysSrc := src
	if flags&(syscall.MS_REMOUNT|syscall.MS_PRIVATE|syscall.MS_SLAVE) != 0 {
		sysSrc = ""
	}
	err := syscall.Mount(sysSrc, dst, fstype, flags, data)
	if err == nil {
		return nil
	}
	if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) {
		return fmt.Errorf("mount %s on %s: %w (%w)", src, dst, errNeedSysAdmin, err)
	}
	return fmt.Errorf("mount %s on %s (%s): %w", src, dst, fstype, err)
}
