package cgroup_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/cgroup"
	"github.com/fogdeploy/fogdeploy/internal/cgroup/cgrouptest"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// fakeTree stands for a machine's cgroup files: a proc directory, a
// mountinfo and the mounted hierarchies, in a temporary directory.
type fakeTree struct {
	root    string
	version cgroup.Version
	ioFile  string // "", blkio.weight, blkio.bfq.weight, io.weight
	next    int
}

func newFakeTree(t *testing.T, v cgroup.Version, ioFile string) *fakeTree {
	t.Helper()
	f := &fakeTree{root: t.TempDir(), version: v, ioFile: ioFile, next: 1000}
	var mi strings.Builder
	switch v {
	case cgroup.V1:
		fmt.Fprintf(&mi, "32 31 0:29 / %s rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct\n", f.mount("cpu"))
		f.write(t, filepath.Join(f.mount("cpu"), "cpu.idle"), "0\n")
		fmt.Fprintf(&mi, "38 31 0:35 / %s rw,relatime - cgroup cgroup rw,blkio\n", f.mount("blkio"))
		fmt.Fprintf(&mi, "41 31 0:38 / %s rw,relatime - cgroup2 cgroup2 rw\n", f.mount("unified"))
	case cgroup.V2:
		fmt.Fprintf(&mi, "30 24 0:26 / %s rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n", f.mount("unified"))
		f.write(t, filepath.Join(f.mount("unified"), "cgroup.controllers"), "cpuset cpu io memory pids\n")
	}
	fmt.Fprintf(&mi, "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n")
	f.write(t, filepath.Join(f.root, "mountinfo"), mi.String())
	f.cgroup(t, "system.slice") // a child cgroup, as every booted machine has
	return f
}

func (f *fakeTree) mount(name string) string { return filepath.Join(f.root, "cg", name) }

func (f *fakeTree) paths() cgroup.Paths {
	return cgroup.Paths{Proc: filepath.Join(f.root, "proc"), Mountinfo: filepath.Join(f.root, "mountinfo")}
}

func (f *fakeTree) write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// cgroup creates a cgroup with the kernel's default values.
func (f *fakeTree) cgroup(t *testing.T, name string) {
	switch f.version {
	case cgroup.V1:
		f.write(t, filepath.Join(f.mount("cpu"), name, "cpu.shares"), "1024\n")
		f.write(t, filepath.Join(f.mount("cpu"), name, "cpu.idle"), "0\n")
		f.write(t, filepath.Join(f.mount("blkio"), name, "tasks"), "")
		switch f.ioFile {
		case "blkio.weight":
			f.write(t, filepath.Join(f.mount("blkio"), f.ioFile), "500\n")
			f.write(t, filepath.Join(f.mount("blkio"), name, f.ioFile), "500\n")
		case "blkio.bfq.weight":
			f.write(t, filepath.Join(f.mount("blkio"), f.ioFile), "100\n")
			f.write(t, filepath.Join(f.mount("blkio"), name, f.ioFile), "100\n")
		}
	case cgroup.V2:
		f.write(t, filepath.Join(f.mount("unified"), name, "cpu.weight"), "100\n")
		f.write(t, filepath.Join(f.mount("unified"), name, "cpu.idle"), "0\n")
		if f.ioFile != "" {
			f.write(t, filepath.Join(f.mount("unified"), name, f.ioFile), "default 100\n")
		}
	}
}

// process adds a pid whose cgroup is name ("/" for the root).
func (f *fakeTree) process(t *testing.T, name string) int {
	f.next++
	var lines string
	switch f.version {
	case cgroup.V1:
		lines = fmt.Sprintf("12:blkio:/%s\n3:cpu,cpuacct:/%s\n1:name=systemd:/\n0::/\n", name, name)
	case cgroup.V2:
		lines = fmt.Sprintf("0::/%s\n", name)
	}
	f.write(t, filepath.Join(f.root, "proc", strconv.Itoa(f.next), "cgroup"), strings.ReplaceAll(lines, "//", "/"))
	return f.next
}

func fakeHarness(v cgroup.Version, ioFile string) func(t *testing.T) cgrouptest.Harness {
	return func(t *testing.T) cgrouptest.Harness {
		f := newFakeTree(t, v, ioFile)
		p, err := cgroup.Detect(f.paths())
		if err != nil {
			t.Fatal(err)
		}
		if p.Version() != v {
			t.Fatalf("Detect chose %s on a %s tree", p.Version(), v)
		}
		return cgrouptest.Harness{
			Priority: p,
			Process: func(t *testing.T) int {
				name := fmt.Sprintf("docker/c%d", f.next)
				f.cgroup(t, name)
				return f.process(t, name)
			},
			RootProcess: func(t *testing.T) int { return f.process(t, "") },
			HasIO:       ioFile != "",
		}
	}
}

func TestConformanceFakeV1(t *testing.T) {
	for _, io := range []string{"", "blkio.weight", "blkio.bfq.weight"} {
		t.Run("io="+io, func(t *testing.T) { cgrouptest.Run(t, fakeHarness(cgroup.V1, io)) })
	}
}

func TestConformanceFakeV2(t *testing.T) {
	for _, io := range []string{"", "io.weight"} {
		t.Run("io="+io, func(t *testing.T) { cgrouptest.Run(t, fakeHarness(cgroup.V2, io)) })
	}
}

// TestConformanceHost runs the suite on this machine's own hierarchy, with
// sleep processes in cgroups the test creates and removes.
func TestConformanceHost(t *testing.T) {
	testenv.NeedRoot(t)
	cgrouptest.Run(t, func(t *testing.T) cgrouptest.Harness {
		p, err := cgroup.Detect(cgroup.Paths{})
		if err != nil {
			testenv.Unavailable(t, testenv.Root, "no cgroup cpu controller: "+err.Error())
		}
		cpuMount, blkMount := hostMounts(t, p.Version())
		hasIO := false
		if blkMount != "" {
			for _, name := range []string{"blkio.weight", "blkio.bfq.weight", "io.weight", "io.bfq.weight"} {
				if _, err := os.Stat(filepath.Join(blkMount, name)); err == nil {
					hasIO = true
				}
			}
		}
		return cgrouptest.Harness{
			Priority: p,
			Process: func(t *testing.T) int {
				cmd := sleeper(t)
				pid := cmd.Process.Pid
				name := fmt.Sprintf("fogdeploy-test-%d", pid)
				for _, m := range []string{cpuMount, blkMount} {
					if m == "" || (m == blkMount && !hasIO) {
						continue
					}
					dir := filepath.Join(m, name)
					if err := os.Mkdir(dir, 0o755); err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() {
						stop(cmd)
						removeCgroup(t, dir)
					})
					if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
						t.Fatal(err)
					}
				}
				return pid
			},
			// A process moved into the hierarchy's root (on a systemd
			// host, none is there to begin with).
			RootProcess: func(t *testing.T) int {
				pid := sleeper(t).Process.Pid
				if err := os.WriteFile(filepath.Join(cpuMount, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
					t.Fatalf("move a process into the root cgroup: %v", err)
				}
				return pid
			},
			HasIO: hasIO,
		}
	})
}

// hostMounts finds where this machine mounts the cpu and the I/O hierarchy.
func hostMounts(t *testing.T, v cgroup.Version) (cpu, io string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		pre, post, _ := strings.Cut(s.Text(), " - ")
		fields, rest := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(rest) < 3 {
			continue
		}
		switch {
		case v == cgroup.V2 && rest[0] == "cgroup2":
			return fields[4], fields[4]
		case v == cgroup.V1 && rest[0] == "cgroup":
			for _, c := range strings.Split(rest[2], ",") {
				switch c {
				case "cpu":
					cpu = fields[4]
				case "blkio":
					io = fields[4]
				}
			}
		}
	}
	return cpu, io
}

func sleeper(t *testing.T) *exec.Cmd {
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop(cmd) })
	return cmd
}

// stop kills and reaps a sleeper; a second call does nothing.
func stop(cmd *exec.Cmd) {
	if cmd.ProcessState == nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
}

// removeCgroup removes a cgroup once its process is gone.
func removeCgroup(t *testing.T, dir string) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := os.Remove(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("remove cgroup %s: %v", dir, err)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestDetect(t *testing.T) {
	t.Run("HybridPrefersV1", func(t *testing.T) {
		f := newFakeTree(t, cgroup.V1, "")
		f.write(t, filepath.Join(f.mount("unified"), "cgroup.controllers"), "")
		p, err := cgroup.Detect(f.paths())
		if err != nil || p.Version() != cgroup.V1 {
			t.Fatalf("Detect = %v, %v; want v1", p, err)
		}
		if d := p.Describe(); d != "cgroup v1: cpu.shares, cpu.idle; no I/O weight (the block layer has no weight files)" {
			t.Fatalf("Describe() = %q", d)
		}
	})
	t.Run("V2WithoutCPUController", func(t *testing.T) {
		f := newFakeTree(t, cgroup.V2, "io.weight")
		f.write(t, filepath.Join(f.mount("unified"), "cgroup.controllers"), "memory pids\n")
		_, err := cgroup.Detect(f.paths())
		if !errors.Is(err, cgroup.ErrUnsupported) {
			t.Fatalf("Detect = %v, want ErrUnsupported", err)
		}
		if !strings.Contains(err.Error(), "no cpu controller") {
			t.Fatalf("error %q does not say what is missing", err)
		}
	})
	t.Run("V2Describe", func(t *testing.T) {
		p, err := cgroup.Detect(newFakeTree(t, cgroup.V2, "io.weight").paths())
		if err != nil {
			t.Fatal(err)
		}
		if d := p.Describe(); d != "cgroup v2: cpu.weight, cpu.idle, io.weight" {
			t.Fatalf("Describe() = %q", d)
		}
	})
	t.Run("NoMountinfo", func(t *testing.T) {
		if _, err := cgroup.Detect(cgroup.Paths{Mountinfo: filepath.Join(t.TempDir(), "missing")}); err == nil {
			t.Fatal("Detect without a mountinfo succeeded")
		}
	})
}

// TestMountRoot covers a hierarchy mounted from a sub-cgroup (as inside a
// container): the process's path is relative to the mount's root.
func TestMountRoot(t *testing.T) {
	f := newFakeTree(t, cgroup.V1, "")
	mi := fmt.Sprintf("32 31 0:29 /docker/abc %s rw - cgroup cgroup rw,cpu,cpuacct\n", f.mount("cpu"))
	f.write(t, filepath.Join(f.root, "mountinfo"), mi)
	f.cgroup(t, "sub")
	f.write(t, filepath.Join(f.root, "proc", "7", "cgroup"), "3:cpu,cpuacct:/docker/abc/sub\n")
	f.write(t, filepath.Join(f.root, "proc", "8", "cgroup"), "3:cpu,cpuacct:/elsewhere\n")
	p, err := cgroup.NewV1(f.paths())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Set(7, cgroup.Background); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(f.mount("cpu"), "sub", "cpu.shares"))
	if err != nil || strings.TrimSpace(string(b)) != "10" {
		t.Fatalf("cpu.shares = %q, %v; want 10", b, err)
	}
	if b, _ := os.ReadFile(filepath.Join(f.mount("cpu"), "sub", "cpu.idle")); strings.TrimSpace(string(b)) != "1" {
		t.Fatalf("cpu.idle = %q after Background, want 1", b)
	}
	if _, err := p.Set(8, cgroup.Normal); !errors.Is(err, cgroup.ErrUnsupported) {
		t.Fatalf("Set on a cgroup outside the mount = %v, want ErrUnsupported", err)
	}
}

// TestKnobsPerCgroup: a reweight writes the optional files (cpu.idle, the
// I/O weight) that the process's own cgroup has, though an earlier one of
// the same hierarchy had others (cgroup v2 gives a cgroup the files of the
// controllers its parent enables), and fails for a cgroup that is gone.
func TestKnobsPerCgroup(t *testing.T) {
	f := newFakeTree(t, cgroup.V2, "io.weight")
	p, err := cgroup.Detect(f.paths())
	if err != nil {
		t.Fatal(err)
	}
	withIO := func() (int, string) {
		name := fmt.Sprintf("docker/c%d", f.next)
		f.cgroup(t, name)
		return f.process(t, name), filepath.Join(f.mount("unified"), name)
	}
	read := func(path string) string {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	first, dir1 := withIO()
	if a, err := p.Set(first, cgroup.Background); err != nil || !a.IO || !a.Idle {
		t.Fatalf("Set(background) on a cgroup with io.weight = %+v, %v; want the I/O weight and cpu.idle applied", a, err)
	}
	if got := read(filepath.Join(dir1, "io.weight")); got != "default 10" {
		t.Fatalf("io.weight = %q, want default 10", got)
	}

	// A cgroup whose parent does not enable io: no io.weight there.
	second, dir2 := withIO()
	if err := os.Remove(filepath.Join(dir2, "io.weight")); err != nil {
		t.Fatal(err)
	}
	a, err := p.Set(second, cgroup.Background)
	if err != nil || a.IO || !a.CPU {
		t.Fatalf("Set(background) on a cgroup without io.weight = %+v, %v; want the CPU weight only", a, err)
	}
	if _, err := os.Stat(filepath.Join(dir2, "io.weight")); err == nil {
		t.Fatal("Set made an io.weight file in a cgroup that had none")
	}

	third, dir3 := withIO()
	if a, err := p.Set(third, cgroup.Normal); err != nil || !a.IO {
		t.Fatalf("Set(normal) after a cgroup without io.weight = %+v, %v; want the I/O weight applied", a, err)
	}
	if got := read(filepath.Join(dir3, "io.weight")); got != "default 100" {
		t.Fatalf("io.weight = %q, want default 100", got)
	}

	// The container exited: its cgroup is gone.
	if err := os.RemoveAll(dir1); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Set(first, cgroup.Normal); err == nil {
		t.Fatal("Set on a cgroup that is gone succeeded")
	}
}

// TestConformanceInMemory runs the suite on the in-memory fake that unit
// tests of the deploy path use.
func TestConformanceInMemory(t *testing.T) {
	next := 100
	cgrouptest.Run(t, func(t *testing.T) cgrouptest.Harness {
		f := cgrouptest.NewFake()
		return cgrouptest.Harness{
			Priority:    f,
			Process:     func(t *testing.T) int { next++; f.Add(next, false); return next },
			RootProcess: func(t *testing.T) int { next++; f.Add(next, true); return next },
			HasIO:       true,
		}
	})
}
