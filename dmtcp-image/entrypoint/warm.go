package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// warm reads the images of generation g once while the slot waits for its
// order, so that the restart that follows finds them in the node's page
// cache: the checkpoint's cold read from the cluster happens before the
// deploy instead of during it. It runs at the slot's own (background) CPU
// weight, and an order that comes first does not wait for it: the restart
// then shares what was read so far.
//
// The images of an app that runs as a user are that user's, readable by
// it alone (0600), and PID 1 has no CAP_DAC_OVERRIDE: those are read by a
// child running as their owner, as the restart itself reads them.
func (s *supervisor) warm(g generation) {
	t := time.Now()
	var n int64
	var err error
	theirs := map[owner][]string{}
	for _, img := range g.images {
		c, rerr := readFile(img)
		n += c
		if errors.Is(rerr, fs.ErrPermission) {
			if o, ok := ownerOf(img); ok && o.uid != 0 {
				theirs[o] = append(theirs[o], img)
				continue
			}
		}
		if err = rerr; err != nil {
			break
		}
	}
	for o, files := range theirs {
		if err != nil {
			break
		}
		var c int64
		c, err = s.readAs(o, files)
		n += c
	}
	if err != nil {
		s.log.Warn("reading the checkpoint ahead of the restart", "gen", g.n, "err", err)
	}
	s.tm.record("warm", g.n, t, n, err)
}

// owner is a file's owner.
type owner struct{ uid, gid uint32 }

func ownerOf(file string) (owner, bool) {
	fi, err := os.Stat(file)
	if err != nil {
		return owner{}, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return owner{}, false
	}
	return owner{st.Uid, st.Gid}, true
}

// readFile reads file to its end and returns how many bytes it read.
func readFile(file string) (int64, error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return io.Copy(io.Discard, f)
}

// readAs reads files in a child (`entrypoint read`) running as o and
// returns how many bytes it read.
func (s *supervisor) readAs(o owner, files []string) (int64, error) {
	cmd := exec.Command(s.self, append([]string{modeRead}, files...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: o.uid, Gid: o.gid, NoSetGroups: true}}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("read %d images as uid %d: %w: %s", len(files), o.uid, err, strings.TrimSpace(errOut.String()))
	}
	n, err := strconv.ParseInt(strings.TrimSpace(out.String()), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read %d images as uid %d: answer %q: %w", len(files), o.uid, out.String(), err)
	}
	return n, nil
}

// readFiles is the read mode: it reads each file to its end and prints the
// number of bytes read.
func readFiles(files []string) int {
	var n int64
	for _, f := range files {
		c, err := readFile(f)
		n += c
		if err != nil {
			fmt.Fprintf(os.Stderr, "entrypoint read: %v\n", err)
			return exitSetup
		}
	}
	fmt.Println(n)
	return exitOK
}
