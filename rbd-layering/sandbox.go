package layering

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/netup"
	"github.com/fogdeploy/fogdeploy/internal/osthread"
	"github.com/fogdeploy/fogdeploy/internal/procfs"
)

// A RUN step (and `fogctl env exec`) runs its command in the mounted
// clone of the environment, as root, in namespaces of its own:
//
//   - mount: a slave copy of the host's, made on a locked OS thread (Go
//     cannot run code between fork and exec), where the clone gets a
//     private /dev (a tmpfs with the usual nodes bound from the host's, a
//     devpts of its own, /dev/shm) and, with NetworkHost, the host's
//     /etc/resolv.conf bound read-only. The clone then becomes the root
//     (pivot_root) and the host's root is detached: nothing of the host's
//     file systems is left to reach, by a link or by escaping a chroot.
//     None of these mounts is ever in the host's namespace: they go when
//     the step ends, or with the process if it is killed.
//   - PID: the command is PID 1, and when it ends the kernel kills what it
//     left running, so the clone can be unmounted and removed. Its /proc is
//     a fresh procfs of this namespace, hidden as Docker hides it
//     (internal/procfs): only a process inside the namespace can mount it,
//     so the namespace's first process is the host's /bin/sh running
//     stepInit, which mounts it, waits until the thread has moved the
//     root, and execs the environment's /bin/sh.
//   - network (unless NetworkHost): lo, up, and on NetworkDefault the
//     tap0 of a user-mode NAT (sandbox_net.go). The step's bounding set
//     is stepCaps: the host's setpriv drops the rest before the
//     environment's shell runs.
//   - UTS and IPC: a hostname or System V objects of a package's scripts
//     stay in the step.
//
// Every path in the environment that is mounted onto or written is
// resolved beneath the root without following a link (beneath.go): an
// environment whose /dev or /proc is a link, or not a directory, is
// refused.

// stepInit is the script of the host's /bin/sh that becomes the step's
// command: run with the step's root as its working directory, fd 3 to say
// that /proc is ready and fd 4 to wait for the root to be moved. It mounts
// /proc, then the host's setpriv leaves the step only stepCaps in its
// bounding set (and so in what its root processes hold), and runs
// stepRun, which waits for the new root and execs the environment's
// /bin/sh. It runs with a fixed environment (no variable of the
// environment reaches a host binary); the step's variables are exported
// just before that exec.
const stepInit = `set -e
mount -t proc -o nosuid,nodev,noexec proc proc
PROC=proc
` + "%s" + `exec setpriv --bounding-set=%s --inh-caps=-all /bin/sh -c "$2" step "$1"
`

// stepRun is the second half of stepInit, run with the step's
// capabilities only.
const stepRun = `set -e
echo ready >&3
exec 3>&-
read -r go <&4
exec 4<&-
[ "$go" = go ]
cd /
exec </dev/null
%sexec /bin/sh -c "$1"
`

// stepPath is the PATH of the host's programs that stepInit runs.
const stepPath = "PATH=/usr/sbin:/usr/bin:/sbin:/bin"

// envName is what a step's variable may be named: the shell that exports
// it must take the name.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// stepSpec is one command to run in a mounted environment.
type stepSpec struct {
	root    string // the mounted clone (a mount point)
	command string
	cfg     ImageConfig
	network Network
	out     io.Writer
	// resolv is the node's file bound on the step's /etc/resolv.conf:
	// the node's own (NetworkHost) or one naming the NAT's DNS
	// (NetworkDefault); "" binds none.
	resolv string
}

// runStep runs a shell command in the environment mounted at s.root with
// its config. Its output goes to s.out; the error of a failing command
// wraps ErrBuildStep and carries the last lines.
func runStep(ctx context.Context, s stepSpec) (err error) {
	exports, err := stepExports(s.cfg)
	if err != nil {
		return err
	}
	wd := s.cfg.WorkDir
	if wd == "" {
		wd = "/"
	}
	inner := fmt.Sprintf("mkdir -p %s && cd %s && %s", shellQuote(wd), shellQuote(wd), s.command)
	switch s.network {
	case NetworkHost:
		if _, err := os.Stat("/etc/resolv.conf"); err == nil {
			s.resolv = "/etc/resolv.conf"
		}
	case NetworkDefault:
		if s.resolv, err = stepResolvConf(); err != nil {
			return fmt.Errorf("the step's resolv.conf: %w", err)
		}
		defer os.Remove(s.resolv)
	}
	undo, err := prepareRoot(s.root, s.resolv != "")
	if err != nil {
		return err
	}
	defer func() {
		if uerr := undo(); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}()
	var tail tailBuffer
	w := io.MultiWriter(&tail, s.out)
	// On a thread of its own, which leaves with what it changed (its root,
	// its namespaces).
	err = osthread.Run(func() error { return sandboxed(ctx, s, inner, exports, w) })
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		err = fmt.Errorf("RUN %s: %w: %w\n%s", s.command, ErrBuildStep, err, tail.String())
		if h, ok := dnsFailed(tail.String(), s.network); ok {
			err = hint.With(err, h)
		}
		return err
	}
	if err != nil {
		return fmt.Errorf("RUN %s: %w\n%s", s.command, err, tail.String())
	}
	return nil
}

// stepExports are the shell lines that export the step's variables: a
// few defaults, then the environment's.
func stepExports(cfg ImageConfig) (string, error) {
	var b strings.Builder
	for _, kv := range append([]string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root", "DEBIAN_FRONTEND=noninteractive", "LANG=C.UTF-8",
	}, cfg.Env...) {
		k, _, _ := strings.Cut(kv, "=")
		if !envName.MatchString(k) {
			return "", hint.With(fmt.Errorf("the environment's variable %q: a RUN step can only be given names of letters, digits and _: %w", k, ErrInvalid),
				"rename it with an ENV step of a valid name")
		}
		fmt.Fprintf(&b, "export %s\n", shellQuote(kv))
	}
	return b.String(), nil
}

// prepareRoot makes, in the clone, the mount points a step needs (dev and
// proc, which must be directories) and what it writes for the step
// (usr/sbin/policy-rc.d, so that packages start no service; with resolv
// an empty etc/resolv.conf to bind the step's on), all beneath root.
// undo removes what it wrote.
func prepareRoot(root string, resolv bool) (undo func() error, err error) {
	rfd, err := openRoot(root)
	if err != nil {
		return nil, err
	}
	defer unix.Close(rfd)
	for _, d := range []string{"dev", "proc"} {
		fd, err := mkdirAllBeneath(rfd, d, "/", unix.O_PATH)
		if err != nil {
			return nil, hint.With(fmt.Errorf("the environment's /%s, where a RUN step mounts its own: %w", d, err),
				"make /"+d+" an empty directory in the environment")
		}
		unix.Close(fd)
	}
	type made struct {
		dir  int
		name string
	}
	var created []made
	undo = func() error {
		var errs []error
		for _, m := range created {
			if err := unix.Unlinkat(m.dir, m.name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("remove %s from the build root: %w", m.name, err))
			}
			unix.Close(m.dir)
		}
		return errors.Join(errs...)
	}
	// create makes name in the directory dir of the environment, unless
	// anything is there (a link too: it is left as it is).
	create := func(dir, name string, data []byte, mode uint32) {
		dfd, err := openBeneath(rfd, dir, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return // a link, or missing: nothing to do
		}
		fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
		if err != nil {
			unix.Close(dfd)
			return
		}
		// A half-written file is removed at the end all the same.
		f := os.NewFile(uintptr(fd), name)
		if _, err := f.Write(data); err == nil {
			_ = f.Chmod(os.FileMode(mode))
		}
		f.Close()
		created = append(created, made{dfd, name})
	}
	create("usr/sbin", "policy-rc.d", []byte("#!/bin/sh\nexit 101\n"), 0o755)
	if resolv {
		create("etc", "resolv.conf", nil, 0o644)
	}
	return undo, nil
}

// sandboxed runs on a locked OS thread: it makes the namespaces and
// mounts, starts stepInit in them, moves the root, and waits for the
// command. It leaves the namespaces before it returns, so that they are
// gone (with every mount in them) before the clone is unmounted on the
// host.
func sandboxed(ctx context.Context, s stepSpec, inner, exports string, w io.Writer) (err error) {
	leave, err := enterStepNamespaces(s.network)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, leave()) }()
	if s.network == NetworkDefault {
		var nat *stepNet
		if nat, err = startStepNet(ctx, unix.Gettid()); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, nat.stop()) }()
	}
	rfd, err := prepareStepRoot(s)
	if err != nil {
		return err
	}
	defer unix.Close(rfd)
	return startStep(ctx, s, rfd, inner, exports, w)
}

// enterStepNamespaces moves this thread into a new mount namespace, and a
// new network namespace unless the step uses the host's; leave moves it
// back, dropping the last reference to them, so that their mounts go.
func enterStepNamespaces(network Network) (leave func() error, err error) {
	hostMnt, err := os.Open("/proc/thread-self/ns/mnt")
	if err != nil {
		return nil, err
	}
	flags := unix.CLONE_NEWNS
	var hostNet *os.File
	if network != NetworkHost {
		flags |= unix.CLONE_NEWNET
		if hostNet, err = os.Open("/proc/thread-self/ns/net"); err != nil {
			hostMnt.Close()
			return nil, err
		}
	}
	leave = func() error {
		defer hostMnt.Close()
		var errs []error
		if err := unix.Setns(int(hostMnt.Fd()), unix.CLONE_NEWNS); err != nil {
			errs = append(errs, fmt.Errorf("leave the step's mount namespace: %w", err))
		}
		if hostNet != nil {
			defer hostNet.Close()
			if err := unix.Setns(int(hostNet.Fd()), unix.CLONE_NEWNET); err != nil {
				errs = append(errs, fmt.Errorf("leave the step's network namespace: %w", err))
			}
		}
		return errors.Join(errs...)
	}
	if err := unix.Unshare(flags); err != nil {
		hostMnt.Close()
		if hostNet != nil {
			hostNet.Close()
		}
		return nil, fmt.Errorf("unshare the step's namespaces: %w", err)
	}
	return leave, nil
}

// prepareStepRoot readies, in the step's namespaces, its root s.root (its
// /dev, its resolv.conf, the loopback link of a network of its own) and
// returns the root's descriptor.
func prepareStepRoot(s stepSpec) (int, error) {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return -1, fmt.Errorf("make / a slave mount: %w", err)
	}
	if s.network != NetworkHost {
		if err := netup.LinkUp("lo"); err != nil {
			return -1, err
		}
	}
	rfd, err := openRoot(s.root)
	if err != nil {
		return -1, err
	}
	fail := func(err error) (int, error) { unix.Close(rfd); return -1, err }
	if err := mountDev(rfd); err != nil {
		return fail(err)
	}
	if s.resolv != "" {
		if err := bindResolvConf(rfd, s.resolv); err != nil {
			return fail(err)
		}
	}
	// stepInit mounts proc on the directory prepareRoot checked.
	pfd, err := openDirBeneath(rfd, "proc", unix.O_PATH, "/proc")
	if err != nil {
		return fail(err)
	}
	unix.Close(pfd)
	return rfd, nil
}

// startStep starts the step's init (stepInit) in new PID, UTS and IPC
// namespaces, pivots into the root rfd once the init has mounted its
// /proc, lets it run the step (inner) and waits for it.
func startStep(ctx context.Context, s stepSpec, rfd int, inner, exports string, w io.Writer) error {
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer readyR.Close()
	goR, goW, err := os.Pipe()
	if err != nil {
		readyW.Close()
		return err
	}
	defer goW.Close()
	// Whatever descriptor this process holds without close-on-exec (one
	// it inherited, one a C library opened) would reach the step, and a
	// directory's would lead it out of its root: mark them all. Go passes
	// the descriptors it gives a child (ExtraFiles, Stdout, ...) by dup2,
	// which clears the mark in the child.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("mark descriptors close-on-exec: %w", err)
	}
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", fmt.Sprintf(stepInit, procfs.Script(), stepBoundingSet()), "step", inner, fmt.Sprintf(stepRun, exports))
	cmd.Dir = s.root
	cmd.Env = []string{stepPath}
	cmd.Stdout, cmd.Stderr = w, w
	cmd.ExtraFiles = []*os.File{readyW, goR}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: unix.CLONE_NEWPID | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC,
		// The parent is this thread, which waits for the command.
		Pdeathsig: syscall.SIGKILL,
	}
	err = cmd.Start()
	readyW.Close()
	goR.Close()
	if err != nil {
		return fmt.Errorf("start the step: %w", err)
	}
	line, _ := bufio.NewReader(readyR).ReadString('\n')
	if line != "ready\n" {
		goW.Close()
		werr := cmd.Wait()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// Not the command's failure (no ErrBuildStep): what the init
		// printed says why.
		return fmt.Errorf("mount the step's /proc: %v", werr)
	}
	if err := pivotInto(rfd); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return err
	}
	if _, err := goW.Write([]byte("go\n")); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return err
	}
	goW.Close()
	return cmd.Wait()
}
