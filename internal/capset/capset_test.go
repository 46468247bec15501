package capset

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/osthread"
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
	if os.Geteuid() != 0 {
		t.Skip("needs root: it drops capabilities root holds")
	}
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
