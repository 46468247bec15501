package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/fogdeploy/fogdeploy/internal/dmtcpctl"
)

// startCoordinator starts dmtcp_coordinator with no capability, on a
// loopback socket handed over on fd 821, so that it never listens on the
// container's bridge address. It returns the pid and port.
//
// It runs in the image's own root, on the image's libraries (build.sh
// copies those DMTCP's tools need), never on the app's: code the app
// wrote into its root (its dynamic loader, its glibc, /etc/ld.so.preload)
// does not run beside PID 1. The app cannot see it: the app has a PID
// namespace of its own (appns.go). Its tmp is the container's /tmp, a
// tmpfs of the instance's container.
func (s *supervisor) startCoordinator(ckptDir string) (int, int, <-chan syscall.WaitStatus, error) {
	l, port, err := dmtcpctl.ListenLoopback()
	if err != nil {
		return 0, 0, nil, err
	}
	defer l.Close()
	files := make([]uintptr, dmtcpctl.CoordFD+1)
	for i := range files {
		files[i] = ^uintptr(0)
	}
	// stdout only carries the interactive "dmtcp>" prompt.
	files[0], files[1], files[2] = s.null.Fd(), s.null.Fd(), os.Stderr.Fd()
	files[dmtcpctl.CoordFD] = l.Fd()
	tmp := "/tmp/dmtcp-coord"
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return 0, 0, nil, fmt.Errorf("coordinator tmpdir: %w", err)
	}
	coord := dmtcpctl.Coordinator{Port: port, CkptDir: ckptDir, TmpDir: tmp, LogFile: filepath.Join(tmp, "coordinator.log")}
	argv := append([]string{s.self, modeNoCaps, filepath.Join(s.cfg.prefix, "bin", "dmtcp_coordinator")},
		coord.Args()...)
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

// command runs dmtcp_command against the container's coordinator, in the
// image's root as the coordinator, waits for it and returns its exit
// status and standard output.
func (s *supervisor) command(args ...string) (int, string, error) {
	argv := append([]string{s.self, modeNoCaps, filepath.Join(s.cfg.prefix, "bin", "dmtcp_command")},
		dmtcpctl.CommandArgs(s.coordPort, args...)...)
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
