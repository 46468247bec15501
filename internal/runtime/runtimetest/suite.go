// Package runtimetest is the behaviour suite every runtime.Runtime passes:
// the in-memory Fake in every `go test`, and Docker whenever a dockerd is
// reachable. It asserts what a user of the container would see: a server
// answering on its published 127.0.0.1 port, labels, logs, exit codes,
// capabilities read from /proc/self/status inside the container.
//
// The suite runs busybox applets (echo, seq, sleep, grep, nc, false) from a
// tiny image made FROM scratch (BusyboxTar + ImportBusybox).
package runtimetest

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/runtime"
)

// Harness is what a runtime under test provides to the suite.
type Harness struct {
	// Runtime is the implementation under test.
	Runtime runtime.Runtime
	// Image holds busybox applets under /bin (see ImportBusybox).
	Image string
	// Timeout bounds each operation; 0 means 60s.
	Timeout time.Duration
}

// BusyboxApplets are the applets the suite runs; BusyboxTar links each to
// /bin/busybox.
func BusyboxApplets() []string {
	return []string{"sh", "echo", "cat", "env", "true", "false", "seq", "sleep", "grep", "nc"}
}

// BusyboxTar returns a root filesystem tarball holding the static busybox
// binary at busyboxPath as /bin/busybox, a symlink per applet, and empty
// /proc, /dev, /etc and /tmp.
func BusyboxTar(busyboxPath string) ([]byte, error) {
	bin, err := os.ReadFile(busyboxPath)
	if err != nil {
		return nil, fmt.Errorf("read busybox: %w (install busybox-static)", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Now()
	for _, d := range []string{"bin/", "proc/", "dev/", "etc/", "tmp/"} {
		mode := int64(0o755)
		if d == "tmp/" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: mode, ModTime: now}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(bin)), ModTime: now}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	for _, a := range BusyboxApplets() {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777, ModTime: now}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// ImportBusybox makes image ref from BusyboxTar(busyboxPath) through the
// runtime's ImageImporter.
func ImportBusybox(ctx context.Context, imp runtime.ImageImporter, ref, busyboxPath string) error {
	tb, err := BusyboxTar(busyboxPath)
	if err != nil {
		return err
	}
	return imp.ImportImage(ctx, ref, tb, runtime.ImageConfig{Cmd: []string{"/bin/sh"}})
}

// RunSuite runs the behaviour suite; newHarness is called once per subtest.
func RunSuite(t *testing.T, newHarness func(t *testing.T) Harness) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s *suite)
	}{
		{"Lifecycle", testLifecycle},
		{"PublishedPortServes", testPublishedPort},
		{"SameContainerPortTwice", testSamePortTwice},
		{"ListFiltersByLabels", testListLabels},
		{"StopRemoveLeaveNothing", testStopRemoveLeaveNothing},
		{"LogsTail", testLogsTail},
		{"WaitExitCode", testWaitExitCode},
		{"BadImage", testBadImage},
		{"InvalidSpec", testInvalidSpec},
		{"CapabilitiesExact", testCapabilities},
		{"NotFound", testNotFound},
		{"Exec", testExec},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			if h.Timeout == 0 {
				h.Timeout = 60 * time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
			defer cancel()
			s := &suite{h: h, rt: h.Runtime, ctx: ctx, deploy: "suite-" + randHex(6)}
			tc.fn(t, s)
		})
	}
}

type suite struct {
	h      Harness
	rt     runtime.Runtime
	ctx    context.Context
	deploy string // unique per subtest, so List sees only this subtest's containers
}

// spec returns a spec of the suite's image running cmd.
func (s *suite) spec(app string, cmd ...string) runtime.Spec {
	return runtime.Spec{Deployment: s.deploy, App: app, Image: s.h.Image, Cmd: cmd}
}

// create creates a container and removes it when the test ends.
func (s *suite) create(t *testing.T, spec runtime.Spec) string {
	t.Helper()
	id, err := s.rt.Create(s.ctx, spec)
	if err != nil {
		t.Fatalf("Create(%s %q): %v", spec.Image, spec.Cmd, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.rt.Remove(ctx, id); err != nil {
			t.Errorf("cleanup: Remove(%s): %v", id, err)
		}
	})
	return id
}

func (s *suite) run(t *testing.T, spec runtime.Spec) string {
	t.Helper()
	id := s.create(t, spec)
	if err := s.rt.Start(s.ctx, id); err != nil {
		t.Fatalf("Start(%s): %v", id, err)
	}
	return id
}

func (s *suite) inspect(t *testing.T, id string) runtime.State {
	t.Helper()
	st, err := s.rt.Inspect(s.ctx, id)
	if err != nil {
		t.Fatalf("Inspect(%s): %v", id, err)
	}
	return st
}

// needBridge skips port tests on a runtime whose daemon has no bridge.
func (s *suite) needBridge(t *testing.T) {
	t.Helper()
	if n, ok := s.rt.(interface {
		Network(context.Context) (string, error)
	}); ok {
		mode, err := n.Network(s.ctx)
		if err != nil {
			t.Fatalf("Network: %v", err)
		}
		if mode == runtime.NetworkNone {
			t.Skip("the daemon has no bridge network (--bridge=none): published ports cannot be tested")
		}
	}
}

func testLifecycle(t *testing.T, s *suite) {
	spec := s.spec("life", "sleep", "3600")
	spec.Labels = map[string]string{"io.fogdeploy.test": "lifecycle", runtime.LabelApp: "spoofed"}
	id := s.create(t, spec)

	st := s.inspect(t, id)
	if st.Running || st.Status != "created" {
		t.Errorf("after Create: running=%v status=%q, want a created container", st.Running, st.Status)
	}
	for k, want := range map[string]string{runtime.LabelManaged: "true", runtime.LabelDeployment: s.deploy,
		runtime.LabelApp: "life", "io.fogdeploy.test": "lifecycle"} {
		if got := st.Labels[k]; got != want {
			t.Errorf("label %s = %q, want %q", k, got, want)
		}
	}
	if st.Deployment != s.deploy || st.App != "life" {
		t.Errorf("State.Deployment/App = %q/%q, want %q/life", st.Deployment, st.App, s.deploy)
	}
	if st.Image != s.h.Image {
		t.Errorf("State.Image = %q, want %q", st.Image, s.h.Image)
	}
	if st.Network != runtime.NetworkBridge && st.Network != runtime.NetworkNone {
		t.Errorf("State.Network = %q", st.Network)
	}

	before := time.Now().Add(-2 * time.Second)
	if err := s.rt.Start(s.ctx, id); err != nil {
		t.Fatalf("Start: %v", err)
	}
	st = s.inspect(t, id)
	if !st.Running || st.Pid <= 0 || st.Status != "running" {
		t.Errorf("after Start: running=%v pid=%d status=%q", st.Running, st.Pid, st.Status)
	}
	if st.StartedAt.Before(before) {
		t.Errorf("StartedAt = %v, want after %v", st.StartedAt, before)
	}

	if err := s.rt.Stop(s.ctx, id, time.Second); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	st = s.inspect(t, id)
	if st.Running || st.Pid != 0 || st.Status != "exited" {
		t.Errorf("after Stop: running=%v pid=%d status=%q", st.Running, st.Pid, st.Status)
	}
	if st.FinishedAt.Before(st.StartedAt) {
		t.Errorf("FinishedAt %v before StartedAt %v", st.FinishedAt, st.StartedAt)
	}
	if err := s.rt.Stop(s.ctx, id, time.Second); err != nil {
		t.Errorf("Stop of a stopped container: %v, want nil", err)
	}
	// A stopped container can be started again.
	if err := s.rt.Start(s.ctx, id); err != nil {
		t.Fatalf("Start again: %v", err)
	}
	if st := s.inspect(t, id); !st.Running {
		t.Errorf("after second Start: not running")
	}
	if err := s.rt.Remove(s.ctx, id); err != nil {
		t.Fatalf("Remove of a running container: %v", err)
	}
	if _, err := s.rt.Inspect(s.ctx, id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Inspect after Remove: %v, want ErrNotFound", err)
	}
	if err := s.rt.Remove(s.ctx, id); err != nil {
		t.Errorf("second Remove: %v, want nil (idempotent)", err)
	}
}

// greeter serves greeting to every client on container port 8080.
func (s *suite) greeter(app, greeting string) runtime.Spec {
	spec := s.spec(app, "nc", "-ll", "-p", "8080", "-e", "echo", greeting)
	spec.Ports = []runtime.Port{{ContainerPort: 8080}}
	return spec
}

// fetch connects to addr until it answers with a line, and returns it.
func fetch(t *testing.T, ctx context.Context, addr string) string {
	t.Helper()
	var last error
	for ctx.Err() == nil {
		line, err := readLine(ctx, addr)
		if err == nil && line != "" {
			return line
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("nothing served on %s: %v", addr, last)
	return ""
}

func readLine(ctx context.Context, addr string) (string, error) {
	d := net.Dialer{Timeout: 2 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	b, err := io.ReadAll(io.LimitReader(c, 4096))
	if err != nil && len(b) == 0 {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

func published(t *testing.T, st runtime.State, port uint16) string {
	t.Helper()
	hp := st.HostPort(port, "tcp")
	if hp == 0 {
		t.Fatalf("container %s publishes no host port for %d/tcp (ports %+v)", st.Name, port, st.Ports)
	}
	for _, p := range st.Ports {
		if p.ContainerPort == port && p.HostIP != runtime.DefaultHostIP {
			t.Errorf("port %d published on %q, want only %s", port, p.HostIP, runtime.DefaultHostIP)
		}
	}
	return net.JoinHostPort(runtime.DefaultHostIP, strconv.Itoa(int(hp)))
}

func testPublishedPort(t *testing.T, s *suite) {
	s.needBridge(t)
	greeting := "hello-" + randHex(4)
	id := s.run(t, s.greeter("web", greeting))
	addr := published(t, s.inspect(t, id), 8080)
	if got := fetch(t, s.ctx, addr); got != greeting {
		t.Errorf("GET %s = %q, want %q", addr, got, greeting)
	}
	// Served to every client, not only the first.
	if got := fetch(t, s.ctx, addr); got != greeting {
		t.Errorf("second client got %q, want %q", got, greeting)
	}
}

func testSamePortTwice(t *testing.T, s *suite) {
	s.needBridge(t)
	a, b := "a-"+randHex(4), "b-"+randHex(4)
	ida := s.run(t, s.greeter("a", a))
	idb := s.run(t, s.greeter("b", b))
	addrA, addrB := published(t, s.inspect(t, ida), 8080), published(t, s.inspect(t, idb), 8080)
	if addrA == addrB {
		t.Fatalf("both instances published on %s", addrA)
	}
	if got := fetch(t, s.ctx, addrA); got != a {
		t.Errorf("instance a on %s answered %q, want %q", addrA, got, a)
	}
	if got := fetch(t, s.ctx, addrB); got != b {
		t.Errorf("instance b on %s answered %q, want %q", addrB, got, b)
	}
}

func testListLabels(t *testing.T, s *suite) {
	other := s.deploy + "-other"
	specs := []runtime.Spec{s.spec("x", "sleep", "3600"), s.spec("y", "sleep", "3600"), s.spec("x", "sleep", "3600")}
	specs[2].Deployment = other
	specs[1].Labels = map[string]string{"tier": "cache"}
	ids := map[string]bool{}
	for _, sp := range specs {
		ids[s.create(t, sp)] = true
	}
	count := func(labels map[string]string) []string {
		t.Helper()
		sts, err := s.rt.List(s.ctx, labels)
		if err != nil {
			t.Fatalf("List(%v): %v", labels, err)
		}
		var got []string
		for _, st := range sts {
			if st.Labels[runtime.LabelManaged] != "true" {
				t.Errorf("List returned unmanaged container %s", st.ID)
			}
			if matchesAll(st.Labels, labels) && ids[st.ID] {
				got = append(got, st.App)
			} else if !matchesAll(st.Labels, labels) {
				t.Errorf("List(%v) returned %s with labels %v", labels, st.ID, st.Labels)
			}
		}
		return got
	}
	if got := count(map[string]string{runtime.LabelDeployment: s.deploy}); len(got) != 2 {
		t.Errorf("List(deployment=%s) = apps %v, want 2 (x, y)", s.deploy, got)
	}
	if got := count(map[string]string{runtime.LabelDeployment: other, runtime.LabelApp: "x"}); len(got) != 1 {
		t.Errorf("List(deployment=other, app=x) = %v, want 1", got)
	}
	if got := count(map[string]string{runtime.LabelDeployment: s.deploy, "tier": "cache"}); len(got) != 1 || got[0] != "y" {
		t.Errorf("List(tier=cache) = %v, want [y]", got)
	}
	if got := count(map[string]string{runtime.LabelDeployment: s.deploy, runtime.LabelApp: "nope"}); len(got) != 0 {
		t.Errorf("List(app=nope) = %v, want none", got)
	}
	if got := count(nil); len(got) < 3 {
		t.Errorf("List(nil) found %d of the 3 containers", len(got))
	}
}

func matchesAll(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

func testStopRemoveLeaveNothing(t *testing.T, s *suite) {
	s.needBridge(t)
	var addrs []string
	var ids []string
	for i := range 2 {
		id := s.run(t, s.greeter("w"+strconv.Itoa(i), "w"))
		addr := published(t, s.inspect(t, id), 8080)
		fetch(t, s.ctx, addr)
		ids, addrs = append(ids, id), append(addrs, addr)
	}
	for _, id := range ids {
		if err := s.rt.Stop(s.ctx, id, 2*time.Second); err != nil {
			t.Fatalf("Stop(%s): %v", id, err)
		}
	}
	for _, addr := range addrs {
		if line, err := readLine(s.ctx, addr); err == nil && line != "" {
			t.Errorf("%s still answers %q after Stop", addr, line)
		}
	}
	for _, id := range ids {
		if err := s.rt.Remove(s.ctx, id); err != nil {
			t.Fatalf("Remove(%s): %v", id, err)
		}
		if _, err := s.rt.Inspect(s.ctx, id); !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("Inspect(%s) after Remove: %v, want ErrNotFound", id, err)
		}
	}
	sts, err := s.rt.List(s.ctx, map[string]string{runtime.LabelDeployment: s.deploy})
	if err != nil {
		t.Fatal(err)
	}
	if len(sts) != 0 {
		t.Errorf("List after Remove: %d containers left: %+v", len(sts), sts)
	}
}

func testLogsTail(t *testing.T, s *suite) {
	id := s.run(t, s.spec("seq", "seq", "1", "20"))
	if code, err := s.rt.Wait(s.ctx, id); err != nil || code != 0 {
		t.Fatalf("Wait = %d, %v; want 0", code, err)
	}
	got, err := s.rt.Logs(s.ctx, id, 3)
	if err != nil {
		t.Fatal(err)
	}
	if got != "18\n19\n20\n" {
		t.Errorf("Logs(tail 3) = %q, want %q", got, "18\n19\n20\n")
	}
	all, err := s.rt.Logs(s.ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(all), "\n"); len(lines) != 20 || lines[0] != "1" {
		t.Errorf("Logs(all) has %d lines starting %q, want 20 starting 1", len(lines), lines[0])
	}
}

func testWaitExitCode(t *testing.T, s *suite) {
	id := s.run(t, s.spec("fail", "false"))
	code, err := s.rt.Wait(s.ctx, id)
	if err != nil || code != 1 {
		t.Fatalf("Wait = %d, %v; want 1 (busybox false)", code, err)
	}
	st := s.inspect(t, id)
	if st.Running || st.ExitCode != 1 {
		t.Errorf("Inspect after exit: running=%v exit=%d, want false/1", st.Running, st.ExitCode)
	}
	// Wait on an exited container returns at once.
	if code, err := s.rt.Wait(s.ctx, id); err != nil || code != 1 {
		t.Errorf("second Wait = %d, %v; want 1", code, err)
	}

	long := s.run(t, s.spec("long", "sleep", "3600"))
	done := make(chan int, 1)
	go func() {
		code, _ := s.rt.Wait(s.ctx, long)
		done <- code
	}()
	select {
	case c := <-done:
		t.Fatalf("Wait returned %d while the container runs", c)
	case <-time.After(300 * time.Millisecond):
	}
	if err := s.rt.Stop(s.ctx, long, time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-done:
		if c == 0 {
			t.Errorf("Wait after Stop = 0, want the signal's code")
		}
	case <-s.ctx.Done():
		t.Fatal("Wait did not return after Stop")
	}
}

// testExec runs commands in a running container (for runtimes that are
// Execers): their output, exit code and environment; a stopped or missing
// container is refused.
func testExec(t *testing.T, s *suite) {
	ex, ok := s.rt.(runtime.Execer)
	if !ok {
		t.Skip("the runtime cannot exec")
	}
	spec := s.spec("exec", "sleep", "3600")
	spec.Env = []string{"FROM_SPEC=1"}
	id := s.run(t, spec)
	r, err := ex.Exec(s.ctx, id, runtime.ExecSpec{Cmd: []string{"echo", "in", "the", "container"}})
	if err != nil || r.ExitCode != 0 || r.Output != "in the container\n" {
		t.Fatalf("Exec(echo) = %+v, %v; want exit 0 and its line", r, err)
	}
	if r, err := ex.Exec(s.ctx, id, runtime.ExecSpec{Cmd: []string{"false"}}); err != nil || r.ExitCode != 1 {
		t.Errorf("Exec(false) = %+v, %v; want exit 1 and no error", r, err)
	}
	r, err = ex.Exec(s.ctx, id, runtime.ExecSpec{Cmd: []string{"env"}, Env: []string{"FROM_EXEC=2"}})
	if err != nil || !strings.Contains(r.Output, "FROM_SPEC=1\n") || !strings.Contains(r.Output, "FROM_EXEC=2\n") {
		t.Errorf("Exec(env) = %+v, %v; want the container's and the exec's variables", r, err)
	}
	if _, err := ex.Exec(s.ctx, id, runtime.ExecSpec{}); !errors.Is(err, runtime.ErrInvalidSpec) {
		t.Errorf("Exec without a command = %v; want ErrInvalidSpec", err)
	}
	if err := s.rt.Stop(s.ctx, id, time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := ex.Exec(s.ctx, id, runtime.ExecSpec{Cmd: []string{"true"}}); !errors.Is(err, runtime.ErrConflict) {
		t.Errorf("Exec in a stopped container = %v; want ErrConflict", err)
	}
	if _, err := ex.Exec(s.ctx, "fogdeploy-no-such-"+randHex(4), runtime.ExecSpec{Cmd: []string{"true"}}); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Exec in a missing container = %v; want ErrNotFound", err)
	}
}

func testBadImage(t *testing.T, s *suite) {
	before, err := s.rt.List(s.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	spec := s.spec("ghost", "sleep", "1")
	spec.Image = "fogdeploy-test/no-such-image:" + randHex(4)
	id, err := s.rt.Create(s.ctx, spec)
	if !errors.Is(err, runtime.ErrImageNotFound) {
		_ = s.rt.Remove(s.ctx, id)
		t.Fatalf("Create with a missing image: id=%q err=%v, want ErrImageNotFound", id, err)
	}
	if !strings.Contains(err.Error(), spec.Image) {
		t.Errorf("error %q does not name the image %q", err, spec.Image)
	}
	after, err := s.rt.List(s.ctx, map[string]string{runtime.LabelDeployment: s.deploy})
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != 0 {
		t.Errorf("a container was left behind: %+v", after)
	}
	all, err := s.rt.List(s.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range all {
		if st.Image == spec.Image {
			t.Errorf("container %s of the missing image exists (%d before, %d after)", st.ID, len(before), len(all))
		}
	}
}

func testInvalidSpec(t *testing.T, s *suite) {
	for name, mut := range map[string]func(*runtime.Spec){
		"relative bind": func(sp *runtime.Spec) { sp.Binds = []runtime.Bind{{HostPath: "rel", ContainerPath: "/x"}} },
		"missing bind": func(sp *runtime.Spec) {
			sp.Binds = []runtime.Bind{{HostPath: "/nonexistent-" + randHex(4), ContainerPath: "/x"}}
		},
		"port 0":       func(sp *runtime.Spec) { sp.Ports = []runtime.Port{{ContainerPort: 0}} },
		"bad protocol": func(sp *runtime.Spec) { sp.Ports = []runtime.Port{{ContainerPort: 80, Proto: "sctp-x"}} },
		"ports and none": func(sp *runtime.Spec) {
			sp.Network = runtime.NetworkNone
			sp.Ports = []runtime.Port{{ContainerPort: 80}}
		},
		"no image": func(sp *runtime.Spec) { sp.Image = "" },
	} {
		spec := s.spec("bad", "sleep", "1")
		mut(&spec)
		id, err := s.rt.Create(s.ctx, spec)
		if err == nil {
			_ = s.rt.Remove(s.ctx, id)
			t.Errorf("%s: Create succeeded", name)
			continue
		}
		if !errors.Is(err, runtime.ErrInvalidSpec) {
			t.Errorf("%s: Create: %v, want ErrInvalidSpec", name, err)
		}
	}
	if sts, _ := s.rt.List(s.ctx, map[string]string{runtime.LabelDeployment: s.deploy}); len(sts) != 0 {
		t.Errorf("invalid specs left %d containers", len(sts))
	}
}

// capEff runs grep CapEff /proc/self/status in a container with these
// capability changes and returns the printed mask.
func (s *suite) capEff(t *testing.T, add, drop []string) string {
	t.Helper()
	spec := s.spec("caps", "grep", "CapEff", "/proc/self/status")
	spec.CapAdd, spec.CapDrop = add, drop
	id := s.run(t, spec)
	if code, err := s.rt.Wait(s.ctx, id); err != nil || code != 0 {
		out, _ := s.rt.Logs(s.ctx, id, 0)
		t.Fatalf("grep CapEff: exit %d, %v; output %q", code, err, out)
	}
	out, err := s.rt.Logs(s.ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(out)
	if len(f) != 2 || f[0] != "CapEff:" {
		t.Fatalf("grep CapEff printed %q", out)
	}
	return f[1]
}

func testCapabilities(t *testing.T, s *suite) {
	for _, tc := range []struct {
		name      string
		add, drop []string
		want      string
	}{
		// Docker's default set: CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID
		// SETUID SETPCAP NET_BIND_SERVICE NET_RAW SYS_CHROOT MKNOD
		// AUDIT_WRITE SETFCAP.
		{"default", nil, nil, "00000000a80425fb"},
		// Exactly CHOWN (bit 0) and NET_BIND_SERVICE (bit 10).
		{"exact", []string{"CHOWN", "CAP_NET_BIND_SERVICE"}, []string{"ALL"}, "0000000000000401"},
		// Nothing at all.
		{"none", nil, []string{"ALL"}, "0000000000000000"},
		// The DMTCP container's set: SETPCAP (8), SYS_CHROOT (18), SYS_ADMIN (21).
		{"dmtcp", runtime.DMTCPCapabilities(), []string{"ALL"}, "0000000000240100"},
		// Default less NET_RAW (bit 13).
		{"drop one", nil, []string{"NET_RAW"}, "00000000a80405fb"},
	} {
		if got := s.capEff(t, tc.add, tc.drop); got != tc.want {
			t.Errorf("%s: CapEff = %s, want %s (add %v, drop %v)", tc.name, got, tc.want, tc.add, tc.drop)
		}
	}
}

func testNotFound(t *testing.T, s *suite) {
	id := "fogdeploy-missing-" + randHex(6)
	if err := s.rt.Start(s.ctx, id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Start: %v, want ErrNotFound", err)
	}
	if err := s.rt.Stop(s.ctx, id, time.Second); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Stop: %v, want ErrNotFound", err)
	}
	if _, err := s.rt.Inspect(s.ctx, id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Inspect: %v, want ErrNotFound", err)
	}
	if _, err := s.rt.Logs(s.ctx, id, 1); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Logs: %v, want ErrNotFound", err)
	}
	if _, err := s.rt.Wait(s.ctx, id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Wait: %v, want ErrNotFound", err)
	}
	if err := s.rt.Remove(s.ctx, id); err != nil {
		t.Errorf("Remove: %v, want nil", err)
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
