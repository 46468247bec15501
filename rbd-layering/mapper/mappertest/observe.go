package mappertest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/mountinfo"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// Tracked is a mapping together with what the kernel showed for it right
// after Map, so that a later look can tell whether it is really gone.
type Tracked struct {
	Mapping  mapper.Mapping
	StateDir string
	// Backing is the loop device's backing file at map time ("" if the
	// device is not a loop device).
	Backing string
}

// Track notes what the kernel shows for mp now.
func Track(t testing.TB, stateDir string, mp *mapper.Mapping) Tracked {
	t.Helper()
	if mp == nil {
		t.Fatal("Track: nil mapping")
		return Tracked{}
	}
	tr := Tracked{Mapping: *mp, StateDir: stateDir}
	if strings.HasPrefix(mp.Device, "/dev/loop") {
		b, ok := loopBacking(mp.Device)
		if !ok {
			t.Fatalf("mapping %s: %s is not an attached loop device", mp.ID, mp.Device)
		}
		tr.Backing = b
	}
	return tr
}

// Leftovers lists, in words, everything of tr that the node still holds:
// a mount at the target or a mount under StateDir named after the mapping
// ID, the device still attached to
// the same file or image, an rbd-fuse/rbd-nbd process for the image, and
// the mapping's record. Empty means fully released.
func (tr Tracked) Leftovers() []string {
	var out []string
	mp := tr.Mapping
	if mp.Target != "" {
		for _, m := range mountsUnder(mp.Target) {
			out = append(out, "mount at "+m)
		}
	}
	for _, m := range mountsUnder(tr.StateDir) {
		if strings.Contains(m, mp.ID) { // e.g. its rbd-fuse mount, StateDir/fuse/<id>
			out = append(out, "mount under StateDir at "+m)
		}
	}
	switch {
	case tr.Backing != "":
		if b, ok := loopBacking(mp.Device); ok && b == tr.Backing {
			out = append(out, fmt.Sprintf("loop device %s still backed by %s", mp.Device, b))
		}
		for _, d := range loopsBacking(tr.Backing) {
			if d != mp.Device {
				out = append(out, fmt.Sprintf("loop device %s backed by %s", d, tr.Backing))
			}
		}
	case strings.HasPrefix(mp.Device, "/dev/rbd"):
		if _, err := os.Stat("/sys/bus/rbd/devices/" + strings.TrimPrefix(mp.Device, "/dev/rbd")); err == nil {
			out = append(out, "rbd device "+mp.Device+" still mapped")
		}
	case strings.HasPrefix(mp.Device, "/dev/nbd"):
		if _, err := os.Stat("/sys/block/" + filepath.Base(mp.Device) + "/pid"); err == nil {
			out = append(out, "nbd device "+mp.Device+" still connected")
		}
	}
	for _, p := range ImageProcesses(mp.Image.Name) {
		out = append(out, "process "+p)
	}
	if _, err := os.Stat(filepath.Join(tr.StateDir, "mappings", mp.ID+".json")); err == nil {
		out = append(out, "record "+mp.ID+".json")
	}
	return out
}

// WaitGone waits up to d for Leftovers to become empty and fails the test
// with what remains. Processes take a moment to exit after their unmount.
func (tr Tracked) WaitGone(t testing.TB, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		left := tr.Leftovers()
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("mapping %s (%s) not fully released:\n  %s", tr.Mapping.ID, tr.Mapping.Image, strings.Join(left, "\n  "))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ImageProcesses lists the rbd-fuse and rbd-nbd processes (other than this
// one) whose command line names the image, as "PID argv...".
func ImageProcesses(name string) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			if i := strings.LastIndexByte(string(st), ')'); i > 0 && strings.HasPrefix(strings.TrimSpace(string(st[i+1:])), "Z") {
				continue // zombie, waiting to be reaped
			}
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || len(b) == 0 {
			continue
		}
		argv := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		if base := filepath.Base(argv[0]); base != "rbd-fuse" && base != "rbd-nbd" {
			continue
		}
		for _, a := range argv[1:] {
			if a == name || strings.HasSuffix(a, "/"+name) || strings.Contains(a, "/"+name+"@") {
				out = append(out, fmt.Sprintf("%d %s", pid, strings.Join(argv, " ")))
				break
			}
		}
	}
	return out
}

// IsMountPoint reports whether dir is a mount point in /proc/self/mountinfo.
func IsMountPoint(dir string) bool {
	for _, m := range mountsUnder(dir) {
		if m == dir {
			return true
		}
	}
	return false
}

func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return nil
	}
	dir = filepath.Clean(dir)
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		m := mountinfo.Unescape(f[4])
		if m == dir || strings.HasPrefix(m, dir+"/") {
			out = append(out, m)
		}
	}
	return out
}

func loopBacking(dev string) (string, bool) {
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
	if err != nil {
		return "", false
	}
	return strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)"), true
}

func loopsBacking(file string) []string {
	ents, _ := os.ReadDir("/sys/block")
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "loop") {
			if b, ok := loopBacking(e.Name()); ok && b == file {
				out = append(out, "/dev/"+e.Name())
			}
		}
	}
	return out
}
