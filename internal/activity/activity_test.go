package activity

import (
	"net"
	"os"
	"os/exec"
	"testing"
	"time"
)

// A process that spins uses CPU and one that sleeps does not; a
// connection established on a watched port counts, one on another port
// does not; a process that is gone is ErrGone.
func TestActivityOf(t *testing.T) {
	spin := exec.Command("sh", "-c", "while :; do :; done")
	if err := spin.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = spin.Process.Kill(); _ = spin.Wait() }()
	sleep := exec.Command("sleep", "30")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sleep.Process.Kill(); _ = sleep.Wait() }()
	a1, _ := Of(spin.Process.Pid, []int{1})
	b1, _ := Of(sleep.Process.Pid, []int{1})
	time.Sleep(500 * time.Millisecond)
	a2, err := Of(spin.Process.Pid, []int{1})
	if err != nil {
		t.Fatal(err)
	}
	b2, err := Of(sleep.Process.Pid, []int{1})
	if err != nil {
		t.Fatal(err)
	}
	if Idle(a1, a2, 0.02) || a2.CPU-a1.CPU < 100*time.Millisecond {
		t.Errorf("a spinning process used %s in 0.5 s and is idle: %v; want busy", a2.CPU-a1.CPU, Idle(a1, a2, 0.02))
	}
	if !Idle(b1, b2, 0.02) {
		t.Errorf("a sleeping process used %s in 0.5 s and is busy; want idle", b2.CPU-b1.CPU)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := Of(os.Getpid(), []int{port})
	if err != nil || s.Connections != 1 {
		t.Errorf("a connection on the watched port: %d, %v; want 1", s.Connections, err)
	}
	if s, _ := Of(os.Getpid(), []int{port + 1}); s.Connections != 0 {
		t.Errorf("a connection on another port counted: %d", s.Connections)
	}
	if _, err := Of(1<<22+7, nil); err == nil {
		t.Error("a process that does not exist: no error")
	}
}
