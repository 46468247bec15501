package main

import (
	"bufio"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/procfs"
)

// The app's own namespaces.
//
// The supervisor (PID 1 of the container), DMTCP's coordinator and every
// dmtcp_command run in the container's PID namespace. The app runs in a
// PID and a mount namespace of its own, whose init is a keeper started
// with -init: the app sees its own processes and that init, nothing of
// the supervisor, and a /proc of its namespace with the kernel's control
// surface hidden (procfs.Mount). The init is chrooted into the root and,
// once it has started the app's keeper, holds no capability.
//
//	PID 1 supervisor ─ keep -init (PID 1 of the app's namespace)
//	                     └ keep (PID 2: the app's parent is never PID 1)
//	                         └ the app (dmtcp_launch, dmtcp_restart or the command)

// appNSFlags are the namespaces the supervisor clones the init into.
const appNSFlags = syscall.CLONE_NEWPID | syscall.CLONE_NEWNS

// initApp is keep -init: it mounts the namespace's /proc on root/proc,
// chroots into root, starts the app's keeper (keep [-user USER] / WORKDIR
// ARGV...) as its only child, drops its last capabilities, reaps every
// process of the namespace, forwards termination signals and SIGUSR2 to
// the keeper, and exits with its status (the kernel then kills whatever is
// left in the namespace).
func initApp(user, root, workdir string, argv []string) int {
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "entrypoint keep -init: not the init of a PID namespace (the supervisor clones it with CLONE_NEWPID)")
		return exitUsage
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR2)
	// Nothing mounted here goes back to the container's namespace.
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_SLAVE, ""); err != nil {
		fmt.Fprintf(os.Stderr, "entrypoint keep -init: make the mount namespace a slave: %v\n", err)
		return exitSetup
	}
	if err := procfs.Mount(root); err != nil {
		fmt.Fprintf(os.Stderr, "entrypoint keep -init: %v\n", err)
		return exitSetup
	}
	if err := syscall.Chroot(root); err != nil {
		fmt.Fprintf(os.Stderr, "entrypoint keep -init: chroot %s: %v\n", root, err)
		return exitSetup
	}
	if err := os.Chdir("/"); err != nil {
		fmt.Fprintf(os.Stderr, "entrypoint keep -init: chdir / inside the root: %v\n", err)
		return exitSetup
	}
	// The keeper gets what it still needs (its permitted set is this
	// bounding set): CAP_SETPCAP to drop the rest, CAP_SETUID and
	// CAP_SETGID to start the app as its user.
	if err := dropCaps(capsExcept(capSetpcap, capSetuid, capSetgid)...); err != nil {
		fmt.Fprintf(os.Stderr, "entrypoint keep -init: %v: the app is not started with capabilities it must not have\n", err)
		return exitSetup
	}
	kargv := []string{"/proc/self/exe", modeKeep}
	if user != "" {
		kargv = append(kargv, "-user", user)
	}
	kargv = append(append(kargv, "/", workdir), argv...)
	// The reaper reaps every process of the namespace, which all become
	// this init's once orphaned, and hands the keeper's status over.
	r := newReaper(slog.New(slog.DiscardHandler))
	keeper, done, err := r.start(kargv, &syscall.ProcAttr{Env: os.Environ(), Files: []uintptr{0, 1, 2}})
	if err != nil {
		fmt.Fprintf(os.Stderr, "entrypoint keep -init: start the keeper: %v\n", err)
		return exitSetup
	}
	if err := dropCaps(capsExcept()...); err != nil {
		// The init of the app's namespace must hold nothing: the app is
		// ended with it (the kernel kills the namespace).
		fmt.Fprintf(os.Stderr, "entrypoint keep -init: %v: the app is ended rather than run beside an init with capabilities\n", err)
		_ = syscall.Kill(keeper, syscall.SIGKILL)
		return exitSetup
	}
	for {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGCHLD {
				r.reap()
				continue
			}
			_ = syscall.Kill(keeper, sig.(syscall.Signal))
		case ws := <-done:
			return exitStatus(ws)
		}
	}
}

// capsExcept returns every capability but keep, in the order dropCaps
// needs (CAP_SETPCAP last, unless kept).
func capsExcept(keep ...int) []int {
	kept := func(c int) bool {
		for _, k := range keep {
			if k == c {
				return true
			}
		}
		return false
	}
	var drop []int
	for c := capLast; c >= 0; c-- {
		if c != capSetpcap && !kept(c) {
			drop = append(drop, c)
		}
	}
	if !kept(capSetpcap) {
		drop = append(drop, capSetpcap)
	}
	return drop
}

// joinApp moves the calling thread, which must be locked to it, into the
// PID and mount namespaces and the root of the container's app: the
// namespaces of the init of the PID namespace below the container's (keep
// -init, or the placeholder init of a CRIU restore), and the root of a
// process of the app's in there (the init's if it is alone). The children
// it forks are born there. It reports whether it joined: without such an
// init (an app launched under CRIU runs in the container's namespaces) it
// changes nothing.
func joinApp() (bool, error) {
	init, member, err := findAppNS("/proc")
	if err != nil || init == 0 {
		return false, err
	}
	var fds []int
	defer func() {
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
	}()
	open := func(pid int, name string, flags int) (int, error) {
		fd, err := unix.Open(filepath.Join("/proc", strconv.Itoa(pid), name), flags|unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, fmt.Errorf("the app's %s: %w", name, err)
		}
		fds = append(fds, fd)
		return fd, nil
	}
	pidNS, err := open(init, "ns/pid", 0)
	if err != nil {
		return false, err
	}
	mntNS, err := open(init, "ns/mnt", 0)
	if err != nil {
		return false, err
	}
	root, err := open(member, "root", unix.O_DIRECTORY|unix.O_PATH)
	if err != nil {
		return false, err
	}
	// A mount namespace is joined by a thread that shares no file system
	// attributes with the others.
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return false, fmt.Errorf("unshare the file system attributes: %w", err)
	}
	if err := unix.Setns(pidNS, unix.CLONE_NEWPID); err != nil {
		return false, fmt.Errorf("join the app's PID namespace (pid %d): %w", init, err)
	}
	if err := unix.Setns(mntNS, unix.CLONE_NEWNS); err != nil {
		return false, fmt.Errorf("join the app's mount namespace (pid %d): %w", init, err)
	}
	if err := unix.Fchdir(root); err != nil {
		return false, fmt.Errorf("enter the app's root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return false, fmt.Errorf("chroot into the app's root: %w", err)
	}
	return true, nil
}

// findAppNS returns, as PIDs of proc's namespace, the init of a PID
// namespace one level below it (NSpid: PID 1; the lowest if several) and
// a process of that namespace other than the init (the one with the lowest
// PID in it), or the init if it is alone; 0, 0 if there is none.
func findAppNS(proc string) (init, member int, err error) {
	entries, err := os.ReadDir(proc)
	if err != nil {
		return 0, 0, err
	}
	type nsProc struct{ pid, inner int }
	var below []nsProc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ns := nsPIDs(filepath.Join(proc, e.Name(), "status"))
		if len(ns) != 2 {
			continue
		}
		inner, _ := strconv.Atoi(ns[1])
		below = append(below, nsProc{pid, inner})
		if inner == 1 && (init == 0 || pid < init) {
			init = pid
		}
	}
	if init == 0 {
		return 0, 0, nil
	}
	nsOf := func(pid int) string {
		l, _ := os.Readlink(filepath.Join(proc, strconv.Itoa(pid), "ns", "pid"))
		return l
	}
	want, best := nsOf(init), 0
	member = init
	for _, p := range below {
		if p.inner != 1 && (best == 0 || p.inner < best) && nsOf(p.pid) == want {
			member, best = p.pid, p.inner
		}
	}
	return init, member, nil
}

// nsPIDs returns the NSpid fields of a /proc/PID/status file.
func nsPIDs(status string) []string {
	f, err := os.Open(status)
	if err != nil {
		return nil
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "NSpid:"); ok {
			return strings.Fields(v)
		}
	}
	return nil
}
