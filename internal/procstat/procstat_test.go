package procstat

import (
	"os"
	"os/exec"
	"testing"
)

func TestAlive(t *testing.T) {
	self, ok := Start(os.Getpid())
	if !ok || !Alive(os.Getpid(), self) {
		t.Fatalf("this process: Start = %d, %v; want it alive", self, ok)
	}
	if Alive(os.Getpid(), self+1) {
		t.Errorf("this process with another start time is alive; want it taken for a reused PID")
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if _, ok := Start(cmd.Process.Pid); ok {
		t.Errorf("an exited process (pid %d) has a start time", cmd.Process.Pid)
	}
	if _, ok := Start(0); ok {
		t.Errorf("pid 0 has a start time")
	}
}
