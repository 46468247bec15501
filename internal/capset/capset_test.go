package capset

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/osthread"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

func status(t *testing.T, b []byte, field string) string {
	t.Helper()
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no %s in:\n%s", field, b)
	return ""
}

// A process started by a thread after ForExec(Thread) runs as root with no
// capability and no_new_privs; the rest of this process keeps its sets.
func TestForExecThread(t *testing.T) {
	testenv.NeedRoot(t)
	self, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	if status(t, self, "CapBnd") == "0000000000000000" {
		t.Skip("this process holds no capability to drop")
	}
	var out []byte
	err = osthread.Run(func() error {
		if err := ForExec(Thread); err != nil {
			return err
		}
		var err error
		out, err = exec.Command("cat", "/proc/self/status").Output()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if v := status(t, out, f); v != "0000000000000000" {
			t.Errorf("%s of the started process = %s; want none", f, v)
		}
	}
	if v := status(t, out, "NoNewPrivs"); v != "1" {
		t.Errorf("NoNewPrivs of the started process = %s; want 1", v)
	}
	if v := status(t, out, "Uid"); !strings.HasPrefix(v, "0") {
		t.Errorf("Uid of the started process = %s; want root", v)
	}
	after, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	if a, b := status(t, after, "CapBnd"), status(t, self, "CapBnd"); a != b {
		t.Errorf("this process's bounding set changed from %s to %s: the drop was not the thread's alone", b, a)
	}
}

// capMask is the hex set of caps as /proc/PID/status writes it.
func capMask(t *testing.T, v string) uint64 {
	t.Helper()
	m, err := strconv.ParseUint(v, 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// DropBounding takes caps out of a thread's bounding set only: the thread
// keeps using them, and a process it starts as root has them nowhere.
// Drop takes them out of every set: the thread no longer holds them
// either. Neither changes the other threads of the process.
func TestDropAndDropBounding(t *testing.T) {
	testenv.NeedRoot(t)
	const chown, kill = 0, 5 // CAP_CHOWN, CAP_KILL
	self, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	if capMask(t, status(t, self, "CapEff"))&(1<<chown|1<<kill) != 1<<chown|1<<kill {
		t.Skip("this process does not hold CAP_CHOWN and CAP_KILL")
	}
	var thread, child []byte
	err = osthread.Run(func() error {
		if err := DropBounding(Thread, chown); err != nil {
			return err
		}
		if err := Drop(Thread, kill); err != nil {
			return err
		}
		var err error
		if thread, err = os.ReadFile("/proc/thread-self/status"); err != nil {
			return err
		}
		child, err = exec.Command("cat", "/proc/self/status").Output()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	bnd, eff := capMask(t, status(t, thread, "CapBnd")), capMask(t, status(t, thread, "CapEff"))
	if bnd&(1<<chown) != 0 || bnd&(1<<kill) != 0 {
		t.Errorf("the thread's bounding set %x still has CAP_CHOWN or CAP_KILL", bnd)
	}
	if eff&(1<<chown) == 0 {
		t.Errorf("the thread's effective set %x lost CAP_CHOWN, which DropBounding must leave", eff)
	}
	if eff&(1<<kill) != 0 {
		t.Errorf("the thread's effective set %x still has CAP_KILL after Drop", eff)
	}
	for _, f := range []string{"CapEff", "CapPrm", "CapBnd"} {
		if m := capMask(t, status(t, child, f)); m&(1<<chown|1<<kill) != 0 {
			t.Errorf("%s of a process the thread started = %x; want neither CAP_CHOWN nor CAP_KILL", f, m)
		}
	}
	after, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	if a, b := status(t, after, "CapEff"), status(t, self, "CapEff"); a != b {
		t.Errorf("this process's effective set changed from %s to %s: the drop was not the thread's alone", b, a)
	}
}
