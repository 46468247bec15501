package cgroup

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// The limit files of each version, as the kernel is given them.
func TestLimitFiles(t *testing.T) {
	lim := Limits{MemoryBytes: 64 << 20, Pids: 100, CPUs: 0.5}
	v1 := values((&groups{version: V1}).files(lim))
	if v1[0]["memory.limit_in_bytes"] != "67108864" || v1[1]["pids.max"] != "100" || v1[2]["cpu.cfs_quota_us"] != "50000" {
		t.Errorf("v1 files = %v", v1)
	}
	v2 := values((&groups{version: V2}).files(lim))
	if v2[0]["memory.max"] != "67108864" || v2[0]["pids.max"] != "100" || v2[0]["cpu.max"] != "50000 100000" {
		t.Errorf("v2 files = %v", v2)
	}
	none := values((&groups{version: V2}).files(Limits{}))
	if none[0]["memory.max"] != "max" || none[0]["cpu.max"] != "max 100000" {
		t.Errorf("v2 files without limits = %v", none)
	}
	// The period is written before the quota, which is checked against it.
	if f := (&groups{version: V1}).files(lim)[2]; f[0].name != "cpu.cfs_period_us" {
		t.Errorf("v1 cpu files in the order %v; want the period first", f)
	}
	if _, err := (&groups{version: V1}).Create("../x", lim); !errors.Is(err, ErrInvalidName) {
		t.Errorf("Create(../x) = %v; want ErrInvalidName", err)
	}
}

// values maps each directory's files by name.
func values(dirs [][]file) []map[string]string {
	out := make([]map[string]string, len(dirs))
	for i, fs := range dirs {
		out[i] = map[string]string{}
		for _, f := range fs {
			out[i][f.name] = f.value
		}
	}
	return out
}

// On this node's hierarchies: a process moved into a group is bounded by
// its limits, its children are born there, and the group goes once it is
// empty.
func TestGroupsOnNode(t *testing.T) {
	testenv.NeedRoot(t)
	gs, err := NewGroups(Paths{}, "fogdeploy-test")
	if errors.Is(err, ErrUnsupported) {
		t.Skipf("no cgroup memory controller here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, d := range gs.(*groups).dirs {
			_ = os.Remove(d)
		}
	})
	name := "t" + strconv.Itoa(os.Getpid())
	g, err := gs.Create(name, Limits{MemoryBytes: 32 << 20, Pids: 16, CPUs: 0.25})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Remove() })
	cmd := exec.Command("sh", "-c", "sleep 30 & wait")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := g.Add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	procs, _ := g.Procs()
	if !slices.Contains(procs, cmd.Process.Pid) {
		t.Errorf("group holds %v; want pid %d", procs, cmd.Process.Pid)
	}
	b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "cgroup"))
	if !strings.Contains(string(b), "/fogdeploy-test/"+name) {
		t.Errorf("/proc/%d/cgroup:\n%s\nwant the group", cmd.Process.Pid, b)
	}
	if err := g.Remove(); !errors.Is(err, ErrBusy) {
		t.Errorf("Remove with a process in = %v; want ErrBusy", err)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	var rerr error
	for range 50 {
		// sleep, the child born in the group after the move, goes with it
		if rerr = g.Remove(); rerr == nil {
			break
		}
		_ = exec.Command("pkill", "-f", "^sleep 30$").Run()
		time.Sleep(20 * time.Millisecond)
	}
	if rerr != nil {
		t.Errorf("Remove of an empty group: %v", rerr)
	}
	// What an agent killed leaves: a group with a process in it. Sweep
	// kills it and removes the group.
	left, err := gs.Create(name+"-left", Limits{Pids: 16})
	if err != nil {
		t.Fatal(err)
	}
	stray := exec.Command("sleep", "300")
	if err := stray.Start(); err != nil {
		t.Fatal(err)
	}
	if err := left.Add(stray.Process.Pid); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- stray.Wait() }()
	if n, err := gs.Sweep(); err != nil || n != 1 {
		t.Errorf("Sweep = %d, %v; want the one group left", n, err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Errorf("the process in the swept group still runs")
		_ = stray.Process.Kill()
	}
	if procs, err := left.Procs(); err == nil {
		t.Errorf("the swept group still exists (processes %v)", procs)
	}
}
