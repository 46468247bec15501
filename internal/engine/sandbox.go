package engine

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/netup"
	"github.com/fogdeploy/fogdeploy/internal/osthread"
	"github.com/fogdeploy/fogdeploy/internal/procfs"
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
}

// sandboxSpec says what to build.
type sandboxSpec struct {
	mountNS bool
	netNS   bool
	root    string      // chroot directory to prepare (needs mountNS)
	rootSrc string      // if set and not root, bound on root first
	mkdirs  []string    // directories to create in the root (after its tmpfs)
	binds   []bindMount // done last
}

type bindMount struct {
	src, dst string // dst is a full path in the sandbox
	ro       bool
	mkdir    bool // create dst if missing
}

// newSandbox makes the namespaces and mounts. On error nothing is left: the
// half-built namespaces die with their thread.
func newSandbox(spec sandboxSpec) (*sandbox, error) {
	if !spec.mountNS && !spec.netNS {
		return &sandbox{}, nil
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
		if err := mountRoot(spec.root, spec.mkdirs); err != nil {
			return nil, err
		}
	}
	for _, b := range spec.binds {
		if err := bind(b); err != nil {
			return nil, err
		}
	}
	sb := &sandbox{}
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

// mountRoot gives root its /proc, /dev and a fresh /tmp.
func mountRoot(root string, mkdirs []string) error {
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
	if err := unix.Mount("/dev", filepath.Join(root, "dev"), "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
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

// do runs fn on a fresh locked thread inside the sandbox's namespaces.
// Processes that fn starts inherit them.
func (sb *sandbox) do(fn func() error) error { return sb.run(false, false, fn) }

// doApp is do that also joins the IPC namespace of the sandbox's PID
// namespace, where the app runs (criu runs outside it, to dump it).
func (sb *sandbox) doApp(fn func() error) error { return sb.run(false, true, fn) }

// doAlone is do on a fresh locked thread even where the sandbox has no
// namespace of its own, so that fn may change what only that thread
// holds (its credentials) for the processes it starts.
func (sb *sandbox) doAlone(fn func() error) error { return sb.run(true, false, fn) }

func (sb *sandbox) run(alone, app bool, fn func() error) error {
	enter := func() error { return nil }
	if sb != nil {
		sb.mu.RLock()
		defer sb.mu.RUnlock()
		if sb.closed {
			return fmt.Errorf("sandbox: %w", ErrExited)
		}
		if sb.mnt != nil || sb.net != nil || sb.pid != nil {
			enter = func() error { return sb.enter(app) }
			alone = true
		}
	}
	if !alone {
		return fn()
	}
	return osthread.Run(func() error {
		if err := enter(); err != nil {
			return err
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
// namespace of its init, which the app's start enters (doApp).
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
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/net")
	if err != nil {
		return fmt.Errorf("network namespace of pid %d: %w", pid, err)
	}
	defer f.Close()
	return (&sandbox{net: f}).do(fn)
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
