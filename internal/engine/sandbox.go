package engine

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/capset"
	"github.com/fogdeploy/fogdeploy/internal/devfs"
	"github.com/fogdeploy/fogdeploy/internal/netup"
	"github.com/fogdeploy/fogdeploy/internal/osthread"
	"github.com/fogdeploy/fogdeploy/internal/procfs"
	"github.com/fogdeploy/fogdeploy/internal/seccomp"
)

// A sandbox is the set of private namespaces one Process runs in: a mount
// namespace (a slave copy of the host's, so nothing mounted inside leaks
// out) and optionally a network namespace with only lo up.
//
// Go cannot run code between fork and exec, so the namespaces are made on a
// locked OS thread: unshare there, mount there, and start the children from
// there (they inherit the thread's namespaces). Such a thread is never
// unlocked, so the Go runtime discards it instead of reusing it, and is
// never the main thread, which it could not discard (osthread.Run). The
// sandbox keeps one fd per namespace; later steps (start the coordinator,
// run criu dump, attach a checkpoint directory) re-enter the namespaces with
// setns on a fresh locked thread. The namespaces die when the fds are closed
// and the processes in them have exited.
type sandbox struct {
	// mu is held (read) while a step runs inside and (write) by close.
	mu     sync.RWMutex
	closed bool
	mnt    *os.File // nil: the host's namespace
	net    *os.File
	pid    *os.File // set once a restore's PID namespace exists
	ipc    *os.File // the IPC namespace of that PID namespace's init
	// confine makes doConfined drop the capabilities of what it starts.
	confine bool
}

// sandboxSpec says what to build.
type sandboxSpec struct {
	mountNS bool
	netNS   bool
	root    string      // chroot directory to prepare (needs mountNS)
	rootSrc string      // if set and not root, bound on root first
	mkdirs  []string    // directories to create in the root (after its tmpfs)
	binds   []bindMount // done last
	// confine gives the root a private /dev and makes doConfined drop
	// capabilities (Config.Confine).
	confine bool
	// privateDev gives the root a private /dev (Config.PrivateDev).
	privateDev bool
}

type bindMount struct {
	src, dst string // dst is a full path in the sandbox
	ro       bool
	mkdir    bool // create dst if missing
	file     bool // dst is a file: create it empty if missing
}

// newSandbox makes the namespaces and mounts. On error nothing is left: the
// half-built namespaces die with their thread.
func newSandbox(spec sandboxSpec) (*sandbox, error) {
	if !spec.mountNS && !spec.netNS {
		return &sandbox{confine: spec.confine}, nil
	}
	var sb *sandbox
	err := osthread.Run(func() (err error) {
		sb, err = buildSandbox(spec)
		return err
	})
	return sb, err
}

func buildSandbox(spec sandboxSpec) (*sandbox, error) {
	flags := 0
	if spec.mountNS {
		flags |= unix.CLONE_NEWNS
	}
	if spec.netNS {
		flags |= unix.CLONE_NEWNET
	}
	if err := unix.Unshare(flags); err != nil {
		return nil, fmt.Errorf("unshare namespaces: %w", err)
	}
	if spec.mountNS {
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
			return nil, fmt.Errorf("make / a slave mount: %w", err)
		}
	}
	if spec.netNS {
		if err := netup.LinkUp("lo"); err != nil {
			return nil, err
		}
	}
	if spec.root != "" {
		if spec.rootSrc != "" && spec.rootSrc != spec.root {
			if err := bind(bindMount{src: spec.rootSrc, dst: spec.root}); err != nil {
				return nil, err
			}
		}
		if err := mountRoot(spec.root, spec.mkdirs, spec.confine || spec.privateDev); err != nil {
			return nil, err
		}
	}
	for _, b := range spec.binds {
		if err := bind(b); err != nil {
			return nil, err
		}
	}
	sb := &sandbox{confine: spec.confine}
	var err error
	if spec.mountNS {
		if sb.mnt, err = os.Open("/proc/thread-self/ns/mnt"); err != nil {
			return nil, err
		}
	}
	if spec.netNS {
		if sb.net, err = os.Open("/proc/thread-self/ns/net"); err != nil {
			sb.close()
			return nil, err
		}
	}
	return sb, nil
}

func bind(b bindMount) error {
	if b.file {
		f, err := os.OpenFile(b.dst, os.O_CREATE|os.O_WRONLY|unix.O_NOFOLLOW, 0o500)
		if err != nil {
			return fmt.Errorf("bind %s: %w", b.src, err)
		}
		f.Close()
	}
	if b.mkdir {
		if err := os.MkdirAll(b.dst, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount(b.src, b.dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", b.src, b.dst, err)
	}
	if b.ro {
		if err := unix.Mount("", b.dst, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("remount %s read-only: %w", b.dst, err)
		}
	}
	return nil
}

// mountRoot gives root its /proc, /dev (the host's, or with privateDev a
// private one) and a fresh /tmp.
func mountRoot(root string, mkdirs []string, privateDev bool) error {
	for _, d := range []string{"proc", "dev", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	// The kernel's control surface is hidden as in a Docker container:
	// in a fresh procfs uid 0 could read the kernel's keys or change some
	// of the host's settings without capabilities.
	if err := procfs.Mount(root); err != nil {
		return err
	}
	if privateDev {
		if err := mountPrivateDev(root); err != nil {
			return err
		}
	} else if err := unix.Mount("/dev", filepath.Join(root, "dev"), "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind /dev in %s: %w", root, err)
	}
	if err := unix.Mount("tmpfs", filepath.Join(root, "tmp"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return fmt.Errorf("mount tmpfs on %s/tmp: %w", root, err)
	}
	for _, d := range mkdirs {
		if err := os.MkdirAll(filepath.Join(root, d), 0o700); err != nil {
			return err
		}
	}
	return nil
}

// mountPrivateDev mounts a private /dev on root's dev directory, which
// must be a directory of root (no link is followed).
func mountPrivateDev(root string) error {
	dev, err := devfs.MountIn(root)
	if err != nil {
		return err
	}
	return unix.Close(dev)
}

// do runs fn on a fresh locked thread inside the sandbox's namespaces.
// Processes that fn starts inherit them.
func (sb *sandbox) do(fn func() error) error { return sb.run(runOpts{}, fn) }

// doConfined is do for the processes of the app's side (the app, DMTCP's
// wrapper, its coordinator's commands). It also joins the IPC namespace
// of the sandbox's PID namespace, where the app runs (criu runs outside
// it, to dump it). In a confining sandbox, what fn starts holds no
// capability and cannot gain one (capset.ForExec), even as root, and runs
// under the system-call filter of internal/seccomp; fn itself keeps the
// thread's capabilities, so that a chroot before the execve works.
func (sb *sandbox) doConfined(fn func() error) error {
	return sb.run(runOpts{alone: true, app: true, confine: sb != nil && sb.confine}, fn)
}

// doAlone is do on a fresh locked thread even where the sandbox has no
// namespace of its own, so that fn may change what only that thread
// holds (its credentials) for the processes it starts.
func (sb *sandbox) doAlone(fn func() error) error { return sb.run(runOpts{alone: true}, fn) }

// runOpts says how run prepares the thread fn runs on.
type runOpts struct {
	alone   bool // a fresh locked thread even without a namespace to enter
	app     bool // join the IPC namespace of the PID namespace's init
	confine bool // drop the capabilities of what fn starts (capset.ForExec)
}

func (sb *sandbox) run(o runOpts, fn func() error) error {
	enter := func() error { return nil }
	if sb != nil {
		sb.mu.RLock()
		defer sb.mu.RUnlock()
		if sb.closed {
			return fmt.Errorf("sandbox: %w", ErrExited)
		}
		if sb.mnt != nil || sb.net != nil || sb.pid != nil {
			enter = func() error { return sb.enter(o.app) }
			o.alone = true
		}
	}
	if !o.alone {
		return fn()
	}
	return osthread.Run(func() error {
		if err := enter(); err != nil {
			return err
		}
		if o.confine {
			if err := capset.ForExec(capset.Thread); err != nil {
				return fmt.Errorf("drop the capabilities of the app's processes: %w", err)
			}
			if err := seccomp.InstallThread(); err != nil {
				return fmt.Errorf("filter the system calls of the app's processes: %w", err)
			}
		}
		return fn()
	})
}

func (sb *sandbox) enter(app bool) error {
	if sb.mnt != nil {
		// setns into a mount namespace needs a private fs_struct.
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			return fmt.Errorf("unshare fs: %w", err)
		}
		if err := unix.Setns(int(sb.mnt.Fd()), unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("enter mount namespace: %w", err)
		}
	}
	if sb.net != nil {
		if err := unix.Setns(int(sb.net.Fd()), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("enter network namespace: %w", err)
		}
	}
	if sb.pid != nil {
		// Affects the children only, which is what criu dump needs.
		if err := unix.Setns(int(sb.pid.Fd()), unix.CLONE_NEWPID); err != nil {
			return fmt.Errorf("enter pid namespace: %w", err)
		}
	}
	if app && sb.ipc != nil {
		if err := unix.Setns(int(sb.ipc.Fd()), unix.CLONE_NEWIPC); err != nil {
			return fmt.Errorf("enter ipc namespace: %w", err)
		}
	}
	return nil
}

// attach mounts the host directory src on dst inside the sandbox's mount
// namespace. The host does not see the mount; it goes away with the
// namespace. An earlier mount on dst is detached first.
func (sb *sandbox) attach(src, dst string) error {
	if sb == nil || !sb.hasMountNS() {
		return fmt.Errorf("attach %s: no private mount namespace: %w", src, ErrInvalid)
	}
	// A detached copy of src, made in our own mount namespace, can be moved
	// into any namespace (open_tree + move_mount).
	tree, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", src, err)
	}
	defer unix.Close(tree)
	return sb.do(func() error {
		_ = unix.Unmount(dst, unix.MNT_DETACH) // EINVAL when nothing is mounted there
		if err := unix.MoveMount(tree, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("move_mount %s to %s: %w", src, dst, err)
		}
		return nil
	})
}

// detach undoes attach.
func (sb *sandbox) detach(dst string) error {
	return sb.do(func() error { return unix.Unmount(dst, unix.MNT_DETACH) })
}

func (sb *sandbox) hasMountNS() bool {
	sb.mu.RLock()
	defer sb.mu.RUnlock()
	return sb.mnt != nil
}

// setPidNS records the PID namespace that later steps enter, and the IPC
// namespace of its init, which the app's start enters (doConfined).
func (sb *sandbox) setPidNS(pid, ipc *os.File) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	sb.pid, sb.ipc = pid, ipc
}

func (sb *sandbox) close() {
	if sb == nil {
		return
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	sb.closed = true
	for _, f := range []**os.File{&sb.mnt, &sb.net, &sb.pid, &sb.ipc} {
		if *f != nil {
			(*f).Close()
			*f = nil
		}
	}
}

// InNetNS runs fn on a locked OS thread inside the network namespace of
// process pid. Sockets fn creates stay in that namespace; processes it
// starts inherit it.
func InNetNS(pid int, fn func() error) error {
	sb, err := sandboxOf(pid, nsNet)
	if err != nil {
		return err
	}
	defer sb.close()
	return sb.do(fn)
}

// Namespaces sandboxOf can open.
const (
	nsMnt = "mnt"
	nsNet = "net"
	nsIPC = "ipc"
	nsPID = "pid"
)

// sandboxOf returns a sandbox onto the namespaces names of process pid,
// which steps then enter; close it when done.
func sandboxOf(pid int, names ...string) (*sandbox, error) {
	sb := &sandbox{}
	fields := map[string]**os.File{nsMnt: &sb.mnt, nsNet: &sb.net, nsIPC: &sb.ipc, nsPID: &sb.pid}
	for _, name := range names {
		f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/" + name)
		if err != nil {
			sb.close()
			return nil, fmt.Errorf("%s namespace of pid %d: %w", name, pid, err)
		}
		*fields[name] = f
	}
	return sb, nil
}

// NetNSDialer returns a DialFunc that dials from inside the network
// namespace of process pid, so probes reach an app restored with NetNS.
func NetNSDialer(pid int) DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := InNetNS(pid, func() error {
			var d net.Dialer
			var err error
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		if err != nil && c != nil {
			c.Close()
			c = nil
		}
		return c, err
	}
}

// StartIn starts cmd beside the app of process pid, as the app runs under
// a confining engine (Config.Confine): in its mount, network, IPC and PID
// namespaces, chrooted into the app's own root, holding no capability and
// unable to gain one. cmd.Args[0] is looked up in the PATH of cmd.Env in
// that root; cmd.Dir is a directory of it ("" is "/").
func StartIn(pid int, cmd *exec.Cmd) error {
	if len(cmd.Args) == 0 {
		return fmt.Errorf("start in pid %d: no command: %w", pid, ErrInvalid)
	}
	proc := "/proc/" + strconv.Itoa(pid)
	path, err := resolveArgv0(proc+"/root", cmd.Args[0], cmd.Env)
	if err != nil {
		return err
	}
	// The app's root, held open: the child chroots into it through its
	// descriptor, which it inherits (the path of the root can differ
	// between the app's mount namespace and ours).
	root, err := os.OpenFile(proc+"/root", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("root of pid %d: %w", pid, err)
	}
	defer root.Close()
	sb, err := sandboxOf(pid, nsMnt, nsNet, nsIPC, nsPID)
	if err != nil {
		return err
	}
	defer sb.close()
	sb.confine = true
	cmd.Path = path
	if cmd.Dir == "" {
		cmd.Dir = "/"
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	// Born in the app's PID namespace, the child finds its descriptor in
	// the /proc mounted there.
	cmd.SysProcAttr.Chroot = "/proc/self/fd/" + strconv.Itoa(int(root.Fd()))
	return sb.doConfined(cmd.Start)
}
