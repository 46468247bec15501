package envtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/procfs"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// stepCapMask is what a step holds (CapBnd, CapEff in /proc/self/status):
// CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID, SETUID, SETPCAP,
// NET_BIND_SERVICE, SYS_CHROOT, AUDIT_WRITE and SETFCAP.
const stepCapMask = "00000000a00405fb"

// stepDevices is what a step's /dev holds.
var stepDevices = []string{"fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout", "tty", "urandom", "zero"}

// testStepNamespaces: a command that Exec runs (as a RUN step runs) has
// namespaces of its own: on the default network lo and the NAT's tap0,
// whose DNS is the NAT's and from which the node's loopback is out of
// reach; only lo with --network=none; the host's network only where the
// manager allows it (refused by default, building nothing); the
// capabilities of a build and no more;
// its shell as PID 1 and no other process of the host, a /dev of the
// usual nodes only, a /proc hidden as Docker hides it, and a mount table
// that holds nothing of the host's; the host's mount table holds nothing
// of it, while it runs or after.
func testStepNamespaces(t *testing.T, l *Parts) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	base := uniq("ns")
	removeEnvs(t, l, base)
	importBusybox(t, l, base)
	run := func(network layering.Network, cmd string) string {
		t.Helper()
		var out bytes.Buffer
		if _, err := l.Manager.ExecWith(ctx, base, cmd, layering.ExecOptions{Output: &out, Network: network}); err != nil {
			t.Fatalf("exec %q (network %q): %v\n%s", cmd, network, err, out.String())

		}
		return out.String()
	}
	none, host, def := layering.NetworkNone, layering.NetworkHost, layering.NetworkDefault

	if got := interfaces(run(none, "cat /proc/net/dev")); !slices.Equal(got, []string{"lo"}) {
		t.Errorf("a step's network interfaces with --network=none: %v; want only lo", got)
	}
	if got := interfaces(run(def, "cat /proc/net/dev")); !slices.Equal(got, []string{"lo", "tap0"}) {
		t.Errorf("a step's network interfaces on the default network: %v; want lo and the NAT's tap0", got)
	}
	// The NAT runs sandboxed in a mount namespace of its own: the node's
	// shared mounts (as dockerd's container roots are) are all still
	// mounted after a step, a submount of a shared one included, not
	// unmounted through propagation when the sandbox detaches its old
	// root.
	shared := t.TempDir()
	must(t, unix.Mount("tmpfs", shared, "tmpfs", 0, "size=64k"))
	t.Cleanup(func() { _ = unix.Unmount(shared, unix.MNT_DETACH) })
	must(t, unix.Mount("", shared, "", unix.MS_SHARED, ""))
	sub := filepath.Join(shared, "sub")
	must(t, os.Mkdir(sub, 0o755))
	must(t, unix.Mount("tmpfs", sub, "tmpfs", 0, "size=64k"))
	run(def, "true")
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err != nil || !slices.Contains(mountPoints(string(mi)), sub) {
		t.Errorf("after a step on the default network, the node's mount %s (below a shared one) is gone (%v)", sub, err)
	}
	if got := run(def, "cat /etc/resolv.conf"); got != "nameserver 10.0.2.3\n" {
		t.Errorf("a step's resolv.conf on the default network: %q; want the NAT's DNS", got)
	}
	// The node's loopback (its etcd, its agents) is out of reach: a server
	// on 127.0.0.1 gets no connection through the NAT's gateway.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer ln.Close()
	reached := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
			reached <- struct{}{}
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	if got := run(def, fmt.Sprintf("if echo x | timeout 5 nc 10.0.2.2 %d; then echo reached; else echo refused; fi", port)); !strings.Contains(got, "refused") {
		t.Errorf("a step on the default network reached the node's loopback through 10.0.2.2: %q", got)
	}
	select {
	case <-reached:
		t.Errorf("a step on the default network connected to the node's 127.0.0.1:%d", port)
	default:
	}
	// A build's capabilities (Docker's default set for a build, less
	// NET_RAW and MKNOD), whatever its network: CapBnd and CapEff.
	for _, network := range []layering.Network{none, def, host} {
		got := run(network, "grep -E '^Cap(Bnd|Eff)' /proc/self/status")
		for _, want := range []string{"CapBnd:\t" + stepCapMask, "CapEff:\t" + stepCapMask} {
			if !strings.Contains(got, want) {
				t.Errorf("a step's capabilities (network %q): %q; want %s", network, got, want)
			}
		}
	}
	// The node's own network only where the operator allows it.
	strict, err := layering.NewManager(l.Store, l.Manager.Mounter(), layering.DefaultManagerConfig(t.TempDir()), nil)
	must(t, err)
	if _, err := strict.ExecWith(ctx, base, "true", layering.ExecOptions{Network: host}); !errors.Is(err, layering.ErrInvalid) || hint.Of(err) == "" {
		t.Errorf("exec with the host's network, not allowed: %v; want ErrInvalid with a hint", err)
	}
	bf, err := layering.ParseBuildFile(strings.NewReader("FROM " + base + "\nRUN true\nRUN --network=host true\n"))
	must(t, err)
	refused := uniq("hostrefused")
	if _, err := strict.Build(ctx, refused, bf, layering.BuildOptions{}); !errors.Is(err, layering.ErrInvalid) || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("a build with RUN --network=host, not allowed: %v; want ErrInvalid naming line 3", err)
	}
	if _, err := l.Manager.Get(ctx, refused); !errors.Is(err, layering.ErrNotFound) {
		t.Errorf("the refused build made environment %s: %v", refused, err)
	}
	hostNet, err := os.ReadFile("/proc/net/dev")
	must(t, err)
	if got, want := interfaces(run(host, "cat /proc/net/dev")), interfaces(string(hostNet)); !slices.Equal(got, want) {
		t.Errorf("a step's network interfaces with the host's network: %v; want the host's %v", got, want)
	}

	marker := uniq("pid1")
	if got := run(none, "echo "+marker+" >/dev/null; cat /proc/1/cmdline; echo"); !strings.HasPrefix(got, "/bin/sh\x00-c\x00") || !strings.Contains(got, marker) {
		t.Errorf("a step's PID 1 runs %q; want its own shell (/bin/sh -c ...%s...)", got, marker)
	}
	for _, p := range strings.Fields(run(none, "ls -1 /proc")) {
		if pid, err := strconv.Atoi(p); err == nil && pid > 10 {
			t.Errorf("a step sees process %d in its /proc: want only its own few", pid)
		}
	}

	// No descriptor of the builder's reaches the step (ls reads the
	// directory through 3).
	if fds := strings.Fields(run(none, "ls -1 /proc/self/fd")); !slices.Equal(fds, []string{"0", "1", "2", "3"}) {
		t.Errorf("a step's open descriptors: %v; want only 0, 1, 2 (and ls's 3)", fds)
	}

	devs := strings.Fields(run(none, "ls -1 /dev"))
	slices.Sort(devs)
	if !slices.Equal(devs, stepDevices) {
		t.Errorf("a step's /dev holds %v; want %v", devs, stepDevices)
	}
	if got := run(none, "echo gone >/dev/null && echo ok >/dev/stdout && ls /dev/pts/ptmx"); got != "ok\n/dev/pts/ptmx\n" {
		t.Errorf("a step's /dev/null, /dev/stdout and /dev/pts: %q", got)
	}

	_, hostResolv := os.Stat("/etc/resolv.conf")
	for _, network := range []layering.Network{none, def, host} {
		mi := run(network, "cat /proc/self/mountinfo")
		if open := procfs.Hidden(mi, "/proc"); len(open) > 0 {
			t.Errorf("a step's /proc (network %q) leaves open %v", network, open)
		}
		points := mountPoints(mi)
		for _, mp := range points {
			if !stepMount(mp, network) {
				t.Errorf("a step's mount table (network %q) holds %s: want only its root, /dev, /proc and (host network) /etc/resolv.conf", network, mp)
			}
		}
		if want := network == def || (network == host && hostResolv == nil); slices.Contains(points, "/etc/resolv.conf") != want {
			t.Errorf("a step's mount table (network %q) has /etc/resolv.conf bound: %v; want %v", network, !want, want)
		}
	}
	if b, err := os.ReadFile("/etc/resolv.conf"); err == nil {
		if got := run(host, "cat /etc/resolv.conf; if echo x 2>/dev/null >/etc/resolv.conf; then echo written; else echo refused; fi"); got != string(b)+"refused\n" {
			t.Errorf("a step with the host's network reads /etc/resolv.conf as %q; want the host's, read-only (%q, refused)", got, b)
		}
	}

	// While a command runs, its mounts are in its own namespace only.
	held := sleeperName()
	done := make(chan error, 1)
	go func() {
		_, err := l.Manager.Exec(ctx, base, "cp /bin/busybox /tmp/"+held+" && /tmp/"+held+" sleep 3", io.Discard)
		done <- err
	}()
	deadline := time.Now().Add(time.Minute)
	for len(processesNamed(t, held)) == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if len(processesNamed(t, held)) == 0 {
		t.Fatal("the exec's command did not start in a minute")
	}
	if m := hostStepMounts(t); len(m) > 0 {
		t.Errorf("while a step runs, the host's mount table holds %v in its root", m)
	}
	must(t, <-done)
	if m := hostStepMounts(t); len(m) > 0 {
		t.Errorf("after a step, the host's mount table holds %v", m)
	}
}

// testBuildStepNamespaces: RUN steps of a build have the same
// namespaces, --network=host gives a step the host's network, and what
// the builder wrote for the step (policy-rc.d, resolv.conf) is not left
// in its layer.
func testBuildStepNamespaces(t *testing.T, l *Parts) {
	ctx := context.Background()
	base, app := uniq("bns"), uniq("bnsapp")
	removeEnvs(t, l, base, app)
	importBusybox(t, l, base)
	file := "FROM " + base + "\nRUN mkdir -p /usr/sbin /out\n" +
		"RUN cat /proc/net/dev >/out/net && cat /usr/sbin/policy-rc.d >/out/policy && ls -1 /dev >/out/dev && cat /proc/1/cmdline >/out/pid1; echo\n" +
		"RUN --network=host cat /proc/net/dev >/out/hostnet && cat /proc/self/mountinfo >/out/mounts\n"
	bf, err := layering.ParseBuildFile(strings.NewReader(file))
	must(t, err)
	res, err := l.Manager.Build(ctx, app, bf, layering.BuildOptions{})
	must(t, err)
	if len(res.Steps) != 3 || !strings.HasPrefix(res.Steps[2].Step, "RUN --network=host cat") {
		t.Fatalf("steps %+v; want 3, the last RUN --network=host", res.Steps)
	}
	if m := hostStepMounts(t); len(m) > 0 {
		t.Errorf("after a build, the host's mount table holds %v", m)
	}
	root, _ := mountClone(t, l, res.Env.Ref)
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Errorf("the layer's %s: %v", p, err)
		}
		return string(b)
	}
	if got := interfaces(read("out/net")); !slices.Equal(got, []string{"lo", "tap0"}) {
		t.Errorf("a RUN step's interfaces: %v; want lo and the NAT's tap0", got)
	}
	hostNet, err := os.ReadFile("/proc/net/dev")
	must(t, err)
	if got, want := interfaces(read("out/hostnet")), interfaces(string(hostNet)); !slices.Equal(got, want) {
		t.Errorf("a RUN --network=host step's interfaces: %v; want the host's %v", got, want)
	}
	if got := read("out/policy"); got != "#!/bin/sh\nexit 101\n" {
		t.Errorf("a RUN step's /usr/sbin/policy-rc.d: %q; want the builder's", got)
	}
	if got := strings.Fields(read("out/dev")); !slices.Equal(got, stepDevices) {
		t.Errorf("a RUN step's /dev: %v; want %v", got, stepDevices)
	}
	if got := read("out/pid1"); !strings.HasPrefix(got, "/bin/sh\x00-c\x00") {
		t.Errorf("a RUN step's PID 1 runs %q; want its own shell", got)
	}
	mi := read("out/mounts")
	if open := procfs.Hidden(mi, "/proc"); len(open) > 0 {
		t.Errorf("a RUN step's /proc leaves open %v", open)
	}
	for _, mp := range mountPoints(mi) {
		if !stepMount(mp, layering.NetworkHost) {
			t.Errorf("a RUN step's mount table holds %s", mp)
		}
	}
	for _, p := range []string{"usr/sbin/policy-rc.d", "etc/resolv.conf"} {
		if _, err := os.Lstat(filepath.Join(root, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the layer holds /%s, which the builder wrote for the step: %v", p, err)
		}
	}
}

// testEnvironmentLinks: an environment's links that aim at the host
// (/dev -> /, /proc -> a host directory, /tmp, /usr, /etc and a file of
// /srv -> a host directory or file) are never followed by the builder: a
// step refuses a /dev or /proc that is a link, a COPY refuses a
// destination through a link and replaces a link it copies over, and
// nothing of the host changes (its files, its mount table).
func testEnvironmentLinks(t *testing.T, l *Parts) {
	ctx := context.Background()
	hostDir := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(hostDir, "sbin"), 0o755))
	victim := filepath.Join(hostDir, "victim")
	must(t, os.WriteFile(victim, []byte("the host's own\n"), 0o644))
	hostBefore := treeOf(t, hostDir)
	mountsBefore := hostMountsAt(t, hostDir)

	hostile := func(name string, links map[string]string) string {
		t.Helper()
		rootfs := BusyboxRootfs(t)
		for at, to := range links {
			p := filepath.Join(rootfs, at)
			must(t, os.MkdirAll(filepath.Dir(p), 0o755))
			must(t, os.RemoveAll(p))
			must(t, os.Symlink(to, p))
		}
		env := uniq(name)
		removeEnvs(t, l, env)
		_, err := l.Manager.Import(ctx, env, layering.Source{Dir: rootfs}, layering.ImportOptions{Size: 64 << 20})
		must(t, err)
		return env
	}
	build := func(file string, bctx string) error {
		bf, err := layering.ParseBuildFile(strings.NewReader(file))
		must(t, err)
		app := uniq("links")
		removeEnvs(t, l, app)
		_, err = l.Manager.Build(ctx, app, bf, layering.BuildOptions{ContextDir: bctx})
		return err
	}
	refused := func(what string, err error, want string) {
		t.Helper()
		if !errors.Is(err, layering.ErrInvalid) || !strings.Contains(err.Error(), want) || hint.Of(err) == "" {
			t.Errorf("%s = %v; want ErrInvalid saying %q, with a hint", what, err, want)
		}
	}

	devRoot := hostile("devroot", map[string]string{"dev": "/"})
	refused("a RUN step in an environment whose /dev is a link to /", build("FROM "+devRoot+"\nRUN echo hi\n", ""), "/dev is a symbolic link (to /)")
	_, err := l.Manager.Exec(ctx, devRoot, "echo hi", io.Discard)
	refused("an exec in an environment whose /dev is a link to /", err, "/dev is a symbolic link (to /)")
	procHost := hostile("prochost", map[string]string{"proc": hostDir})
	refused("a RUN step in an environment whose /proc is a link to a host directory", build("FROM "+procHost+"\nRUN echo hi\n", ""), "/proc is a symbolic link")

	links := hostile("links", map[string]string{"tmp": hostDir, "usr": hostDir, "etc": hostDir, "srv/www/index.html": victim})
	// The step writes through its /tmp and its /etc; the builder writes
	// policy-rc.d (usr/sbin) and resolv.conf (etc): none of it may land in
	// the host's directory.
	if err := build("FROM "+links+"\nRUN --network=host echo hi >/tmp/x || echo refused\n", ""); err != nil {
		t.Errorf("a RUN step in an environment whose /tmp, /usr and /etc are links to the host: %v", err)
	}
	bctx := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(bctx, "site"), 0o755))
	must(t, os.WriteFile(filepath.Join(bctx, "site/index.html"), []byte("from the context\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(bctx, "f"), []byte("f\n"), 0o644))
	refused("a COPY to /tmp/x where /tmp is a link to a host directory", build("FROM "+links+"\nCOPY f /tmp/x\n", bctx), "/tmp is a symbolic link")
	refused("a COPY to /usr/sbin/ where /usr is a link", build("FROM "+links+"\nCOPY f /usr/sbin/\n", bctx), "/usr is a symbolic link")
	refused("a COPY onto /srv/www/index.html, a link", build("FROM "+links+"\nCOPY f /srv/www/index.html\n", bctx), "/srv/www/index.html is a symbolic link")
	// A directory copied over a link of the environment replaces the
	// link.
	bf, err := layering.ParseBuildFile(strings.NewReader("FROM " + links + "\nCOPY site /srv/www/\n"))
	must(t, err)
	app := uniq("linkcopy")
	removeEnvs(t, l, app)
	res, err := l.Manager.Build(ctx, app, bf, layering.BuildOptions{ContextDir: bctx})
	if err != nil {
		t.Errorf("COPY site /srv/www/ over the environment's link /srv/www/index.html: %v", err)
	} else {
		root, _ := mountClone(t, l, res.Env.Ref)
		p := filepath.Join(root, "srv/www/index.html")
		if st, err := os.Lstat(p); err != nil || !st.Mode().IsRegular() {
			t.Errorf("the layer's /srv/www/index.html: %v, %v; want a regular file in place of the link", st, err)
		} else if b, _ := os.ReadFile(p); string(b) != "from the context\n" {
			t.Errorf("the layer's /srv/www/index.html: %q", b)
		}
	}

	if after := treeOf(t, hostDir); !maps.Equal(hostBefore, after) {
		t.Errorf("the host directory the environments' links aim at changed: %v -> %v", hostBefore, after)
	}
	if after := hostMountsAt(t, hostDir); !slices.Equal(mountsBefore, after) {
		t.Errorf("the host's mounts on /, /dev, /proc, /etc and %s changed: %v -> %v", hostDir, mountsBefore, after)
	}
	if m := hostStepMounts(t); len(m) > 0 {
		t.Errorf("the host's mount table holds %v", m)
	}
}

// sleeperName names a copy of busybox that runs as a process of that name
// (busybox takes its applet from the next argument when its name starts
// with "busybox"; its comm is at most 15 characters).
func sleeperName() string { return fmt.Sprintf("busybox%06x", rand.Uint32()&0xffffff) }

// interfaces returns the interface names of a /proc/net/dev, sorted.
func interfaces(netdev string) []string {
	var names []string
	for _, l := range strings.Split(netdev, "\n") {
		if name, _, ok := strings.Cut(l, ":"); ok && !strings.Contains(name, "|") {
			names = append(names, strings.TrimSpace(name))
		}
	}
	slices.Sort(names)
	return names
}

// mountPoints returns the mount points of a mount table (mountinfo).
func mountPoints(mountinfo string) []string {
	var out []string
	for _, l := range strings.Split(mountinfo, "\n") {
		if f := strings.Fields(l); len(f) > 4 {
			out = append(out, f[4])
		}
	}
	return out
}

// stepMount reports whether mount point mp belongs in a step's mount table.
func stepMount(mp string, network layering.Network) bool {
	switch {
	case mp == "/", mp == "/dev", mp == "/proc":
		return true
	case strings.HasPrefix(mp, "/dev/"), strings.HasPrefix(mp, "/proc/"):
		return true
	case mp == "/etc/resolv.conf":
		return network != layering.NetworkNone
	}
	return false
}

// hostStepMounts returns the mounts of the host's mount table below the
// mount target of one of this process's build steps or execs: a step's
// /dev, /proc, /etc/resolv.conf would be there, were they mounted in the
// host's namespace.
func hostStepMounts(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	must(t, err)
	inStep := regexp.MustCompile(fmt.Sprintf(`/(build|exec)-%d-[0-9]+-[0-9]+/.`, os.Getpid()))
	var out []string
	for _, mp := range mountPoints(string(b)) {
		if inStep.MatchString(mp) {
			out = append(out, mp)
		}
	}
	return out
}

// hostMountsAt returns the host's mount table lines whose mount point is
// /, /dev, /proc, /etc or under dir, sorted.
func hostMountsAt(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	must(t, err)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && (slices.Contains([]string{"/", "/dev", "/proc", "/etc"}, f[4]) || strings.HasPrefix(f[4], dir)) {
			out = append(out, strings.Join(f[3:], " "))
		}
	}
	slices.Sort(out)
	return out
}

// treeOf returns each path below dir with its type and content.
func treeOf(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	must(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		v := d.Type().String()
		if d.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += " " + string(b)
		}
		out[p] = v
		return nil
	}))
	return out
}
