// The way out of a step's network namespace on the default network: a user-mode NAT.

package layering

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/hint"
)

// A step on NetworkDefault gets what Docker gives a build by default, a
// network namespace of its own with outbound access through NAT, without
// a route, a firewall rule or a forwarding switch of the node's:
// slirp4netns, a user-mode TCP/IP stack (Debian package slirp4netns, as
// rootless Docker and Podman use), gives the namespace a tap0 with
// 10.0.2.100/24, a default route through 10.0.2.2 and a DNS forwarder at
// 10.0.2.3, and makes the step's connections as sockets of its own in the
// node's namespace. --disable-host-loopback refuses connections to the
// node's loopback (its etcd, its agents' APIs, dockerd's ports); the
// step holds no capability over the node's network, and slirp4netns runs
// sandboxed (--enable-sandbox: its own mount namespace, no capability but
// NET_BIND_SERVICE) in a mount namespace of its own, recursively
// private, so that nothing it mounts or unmounts reaches the node's.

// slirpBin is the user-mode NAT's program.
const slirpBin = "slirp4netns"

// stepDNS is the DNS forwarder slirp4netns gives the namespace.
const stepDNS = "10.0.2.3"

// slirpWait bounds the wait for the NAT to have configured the namespace.
const slirpWait = 10 * time.Second

// stepNet is the NAT of one step's network namespace.
type stepNet struct {
	cmd  *exec.Cmd
	exit *os.File // closing it ends slirp4netns (--exit-fd)
	done chan error
}

// startStepNet starts slirp4netns for the network namespace of thread
// tid of this process (the step's thread, which made it) and waits until
// the namespace is configured. It starts the process from another
// goroutine: a child forked from the step's thread would live in the
// step's namespace, and make its connections from there.
func startStepNet(ctx context.Context, tid int) (*stepNet, error) {
	bin, err := exec.LookPath(slirpBin)
	if err != nil {
		return nil, hint.With(fmt.Errorf("a RUN step's default network needs %s: %w", slirpBin, err),
			"install the Debian package slirp4netns (scripts/install-deps.sh does), or give the step --network=none")
	}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer readyR.Close()
	exitR, exitW, err := os.Pipe()
	if err != nil {
		readyW.Close()
		return nil, err
	}
	ns := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), tid)
	cmd := exec.Command(bin, "--configure", "--mtu=65520", "--disable-host-loopback", "--enable-sandbox",
		"--ready-fd=3", "--exit-fd=4", "--netns-type=path", ns, "tap0")
	cmd.ExtraFiles = []*os.File{readyW, exitR}
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	var out tailBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// A mount namespace of its own, made recursively private before it
	// runs (Go does that for CLONE_NEWNS): nothing --enable-sandbox
	// mounts or detaches there can reach the node's shared mounts.
	cmd.SysProcAttr = &unix.SysProcAttr{Pdeathsig: unix.SIGKILL, Unshareflags: unix.CLONE_NEWNS}
	started := make(chan error, 1)
	go func() { started <- cmd.Start() }()
	err = <-started
	readyW.Close()
	exitR.Close()
	if err != nil {
		exitW.Close()
		return nil, fmt.Errorf("start %s: %w", slirpBin, err)
	}
	n := &stepNet{cmd: cmd, exit: exitW, done: make(chan error, 1)}
	go func() { n.done <- cmd.Wait() }()
	ready := make(chan string, 1)
	go func() {
		b, _ := bufio.NewReader(readyR).ReadByte()
		ready <- string(b)
	}()
	timer := time.NewTimer(slirpWait)
	defer timer.Stop()
	select {
	case got := <-ready:
		if got == "1" {
			return n, nil
		}
		err = fmt.Errorf("%s ended before the step's network was up: %s", slirpBin, out.String())
	case <-timer.C:
		err = fmt.Errorf("%s did not configure the step's network within %s: %s", slirpBin, slirpWait, out.String())
	case <-ctx.Done():
		err = ctx.Err()
	}
	return nil, errors.Join(err, n.stop())
}

// stop ends the NAT and waits for it.
func (n *stepNet) stop() error {
	n.exit.Close()
	select {
	case <-n.done:
	case <-time.After(5 * time.Second):
		_ = n.cmd.Process.Kill()
		<-n.done
	}
	return nil
}

// stepResolvConf writes the resolv.conf of a step on the default network
// (its DNS is the NAT's forwarder, which asks the node's resolvers) into
// a new file of the node's temporary directory, and returns its path.
func stepResolvConf() (string, error) {
	f, err := os.CreateTemp("", "fogdeploy-step-resolv-*.conf")
	if err != nil {
		return "", err
	}
	_, err = f.WriteString("nameserver " + stepDNS + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// stepCaps are the capabilities a step keeps (its bounding set, and so
// what its root processes hold): Docker's default set for a build, less
// NET_RAW (packet sockets: on the node's network they would read its
// traffic) and MKNOD (a device node written into the environment would be
// an app's way to the node's disks).
var stepCaps = []string{"chown", "dac_override", "fowner", "fsetid", "kill", "setgid", "setuid", "setpcap", "setfcap",
	"net_bind_service", "sys_chroot", "audit_write"}

// stepBoundingSet is stepCaps as setpriv's --bounding-set takes them.
func stepBoundingSet() string {
	s := "-all"
	for _, c := range stepCaps {
		s += ",+" + c
	}
	return s
}

// dnsFailed says whether a step's output shows that it could not resolve
// a name, and the hint for its network.
func dnsFailed(out string, network Network) (string, bool) {
	for _, m := range []string{"Temporary failure resolving", "Could not resolve", "Name or service not known", "bad address", "Temporary failure in name resolution"} {
		if !strings.Contains(strings.ToLower(out), strings.ToLower(m)) {
			continue
		}
		switch network {
		case NetworkNone:
			return "this step has no network (--network=none): drop the flag, and it reaches out through NAT", true
		case NetworkHost:
			return "the step used the node's own network and /etc/resolv.conf: check the node's resolver", true
		default:
			return "the step's DNS is " + stepDNS + ", which asks the node's resolvers (its /etc/resolv.conf): check that the node resolves the name itself", true
		}
	}
	return "", false
}
