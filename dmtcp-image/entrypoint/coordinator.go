package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// protectedCoordFD is DMTCP's PROTECTED_COORD_FD: a coordinator that finds
// a listening socket there uses it instead of binding INADDR_ANY itself.
const protectedCoordFD = 821

// listenLoopback returns a listening TCP socket on 127.0.0.1 with a
// kernel-chosen port.
func listenLoopback() (fd, port int, err error) {
	fd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, 0, fmt.Errorf("socket: %w", err)
	}
	if err = syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err == nil {
		err = syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}})
	}
	if err == nil {
		err = syscall.Listen(fd, 128)
	}
	var sa syscall.Sockaddr
	if err == nil {
		sa, err = syscall.Getsockname(fd)
	}
	if err != nil {
		_ = syscall.Close(fd)
		return -1, 0, fmt.Errorf("listen on 127.0.0.1: %w", err)
	}
	return fd, sa.(*syscall.SockaddrInet4).Port, nil
}

// startCoordinator starts dmtcp_coordinator chrooted into the app's root,
// with no capability, on a loopback socket handed over on fd 821, so that it never
// listens on the container's bridge address. It returns the pid and port.
//
// Implements: dmtcp_coordinator --coord-port 0 --ckptdir DIR --tmpdir /tmp -q.
func (s *supervisor) startCoordinator(ckptDir string) (int, int, <-chan syscall.WaitStatus, error) {
	fd, port, err := listenLoopback()
	if err != nil {
		return 0, 0, nil, err
	}
	defer syscall.Close(fd)
	files := make([]uintptr, protectedCoordFD+1)
	for i := range files {
		files[i] = ^uintptr(0)
	}
	// stdout only carries the interactive "dmtcp>" prompt.
	files[0], files[1], files[2] = s.null.Fd(), s.null.Fd(), os.Stderr.Fd()
	files[protectedCoordFD] = uintptr(fd)
	// Its /tmp is the root's (a tmpfs of the instance's own).
	tmp := "/tmp/dmtcp-coord"
	if err := os.MkdirAll(filepath.Join(s.cfg.root, tmp), 0o700); err != nil {
		return 0, 0, nil, fmt.Errorf("coordinator tmpdir: %w", err)
	}
	argv := []string{s.self, modeNoCaps, "-root", s.cfg.root, filepath.Join(s.cfg.prefix, "bin", "dmtcp_coordinator"),
		"--coord-port", "0", "--ckptdir", ckptDir, "--tmpdir", tmp,
		"--coord-logfile", filepath.Join(tmp, "coordinator.log"), "--stale-timeout", "-1", "-q"}
	pid, done, err := s.reaper.start(argv, &syscall.ProcAttr{
		Env:   []string{"PATH=/usr/bin:/bin", "LC_ALL=C", "USER=root", "HOME=/root"},
		Files: files,
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	if err != nil {
		return 0, 0, nil, fmt.Errorf("dmtcp coordinator: %w", err)
	}
	return pid, port, done, nil
}

// command runs dmtcp_command against the container's coordinator, waits
// for it and returns its exit status and standard output.
//
// Implements: dmtcp_command -h 127.0.0.1 -p PORT ARGS.
func (s *supervisor) command(args ...string) (int, string, error) {
	argv := append([]string{s.self, modeNoCaps, "-root", s.cfg.root, filepath.Join(s.cfg.prefix, "bin", "dmtcp_command"),
		"--coord-host", "127.0.0.1", "--coord-port", strconv.Itoa(s.coordPort)}, args...)
	r, w, err := os.Pipe()
	if err != nil {
		return 0, "", fmt.Errorf("pipe: %w", err)
	}
	defer r.Close()
	_, done, err := s.reaper.start(argv, &syscall.ProcAttr{
		Env:   []string{"PATH=/usr/bin:/bin", "LC_ALL=C"},
		Files: []uintptr{s.null.Fd(), w.Fd(), os.Stderr.Fd()},
	})
	_ = w.Close()
	if err != nil {
		return 0, "", err
	}
	out, _ := io.ReadAll(io.LimitReader(r, 64<<10))
	return exitStatus(<-done), string(out), nil
}
