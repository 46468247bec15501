//go:build !no_ceph

// Package faults takes away, one at a time, what a PoP stands on while real
// pop-agent processes run on it: an OSD in the middle of a deploy, etcd,
// dockerd, the space of the pool and of a node's state directory. Each test
// checks what an operator observes (fogctl, the apps' HTTP answers, the
// agents' /healthz) and counts what is left on the node and in the pool.
//
// These tests stop services, so they never use the shared dev services of
// `make dev-up`: the package starts a Ceph cluster and a dockerd of its own
// (scripts/dev-ceph.sh and scripts/dev-docker.sh in a temporary directory,
// on their own ports and bridge) the first time a test needs them, and
// removes them at the end. Each test has its own etcd (a `pop-agent etcd`
// process) and agents.
package faults

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/client"

	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/devenv"
	"github.com/fogdeploy/fogdeploy/internal/procstat"
	"github.com/fogdeploy/fogdeploy/internal/runtime/runtimetest"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// Names of what the package makes.
const (
	bootImage = "fogdeploy/boot:faults"
	envName   = "faults-busybox"
	dirPrefix = "fdf-" // os.TempDir()/fdf-*: short, for the 107-byte socket paths
)

// services are the private Ceph cluster and dockerd of this package, and the
// binaries built from this tree.
type services struct {
	dir     string   // FOGDEPLOY_DEV_DIR of the private Ceph and dockerd
	scripts []string // environment of the dev scripts
	conf    string
	keyring string
	pool    string
	docker  string // DOCKER_HOST
	bin     string // pop-agent and fogctl
	dc      *client.Client
}

// shared starts the services once, for the first test that needs them;
// TestMain removes them.
type shared struct {
	once    sync.Once
	s       *services
	service string // why they are unavailable: the testenv service
	reason  string
	err     error
}

var private shared

func TestMain(m *testing.M) {
	code := m.Run()
	if private.s != nil {
		if err := private.s.down(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "faults: removing the private services:", err)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

// need returns the private services, starting them on first use. Without
// root, the Ceph or Docker tools, or when `make unit` points the tests at
// no service, it skips (or fails under FOGDEPLOY_REQUIRE).
func need(t *testing.T) *services {
	t.Helper()
	testenv.SkipShort(t, "private Ceph and dockerd")
	private.once.Do(func() {
		private.service, private.reason = unavailable()
		if private.reason != "" {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		private.s, private.err = start(ctx)
	})
	if private.reason != "" {
		testenv.Unavailable(t, private.service, private.reason)
	}
	if private.err != nil {
		t.Fatalf("starting the private Ceph and dockerd: %v", private.err)
	}
	return private.s
}

// unavailable says which service these tests cannot have here, and why.
func unavailable() (service, reason string) {
	if os.Geteuid() != 0 {
		return testenv.Root, "the fault tests start a Ceph cluster and a dockerd, and mount filesystems"
	}
	// `make unit` turns the services off this way.
	if c := os.Getenv(devenv.EnvCephConf); c != "" {
		if _, err := os.Stat(c); err != nil {
			return testenv.Ceph, fmt.Sprintf("%s=%s does not exist", devenv.EnvCephConf, c)
		}
	}
	if h, ok := strings.CutPrefix(os.Getenv(devenv.EnvDockerHost), "unix://"); ok {
		if _, err := os.Stat(h); err != nil {
			return testenv.Docker, fmt.Sprintf("%s=unix://%s does not exist", devenv.EnvDockerHost, h)
		}
	}
	for _, tool := range []string{"ceph-mon", "ceph-osd", "ceph-mgr", "ceph", "rbd", "rbd-fuse", "losetup", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			return testenv.Ceph, tool + " is not installed: run scripts/install-deps.sh"
		}
	}
	for _, tool := range []string{"dockerd", "docker", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			return testenv.Docker, tool + " is not installed: run scripts/install-deps.sh"
		}
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		return testenv.Docker, "no /bin/busybox for the test environment (install busybox-static)"
	}
	return "", ""
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

// start brings up a private Ceph cluster (1 OSD, memstore) and dockerd
// (live-restore, no iptables) in a new directory, builds pop-agent, fogctl
// and the boot image, and imports the busybox environment.
func start(ctx context.Context) (_ *services, err error) {
	reapStale(ctx)
	dir, err := os.MkdirTemp(tmpDir(), dirPrefix)
	if err != nil {
		return nil, err
	}
	mon, mon1, err := freePorts()
	if err != nil {
		return nil, err
	}
	bridge := fmt.Sprintf("fdf%d", os.Getpid()%100000)
	cidr, err := freeSubnet(ctx)
	if err != nil {
		return nil, err
	}
	s := &services{
		dir: dir, pool: "fogdeploy", bin: filepath.Join(dir, "bin"),
		conf: filepath.Join(dir, "ceph", "ceph.conf"), keyring: filepath.Join(dir, "ceph", "ceph.client.admin.keyring"),
		docker: "unix://" + filepath.Join(dir, "docker", "docker.sock"),
	}
	s.scripts = []string{
		devenv.EnvDevDir + "=" + dir,
		"FOGDEPLOY_CEPH_MON_PORT=" + strconv.Itoa(mon), "FOGDEPLOY_CEPH_MON_PORT_V1=" + strconv.Itoa(mon1),
		"FOGDEPLOY_CEPH_POOL=" + s.pool, "FOGDEPLOY_CEPH_STORE=memstore", "FOGDEPLOY_CEPH_OSDS=1", "FOGDEPLOY_CEPH_PG_NUM=8",
		"FOGDEPLOY_DOCKER_HOST=", "FOGDEPLOY_DOCKER_BRIDGE=" + bridge, "FOGDEPLOY_DOCKER_BRIDGE_CIDR=" + cidr,
		"FOGDEPLOY_DOCKER_IPTABLES=false", "FOGDEPLOY_DOCKER_LIVE_RESTORE=true", "FOGDEPLOY_DOCKER_STOP_TIMEOUT=10",
	}
	// What reapStale needs to remove them if this process dies first.
	pstart, _ := procstat.Start(os.Getpid())
	owner := fmt.Sprintf("%d %d\n%s\n", os.Getpid(), pstart, strings.Join(s.scripts, "\n"))
	if err := os.WriteFile(filepath.Join(dir, "owner"), []byte(owner), 0o600); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			if derr := s.down(context.WithoutCancel(ctx)); derr != nil {
				err = errors.Join(err, derr)
			}
		}
	}()
	if out, err := s.script(ctx, "dev-ceph.sh", "up"); err != nil {
		return nil, fmt.Errorf("dev-ceph.sh up: %w\n%s", err, out)
	}
	// A killed client's watch on an image blocks its removal until the OSD
	// drops it (30 s by default): shorter here, where clients are killed.
	if out, err := s.ceph(ctx, "config", "set", "osd", "osd_client_watch_timeout", "10"); err != nil {
		return nil, fmt.Errorf("ceph config set: %w\n%s", err, out)
	}
	if out, err := s.script(ctx, "dev-docker.sh", "up"); err != nil {
		return nil, fmt.Errorf("dev-docker.sh up: %w\n%s", err, out)
	}
	if s.dc, err = client.NewClientWithOpts(client.WithHost(s.docker), client.WithAPIVersionNegotiation()); err != nil {
		return nil, err
	}
	for _, b := range []string{"pop-agent", "fogctl"} {
		build := exec.CommandContext(ctx, goTool(), "build", "-tags=pacific", "-o", filepath.Join(s.bin, b), "./"+b)
		build.Dir = deploytest.RepoRoot()
		if out, err := build.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("build %s: %w\n%s", b, err, out)
		}
	}
	img := exec.CommandContext(ctx, "bash", filepath.Join(deploytest.RepoRoot(), "dmtcp-image", "build.sh"), "-b", "-t", bootImage, s.docker)
	img.Env = append(os.Environ(), "GO="+goTool())
	if out, err := img.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("dmtcp-image/build.sh -b: %w\n%s", err, out)
	}
	tb, err := runtimetest.BusyboxTar("/bin/busybox")
	if err != nil {
		return nil, err
	}
	tarFile := filepath.Join(dir, "busybox.tar")
	if err := os.WriteFile(tarFile, tb, 0o600); err != nil {
		return nil, err
	}
	imp := exec.CommandContext(ctx, filepath.Join(s.bin, "fogctl"), "env", "import", envName, "--tar", tarFile, "--size", "64M")
	imp.Env = append(os.Environ(), s.clientEnv()...)
	if out, err := imp.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("fogctl env import: %w\n%s", err, out)
	}
	return s, nil
}

// clientEnv points fogctl and pop-agent at the private cluster and dockerd.
func (s *services) clientEnv() []string {
	return []string{devenv.EnvCephConf + "=" + s.conf, devenv.EnvCephKeyring + "=" + s.keyring, devenv.EnvCephPool + "=" + s.pool,
		devenv.EnvCephID + "=admin", devenv.EnvDockerHost + "=" + s.docker, "CEPH_CONF=" + s.conf}
}

// script runs scripts/NAME ARGS... against the private services.
func (s *services) script(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(deploytest.RepoRoot(), "scripts", name)}, args...)...)
	cmd.Env = append(os.Environ(), s.scripts...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// ceph runs the ceph CLI against the private cluster, bounded.
func (s *services) ceph(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ceph", append([]string{"-c", s.conf, "--keyring", s.keyring, "--connect-timeout", "20"}, args...)...).CombinedOutput()
	return string(out), err
}

// down removes the private services; the directory goes too unless
// something is still mounted under it.
func (s *services) down(ctx context.Context) error {
	var errs []error
	if s.dc != nil {
		s.dc.Close()
	}
	if out, err := s.script(ctx, "dev-docker.sh", "down"); err != nil {
		errs = append(errs, fmt.Errorf("dev-docker.sh down: %w\n%s", err, out))
	}
	if out, err := s.script(ctx, "dev-ceph.sh", "down"); err != nil {
		errs = append(errs, fmt.Errorf("dev-ceph.sh down: %w\n%s", err, out))
	}
	if m := mountsUnder(s.dir); len(m) > 0 {
		errs = append(errs, fmt.Errorf("still mounted under %s (kept): %v", s.dir, m))
	} else {
		_ = os.RemoveAll(s.dir)
	}
	return errors.Join(errs...)
}

// reapStale removes the private services of an earlier run of this package
// that died before its TestMain could (a panic, a go test timeout).
func reapStale(ctx context.Context) {
	dirs, _ := filepath.Glob(filepath.Join(tmpDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "owner"))
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		var pid int
		var pstart uint64
		if _, err := fmt.Sscanf(lines[0], "%d %d", &pid, &pstart); err != nil {
			continue
		}
		if st, ok := procstat.Start(pid); ok && st == pstart {
			continue // still running: another run of these tests
		}
		old := &services{dir: dir, scripts: lines[1:]}
		if err := old.down(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "faults: removing the services a dead run left in %s: %v\n", dir, err)
		}
	}
}

// tmpDir is where the private services live: $TMPDIR, unless it is too
// long for the sockets under it (107 bytes at most).
func tmpDir() string {
	if d := os.TempDir(); len(d) <= 24 {
		return d
	}
	return "/tmp"
}

// freePorts returns two free TCP ports on 127.0.0.1 (the mon's).
func freePorts() (int, int, error) {
	a, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, 0, err
	}
	defer a.Close()
	b, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, 0, err
	}
	defer b.Close()
	return a.Addr().(*net.TCPAddr).Port, b.Addr().(*net.TCPAddr).Port, nil
}

// freeSubnet picks a /24 in 172.31.0.0/16 that no route uses, for the
// private dockerd's bridge.
func freeSubnet(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "ip", "-4", "route", "show", "table", "main").Output()
	if err != nil {
		return "", fmt.Errorf("ip route: %w", err)
	}
	routes := string(out)
	for i := range 250 {
		n := (os.Getpid() + i) % 250
		if !strings.Contains(routes, fmt.Sprintf("172.31.%d.", n)) && !strings.Contains(routes, "172.31.0.0/16") {
			return fmt.Sprintf("172.31.%d.1/24", n), nil
		}
	}
	return "", errors.New("no free /24 in 172.31.0.0/16 for the private dockerd's bridge")
}

// osdPID returns the pid of osd.0 of the private cluster.
func (s *services) osdPID() (int, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, "ceph", "run", "ceph-osd.0.pid"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// stopOSD stops osd.0 as a service manager does (SIGTERM: it tells the
// monitors it goes down, and keeps its data) and waits until it is gone.
func (s *services) stopOSD(t *testing.T) {
	t.Helper()
	pid, err := s.osdPID()
	if err != nil {
		t.Fatal(err)
	}
	start, ok := procstat.Start(pid)
	if !ok {
		t.Fatalf("osd.0 (pid %d) does not run", pid)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Whatever happens to the test, the next one gets its OSD back.
	t.Cleanup(func() {
		if s.osdRuns() {
			return
		}
		if err := s.osdUp(context.Background()); err != nil {
			t.Errorf("starting osd.0 again: %v", err)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if st, ok := procstat.Start(pid); !ok || st != start {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("osd.0 (pid %d) still runs 30 s after SIGTERM", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startOSD starts osd.0 again and waits until every PG is active+clean.
func (s *services) startOSD(ctx context.Context, t *testing.T) {
	t.Helper()
	if err := s.osdUp(ctx); err != nil {
		t.Fatal(err)
	}
}

// osdRuns reports whether osd.0 runs.
func (s *services) osdRuns() bool {
	pid, err := s.osdPID()
	if err != nil {
		return false
	}
	_, ok := procstat.Start(pid)
	return ok
}

func (s *services) osdUp(ctx context.Context) error {
	out, err := exec.CommandContext(ctx, "ceph-osd", "-c", s.conf, "-i", "0").CombinedOutput()
	if err != nil {
		return fmt.Errorf("ceph-osd -i 0: %w\n%s", err, out)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		osd, _ := s.ceph(ctx, "osd", "stat")
		st, err := s.ceph(ctx, "pg", "stat")
		// "1 osds: 1 up ..." and "41 pgs: 41 active+clean; ..." once every PG is served again.
		if f := strings.Fields(st); err == nil && strings.Contains(osd, " 1 up") && len(f) > 3 && f[1] == "pgs:" && f[0] == f[2] && strings.HasPrefix(f[3], "active+clean;") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the PGs are not active+clean 90 s after osd.0 started again: %s %v", st, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// restartDockerd restarts the private dockerd as a service manager does;
// liveRestore says whether the daemon that comes back keeps the
// containers it finds running.
func (s *services) restartDockerd(ctx context.Context, t *testing.T, liveRestore bool) {
	t.Helper()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(deploytest.RepoRoot(), "scripts", "dev-docker.sh"), "restart")
	cmd.Env = append(append(os.Environ(), s.scripts...), "FOGDEPLOY_DOCKER_LIVE_RESTORE="+strconv.FormatBool(liveRestore))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("dev-docker.sh restart: %v\n%s", err, out)
	} else {
		t.Logf("%s", bytes.TrimSpace(out))
	}
}

// mountsUnder lists the mount points below dir.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}
