package runtime_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/devenv"
	"github.com/fogdeploy/fogdeploy/internal/instancectl"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// Where the DMTCP container test finds what it needs; each can be
// overridden by the environment.
const (
	envDMTCPPrefix = "FOGDEPLOY_DMTCP_PREFIX" // installed DMTCP (default /opt/dmtcp)
	dmtcpTestImage = "fogdeploy/dmtcp:runtimetest"
)

// redisContainer is the DMTCP container of redis on port 6379 with a
// PING/+PONG readiness probe, in a deployment named prefix + a unique suffix.
func redisContainer(prefix, root, ckpt string) runtime.DMTCPContainer {
	return runtime.DMTCPContainer{
		Image:       dmtcpTestImage,
		Deployment:  prefix + strconv.FormatInt(time.Now().UnixNano(), 36),
		App:         "redis",
		EnvPath:     root,
		CkptPath:    ckpt,
		Ports:       []runtime.Port{{ContainerPort: 6379}},
		ReadyAddr:   "127.0.0.1:6379",
		ReadySend:   `PING\r\n`,
		ReadyExpect: "+PONG",
	}
}

// TestDMTCPContainerCheckpointRestore is the proof that the DMTCP container
// works: it builds the image with dmtcp-image/build.sh from the installed
// DMTCP, launches redis in it chrooted into a copy of a bookworm rootfs,
// SETs a key, checkpoints, and restores in a NEW container (own network
// namespace) that answers GET on its published port. It then repeats the
// cycle from the restored instance (generation 2) and stops the last one.
func TestDMTCPContainerCheckpointRestore(t *testing.T) {
	ctx, d, root, ckpt := setupDMTCPContainer(t)
	c := redisContainer("dmtcp-", root, ckpt)
	redisArgv := []string{"redis-server", "--port", "6379", "--protected-mode", "no", "--save", "", "--appendonly", "no",
		"--jemalloc-bg-thread", "no", "--daemonize", "no"}

	// Restart with nothing to restore fails clearly, at once.
	t.Run("RestartWithoutCheckpoint", func(t *testing.T) {
		id := runContainer(ctx, t, d, c.Restart(0))
		code, err := d.Wait(ctx, id)
		if err != nil || code != 4 {
			t.Errorf("restart from an empty checkpoint dir: exit %d, %v; want 4", code, err)
		}
		if logs, _ := d.Logs(ctx, id, 0); !strings.Contains(logs, "no complete checkpoint") {
			t.Errorf("logs do not say why:\n%s", logs)
		}
	})

	// Generation 1: first deploy, checkpoint requested by file.
	a := runContainer(ctx, t, d, c.Launch(redisArgv))
	addrA := publishedAddr(ctx, t, d, a)
	launchReady := waitRedis(ctx, t, addrA)
	t.Logf("launch -> PONG (host side, from Start): %s", launchReady)
	assertRedis(ctx, t, addrA, "OK", "SET", "greeting", "hello from generation 1")
	assertAppHasNoCaps(ctx, t, d, a)
	t0 := time.Now()
	if err := os.WriteFile(filepath.Join(ckpt, instancectl.CheckpointRequest), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code, err := d.Wait(ctx, a); err != nil || code != 0 {
		t.Fatalf("launch container after checkpoint: exit %d, %v; want 0\n%s", code, err, logsOf(ctx, d, a))
	}
	t.Logf("checkpoint request -> container exited (host side): %s", time.Since(t0).Round(time.Millisecond))
	logTimings(ctx, t, d, a)
	assertImage(t, ckpt, 1)

	// Generation 2: restore in a new container, change state, checkpoint
	// with SIGUSR1.
	b := runContainer(ctx, t, d, c.Restart(0))
	addrB := publishedAddr(ctx, t, d, b)
	restoreReady := waitRedis(ctx, t, addrB)
	assertRedis(ctx, t, addrB, "hello from generation 1", "GET", "greeting")
	t.Logf("restart -> PONG (host side, from Start): %s", restoreReady)
	assertRedis(ctx, t, addrB, "OK", "SET", "second", "written after restore")
	assertAppHasNoCaps(ctx, t, d, b)
	t0 = time.Now()
	if err := d.Signal(ctx, b, "USR1"); err != nil {
		t.Fatal(err)
	}
	if code, err := d.Wait(ctx, b); err != nil || code != 0 {
		t.Fatalf("restored container after checkpoint: exit %d, %v; want 0\n%s", code, err, logsOf(ctx, d, b))
	}
	t.Logf("SIGUSR1 -> container exited (host side): %s", time.Since(t0).Round(time.Millisecond))
	logTimings(ctx, t, d, b)
	assertImage(t, ckpt, 2)

	// Generation 3: restore the restored instance's checkpoint; both keys
	// are there. Stop forwards SIGTERM and the container exits with redis's
	// status.
	cc := runContainer(ctx, t, d, c.Restart(0))
	addrC := publishedAddr(ctx, t, d, cc)
	waitRedis(ctx, t, addrC)
	assertRedis(ctx, t, addrC, "hello from generation 1", "GET", "greeting")
	assertRedis(ctx, t, addrC, "written after restore", "GET", "second")
	if err := d.Stop(ctx, cc, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if st, err := d.Inspect(ctx, cc); err != nil || st.ExitCode != 0 || st.Running {
		t.Errorf("after Stop: %+v, %v; want exit 0 (redis shuts down cleanly on SIGTERM)", st, err)
	}
	logTimings(ctx, t, d, cc)
}

// TestDMTCPContainerUser runs redis as user redis of its root (User): the
// app runs with redis's uid and no capability, writes its own image into
// the generation directory, is restored as redis in a new container with
// its data, and stops on SIGTERM forwarded across the uid change.
func TestDMTCPContainerUser(t *testing.T) {
	ctx, d, root, ckpt := setupDMTCPContainer(t)
	uid, ok := passwdUID(t, root, "redis")
	if !ok {
		testenv.Unavailable(t, testenv.DMTCP, "the test rootfs has no user redis")
	}
	c := redisContainer("dmtcp-user-", root, ckpt)
	c.User = "redis"
	// redis's home (0750, owned by redis): only the app's user may enter
	// it, not the keeper, which has no CAP_DAC_OVERRIDE.
	c.WorkingDir = "/var/lib/redis"
	if spec := c.Launch([]string{"redis-server"}); !slices.Contains(spec.CapAdd, "SETUID") || !slices.Contains(spec.CapAdd, "SETGID") {
		t.Fatalf("CapAdd = %v, want SETUID and SETGID for a user", spec.CapAdd)
	}
	a := runContainer(ctx, t, d, c.Launch([]string{"redis-server", "--port", "6379", "--protected-mode", "no", "--save", "",
		"--appendonly", "no", "--jemalloc-bg-thread", "no", "--daemonize", "no"}))
	addrA := publishedAddr(ctx, t, d, a)
	waitRedis(ctx, t, addrA)
	assertRedis(ctx, t, addrA, "OK", "SET", "greeting", "set as redis")
	assertAppHasNoCaps(ctx, t, d, a)
	assertAppUID(ctx, t, d, a, "redis-se", uid)
	if err := d.Signal(ctx, a, "USR1"); err != nil {
		t.Fatal(err)
	}
	if code, err := d.Wait(ctx, a); err != nil || code != 0 {
		t.Fatalf("launch container after checkpoint: exit %d, %v; want 0\n%s", code, err, logsOf(ctx, d, a))
	}
	assertImage(t, ckpt, 1)

	b := runContainer(ctx, t, d, c.Restart(0))
	addrB := publishedAddr(ctx, t, d, b)
	waitRedis(ctx, t, addrB)
	assertRedis(ctx, t, addrB, "set as redis", "GET", "greeting")
	assertAppHasNoCaps(ctx, t, d, b)
	assertAppUID(ctx, t, d, b, "redis-se", uid)
	t0 := time.Now()
	if err := d.Stop(ctx, b, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if st, err := d.Inspect(ctx, b); err != nil || st.ExitCode != 0 || time.Since(t0) > 5*time.Second {
		t.Errorf("after Stop (%s): %+v, %v; want exit 0 at once (SIGTERM reaches the app)", time.Since(t0).Round(time.Millisecond), st, err)
	}

	// A slot restored from the same generation waits for its order and
	// reads the images ahead meanwhile. They are redis's (0600) and PID 1
	// has no CAP_DAC_OVERRIDE: it reads them as redis.
	w := c
	w.Deployment += "-slot"
	w.CtlPath, w.Wait = t.TempDir(), true
	runContainer(ctx, t, d, w.Restart(0))
	warm := waitTiming(ctx, t, filepath.Join(w.CtlPath, instancectl.Timings), "warm")
	if warm.Error != "" || warm.Bytes == 0 {
		t.Errorf("read ahead of a user's images: %+v; want their bytes read, no error", warm)
	}
}

// waitTiming waits up to 30 s for the entrypoint's timing of phase in its
// timings file.
func waitTiming(ctx context.Context, t *testing.T, file, phase string) runtime.Timing {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(file)
		for _, x := range runtime.ParseTimings(string(b)) {
			if x.Phase == phase {
				return x
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("no %s timing in %s after 30 s:\n%s", phase, file, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// passwdUID returns the uid of name in root's /etc/passwd.
func passwdUID(t *testing.T, root, name string) (string, bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "etc", "passwd"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Split(line, ":"); len(f) > 3 && f[0] == name {
			return f[2], true
		}
	}
	return "", false
}

// assertAppUID checks that every process of the container whose name holds
// comm runs with uid (real, effective, saved and filesystem). A restored
// process is named "DMTCP:" and the first 9 bytes of its name.
func assertAppUID(ctx context.Context, t *testing.T, d *runtime.Docker, id, comm, uid string) {
	t.Helper()
	st, err := d.Inspect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	var names []string
	for _, pid := range descendants(st.Pid) {
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		if names = append(names, procName(status)); !strings.Contains(procName(status), comm) {
			continue
		}
		found++
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(line); len(f) == 5 && f[0] == "Uid:" && (f[1] != uid || f[2] != uid || f[3] != uid || f[4] != uid) {
				t.Errorf("pid %d (%s): %s, want uid %s", pid, comm, line, uid)
			}
		}
	}
	if found == 0 {
		t.Errorf("no process %s in container %s (processes: %q)", comm, id[:12], names)
	}
}

// descendants returns the PIDs below pid, read from /proc/*/task/*/children.
func descendants(pid int) []int {
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", p))
		for _, f := range files {
			b, _ := os.ReadFile(f)
			for _, k := range strings.Fields(string(b)) {
				kid, _ := strconv.Atoi(k)
				out = append(out, kid)
				queue = append(queue, kid)
			}
		}
	}
	return out
}

// setupDMTCPContainer builds the DMTCP image from the installed DMTCP and
// returns the dockerd, an environment clone (a copy of a bookworm rootfs with
// redis-server) and an empty checkpoint directory; it skips when one of them
// is missing.
func setupDMTCPContainer(t *testing.T) (context.Context, *runtime.Docker, string, string) {
	t.Helper()
	d := dockerForTest(t)
	prefix := devenv.Lookup(envDMTCPPrefix, "/opt/dmtcp")
	if _, err := os.Stat(filepath.Join(prefix, "bin", "dmtcp_launch")); err != nil {
		testenv.Unavailable(t, testenv.DMTCP, fmt.Sprintf("no DMTCP install at %s (set %s): %v", prefix, envDMTCPPrefix, err))
	}
	srcRoot := testenv.RedisRootfs(t, testenv.DMTCP)
	if _, err := exec.LookPath("docker"); err != nil {
		testenv.Unavailable(t, testenv.Docker, "dmtcp-image/build.sh needs the docker CLI on PATH")
	}
	testenv.NeedRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)

	host := devenv.Lookup(devenv.EnvDockerHost, devenv.DockerHost())
	start := time.Now()
	build := exec.CommandContext(ctx, "bash", "../../dmtcp-image/build.sh", "-t", dmtcpTestImage, prefix, host)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("dmtcp-image/build.sh: %v\n%s", err, out)
	}
	t.Logf("image %s built in %s", dmtcpTestImage, time.Since(start).Round(time.Millisecond))

	// The environment clone (here a copy of the rootfs) and the checkpoint
	// clone (here an empty directory) outlive every container, as the
	// mounted RBD clones do.
	work := t.TempDir()
	root, ckpt := filepath.Join(work, "root"), filepath.Join(work, "ckpt")
	if out, err := exec.CommandContext(ctx, "cp", "-a", srcRoot, root).CombinedOutput(); err != nil {
		t.Fatalf("copy rootfs: %v\n%s", err, out)
	}
	if err := os.Mkdir(ckpt, 0o755); err != nil {
		t.Fatal(err)
	}
	return ctx, d, root, ckpt
}

func runContainer(ctx context.Context, t *testing.T, d *runtime.Docker, spec runtime.Spec) string {
	t.Helper()
	id, err := d.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create %v: %v", spec.Cmd, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs of %s:\n%s", id[:12], logsOf(context.Background(), d, id))
		}
		_ = d.Remove(context.Background(), id)
	})
	if err := d.Start(ctx, id); err != nil {
		t.Fatalf("Start %v: %v\n%s", spec.Cmd, err, logsOf(ctx, d, id))
	}
	return id
}

func publishedAddr(ctx context.Context, t *testing.T, d *runtime.Docker, id string) string {
	t.Helper()
	st, err := d.Inspect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	hp := st.HostPort(6379, "tcp")
	if hp == 0 {
		t.Fatalf("container %s publishes no port for 6379 (%+v)\n%s", id[:12], st.Ports, logsOf(ctx, d, id))
	}
	return net.JoinHostPort(runtime.DefaultHostIP, strconv.Itoa(int(hp)))
}

// waitRedis waits until PING answers PONG and returns how long it took.
func waitRedis(ctx context.Context, t *testing.T, addr string) time.Duration {
	t.Helper()
	start := time.Now()
	var last error
	for ctx.Err() == nil && time.Since(start) < time.Minute {
		got, err := testenv.RedisDo(ctx, nil, addr, "PING")
		if err == nil && got == "PONG" {
			return time.Since(start)
		}
		last = fmt.Errorf("%q, %w", got, err)
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("redis at %s never answered PING: %v", addr, last)
	return 0
}

func assertRedis(ctx context.Context, t *testing.T, addr, want string, args ...string) {
	t.Helper()
	got, err := testenv.RedisDo(ctx, nil, addr, args...)
	if err != nil || got != want {
		t.Fatalf("redis %v at %s = %q, %v; want %q", args, addr, got, err, want)
	}
}

// assertImage checks that generation gen holds a complete DMTCP image.
func assertImage(t *testing.T, ckpt string, gen int) {
	t.Helper()
	dir := runtime.DMTCPGenerationDir(ckpt, gen)
	imgs, _ := filepath.Glob(filepath.Join(dir, "ckpt_*.dmtcp"))
	if len(imgs) == 0 {
		t.Fatalf("generation %d (%s) has no ckpt_*.dmtcp", gen, dir)
	}
	if _, err := os.Lstat(filepath.Join(dir, "dmtcp_restart_script.sh")); err != nil {
		t.Errorf("generation %d is not marked complete: %v", gen, err)
	}
	if st, err := os.Stat(imgs[0]); err != nil {
		t.Error(err)
	} else if st.Size() < 1<<20 {
		t.Errorf("image %s has only %d bytes", imgs[0], st.Size())
	}
}

// assertAppHasNoCaps checks, from the host, that every process of the
// container but its PID 1 (the entrypoint) runs with no capability at all:
// the app, its keeper and the DMTCP coordinator.
func assertAppHasNoCaps(ctx context.Context, t *testing.T, d *runtime.Docker, id string) {
	t.Helper()
	st, err := d.Inspect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	queue := []int{st.Pid}
	seen := 0
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		// Each thread lists the children it forked.
		files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
		var kids []string
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Logf("cannot walk the process tree (%v); capability check skipped", err)
				return
			}
			kids = append(kids, strings.Fields(string(b))...)
		}
		for _, k := range kids {
			kid, _ := strconv.Atoi(k)
			queue = append(queue, kid)
			seen++
			status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", kid))
			if err != nil {
				continue // exited meanwhile
			}
			for _, line := range strings.Split(string(status), "\n") {
				f := strings.Fields(line)
				if len(f) == 2 && (f[0] == "CapEff:" || f[0] == "CapBnd:" || f[0] == "CapPrm:") && f[1] != "0000000000000000" {
					t.Errorf("pid %d (%s): %s, want no capability", kid, procName(status), line)
				}
			}
		}
	}
	if seen < 3 {
		t.Errorf("container PID 1 has %d descendants, want at least the coordinator, the keeper and the app", seen)
	}
}

func procName(status []byte) string {
	first, _, _ := strings.Cut(string(status), "\n")
	return strings.TrimSpace(strings.TrimPrefix(first, "Name:"))
}

func logTimings(ctx context.Context, t *testing.T, d *runtime.Docker, id string) {
	t.Helper()
	logs, err := d.Logs(ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	tms := runtime.ParseTimings(logs)
	if len(tms) == 0 {
		t.Errorf("no timing lines in the logs of %s:\n%s", id[:12], logs)
	}
	var parts []string
	for _, tm := range tms {
		if tm.Error != "" {
			t.Errorf("phase %s failed: %s", tm.Phase, tm.Error)
		}
		p := fmt.Sprintf("%s=%.1fms", tm.Phase, tm.MS)
		if tm.Bytes > 0 {
			p += fmt.Sprintf("(%.1fMB)", float64(tm.Bytes)/1e6)
		}
		parts = append(parts, p)
	}
	t.Logf("in-container timings (%s): %s", tms[0].Mode, strings.Join(parts, " "))
}

func logsOf(ctx context.Context, d *runtime.Docker, id string) string {
	s, err := d.Logs(ctx, id, 60)
	if err != nil {
		return err.Error()
	}
	return s
}
