package mapper_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/devenv"
	"github.com/fogdeploy/fogdeploy/internal/procprio"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper/mappertest"
)

// cephEnv is the cluster the fuse tests run against: $FOGDEPLOY_CEPH_CONF
// (else the dev cluster's conf), its keyring, and pool "fogdeploy".
type cephEnv struct {
	conf, keyring, id, pool string
}

func (c cephEnv) args(a ...string) []string {
	args := []string{"-c", c.conf}
	if c.keyring != "" {
		args = append(args, "--keyring", c.keyring)
	}
	if c.id != "" {
		args = append(args, "--id", c.id)
	}
	return append(args, a...)
}

func (c cephEnv) rbd(t *testing.T, a ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "rbd", c.args(a...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("rbd %s: %v: %s", strings.Join(a, " "), err, out)
	}
}

// needCeph skips unless the cluster answers `ceph -s` within 5 s and the
// fuse backend's tools are here.
func needCeph(t *testing.T) cephEnv {
	t.Helper()
	needLoop(t)
	// testenv checks that the cluster answers (and skips, or fails where
	// FOGDEPLOY_REQUIRE lists ceph).
	cc := testenv.CephCluster(t)
	c := cephEnv{conf: cc.Conf, keyring: cc.Keyring, id: os.Getenv(devenv.EnvCephID), pool: cc.Pool}
	for _, tool := range []string{"ceph", "rbd", "rbd-fuse"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Unavailable(t, testenv.Ceph, "needs "+tool+" in PATH (Debian packages ceph-common, rbd-fuse)")
		}
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testenv.Unavailable(t, testenv.Root, "needs /dev/fuse")
	}
	return c
}

func (c cephEnv) config(stateDir string) mapper.Config {
	return mapper.Config{Backend: mapper.BackendFuse, StateDir: stateDir, CephConf: c.conf, Keyring: c.keyring, ID: c.id}
}

func (c cephEnv) harness() mappertest.Harness {
	return mappertest.Harness{
		Backend: mapper.BackendFuse,
		NewMapper: func(t *testing.T, stateDir string) *mapper.Mapper {
			m, err := mapper.New(t.Context(), c.config(stateDir), testLogger(t))
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			return m
		},
		CreateImage: func(t *testing.T, name string, size int64) mapper.Image {
			img := mapper.Image{Pool: c.pool, Name: name}
			c.rbd(t, "create", img.String(), "--size", fmt.Sprintf("%dM", (size+(1<<20)-1)>>20))
			return img
		},
		DeleteImage: func(t *testing.T, img mapper.Image) {
			c.rbd(t, "snap", "purge", img.String())
			c.rbd(t, "rm", "--no-progress", img.String())
		},
		Snapshot: func(t *testing.T, img mapper.Image, snap string) {
			c.rbd(t, "snap", "create", img.String()+"@"+snap)
		},
		// rbd-fuse (Ceph 16) only opens image heads.
		SnapshotUnsupported: true,
	}
}

// TestFuseBackendSuite runs the conformance suite against rbd-fuse + loop
// on the dev Ceph cluster.
func TestFuseBackendSuite(t *testing.T) {
	c := needCeph(t)
	mappertest.RunSuite(t, c.harness())
}

// TestFuseBackendSurvivesKill: the process that started rbd-fuse and the
// loop device is killed with SIGKILL; rbd-fuse, the loop device and the
// mount keep serving, and Recover in this process undoes all of them.
func TestFuseBackendSurvivesKill(t *testing.T) {
	c := needCeph(t)
	h := c.harness()
	img := h.CreateImage(t, fmt.Sprintf("mt-killed-%d", os.Getpid()), 64<<20)
	testSurvivesKill(t, helperSpec{Backend: mapper.BackendFuse, CephConf: c.conf, Keyring: c.keyring, Image: img},
		func(stateDir string) *mapper.Mapper { return h.NewMapper(t, stateDir) },
		func() { h.DeleteImage(t, img) })
}

// TestAutoChoiceOnThisNode: "auto" takes the first usable backend and says
// why; without rbd and nbd kernel modules (as on the dev VMs) that is fuse.
func TestAutoChoiceOnThisNode(t *testing.T) {
	c := needCeph(t)
	cfg := c.config(t.TempDir())
	cfg.Backend = ""
	m, err := mapper.New(t.Context(), cfg, testLogger(t))
	if err != nil {
		t.Fatalf("New(auto): %v", err)
	}
	ch := m.Choice()
	t.Logf("auto chose %s: %s", ch.Backend, ch.Reason)
	_, errRBD := os.Stat("/sys/bus/rbd")
	_, errNBD1 := os.Stat("/sys/module/nbd")
	_, errNBD2 := os.Stat("/dev/nbd0")
	if errRBD != nil && errNBD1 != nil && errNBD2 != nil && ch.Backend != mapper.BackendFuse {
		t.Fatalf("no rbd/nbd module here, but auto chose %q", ch.Backend)
	}
	if last := ch.Probes[len(ch.Probes)-1]; last.Backend != ch.Backend || last.Err != nil {
		t.Fatalf("chosen backend's probe = %+v", last)
	}
}

// TestFuseRecoverInterruptedMap: a crash hit after rbd-fuse and losetup
// ran but before the record named them (only the intent, the mount
// directory and backing path, was saved). Recover finds the process by
// its mount directory and the loop device by its backing file, both of
// which hold the mapping ID, and undoes them.
func TestFuseRecoverInterruptedMap(t *testing.T) {
	c := needCeph(t)
	h := c.harness()
	img := h.CreateImage(t, fmt.Sprintf("mt-interrupted-%d", os.Getpid()), 32<<20)
	t.Cleanup(func() { h.DeleteImage(t, img) })
	stateDir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m := h.NewMapper(t, stateDir)
	dir := filepath.Join(stateDir, "fuse", "interrupted")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("rbd-fuse", "-c", c.conf, "-p", img.Pool, "-r", img.Name, "-f", dir)
	cmd.Env = append(os.Environ(), "CEPH_ARGS=--keyring "+c.keyring)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		if _, err := h.NewMapper(t, stateDir).Recover(context.Background()); err != nil {
			t.Errorf("cleanup Recover: %v", err)
		}
		exec.Command("umount", dir).Run()
		cmd.Process.Kill()
		<-exited
	})
	file := filepath.Join(dir, img.Name)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if mappertest.IsMountPoint(dir) {
			if _, err := os.Stat(file); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("rbd-fuse did not show %s", file)
		}
	}
	dev := losetup(t, file)
	writeRecord(t, stateDir, mapper.Record{ID: "interrupted", Backend: mapper.BackendFuse, Image: img, FuseDir: dir, LoopBacking: file})
	tr := mappertest.Track(t, stateDir, &mapper.Mapping{ID: "interrupted", Image: img, Device: dev})

	undone, err := m.Recover(t.Context())
	if err != nil || len(undone) != 1 {
		t.Fatalf("Recover = %+v, %v; want the interrupted mapping undone", undone, err)
	}
	tr.WaitGone(t, 10*time.Second)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("rbd-fuse still running after Recover")
	}
}

// TestFuseBadCredentials: a cephx user that does not exist makes Map fail
// quickly with a hint about the credentials, leaving nothing behind.
func TestFuseBadCredentials(t *testing.T) {
	c := needCeph(t)
	h := c.harness()
	img := h.CreateImage(t, fmt.Sprintf("mt-badcreds-%d", os.Getpid()), 16<<20)
	t.Cleanup(func() { h.DeleteImage(t, img) })
	cfg := c.config(filepath.Join(t.TempDir(), "state"))
	cfg.ID = "no-such-user"
	m, err := mapper.New(t.Context(), cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.Map(t.Context(), img)
	if err == nil || errors.Is(err, mapper.ErrImageNotFound) || !strings.Contains(err.Error(), "Config.ID") {
		t.Fatalf("Map with an unknown cephx user: %v; want a connection error with a hint", err)
	}
	t.Logf("user sees: %v", err)
	if l, _ := m.List(); len(l) != 0 {
		t.Errorf("records left: %+v", l)
	}
	if p := mappertest.ImageProcesses(img.Name); len(p) > 0 {
		t.Errorf("processes left: %v", p)
	}
	if mnt := mappertest.IsMountPoint(filepath.Join(cfg.StateDir, "fuse")); mnt {
		t.Errorf("fuse directory left mounted")
	}
}

// TestFuseUsers: Users names a mapping's record and its rbd-fuse process
// while the image is mapped, and nothing once it is released. (A record
// whose rbd-fuse was killed is still named; killing it here would leave
// the image watched for 30 s.)
func TestFuseUsers(t *testing.T) {
	c := needCeph(t)
	h := c.harness()
	img := h.CreateImage(t, fmt.Sprintf("mt-users-%d", os.Getpid()), 64<<20)
	t.Cleanup(func() { h.DeleteImage(t, img) })
	m := h.NewMapper(t, t.TempDir())
	ctx := t.Context()
	if users, err := m.Users(img); err != nil || len(users) != 0 {
		t.Fatalf("Users of an unmapped image = %q, %v; want none", users, err)
	}
	mp, err := m.Map(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	users, err := m.Users(img)
	if err != nil || len(users) != 2 || !strings.HasPrefix(users[0], "mapping "+mp.ID) || !strings.HasPrefix(users[1], "rbd-fuse pid ") {
		t.Fatalf("Users of a mapped image = %q, %v; want its mapping and its rbd-fuse", users, err)
	}
	// rbd-fuse is deployment work: it runs below the instances that serve.
	var pid int
	if _, err := fmt.Sscanf(users[1], "rbd-fuse pid %d", &pid); err != nil {
		t.Fatalf("Users: %q names no rbd-fuse pid: %v", users[1], err)
	}
	if got, err := procprio.Of(pid); err != nil || got != procprio.Background {
		t.Errorf("rbd-fuse (pid %d) runs at priority %+v, %v; want the background priority %+v", pid, got, err, procprio.Background)
	}
	// It is lean: one messenger worker thread, one malloc arena.
	if workers := threadsNamed(t, pid, "msgr-worker-"); workers != 1 {
		t.Errorf("rbd-fuse (pid %d) runs %d messenger workers; want 1", pid, workers)
	}
	if env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid)); err != nil || !strings.Contains("\x00"+string(env), "\x00MALLOC_ARENA_MAX=1\x00") {
		t.Errorf("rbd-fuse (pid %d) runs without MALLOC_ARENA_MAX=1 (%v)", pid, err)
	} else if !strings.Contains(string(env)+"\x00", " --log_max_recent 1 ") && !strings.Contains(string(env), " --log_max_recent 1\x00") {
		t.Errorf("rbd-fuse (pid %d) keeps Ceph's default 10000 recent log entries in memory; want 1", pid)
	}
	other := img
	other.Name += "-other"
	if users, err := m.Users(other); err != nil || len(users) != 0 {
		t.Errorf("Users of another image = %q, %v; want none", users, err)
	}
	if err := m.Release(ctx, mp.ID); err != nil {
		t.Fatal(err)
	}
	if users, err := m.Users(img); err != nil || len(users) != 0 {
		t.Errorf("Users after Release = %q, %v; want none", users, err)
	}
}

// threadsNamed counts the threads of process pid whose name begins with
// prefix.
func threadsNamed(t *testing.T, pid int, prefix string) int {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("threads of %d: %v", pid, err)
	}
	n := 0
	for _, e := range ents {
		if b, err := os.ReadFile(filepath.Join(dir, e.Name(), "comm")); err == nil && strings.HasPrefix(string(b), prefix) {
			n++
		}
	}
	return n
}

// TestFuseImageShownLate: rbd-fuse answers ENOENT for an image it does not
// list at that moment, also when its listing or open failed for a moment.
// An image created once rbd-fuse has mounted (so that its first lookups do
// not find it) is still mapped, and one that never comes is refused with
// ErrImageNotFound, naming it.
func TestFuseImageShownLate(t *testing.T) {
	c := needCeph(t)
	h := c.harness()
	state := t.TempDir()
	m := h.NewMapper(t, state)
	ctx := t.Context()
	img := mapper.Image{Pool: c.pool, Name: fmt.Sprintf("mt-late-%d", os.Getpid())}
	t.Cleanup(func() {
		if l, err := m.List(); err == nil {
			for _, mp := range l {
				m.Release(context.Background(), mp.ID)
			}
		}
		exec.Command("rbd", c.args("rm", "--no-progress", img.String())...).Run()
	})
	type result struct {
		mp  *mapper.Mapping
		err error
	}
	done := make(chan result, 1)
	go func() {
		mp, err := m.Map(ctx, img)
		done <- result{mp, err}
	}()
	// Once rbd-fuse has mounted under the state directory, its lookups of
	// the image find nothing: create it then.
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile("/proc/self/mountinfo")
		if strings.Contains(string(b), state) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("rbd-fuse did not mount within 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.rbd(t, "create", img.String(), "--size", "8M")
	r := <-done
	if r.err != nil {
		t.Fatalf("Map of an image created while rbd-fuse looked for it: %v", r.err)
	}
	if err := m.Release(ctx, r.mp.ID); err != nil {
		t.Fatalf("Release: %v", err)
	}

	missing := mapper.Image{Pool: c.pool, Name: img.Name + "-never"}
	_, err := m.Map(ctx, missing)
	if !errors.Is(err, mapper.ErrImageNotFound) || !strings.Contains(err.Error(), missing.Name) {
		t.Fatalf("Map of an image that never comes: %v; want ErrImageNotFound naming %s", err, missing.Name)
	}
}
