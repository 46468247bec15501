package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/atomicfile"
	"github.com/fogdeploy/fogdeploy/internal/instancectl"
	"github.com/fogdeploy/fogdeploy/internal/mountinfo"
)

// Bounds of a release.
var (
	// reapWait bounds the wait for the killed processes to be reaped.
	reapWait = 5 * time.Second
	// lingerWait bounds the wait for the app's listening ports to be
	// bindable again.
	lingerWait = time.Second
)

func (s *supervisor) ctlFile(name string) string {
	return filepath.Join(filepath.Dir(s.cfg.wait), name)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// recycle gives the instance back (-recycle): every process of the
// container but this one is killed, the mounts that prepareRoot made in
// the root are unmounted, what the app left in the container's IPC
// namespace and /dev/shm is removed, the order and the timings are
// cleared, and the answer is written. Then it waits for the rearm, which
// the host writes once it has reset the root, and returns to serve the
// next order; or, if the container cannot serve again, it exits and the
// host removes it.
func (s *supervisor) recycle(sigs <-chan os.Signal) (int, bool) {
	t := time.Now()
	select {
	case <-s.appGone:
	default:
		close(s.appGone) // the instance's ready probe, if still at it, gives up
	}
	err := s.release()
	ans := instancectl.ReleasedBody{}
	if err != nil {
		ans.Error = err.Error()
		s.log.Error("the container cannot serve another instance", "err", err)
	}
	if werr := writeJSON(s.ctlFile(instancectl.Released), ans); werr != nil {
		s.log.Error("answer the release", "err", werr)
		return exitSetup, false
	}
	if err != nil {
		return exitSetup, false
	}
	s.log.Info("instance released; waiting for the rearm", "ms", time.Since(t).Milliseconds())
	if _, err := s.waitFile(s.ctlFile(instancectl.Rearm), sigs); errors.Is(err, errReleased) {
		return exitOK, false
	} else if err != nil {
		s.log.Error("wait for the rearm", "err", err)
		return exitSetup, false
	}
	for _, f := range []string{instancectl.Release, instancectl.Released, instancectl.Rearm} {
		_ = os.Remove(s.ctlFile(f))
	}
	s.appGone, s.appPid, s.coordPid, s.coordPort = make(chan struct{}), 0, 0, 0
	s.started = time.Now()
	return exitOK, true
}

// release ends the instance and clears what it left in the container.
func (s *supervisor) release() error {
	ports := listeningPorts()
	// The coordinator's: the next coordinator listens on another port.
	delete(ports, listener{s.coordPort, false})
	delete(ports, listener{s.coordPort, true})
	// PID 1 of the container's PID namespace: -1 is every other process
	// in it (the keeper, the app, the coordinator, helpers).
	_ = syscall.Kill(-1, syscall.SIGKILL)
	deadline := time.Now().Add(reapWait)
	for {
		s.reaper.reap()
		var info unix.Siginfo
		err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		if errors.Is(err, unix.ECHILD) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes still alive %s after SIGKILL", reapWait)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if err := unmountUnder(s.cfg.root); err != nil {
		return err
	}
	removeIPC()
	clearDir("/dev/shm")
	clearDir("/dev/mqueue")
	// The checkpoint volume was bound writable into the root: what the
	// app wrote there goes; the generation it restores from, bound
	// read-only from the node's copy or named by -from, stays.
	if err := clearUnmounted(s.cfg.ckpt, s.cfg.from); err != nil {
		return err
	}
	_ = os.Remove(s.cfg.wait)
	_ = os.Truncate(s.ctlFile(instancectl.Timings), 0)
	// The next instance binds its listeners again with SO_REUSEADDR (DMTCP
	// with the project's patch, as CRIU does): connections of this one
	// in TIME_WAIT do not stop it, but one that an app without
	// SO_REUSEADDR left would. The same bind is tried here.
	deadline = time.Now().Add(lingerWait)
	for {
		l := unbindable(ports)
		if l == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the app's port %d cannot be bound again after it ended (%v): a connection it left lingers there", l.port, l.err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// writeJSON writes v to path whole (a rename).
func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, b, 0o644, false)
}

// unmountUnder unmounts every mount below root (not root itself), the
// deepest first.
func unmountUnder(root string) error {
	for range 3 {
		points, err := mountsUnder(root)
		if err != nil {
			return err
		}
		if len(points) == 0 {
			return nil
		}
		sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
		for _, p := range points {
			_ = unix.Unmount(p, unix.MNT_DETACH)
		}
	}
	if points, _ := mountsUnder(root); len(points) > 0 {
		return fmt.Errorf("mounts left under the root: %s", strings.Join(points, ", "))
	}
	return nil
}

// mountsUnder lists the mount points below root in this mount namespace.
func mountsUnder(root string) ([]string, error) {
	f, err := os.Open("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	prefix := strings.TrimRight(root, "/") + "/"
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		if p := mountinfo.Unescape(fields[4]); strings.HasPrefix(p, prefix) {
			out = append(out, p)
		}
	}
	return out, sc.Err()
}

// removeIPC removes the System V shared memory segments, semaphore sets
// and message queues of the container's IPC namespace.
func removeIPC() {
	for _, k := range []struct {
		file string
		rm   func(id int)
	}{
		{"/proc/sysvipc/shm", func(id int) { _, _ = unix.SysvShmCtl(id, unix.IPC_RMID, nil) }},
		{"/proc/sysvipc/sem", func(id int) { _, _, _ = unix.Syscall6(unix.SYS_SEMCTL, uintptr(id), 0, unix.IPC_RMID, 0, 0, 0) }},
		{"/proc/sysvipc/msg", func(id int) { _, _, _ = unix.Syscall(unix.SYS_MSGCTL, uintptr(id), unix.IPC_RMID, 0) }},
	} {
		for _, f := range procRows(k.file) {
			if len(f) < 2 {
				continue
			}
			if id, err := strconv.Atoi(f[1]); err == nil {
				k.rm(id)
			}
		}
	}
}

// clearUnmounted removes what dir holds but the mount points below it and
// the directories that lead to them, and the generation keep (0: none):
// the one the host named with -from, which it put there itself, where the
// node had no copy to bind read-only. Anything else, a directory named as
// a generation included, is what the app wrote, and goes: what survives
// a recycle is what the host put there, never what a name looks like.
func clearUnmounted(dir string, keep int) error {
	points, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if (keep > 0 && e.IsDir() && e.Name() == strconv.Itoa(keep)) || slices.ContainsFunc(points, func(m string) bool { return m == p || strings.HasPrefix(m, p+"/") }) {
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("clear %s: %w", p, err)
		}
	}
	return nil
}

// clearDir removes what dir holds, not dir itself.
func clearDir(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		_ = os.RemoveAll(filepath.Join(dir, e.Name()))
	}
}

// tcpListen is the state of a listening socket in /proc/net/tcp.
const tcpListen = "0A"

// listener is a port that TCP sockets listened on, by address family.
type listener struct {
	port int
	v6   bool
}

// listeningPorts returns the ports that TCP sockets listen on in the
// container's network namespace.
func listeningPorts() map[listener]bool {
	ports := map[listener]bool{}
	eachSocket(func(addr string, port int, state string, v6 bool) {
		// Docker's embedded DNS server listens in the container's
		// namespace too, on a network of the user's: not the app's.
		if state == tcpListen && addr != dockerDNS {
			ports[listener{port, v6}] = true
		}
	})
	return ports
}

// unbound is a listener that cannot be bound again, and why.
type unbound struct {
	port int
	err  error
}

// unbindable tries to bind each of ports again on its family's wildcard
// address with SO_REUSEADDR (as Go's listeners set it), and returns the
// first that fails, or nil.
func unbindable(ports map[listener]bool) *unbound {
	for l := range ports {
		network, addr := "tcp4", "0.0.0.0:"+strconv.Itoa(l.port)
		if l.v6 {
			network, addr = "tcp6", "[::]:"+strconv.Itoa(l.port)
		}
		ln, err := net.Listen(network, addr)
		if err != nil {
			return &unbound{port: l.port, err: err}
		}
		_ = ln.Close()
	}
	return nil
}

// dockerDNS is 127.0.0.11, where Docker's embedded DNS server listens in
// a container on a user-defined network, as /proc/net/tcp writes it.
const dockerDNS = "0B00007F"

// eachSocket calls f with the local address (hexadecimal, as the kernel
// writes it), port and state of every TCP socket in /proc/net/tcp and
// /proc/net/tcp6 (v6).
func eachSocket(f func(addr string, port int, state string, v6 bool)) {
	for i, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		for _, fields := range procRows(file) {
			if len(fields) < 4 {
				continue
			}
			addr, port, ok := strings.Cut(fields[1], ":")
			if !ok {
				continue
			}
			if p, err := strconv.ParseUint(port, 16, 16); err == nil {
				f(addr, int(p), fields[3], i == 1)
			}
		}
	}
}

// procRows returns the fields of each line of a /proc table after its
// header line (none if it cannot be read).
func procRows(file string) [][]string {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	lines := strings.Split(string(b), "\n")
	var rows [][]string
	for _, l := range lines[min(1, len(lines)):] {
		if f := strings.Fields(l); len(f) > 0 {
			rows = append(rows, f)
		}
	}
	return rows
}
