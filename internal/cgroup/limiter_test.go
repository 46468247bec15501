package cgroup_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/cgroup"
	"github.com/fogdeploy/fogdeploy/internal/cgroup/cgrouptest"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// TestLimiterConformanceHost runs the Limiter suite on this machine's
// hierarchy: a sleeping process in a group of its own, bounded by the
// kernel's files.
func TestLimiterConformanceHost(t *testing.T) {
	testenv.NeedRoot(t)
	cgrouptest.RunLimiter(t, func(t *testing.T) cgrouptest.LimiterHarness {
		l, err := cgroup.NewLimiter(cgroup.Paths{})
		if err != nil {
			testenv.Unavailable(t, testenv.Root, "no cgroup memory, pids and cpu controllers: "+err.Error())
		}
		parent := "fogdeploy-limiter-test"
		gs, err := cgroup.NewGroups(cgroup.Paths{}, parent)
		if err != nil {
			t.Fatal(err)
		}
		hasSwap := false
		return cgrouptest.LimiterHarness{
			Limiter: l,
			Process: func(t *testing.T) int {
				cmd := sleeper(t)
				g, err := gs.Create(fmt.Sprintf("p%d", cmd.Process.Pid), cgroup.Limits{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					stop(cmd)
					deadline := time.Now().Add(5 * time.Second)
					for g.Remove() != nil && time.Now().Before(deadline) {
						time.Sleep(20 * time.Millisecond)
					}
				})
				if err := g.Add(cmd.Process.Pid); err != nil {
					t.Fatal(err)
				}
				return cmd.Process.Pid
			},
			HasSwap: func() bool {
				if gs.Version() == cgroup.V2 {
					m, _ := hostMounts(t, cgroup.V2)
					_, err := os.Stat(filepath.Join(m, parent, "memory.swap.max"))
					hasSwap = err == nil
				} else {
					_, err := os.Stat(filepath.Join(memoryMount(t), "memory.memsw.limit_in_bytes"))
					hasSwap = err == nil
				}
				return hasSwap
			}(),
		}
	})
}

// memoryMount is where this machine mounts the cgroup v1 memory
// controller.
func memoryMount(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		pre, post, _ := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) >= 5 && len(g) >= 3 && g[0] == "cgroup" && strings.Contains(","+g[2]+",", ",memory,") {
			return f[4]
		}
	}
	t.Fatal("no cgroup v1 memory mount")
	return ""
}

// TestLimiterConformanceFiles runs the suite on file trees that stand for
// both versions: what the files hold after each Limit.
func TestLimiterConformanceFiles(t *testing.T) {
	for _, v := range []cgroup.Version{cgroup.V1, cgroup.V2} {
		t.Run(string(v), func(t *testing.T) {
			cgrouptest.RunLimiter(t, func(t *testing.T) cgrouptest.LimiterHarness {
				f := newLimitTree(t, v)
				l, err := cgroup.NewLimiter(f.paths())
				if err != nil {
					t.Fatal(err)
				}
				return cgrouptest.LimiterHarness{Limiter: l, Process: f.limited, HasSwap: true, Used: 2101248}
			})
		})
	}
}

// TestLimiterConformanceInMemory runs the suite on the in-memory fake.
func TestLimiterConformanceInMemory(t *testing.T) {
	next := 100
	cgrouptest.RunLimiter(t, func(t *testing.T) cgrouptest.LimiterHarness {
		f := cgrouptest.NewFake()
		return cgrouptest.LimiterHarness{Limiter: f, Process: func(t *testing.T) int { next++; f.Add(next, false); return next }, HasSwap: true, Used: cgrouptest.FakeMemoryUsed}
	})
}

// A process of the root cgroup is refused: bounding it would bound the
// whole machine.
func TestLimiterRefusesRoot(t *testing.T) {
	for _, v := range []cgroup.Version{cgroup.V1, cgroup.V2} {
		f := newLimitTree(t, v)
		l, err := cgroup.NewLimiter(f.paths())
		if err != nil {
			t.Fatal(err)
		}
		pid := f.processIn(t, "")
		if err := l.Limit(pid, cgroup.Limits{Pids: 10}); !errors.Is(err, cgroup.ErrUnsupported) {
			t.Fatalf("%s: Limit of a root-cgroup process = %v, want ErrUnsupported", v, err)
		}
	}
}

// limitTree is a fakeTree with the memory, pids and cpu files.
type limitTree struct{ *fakeTree }

func newLimitTree(t *testing.T, v cgroup.Version) limitTree {
	f := newFakeTree(t, v, "")
	if v == cgroup.V1 {
		// The memory and pids hierarchies beside fakeTree's cpu one.
		mi, err := os.ReadFile(filepath.Join(f.root, "mountinfo"))
		if err != nil {
			t.Fatal(err)
		}
		extra := fmt.Sprintf("33 31 0:30 / %s rw,relatime - cgroup cgroup rw,memory\n34 31 0:31 / %s rw,relatime - cgroup cgroup rw,pids\n",
			f.mount("memory"), f.mount("pids"))
		f.write(t, filepath.Join(f.root, "mountinfo"), extra+string(mi))
	}
	return limitTree{f}
}

// limited adds a process in a child cgroup with the kernel's defaults.
func (f limitTree) limited(t *testing.T) int {
	name := "c" + strconv.Itoa(f.next+1)
	switch f.version {
	case cgroup.V1:
		f.write(t, filepath.Join(f.mount("memory"), name, "memory.limit_in_bytes"), "9223372036854771712\n")
		f.write(t, filepath.Join(f.mount("memory"), name, "memory.memsw.limit_in_bytes"), "9223372036854771712\n")
		f.write(t, filepath.Join(f.mount("memory"), name, "memory.usage_in_bytes"), "2101248\n")
		f.write(t, filepath.Join(f.mount("pids"), name, "pids.max"), "max\n")
		f.write(t, filepath.Join(f.mount("cpu"), name, "cpu.cfs_period_us"), "100000\n")
		f.write(t, filepath.Join(f.mount("cpu"), name, "cpu.cfs_quota_us"), "-1\n")
	case cgroup.V2:
		d := filepath.Join(f.mount("unified"), name)
		f.write(t, filepath.Join(d, "memory.max"), "max\n")
		f.write(t, filepath.Join(d, "memory.swap.max"), "max\n")
		f.write(t, filepath.Join(d, "memory.current"), "2101248\n")
		f.write(t, filepath.Join(d, "pids.max"), "max\n")
		f.write(t, filepath.Join(d, "cpu.max"), "max 100000\n")
	}
	return f.processIn(t, name)
}

// processIn adds a pid whose cgroup is name in every hierarchy ("" for
// the root).
func (f limitTree) processIn(t *testing.T, name string) int {
	f.next++
	lines := fmt.Sprintf("0::/%s\n", name)
	if f.version == cgroup.V1 {
		lines = fmt.Sprintf("6:pids:/%s\n4:memory:/%s\n3:cpu,cpuacct:/%s\n1:name=systemd:/\n0::/\n", name, name, name)
	}
	f.write(t, filepath.Join(f.root, "proc", strconv.Itoa(f.next), "cgroup"), lines)
	return f.next
}
