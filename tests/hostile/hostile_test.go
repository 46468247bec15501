//go:build !no_ceph

// Package hostile runs apps that try to harm their node and their
// neighbours, as a stranger's backend on a shared PoP would, and checks
// that each hole is closed: under DMTCP and CRIU in the light container,
// in an instance restored from its checkpoint and in one recycled for the
// next tenant, and under the host driver.
package hostile

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/config"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// probe runs as the app (uid 0, no capability, in its root) and prints one
// line per hole it finds open; it exits 1 if any. $TARGET is a path of the
// node that the app aims links at; markers of the tenant before are looked
// for, then left for the tenant after.
const probe = `
open=0
hole() { echo "OPEN: $*"; open=1; }
# The kernel's control surface.
for f in kcore keys timer_list timer_stats latency_stats sched_debug interrupts; do
  p=/proc/$f
  [ -e $p ] || continue
  if [ -n "$(head -c 1 $p 2>/dev/null)" ]; then hole "$p is readable"; fi
done
for d in acpi asound scsi; do
  [ -d /proc/$d ] && [ -n "$(ls -A /proc/$d 2>/dev/null)" ] && hole "/proc/$d is listed"
done
for f in sysrq-trigger sys/kernel/domainname; do
  [ -e /proc/$f ] && [ -w /proc/$f ] && hole "/proc/$f is writable"
done
if [ -e /proc/irq/default_smp_affinity ]; then
  v=$(cat /proc/irq/default_smp_affinity)
  if (echo "$v" > /proc/irq/default_smp_affinity) 2>/dev/null; then hole "wrote /proc/irq/default_smp_affinity"; fi
fi
# The supervisor's processes: none is visible (the app sees its own and
# the init of its PID namespace).
app=0
for p in /proc/[0-9]*; do
  c=$(tr '\0' ' ' < $p/cmdline 2>/dev/null)
  case "$c" in
    *redis-server*) app=1;;
  esac
  set -- $c
  case "${1##*/} $2" in
    "dmtcp_coordinator "*|"dmtcp_command "*|"criu "*|"entrypoint launch"|"entrypoint restart"|"entrypoint boot"|"entrypoint nocaps")
      hole "a process of the supervisor is visible: ${p#/proc/}: $1 $2";;
  esac
done
echo "app visible: $app"
# The supervisor's files, through /proc/PID/root of a process outside the
# app's root: none must be reachable; were one, its root must be read-only
# and the links planted in its control directory not followed.
seen=0
for p in /proc/[0-9]*; do
  [ -e "$p/root/fog/entrypoint" ] 2>/dev/null || continue
  seen=1
  if (: > "$p/root/fog/entrypoint.hostile") 2>/dev/null; then hole "wrote into the container's root through $p/root"; fi
  if [ -d "$p/root/fog/ctl/identity" ]; then
    # Links for the node's agent to follow: it must not.
    rm -f "$p/root/fog/ctl/identity/identity.json" 2>/dev/null
    ln -s "$TARGET" "$p/root/fog/ctl/identity/identity.json" 2>/dev/null
    ln -sf "$TARGET" "$p/root/fog/ctl/timings.json" 2>/dev/null
  fi
done
echo "supervisor's root reached: $seen"
# The node's files through /proc/PID/root of any process it can see (the
# host driver's init runs in the node's root): $HOSTMARK exists only there.
if [ -n "$HOSTMARK" ]; then
  for p in /proc/[0-9]*; do
    if [ -e "$p/root$HOSTMARK" ] 2>/dev/null; then hole "reached the node's files through $p/root"; fi
  done
fi
# The node's devices: disks, mapped images, memory, the kernel's log.
for d in /dev/sd* /dev/vd* /dev/nvme* /dev/rbd* /dev/loop* /dev/nbd* /dev/mem /dev/kmem /dev/port /dev/kmsg; do
  [ -e "$d" ] && hole "$d is in the instance's /dev"
done
# Outside the system-call filter: a user namespace (every capability
# again, inside it), the kernel's keyrings (uid 0's are the node's).
if command -v unshare >/dev/null 2>&1 && unshare -U true 2>/dev/null; then hole "made a user namespace (unshare -U)"; fi
# keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING, 0), 250 on x86_64,
# through perl (perl-base is in every Debian root): no keyutils needed.
if [ "$(uname -m)" = x86_64 ] && command -v perl >/dev/null 2>&1; then
  if perl -e 'exit(syscall(250, 0, -4, 0) >= 0 ? 0 : 1)' 2>/dev/null; then hole "reached the user keyring (keyctl KEYCTL_GET_KEYRING_ID)"; fi
  echo "keyring tried"
fi
# Its pages offered to the kernel's same-page merging, to time its writes
# against its neighbours' pages: prctl(PR_SET_MEMORY_MERGE, 1) (157 on x86_64).
if [ "$(uname -m)" = x86_64 ] && command -v perl >/dev/null 2>&1 && perl -e 'exit(syscall(157, 67, 1, 0, 0, 0) == 0 ? 0 : 1)' 2>/dev/null; then hole "opted its memory in to same-page merging (prctl PR_SET_MEMORY_MERGE)"; fi
# Capabilities: none beyond what the app's driver gives (CapEff in hex).
echo "caps: $(grep CapEff /proc/self/status)"
# The app's own variables reached the app: those named as the
# supervisor's settings too, which must have steered nothing else.
for p in /proc/[0-9]*; do
  case "$(tr '\0' ' ' < $p/cmdline 2>/dev/null)" in
    *redis-server*)
      if tr '\0' '\n' < $p/environ 2>/dev/null | grep -qx "FOG_CRIU_PREFIX=/nonexistent-fog"; then echo "app env: own"; fi;;
  esac
done
# /dev is the instance's own: what a tenant before made of it is gone.
if [ -e /dev/urandom ] && [ ! -c /dev/urandom ]; then hole "/dev/urandom is not the kernel's device: $(ls -l /dev/urandom)"; fi
if [ "$(head -c 16 /dev/urandom 2>/dev/null | od -An -tx1 | tr -d ' \n')" = 00000000000000000000000000000000 ]; then hole "/dev/urandom gives zeros"; fi
# What a tenant before left, in its volumes and under a name that looks
# like a checkpoint generation's.
markers="/tmp/hostile-marker /var/tmp/hostile-marker /dev/shm/hostile-marker /dev/hostile-marker /fog/ckpt/hostile-marker /fog/ckpt/97/hostile-marker"
for f in $markers; do
  if [ -e $f ]; then hole "$f of the tenant before is here: $(cat $f)"; fi
done
# Markers for the tenant after, and a /dev/urandom of zeros.
mkdir -p /fog/ckpt/97 2>/dev/null
for f in $markers; do
  echo "$FOGDEPLOY_INSTANCE" > $f 2>/dev/null
done
rm -f /dev/urandom 2>/dev/null
if head -c 4096 /dev/zero > /dev/urandom.zero 2>/dev/null; then mv -f /dev/urandom.zero /dev/urandom 2>/dev/null; rm -f /dev/urandom.zero; fi
echo probed
exit $open
`

func TestHostileApp(t *testing.T) {
	for _, eng := range []engine.Name{engine.NameDMTCP, engine.NameCRIU} {
		t.Run(string(eng), func(t *testing.T) { testHostile(t, eng) })
	}
}

// node is a node whose apps of engine eng run under driver, and the
// test's context.
func node(t *testing.T, driver string, eng engine.Name) (*deploytest.Fixture, context.Context) {
	f := deploytest.NewFixture(t, driver)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	if _, _, err := f.D.Drivers().CheckEngine(ctx, eng); err != nil {
		testenv.Unavailable(t, string(eng), err.Error())
	}
	return f, ctx
}

func testHostile(t *testing.T, eng engine.Name) {
	f, ctx := node(t, "container", eng)
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e6, 36)
	newApp := func(name string) spec.App {
		a := deploytest.RedisApp(name+"-"+string(eng)+"-"+suffix, f.Env, eng)
		a.Resources = spec.Resources{} // a stranger's spec: no limits asked for
		t.Cleanup(func() { f.RemoveGenerations(t, a.Name) })
		t.Cleanup(func() { f.UndeployAll(t, a.Name) })
		return a
	}
	target := filepath.Join(t.TempDir(), "planted-by-the-app")
	app := newApp("hostile")
	// Variables named as the supervisor's settings (its engines' prefixes,
	// the PATH it looks its tools up in): the app's, steering nothing of
	// the supervisor; the deploy works and the app sees them.
	app.Environment = append(app.Environment, "TARGET="+target, "FOG_DMTCP_PREFIX=/nonexistent-fog", "FOG_CRIU_PREFIX=/nonexistent-fog",
		"PATH=/nonexistent-fog:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")

	first, err := f.D.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatalf("first deploy: %v", err)
	}
	runProbe(ctx, t, f, first, app, "a fresh restore")

	// The boot image (no checkpoint engine) runs the app in the same
	// sandbox.
	if eng == engine.NameDMTCP {
		booted, err := f.D.Deploy(ctx, app, deploy.Options{Mode: spec.ModeBoot})
		if err != nil {
			t.Fatalf("boot: %v", err)
		}
		runProbe(ctx, t, f, booted, app, "a boot")
		if err := f.D.Undeploy(ctx, booted.ID); err != nil {
			t.Fatalf("undeploy the boot: %v", err)
		}
	}

	if eng == engine.NameDMTCP {
		preloadAttack(ctx, t, f, app)
	}

	// No limit in the spec: the node's defaults.
	want := config.DefaultLimits().Spec()
	if first.Limits == nil || *first.Limits != want {
		t.Errorf("limits of %s = %+v; want the node's defaults %+v", first.ID, first.Limits, want)
	}
	checkLimits(ctx, t, f, first, want)

	// Neighbours: another user's redis is not reachable from the instance;
	// two apps of one network group reach each other; every published
	// port answers from the node.
	neighbour, err := f.D.Deploy(ctx, newApp("neighbour"), deploy.Options{})
	if err != nil {
		t.Fatalf("neighbour: %v", err)
	}
	if err := dialFrom(ctx, f, first, neighbour); err == nil {
		t.Errorf("%s reached another user's instance %s on the node's network", first.ID, neighbour.ID)
	} else {
		t.Logf("%s -> %s: %v (closed, as it should be)", first.ID, neighbour.ID, err)
	}
	var group []deploy.Deployment
	for _, name := range []string{"shop-a", "shop-b"} {
		a := newApp(name)
		a.Network = "shop-" + suffix
		d, err := f.D.Deploy(ctx, a, deploy.Options{})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		group = append(group, d)
	}
	if err := dialFrom(ctx, f, group[0], group[1]); err != nil {
		t.Errorf("%s cannot reach %s of its network group: %v", group[0].ID, group[1].ID, err)
	}
	if err := dialFrom(ctx, f, group[0], neighbour); err == nil {
		t.Errorf("%s of a network group reached %s outside it", group[0].ID, neighbour.ID)
	}
	for _, d := range append(group, first, neighbour) {
		if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, d), "PING"); err != nil || got != "PONG" {
			t.Errorf("%s from the node: PING = %q, %v", d.ID, got, err)
		}
	}

	// A spare slot, made for no app, that this app's restore takes: the
	// same sandbox, the node's limits, no neighbour reached.
	if err := f.D.Pool().MakesSpares(ctx, eng); err != nil {
		t.Errorf("no spare slots of %s on this node: %v", eng, err)
	} else {
		t.Cleanup(func() { _, _ = f.D.Pool().ReleaseSpares(context.Background(), "", -1) })
		if _, err := f.D.Pool().ProvisionSpare(ctx, eng); err != nil {
			t.Fatalf("spare: %v", err)
		}
		sp, err := f.D.Deploy(ctx, app, deploy.Options{})
		if err != nil {
			t.Fatalf("restore into a spare: %v", err)
		}
		if sp.Pool != spec.PoolSpare {
			t.Errorf("restore %s: pool %q; want a spare slot", sp.ID, sp.Pool)
		}
		runProbe(ctx, t, f, sp, app, "a spare slot")
		checkLimits(ctx, t, f, sp, want)
		if err := dialFrom(ctx, f, sp, neighbour); err == nil {
			t.Errorf("%s (in a spare slot) reached another user's instance %s", sp.ID, neighbour.ID)
		}
		if err := f.D.Undeploy(ctx, sp.ID); err != nil {
			t.Fatalf("undeploy the spare's instance: %v", err)
		}
	}

	// Recycled for the next tenant: a warm-pool slot serves two
	// deployments in one container; the second finds nothing of the first,
	// and the links the first planted were not followed.
	g, err := f.D.Checkpoints().Latest(ctx, app.Name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.D.Pool().ProvisionPoolSlot(ctx, g); err != nil {
		t.Fatal(err)
	}
	var ref string
	for round := 1; round <= 2; round++ {
		dep, err := f.D.Deploy(ctx, app, deploy.Options{})
		if err != nil {
			t.Fatalf("round %d: deploy: %v", round, err)
		}
		if dep.Pool != spec.PoolHit || dep.Handle == nil || (ref != "" && dep.Handle.Ref != ref) {
			t.Fatalf("round %d: %s (%s); want a hit of the slot's container %s", round, dep.ID, dep.Pool, ref)
		}
		ref = dep.Handle.Ref
		runProbe(ctx, t, f, dep, app, fmt.Sprintf("round %d of a recycled container", round))
		if _, err := f.D.Pool().Recycle(ctx, dep.ID); err != nil {
			t.Fatalf("round %d: recycle: %v", round, err)
		}
	}
	if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s, where the app's links pointed, exists on the node: %v", target, err)
	}
}

// runProbe runs the probe in dep as its app would run it.
func runProbe(ctx context.Context, t *testing.T, f *deploytest.Fixture, dep deploy.Deployment, app spec.App, what string) string {
	return runProbeIn(ctx, t, f.Container, dep, app, what)
}

// runProbeIn runs the probe in dep through driver dr and returns its
// output.
func runProbeIn(ctx context.Context, t *testing.T, dr drivers.Driver, dep deploy.Deployment, app spec.App, what string) string {
	t.Helper()
	if dep.Handle == nil {
		t.Fatalf("%s: no handle", dep.ID)
	}
	r, err := dr.Exec(ctx, *dep.Handle, drivers.Exec{Argv: []string{"sh", "-c", probe}, User: app.User,
		Env: []string{"TARGET=" + envOf(app, "TARGET"), "HOSTMARK=" + envOf(app, "HOSTMARK"), "FOGDEPLOY_INSTANCE=" + dep.ID}})
	if err != nil {
		t.Fatalf("%s: probe: %v", what, err)
	}
	if r.ExitCode != 0 || !strings.Contains(r.Output, "probed") {
		t.Errorf("%s (%s): the app found holes (exit %d):\n%s", what, dep.ID, r.ExitCode, r.Output)
	}
	// A command run as the app holds no capability, under every driver
	// and engine; the keyring was tried, not passed over.
	if !strings.Contains(r.Output, "caps: CapEff:\t0000000000000000") {
		t.Errorf("%s: the probe holds capabilities:\n%s", what, r.Output)
	}
	if runtime.GOARCH == "amd64" && !strings.Contains(r.Output, "keyring tried") {
		t.Errorf("%s: the probe could not try the kernel's keyring (no perl in the root?):\n%s", what, r.Output)
	}
	// The probe ran among the app's processes, as the app would.
	if !strings.Contains(r.Output, "app visible: 1") {
		t.Errorf("%s: the probe does not see the app's own processes:\n%s", what, r.Output)
	}
	// The app has the variables of its spec, those named as the
	// supervisor's included. Only a booted app shows them in
	// /proc/PID/environ: a restored process's environment block is the
	// restarter's there (neither engine may move it without
	// CAP_SYS_RESOURCE), whatever the process holds.
	if what == "a boot" && envOf(app, "FOG_CRIU_PREFIX") != "" && !strings.Contains(r.Output, "app env: own") {
		t.Errorf("%s: the app lacks the variables of its spec:\n%s", what, r.Output)
	}
	// No process of the supervisor that the app can reach has the
	// container's root as its own (DMTCP's coordinator and dmtcp_command run
	// chrooted into the app's root; PID 1 holds capabilities the app lacks).
	if !strings.Contains(r.Output, "supervisor's root reached: 0") {
		t.Errorf("%s: the app reached the container's root through a process of the supervisor:\n%s", what, r.Output)
	}
	return r.Output
}

// preloadSource is a library the app writes into its root and lists in
// its /etc/ld.so.preload: loaded into a process of DMTCP's supervisor
// (its coordinator, dmtcp_command), it says so in the app's /var/tmp.
// The app's own processes load it too, and it leaves them be.
const preloadSource = `
#include <fcntl.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>
__attribute__((constructor)) static void hostile(void) {
	char comm[17] = {0};
	if (prctl(PR_GET_NAME, comm) != 0) return;
	if (strncmp(comm, "dmtcp_coord", 11) != 0 && strncmp(comm, "dmtcp_command", 13) != 0) return;
	int fd = open("/var/tmp/hostile-preload-ran", O_WRONLY | O_CREAT | O_APPEND, 0666);
	if (fd < 0) return;
	comm[strlen(comm)] = '\n';
	write(fd, comm, strlen(comm));
	close(fd);
}
`

// preloadAttack: an app that writes a library into its root and lists it
// in /etc/ld.so.preload gets no code run in its supervisor's processes:
// neither in dmtcp_command, which its suspend's checkpoint runs, nor in
// the coordinator its resume starts. (Both ran chrooted into the app's
// root, on its loader and /etc/ld.so.preload, before they ran on the
// image's own libraries.)
func preloadAttack(ctx context.Context, t *testing.T, f *deploytest.Fixture, app spec.App) {
	t.Helper()
	dir := t.TempDir()
	src, lib := filepath.Join(dir, "preload.c"), filepath.Join(dir, "preload.so")
	if err := os.WriteFile(src, []byte(preloadSource), 0o644); err != nil {
		t.Fatal(err)
	}
	// gcc is among the tools the engines' build installs.
	if out, err := exec.CommandContext(ctx, "gcc", "-shared", "-fPIC", "-O2", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("building the app's library: %v\n%s", err, out)
	}
	so, err := os.ReadFile(lib)
	if err != nil {
		t.Fatal(err)
	}
	dep, err := f.D.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatalf("deploy for the preload: %v", err)
	}
	t.Cleanup(func() { _ = f.D.Undeploy(context.Background(), dep.ID) })
	const plant = `echo "$SO" | base64 -d > /usr/lib/hostile-preload.so && echo /usr/lib/hostile-preload.so > /etc/ld.so.preload && rm -f /var/tmp/hostile-preload-ran && echo planted`
	r, err := f.Container.Exec(ctx, *dep.Handle, drivers.Exec{Argv: []string{"sh", "-c", plant}, User: app.User,
		Env: []string{"SO=" + base64.StdEncoding.EncodeToString(so)}})
	if err != nil || !strings.Contains(r.Output, "planted") {
		t.Fatalf("the app could not write its preload (%v):\n%s", err, r.Output)
	}
	susp, err := f.D.Suspensions().Suspend(ctx, dep.ID, app, deploy.SuspendOptions{})
	if err != nil {
		t.Fatalf("suspend with the app's preload: %v", err)
	}
	if err := f.D.Suspensions().Forget(dep.ID); err != nil { // as the agent does once etcd has the suspension
		t.Fatal(err)
	}
	resumed, err := f.D.Resume(ctx, app, dep.ID, susp, deploy.Options{})
	if err != nil {
		t.Fatalf("resume with the app's preload: %v", err)
	}
	f.D.Suspensions().DropSuspension(ctx, resumed.ID, susp)
	r, err = f.Container.Exec(ctx, *resumed.Handle, drivers.Exec{Argv: []string{"sh", "-c",
		"cat /etc/ld.so.preload; cat /var/tmp/hostile-preload-ran 2>/dev/null | sed 's/^/ran in: /'; echo checked"}, User: app.User})
	if err != nil || !strings.Contains(r.Output, "hostile-preload.so") || !strings.Contains(r.Output, "checked") {
		t.Fatalf("reading what the preload left (%v): the app's root lost its files?\n%s", err, r.Output)
	}
	if strings.Contains(r.Output, "ran in: ") {
		t.Errorf("the app's /etc/ld.so.preload ran its code in a process of its supervisor:\n%s", r.Output)
	}
	if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, resumed), "PING"); err != nil || got != "PONG" {
		t.Errorf("the resumed app with its preload: PING = %q, %v", got, err)
	}
	if err := f.D.Undeploy(ctx, resumed.ID); err != nil {
		t.Errorf("undeploy: %v", err)
	}
}

func envOf(app spec.App, key string) string {
	for _, kv := range app.Environment {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}

// checkLimits reads, from the node, the limits the instance's processes
// run with: open files of the app, and its container's pids limit.
func checkLimits(ctx context.Context, t *testing.T, f *deploytest.Fixture, dep deploy.Deployment, want spec.Limits) {
	t.Helper()
	checkLimitsIn(ctx, t, f.Container, dep, want)
}

// checkLimitsIn is checkLimits of an instance of driver dr.
func checkLimitsIn(ctx context.Context, t *testing.T, dr drivers.Driver, dep deploy.Deployment, want spec.Limits) {
	t.Helper()
	pid, err := dr.NetPid(ctx, *dep.Handle)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/limits")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "Max open files") {
			if f := strings.Fields(l); len(f) < 5 || f[3] != strconv.FormatUint(want.OpenFiles, 10) {
				t.Errorf("open files of %s: %q; want %d", dep.ID, l, want.OpenFiles)
			}
		}
	}
	cg, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(cg), "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) == 3 && (parts[1] == "pids" || parts[1] == "") {
			for _, file := range []string{"/sys/fs/cgroup/pids" + parts[2] + "/pids.max", "/sys/fs/cgroup" + parts[2] + "/pids.max"} {
				if v, err := os.ReadFile(file); err == nil {
					if strings.TrimSpace(string(v)) != strconv.FormatInt(want.Pids, 10) {
						t.Errorf("pids.max of %s = %s; want %d", dep.ID, v, want.Pids)
					}
					return
				}
			}
		}
	}
	t.Errorf("no pids cgroup of %s found in %q", dep.ID, cg)
}

// dialFrom connects, from inside from's network namespace, to the address
// of to's container on the node's network, on redis's port.
func dialFrom(ctx context.Context, f *deploytest.Fixture, from, to deploy.Deployment) error {
	fromPid, err := f.Container.NetPid(ctx, *from.Handle)
	if err != nil {
		return fmt.Errorf("netpid of %s: %w", from.ID, err)
	}
	toIP, err := containerIP(ctx, f, to)
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		// The thread enters the namespace and is never given back.
		runtime.LockOSThread()
		ns, err := os.Open("/proc/" + strconv.Itoa(fromPid) + "/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer ns.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		c, err := net.DialTimeout("tcp", net.JoinHostPort(toIP, "6379"), 2*time.Second)
		if err == nil {
			c.Close()
		}
		errc <- err
	}()
	return <-errc
}

// containerIP is the address of dep's container on its network.
func containerIP(ctx context.Context, f *deploytest.Fixture, dep deploy.Deployment) (string, error) {
	st, err := f.RT.Inspect(ctx, dep.Handle.Ref)
	if err != nil {
		return "", err
	}
	if st.IP == "" {
		return "", fmt.Errorf("container of %s has no address (%+v)", dep.ID, st)
	}
	return st.IP, nil
}

// TestHostileAppHostDriver runs the stranger's app (no resources, not
// marked trusted) under the host driver, DMTCP and CRIU: in its first
// instance and in a restore, it finds no hole; its limits are the node's;
// it reaches no neighbour; nothing of it stays on the node.
func TestHostileAppHostDriver(t *testing.T) {
	for _, eng := range []engine.Name{engine.NameDMTCP, engine.NameCRIU} {
		t.Run(string(eng), func(t *testing.T) { testHostileHost(t, eng) })
	}
}

func testHostileHost(t *testing.T, eng engine.Name) {
	f, ctx := node(t, "host", eng)
	if !f.Host.Limited() {
		t.Fatal("the host driver cannot make cgroups on this node: its instances would run without limits")
	}
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e6, 36)
	mark := filepath.Join(t.TempDir(), "on-the-node-only")
	if err := os.WriteFile(mark, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	newApp := func(name string) spec.App {
		a := deploytest.RedisApp(name+"-h"+string(eng)+"-"+suffix, f.Env, eng)
		a.Resources = spec.Resources{} // a stranger's spec: no limits asked for
		a.Trusted = false
		a.Environment = append(a.Environment, "HOSTMARK="+mark, "TARGET="+filepath.Join(t.TempDir(), "planted"))
		t.Cleanup(func() { f.RemoveGenerations(t, a.Name) })
		t.Cleanup(func() { f.UndeployAll(t, a.Name) })
		return a
	}
	app := newApp("hostile")
	first, err := f.D.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatalf("first deploy: %v", err)
	}
	out := runProbeIn(ctx, t, f.Host, first, app, "a first deploy")
	if !strings.Contains(out, "CapEff:\t0000000000000000") {
		t.Errorf("the app holds capabilities:\n%s", out)
	}
	restored, err := f.D.Deploy(ctx, app, deploy.Options{})
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	if restored.Mode != spec.ModeRestore {
		t.Errorf("second deploy of %s: mode %s; want a restore", app.Name, restored.Mode)
	}
	out = runProbeIn(ctx, t, f.Host, restored, app, "a restore")
	if !strings.Contains(out, "CapEff:\t0000000000000000") {
		t.Errorf("the restored app holds capabilities:\n%s", out)
	}

	// No limit in the spec: the node's defaults, in the instance's own
	// cgroup.
	want := config.DefaultLimits().Spec()
	if restored.Limits == nil || *restored.Limits != want {
		t.Errorf("limits of %s = %+v; want the node's defaults %+v", restored.ID, restored.Limits, want)
	}
	checkLimitsIn(ctx, t, f.Host, restored, want)

	// Another user's instance: its published port answers from the node,
	// not from inside this one (it has a network of its own).
	neighbour, err := f.D.Deploy(ctx, newApp("neighbour"), deploy.Options{})
	if err != nil {
		t.Fatalf("neighbour: %v", err)
	}
	pid, err := f.Host.NetPid(ctx, *restored.Handle)
	if err != nil {
		t.Fatal(err)
	}
	addr := deploytest.RedisAddr(t, neighbour)
	if err := engine.InNetNS(pid, func() error {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}); err == nil {
		t.Errorf("%s reached another user's instance %s at %s", restored.ID, neighbour.ID, addr)
	}
	for _, d := range []deploy.Deployment{first, restored, neighbour} {
		if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, d), "PING"); err != nil || got != "PONG" {
			t.Errorf("%s from the node: PING = %q, %v", d.ID, got, err)
		}
	}

	// Undeployed, nothing of the instances stays: no process, no cgroup.
	for _, d := range []deploy.Deployment{first, restored, neighbour} {
		if err := f.D.Undeploy(ctx, d.ID); err != nil {
			t.Fatalf("undeploy %s: %v", d.ID, err)
		}
		for _, c := range []string{"memory", "pids", "cpu"} {
			dir := filepath.Join("/sys/fs/cgroup", c, deploytest.HostCgroups, d.ID)
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("cgroup %s of %s stays after its undeploy: %v", dir, d.ID, err)
			}
		}
	}
}
