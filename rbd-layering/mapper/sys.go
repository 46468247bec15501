package mapper

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/mountinfo"
	"github.com/fogdeploy/fogdeploy/internal/procstat"
)

// This file reads what the kernel says about processes, mounts and loop
// devices, so that undo steps can verify identity before acting.

// procCmdline returns the argv of pid.
func procCmdline(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
}

// findProcs returns the PIDs of live processes whose argv[0] has base name
// prog and whose argv holds every one of args as a whole argument.
func findProcs(prog string, args ...string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if _, ok := procstat.Start(pid); !ok {
			continue
		}
		if cmdlineMatches(procCmdline(pid), prog, args...) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func cmdlineMatches(argv []string, prog string, args ...string) bool {
	if len(argv) == 0 || filepath.Base(argv[0]) != prog {
		return false
	}
	for _, want := range args {
		found := false
		for _, a := range argv[1:] {
			found = found || a == want
		}
		if !found {
			return false
		}
	}
	return true
}

// waitExit polls until pid (started at start) is gone or ctx is done.
func waitExit(ctx context.Context, pid int, start uint64) bool {
	for {
		if !procstat.Alive(pid, start) {
			return true
		}
		select {
		case <-ctx.Done():
			return !procstat.Alive(pid, start)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	Dev    string // "major:minor"
	Target string
	FSType string
	Source string
}

func mounts() ([]mountEntry, error) {
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, err
	}
	return parseMountinfo(string(b)), nil
}

func parseMountinfo(s string) []mountEntry {
	var out []mountEntry
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) < 10 {
			continue
		}
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+2 >= len(f) {
			continue
		}
		out = append(out, mountEntry{
			Dev:    f[2],
			Target: mountinfo.Unescape(f[4]),
			FSType: f[sep+1],
			Source: mountinfo.Unescape(f[sep+2]),
		})
	}
	return out
}

// mountsAt returns the mounts whose mount point is target.
func mountsAt(target string) ([]mountEntry, error) {
	all, err := mounts()
	if err != nil {
		return nil, err
	}
	var out []mountEntry
	for _, m := range all {
		if m.Target == target {
			out = append(out, m)
		}
	}
	return out, nil
}

// devNum returns the "major:minor" of a block device node.
func devNum(dev string) (string, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(dev, &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", dev, err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFBLK {
		return "", fmt.Errorf("%s is not a block device", dev)
	}
	rdev := st.Rdev
	major := (rdev>>8)&0xfff | (rdev>>32)&^0xfff
	minor := rdev&0xff | (rdev>>12)&^0xff
	return fmt.Sprintf("%d:%d", major, minor), nil
}

// loopBacking returns the backing file of a loop device, with a
// " (deleted)" suffix removed, and whether the device is attached.
func loopBacking(dev string) (string, bool) {
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
	if err != nil {
		return "", false
	}
	return strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)"), true
}

// loopsBacking returns the attached loop devices whose backing file is file.
func loopsBacking(file string) []string {
	ents, _ := os.ReadDir("/sys/block")
	var devs []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		dev := "/dev/" + e.Name()
		if b, ok := loopBacking(dev); ok && b == file {
			devs = append(devs, dev)
		}
	}
	return devs
}

// loopAttach runs `losetup --find --show [--read-only] FILE`.
func (r runner) loopAttach(ctx context.Context, file string, readOnly bool) (string, error) {
	args := []string{"--find", "--show"}
	if readOnly {
		args = append(args, "--read-only")
	}
	out, err := r.run(ctx, nil, "losetup", append(args, file)...)
	if err != nil {
		return "", err
	}
	dev := strings.TrimSpace(out)
	if !strings.HasPrefix(dev, "/dev/loop") {
		return "", fmt.Errorf("losetup --find --show %s printed %q, not a loop device", file, dev)
	}
	return dev, nil
}

// loopDetach runs `losetup -d DEV` if DEV is still backed by backing, then
// waits (bounded) for the kernel to let go of it. A loop device backed by
// another file is not ours (loop devices are shared and get reused): it is
// left alone and reported as gone.
func (r runner) loopDetach(ctx context.Context, dev, backing string) error {
	b, ok := loopBacking(dev)
	if !ok {
		return nil
	}
	if b != backing {
		r.log.Warn("loop device now backs another file; leaving it alone", "device", dev, "backing_file", b, "want", backing)
		return nil
	}
	if _, err := r.run(ctx, nil, "losetup", "-d", dev); err != nil {
		if _, ok := loopBacking(dev); !ok {
			return nil // detached under us
		}
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	for {
		b, ok := loopBacking(dev)
		if !ok || b != backing {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("loop device %s still backed by %s after losetup -d (held by: %s): %w (hint: something still holds it open; see `losetup -l` and `fuser -v %s`)", dev, backing, holders(dev), ErrBusy, dev)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// umount runs `umount TARGET`, retrying for a short while on EBUSY.
func (r runner) umount(ctx context.Context, target string) error {
	deadline := time.Now().Add(2 * time.Second)
	for {
		_, err := r.run(ctx, nil, "umount", target)
		if err == nil {
			return nil
		}
		if !strings.Contains(strings.ToLower(stderrOf(err)), "busy") {
			return err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("unmount %s: %w: %w (hint: close files and leave directories under it; `fuser -vm %s` lists users)", target, ErrBusy, err, target)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// isNotExist reports whether err means a missing file, also through
// ErrImageNotFound.
func isNotExist(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrImageNotFound)
}

// holders names the processes that have dev mounted (in any mount
// namespace) or open, for error messages: "pid 42 (redis-server, mnt:[4026532209]) mounted at /data".
func holders(dev string) string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*")
	seenNS := map[string]bool{}
	for _, p := range procs {
		comm, _ := os.ReadFile(p + "/comm")
		who := fmt.Sprintf("pid %s (%s", filepath.Base(p), strings.TrimSpace(string(comm)))
		if ns, err := os.Readlink(p + "/ns/mnt"); err == nil && !seenNS[ns] {
			seenNS[ns] = true
			if mi, err := os.ReadFile(p + "/mountinfo"); err == nil {
				for _, line := range strings.Split(string(mi), "\n") {
					_, post, ok := strings.Cut(line, " - ")
					if f := strings.Fields(post); ok && len(f) > 1 && f[1] == dev {
						out = append(out, fmt.Sprintf("%s, %s) mounted at %s", who, ns, strings.Fields(line)[4]))
					}
				}
			}
		}
		fds, _ := filepath.Glob(p + "/fd/*")
		for _, fd := range fds {
			if t, err := os.Readlink(fd); err == nil && t == dev {
				out = append(out, who+") has it open")
				break
			}
		}
	}
	if len(out) == 0 {
		return "no process found"
	}
	return strings.Join(out, "; ")
}
