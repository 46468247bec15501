package cgroup_test

import (
	"context"
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
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// freezerHarness is one Freezer under test.
type freezerHarness struct {
	f cgroup.Freezer
	// process returns a process in a cgroup of its own and a function
	// that says whether it made progress (ran) since the last call.
	process func(t *testing.T) (pid int, ran func() bool)
	// rootProcess returns a process of the root cgroup (0: none).
	rootProcess func(t *testing.T) int
}

// runFreezerSuite is what every Freezer does.
func runFreezerSuite(t *testing.T, newHarness func(t *testing.T) freezerHarness) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t.Run("FreezeThenThaw", func(t *testing.T) {
		h := newHarness(t)
		pid, ran := h.process(t)
		if frozen, err := h.f.Frozen(pid); err != nil || frozen {
			t.Fatalf("Frozen before Freeze = %v, %v; want false", frozen, err)
		}
		if err := h.f.Freeze(ctx, pid); err != nil {
			t.Fatalf("Freeze(%d): %v", pid, err)
		}
		t.Cleanup(func() { _ = h.f.Thaw(pid) })
		if frozen, err := h.f.Frozen(pid); err != nil || !frozen {
			t.Fatalf("Frozen after Freeze = %v, %v; want true", frozen, err)
		}
		ran()
		if ran() {
			t.Fatal("the process ran while frozen")
		}
		if err := h.f.Thaw(pid); err != nil {
			t.Fatalf("Thaw(%d): %v", pid, err)
		}
		if frozen, err := h.f.Frozen(pid); err != nil || frozen {
			t.Fatalf("Frozen after Thaw = %v, %v; want false", frozen, err)
		}
		if !ran() {
			t.Fatal("the process did not run again after Thaw")
		}
	})
	t.Run("RootRefused", func(t *testing.T) {
		h := newHarness(t)
		pid := h.rootProcess(t)
		if pid == 0 {
			t.Skip("no process of the root cgroup to try")
		}
		if err := h.f.Freeze(ctx, pid); !errors.Is(err, cgroup.ErrUnsupported) || !strings.Contains(err.Error(), "root") {
			t.Fatalf("Freeze of a root-cgroup process = %v; want ErrUnsupported naming the root cgroup", err)
		}
	})
	t.Run("NoProcess", func(t *testing.T) {
		h := newHarness(t)
		if err := h.f.Freeze(ctx, 999999999); !errors.Is(err, cgroup.ErrNoProcess) {
			t.Fatalf("Freeze of no process = %v; want ErrNoProcess", err)
		}
	})
}

// TestFreezerFake runs the suite on file trees of both versions; a
// goroutine stands for the kernel (it reports a v2 cgroup frozen once
// cgroup.freeze says so) and each fake process "runs" while its cgroup is
// not frozen.
func TestFreezerFake(t *testing.T) {
	for _, v := range []cgroup.Version{cgroup.V1, cgroup.V2} {
		t.Run(string(v), func(t *testing.T) {
			runFreezerSuite(t, func(t *testing.T) freezerHarness {
				f := newFakeTree(t, v, "")
				if v == cgroup.V1 {
					mi, _ := os.ReadFile(filepath.Join(f.root, "mountinfo"))
					mi = append(mi, fmt.Sprintf("39 31 0:36 / %s rw,relatime - cgroup cgroup rw,freezer\n", f.mount("freezer"))...)
					f.write(t, filepath.Join(f.root, "mountinfo"), string(mi))
				}
				fr, err := cgroup.DetectFreezer(f.paths())
				if err != nil {
					t.Fatal(err)
				}
				if fr.Version() != v {
					t.Fatalf("DetectFreezer chose %s on a %s tree", fr.Version(), v)
				}
				return freezerHarness{f: fr,
					process: func(t *testing.T) (int, func() bool) {
						name := fmt.Sprintf("docker/c%d", f.next)
						state := filepath.Join(f.mount("freezer"), name, "freezer.state")
						if v == cgroup.V1 {
							f.write(t, state, "THAWED\n")
						} else {
							dir := filepath.Join(f.mount("unified"), name)
							state = filepath.Join(dir, "cgroup.freeze")
							f.write(t, state, "0\n")
							f.write(t, filepath.Join(dir, "cgroup.events"), "populated 1\nfrozen 0\n")
							kernel(t, dir)
						}
						pid := f.process(t, name)
						if v == cgroup.V1 {
							p := filepath.Join(f.root, "proc", strconv.Itoa(pid), "cgroup")
							b, _ := os.ReadFile(p)
							f.write(t, p, "7:freezer:/"+name+"\n"+string(b))
						}
						return pid, func() bool {
							b, _ := os.ReadFile(state)
							s := strings.TrimSpace(string(b))
							return s == "THAWED" || s == "0"
						}
					},
					rootProcess: func(t *testing.T) int {
						pid := f.process(t, "")
						if v == cgroup.V1 {
							p := filepath.Join(f.root, "proc", strconv.Itoa(pid), "cgroup")
							b, _ := os.ReadFile(p)
							f.write(t, p, "7:freezer:/\n"+string(b))
						}
						return pid
					},
				}
			})
		})
	}
}

// kernel reports dir frozen in cgroup.events as cgroup.freeze asks, until
// the test ends.
func kernel(t *testing.T, dir string) {
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
			b, err := os.ReadFile(filepath.Join(dir, "cgroup.freeze"))
			if err != nil {
				continue
			}
			_ = os.WriteFile(filepath.Join(dir, "cgroup.events"), []byte("populated 1\nfrozen "+strings.TrimSpace(string(b))+"\n"), 0o644)
		}
	}()
}

// TestFreezerHost runs the suite on this machine's freezer, with a shell
// loop that appends to a file in a cgroup the test creates and removes.
func TestFreezerHost(t *testing.T) {
	testenv.NeedRoot(t)
	runFreezerSuite(t, func(t *testing.T) freezerHarness {
		fr, err := cgroup.DetectFreezer(cgroup.Paths{})
		if err != nil {
			testenv.Unavailable(t, testenv.Root, "no cgroup freezer: "+err.Error())
		}
		mount := hostFreezerMount(t, fr.Version())
		return freezerHarness{f: fr,
			process: func(t *testing.T) (int, func() bool) {
				out := filepath.Join(t.TempDir(), "ticks")
				cmd := exec.Command("sh", "-c", "while :; do echo x >> "+out+"; sleep 0.005; done")
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				pid := cmd.Process.Pid
				dir := filepath.Join(mount, fmt.Sprintf("fogdeploy-test-freeze-%d", pid))
				if err := os.Mkdir(dir, 0o755); err != nil {
					stop(cmd)
					t.Fatal(err)
				}
				t.Cleanup(func() {
					_ = fr.Thaw(pid)
					stop(cmd)
					removeCgroup(t, dir)
				})
				if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
					t.Fatal(err)
				}
				var last int64 = -1
				return pid, func() bool {
					time.Sleep(100 * time.Millisecond)
					st, _ := os.Stat(out)
					size := int64(0)
					if st != nil {
						size = st.Size()
					}
					ran := size != last
					last = size
					return ran
				}
			},
			rootProcess: func(t *testing.T) int {
				b, err := os.ReadFile("/proc/self/cgroup")
				if err != nil {
					t.Fatal(err)
				}
				if fr.Version() == cgroup.V1 && !strings.Contains(string(b), ":freezer:/\n") ||
					fr.Version() == cgroup.V2 && !strings.Contains(string(b), "0::/\n") {
					return 0
				}
				return sleeper(t).Process.Pid
			},
		}
	})
}

// hostFreezerMount is where this machine mounts its freezer hierarchy.
func hostFreezerMount(t *testing.T, v cgroup.Version) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		pre, post, _ := strings.Cut(line, " - ")
		fields, rest := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(rest) < 3 {
			continue
		}
		if v == cgroup.V2 && rest[0] == "cgroup2" || v == cgroup.V1 && rest[0] == "cgroup" && strings.Contains(","+rest[2]+",", ",freezer,") {
			return fields[4]
		}
	}
	t.Fatalf("no %s freezer mount in /proc/self/mountinfo", v)
	return ""
}
