package main

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

// fakeProc writes a /proc with the given NSpid lines and PID namespace links.
func fakeProc(t *testing.T, procs map[int][2]string) string {
	t.Helper()
	dir := t.TempDir()
	for pid, p := range procs {
		d := filepath.Join(dir, strconv.Itoa(pid))
		if err := os.MkdirAll(filepath.Join(d, "ns"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "status"), []byte("Name:\tx\nNSpid:\t"+p[0]+"\nPPid:\t0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(p[1], filepath.Join(d, "ns", "pid")); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "uptime"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestFindAppNS(t *testing.T) {
	// The container: its supervisor (1), the coordinator (20), an exec
	// (90); the app's namespace: its init (30 = 1), the keeper (31 = 2),
	// the app (32 = 3); a second level (a namespace of the app's own) is
	// not the app's.
	proc := fakeProc(t, map[int][2]string{
		1: {"1", "pid:[1]"}, 20: {"20", "pid:[1]"}, 90: {"90", "pid:[1]"},
		30: {"30\t1", "pid:[2]"}, 31: {"31\t2", "pid:[2]"}, 32: {"32\t3", "pid:[2]"},
		40: {"40\t5\t1", "pid:[3]"},
	})
	init, member, err := findAppNS(proc)
	if err != nil || init != 30 || member != 31 {
		t.Fatalf("findAppNS = %d, %d, %v; want the init 30 and its first process 31", init, member, err)
	}
	// The init alone: its own root is the app's.
	alone := fakeProc(t, map[int][2]string{1: {"1", "pid:[1]"}, 30: {"30\t1", "pid:[2]"}})
	if init, member, _ := findAppNS(alone); init != 30 || member != 30 {
		t.Fatalf("an init alone: %d, %d", init, member)
	}
	// A CRIU launch: everything in the container's namespace.
	flat := fakeProc(t, map[int][2]string{1: {"1", "pid:[1]"}, 7: {"7", "pid:[1]"}})
	if init, member, _ := findAppNS(flat); init != 0 || member != 0 {
		t.Fatalf("no namespace below: %d, %d", init, member)
	}
}

func TestCapsExcept(t *testing.T) {
	all := capsExcept()
	if len(all) != capLast+1 || all[len(all)-1] != capSetpcap {
		t.Fatalf("capsExcept() = %v; want every capability, CAP_SETPCAP last", all)
	}
	kept := capsExcept(capSetpcap, capSetuid, capSetgid)
	for _, c := range []int{capSetpcap, capSetuid, capSetgid} {
		if slices.Contains(kept, c) {
			t.Errorf("capsExcept kept %d in the drop list %v", c, kept)
		}
	}
	if len(kept) != capLast+1-3 || !slices.Contains(kept, capSysAdmin) {
		t.Errorf("capsExcept(SETPCAP, SETUID, SETGID) = %v", kept)
	}
}
