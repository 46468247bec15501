package procprio_test

import (
	"errors"
	"os"
	"os/exec"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/procprio"
)

// TestSetChild lowers a child process's priority, reads it back as ps
// would, and sees that what the child starts afterwards inherits it.
func TestSetChild(t *testing.T) {
	cmd := exec.Command("sh", "-c", "read x; sleep 30")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	if err := procprio.Set(pid, procprio.Background); err != nil {
		t.Fatal(err)
	}
	got, err := procprio.Of(pid)
	if err != nil {
		t.Fatal(err)
	}
	if got != procprio.Background {
		t.Fatalf("priority after Set(Background) = %+v, want %+v", got, procprio.Background)
	}
	// The child's own child (sleep) inherits the lowered priority.
	_, _ = in.Write([]byte("go\n"))
	var kid int
	for range 100 {
		if b, err := os.ReadFile("/proc/" + itoa(pid) + "/task/" + itoa(pid) + "/children"); err == nil && len(b) > 0 {
			kid = atoi(string(b))
			break
		}
		sleep()
	}
	if kid == 0 {
		t.Fatal("the child started no process")
	}
	if got, err := procprio.Of(kid); err != nil || got.Nice != procprio.Background.Nice {
		t.Fatalf("the grandchild's priority = %+v, %v; want nice %d", got, err, procprio.Background.Nice)
	}
	// Back to normal, as the evaluation does for its load generator (root
	// may raise a priority; others get EACCES).
	if os.Geteuid() == 0 {
		if err := procprio.Set(pid, procprio.Normal); err != nil {
			t.Fatal(err)
		}
		if got, _ := procprio.Of(pid); got != procprio.Normal {
			t.Fatalf("priority after Set(Normal) = %+v, want %+v", got, procprio.Normal)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, p := range []procprio.Priority{{Nice: 20}, {Nice: -21}, {IOLevel: 8}, {IOLevel: -1}} {
		if err := procprio.Set(os.Getpid(), p); !errors.Is(err, procprio.ErrInvalid) {
			t.Errorf("Set(%+v) = %v, want ErrInvalid", p, err)
		}
	}
	if err := procprio.Set(1<<30, procprio.Background); err == nil {
		t.Error("Set on a process that does not exist succeeded")
	}
}
