package netredirect_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/netredirect"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// inNewNetns starts a process in a network namespace of its own.
func inNewNetns(t *testing.T) int {
	t.Helper()
	testenv.NeedRoot(t)
	cmd := exec.Command("unshare", "--net", "sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatalf("unshare: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	// unshare execs sleep once the namespace is made: wait until its
	// namespace is no longer ours.
	self, _ := os.Readlink("/proc/self/ns/net")
	pid := strconv.Itoa(cmd.Process.Pid)
	for range 1000 {
		ns, _ := os.Readlink("/proc/" + pid + "/ns/net")
		if exe, _ := os.Readlink("/proc/" + pid + "/exe"); ns != "" && ns != self && filepath.Base(exe) == "sleep" {
			return cmd.Process.Pid
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("the process did not get a network namespace of its own")
	return 0
}

func TestPrepareSetList(t *testing.T) {
	pid := inNewNetns(t)
	if err := netredirect.Set(pid, []netredirect.Rule{{From: 61000, To: 6379}, {From: 61001, To: 8080}}); err != nil {
		t.Fatalf("Set: %v", err)
	}
	got, err := netredirect.List(pid)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if want := []netredirect.Rule{{From: 61000, To: 6379}, {From: 61001, To: 8080}}; !slices.Equal(got, want) {
		t.Fatalf("rules %v, want %v", got, want)
	}
	if err := netredirect.Prepare(pid); err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	if got, _ := netredirect.List(pid); len(got) != 0 {
		t.Fatalf("after Prepare: %v, want none", got)
	}
	if err := netredirect.Set(pid, []netredirect.Rule{{From: 61000, To: 5432}}); err != nil {
		t.Fatalf("Set after Prepare: %v", err)
	}
	if got, _ := netredirect.List(pid); !slices.Equal(got, []netredirect.Rule{{From: 61000, To: 5432}}) {
		t.Fatalf("after Prepare and Set: %v, want only 61000 -> 5432", got)
	}
	// Nothing of it in this process's own namespace.
	if got, err := netredirect.List(os.Getpid()); err == nil && len(got) > 0 {
		t.Fatalf("the host's namespace got rules: %v", got)
	}
}

func TestSetRefusesPortZero(t *testing.T) {
	err := netredirect.Set(os.Getpid(), []netredirect.Rule{{From: 0, To: 80}})
	if !errors.Is(err, netredirect.ErrRedirect) {
		t.Fatalf("Set with port 0: %v, want ErrRedirect", err)
	}
}
