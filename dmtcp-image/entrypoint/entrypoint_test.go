package main

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/dmtcpctl"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/instancectl"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

func TestParseConfig(t *testing.T) {
	c, err := parseConfig(modeLaunch, []string{"-ready", "127.0.0.1:6379", "-ready-send", `PING\r\n`, "--", "redis-server", "--port", "6379"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.readySend != "PING\r\n" || strings.Join(c.app, " ") != "redis-server --port 6379" {
		t.Errorf("readySend %q app %q", c.readySend, c.app)
	}
	if c.trigger != "/fog/ckpt/checkpoint.request" || c.root != "/fog/root" || c.after != afterExit {
		t.Errorf("defaults: trigger %q root %q after %q", c.trigger, c.root, c.after)
	}
	for _, tc := range []struct {
		mode string
		args []string
		want string
	}{
		{modeLaunch, nil, "needs the app's command"},
		{modeRestart, []string{"redis-server"}, "restart takes no command"},
		{modeLaunch, []string{"-after-checkpoint", "pause", "app"}, `-after-checkpoint "pause"`},
		{modeLaunch, []string{"-root", "rel", "app"}, `-root "rel" must be an absolute path`},
		{modeLaunch, []string{"-engine", "podman", "app"}, `-engine "podman": want dmtcp or criu`},
		{modeRestart, []string{"-lazy"}, "-lazy needs an engine with lazy restore (criu)"},
		{modeRestart, []string{"-recycle"}, "-recycle is for restart with -wait"},
		{modeRestart, []string{"-recycle", "-engine", "criu"}, "-recycle is for restart with -wait"},
		{modeLaunch, []string{"-recycle", "-wait", "/fog/ctl/order", "app"}, "-recycle is for restart"},
		{modeRestart, []string{"-source-later", "-from", "2"}, "-source-later is for restart with -wait and -from"},
		{modeRestart, []string{"-source-later", "-wait", "/fog/ctl/order"}, "-source-later is for restart with -wait and -from"},
		{modeLaunch, []string{"-source-later", "-wait", "/fog/ctl/order", "-from", "2", "app"}, "-source-later is for restart"},
		{modeRestart, []string{"-root-later"}, "-root-later is for restart with -wait"},
		{modeLaunch, []string{"-root-later", "-wait", "/fog/ctl/order", "app"}, "-root-later is for restart with -wait"},
		{modeLaunch, []string{"-engine", "criu", "-lazy", "app"}, "-lazy is for restart only"},
		{modeLaunch, []string{"-engine", "criu", "-after-checkpoint", "continue", "app"}, "criu's dump stops the app"},
		{modeLaunch, []string{"-engine", "criu", "-criu-prefix", "opt/criu", "app"}, `-criu-prefix "opt/criu" must be an absolute path`},
		{modeLaunch, []string{"--", "-x"}, "looks like a flag"},
		{modeLaunch, []string{"-ready-http", "health", "app"}, `-ready-http "health"`},
		{modeLaunch, []string{"-ready-http", "/", "-ready-expect", "x", "app"}, "drop -ready-send and -ready-expect"},
		{modeLaunch, []string{"-ready-status", "200", "app"}, "-ready-status 200: want 100 to 599, with -ready-http"},
	} {
		_, err := parseConfig(tc.mode, tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %q: %v, want %q", tc.mode, tc.args, err, tc.want)
		}
	}
	// A recycled container serves either engine's restores.
	for _, eng := range []engine.Name{engine.NameDMTCP, engine.NameCRIU} {
		args := []string{"-recycle", "-wait", "/fog/ctl/order", "-root", "/fog/mnt/root", "-engine", string(eng)}
		if c, err := parseConfig(modeRestart, args, io.Discard); err != nil || !c.recycle {
			t.Errorf("restart %q: %+v, %v; want a recycled container", args, c, err)
		}
	}
}

func TestGenerations(t *testing.T) {
	ck := t.TempDir()
	write := func(rel string) {
		t.Helper()
		p := filepath.Join(ck, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gens, err := generations(ck)
	if err != nil || len(gens) != 0 || nextGeneration(gens) != 1 {
		t.Fatalf("empty dir: %v %v next %d", gens, err, nextGeneration(gens))
	}
	if _, err := pickRestore(ck, gens, 0); !errors.Is(err, errNoCheckpoint) {
		t.Errorf("pickRestore on empty dir: %v", err)
	}
	write("1/ckpt_a_1.dmtcp")
	write("1/" + dmtcpctl.RestartScript)
	write("2/ckpt_a_2.dmtcp")
	write("2/" + dmtcpctl.RestartScript)
	write("3/ckpt_a_3.dmtcp.temp") // a checkpoint that died half way
	write("10/ckpt_a_10.dmtcp")    // image without the coordinator's marker
	write("notes/ckpt_x.dmtcp")    // not a generation
	write("checkpoint.request")
	gens, err = generations(ck)
	if err != nil {
		t.Fatal(err)
	}
	var ns []int
	for _, g := range gens {
		ns = append(ns, g.n)
	}
	if len(ns) != 4 || ns[0] != 1 || ns[3] != 10 {
		t.Errorf("generations = %v, want [1 2 3 10]", ns)
	}
	if nextGeneration(gens) != 11 {
		t.Errorf("next = %d, want 11 (past every existing directory)", nextGeneration(gens))
	}
	g, err := pickRestore(ck, gens, 0)
	if err != nil || g.n != 2 || len(g.images) != 1 || filepath.Base(g.images[0]) != "ckpt_a_2.dmtcp" {
		t.Errorf("newest complete = %+v, %v; want generation 2", g, err)
	}
	if g, err := pickRestore(ck, gens, 1); err != nil || g.n != 1 {
		t.Errorf("-from 1 = %+v, %v", g, err)
	}
	for _, from := range []int{3, 10, 7} {
		if _, err := pickRestore(ck, gens, from); !errors.Is(err, errNoCheckpoint) {
			t.Errorf("-from %d: %v, want errNoCheckpoint", from, err)
		}
	}
}

func TestUnescape(t *testing.T) {
	if got := unescape(`PING\r\n\\r`); got != "PING\r\n\\r" {
		t.Errorf("unescape = %q", got)
	}
}

func TestLookupUser(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	passwd := "root:x:0:0:root:/root:/bin/bash\n# a comment\npostgres:x:100:102:PostgreSQL:/var/lib/postgresql:/bin/bash\ntoor:x:0:0::/:/bin/sh\nbad:x:notanumber:1::/:/bin/sh\n"
	group := "root:x:0:\nssl-cert:x:101:postgres,other\npostgres:x:102:\nadm:x:4:\n"
	if err := os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "group"), []byte(group), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		spec string
		want account
	}{
		{"postgres", account{uid: 100, gid: 102, groups: []uint32{102, 101}, home: "/var/lib/postgresql"}},
		{"postgres:adm", account{uid: 100, gid: 4, groups: []uint32{4}, home: "/var/lib/postgresql"}},
		{"100", account{uid: 100, gid: 102, groups: []uint32{102, 101}, home: "/var/lib/postgresql"}},
		{"4242", account{uid: 4242, gid: 0, groups: []uint32{0}}},
		{"4242:4343", account{uid: 4242, gid: 4343, groups: []uint32{4343}}},
	} {
		got, err := lookupUser(root, tc.spec)
		if err != nil {
			t.Errorf("lookupUser(%q): %v", tc.spec, err)
			continue
		}
		if got.uid != tc.want.uid || got.gid != tc.want.gid || got.home != tc.want.home || !slices.Equal(got.groups, tc.want.groups) {
			t.Errorf("lookupUser(%q) = %+v, want %+v", tc.spec, got, tc.want)
		}
	}
	for spec, want := range map[string]string{
		"nobody":         `no user "nobody"`,
		"postgres:wheel": `no group "wheel"`,
		"root":           "is root",
		"toor":           "is root",
		"0:4":            "is root",
		"bad":            "bad passwd entry",
		":100":           "want NAME",
		"a:b:c":          "want NAME",
	} {
		if _, err := lookupUser(root, spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("lookupUser(%q) = %v, want an error with %q", spec, err, want)
		}
	}
	if _, err := lookupUser(t.TempDir(), "4242"); err != nil {
		t.Errorf("a numeric user needs no /etc/passwd: %v", err)
	}
	if _, err := lookupUser(t.TempDir(), "postgres"); err == nil {
		t.Error("a user name without /etc/passwd: no error")
	}
}

func TestParseConfigUser(t *testing.T) {
	c, err := parseConfig(modeRestart, []string{"-user", "postgres"}, io.Discard)
	if err != nil || c.user != "postgres" {
		t.Fatalf("parseConfig -user: %+v, %v", c, err)
	}
}

// The app's user reopens the container's output pipes by path (DMTCP logs
// to /dev/stderr): shareOutput makes them writable for every user.
func TestShareOutput(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	f, err := os.CreateTemp(t.TempDir(), "regular")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	shareOutput(w, f)
	if st, _ := w.Stat(); st.Mode().Perm()&0o022 != 0o022 {
		t.Errorf("pipe mode %v, want group and others writable", st.Mode().Perm())
	}
	if st, _ := f.Stat(); st.Mode().Perm() != 0o600 {
		t.Errorf("a regular file was changed to %v; only pipes are shared", st.Mode().Perm())
	}
}

func TestOpenDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ckpt", "3")
	if err := openDir(dir); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o777 {
		t.Errorf("generation dir: %v, %v; want mode 0777", st, err)
	}
}

// fakeSupervisor returns a supervisor for a launch whose dmtcp_command runs
// script, with a goroutine reaping its children until the test ends.
func fakeSupervisor(t *testing.T, script string, flags ...string) (*supervisor, string) {
	t.Helper()
	dir := t.TempDir()
	prefix, ckpt := filepath.Join(dir, "dmtcp"), filepath.Join(dir, "ckpt")
	if err := os.MkdirAll(filepath.Join(prefix, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	// self stands in for the entrypoint's nocaps mode.
	self := "#!/bin/sh\nshift\nif [ \"$1\" = -root ]; then shift 2; fi\nexec \"$@\"\n"
	for name, body := range map[string]string{filepath.Join(prefix, "bin", "dmtcp_command"): script, filepath.Join(dir, "self"): self} {
		if err := os.WriteFile(name, []byte(strings.ReplaceAll(body, "CKPT", ckpt)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := parseConfig(modeLaunch, append([]string{"-prefix", prefix, "-ckpt", ckpt, "-checkpoint-timeout", "1m"}, append(flags, "--", "app")...), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s := newSupervisor(cfg, newLogger(io.Discard, "error", "text"), io.Discard)
	s.self, s.gen = filepath.Join(dir, "self"), 1
	if s.null, err = os.Open(os.DevNull); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop); s.null.Close() })
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
				s.reaper.reap()
			}
		}
	}()
	return s, ckpt
}

// A checkpoint whose app died on the way (DMTCP aborted it) fails soon
// after the app exits, not after the whole -checkpoint-timeout.
func TestCheckpointFailsSoonAfterTheAppExits(t *testing.T) {
	// dmtcp_command accepts the request; no image ever appears.
	s, _ := fakeSupervisor(t, "#!/bin/sh\necho 'Computation was checkpointed and killed.'\n")
	defer func(g time.Duration) { appGoneGrace = g }(appGoneGrace)
	appGoneGrace = 100 * time.Millisecond

	done, exitAfter := s.checkpoint("test")
	if !exitAfter {
		t.Error("a -kc checkpoint does not stop the app")
	}
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	close(s.appGone)
	select {
	case res := <-done:
		if !errors.Is(res.err, errCheckpoint) || !strings.Contains(res.err.Error(), "after the app exited") {
			t.Errorf("checkpoint result: %v; want a failure that says the app exited", res.err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("the checkpoint failed %s after the app exited", took)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the checkpoint still waits 30 s after the app exited")
	}
}

// -checkpoint-delay: dmtcp_command runs that long after the request, and
// the checkpoint's timing starts then.
func TestCheckpointDelay(t *testing.T) {
	s, ckpt := fakeSupervisor(t, "#!/bin/sh\nmkdir -p CKPT/1 && date +%s%N >CKPT/called && touch CKPT/1/ckpt_app_1.dmtcp CKPT/1/dmtcp_restart_script.sh\n",
		"-checkpoint-delay", "300ms")
	start := time.Now()
	done, _ := s.checkpoint("test")
	var res ckptResult
	select {
	case res = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("no checkpoint result after 30 s")
	}
	if res.err != nil || len(res.gen.images) != 1 {
		t.Fatalf("checkpoint: %+v", res)
	}
	b, err := os.ReadFile(filepath.Join(ckpt, "called"))
	if err != nil {
		t.Fatal(err)
	}
	ns, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if called := time.Unix(0, ns); called.Sub(start) < 300*time.Millisecond {
		t.Errorf("dmtcp_command ran %s after the request, want at least the 300ms delay", called.Sub(start))
	}
	if res.gen.started.Sub(start) < 300*time.Millisecond {
		t.Errorf("the checkpoint's timing starts %s after the request, want after the delay", res.gen.started.Sub(start))
	}
	if _, err := parseConfig(modeLaunch, []string{"-checkpoint-delay", "2h", "app"}, io.Discard); err == nil {
		t.Error("-checkpoint-delay 2h accepted")
	}
}

// TestHTTPReady probes real HTTP servers the way the entrypoint does.
func TestHTTPReady(t *testing.T) {
	var code atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" || r.Method != http.MethodGet {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		w.WriteHeader(int(code.Load()))
	}))
	defer srv.Close()
	probe := func(path string, status int) bool {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return httpReady(c, path, status)
	}
	for _, tc := range []struct {
		serves    int
		path      string
		status    int
		wantReady bool
	}{
		{200, "/health", 0, true},
		{204, "/health", 0, true},
		{503, "/health", 0, false},
		{302, "/health", 0, false},
		{302, "/health", 302, true},
		{200, "/health", 204, false},
		{200, "/other", 0, false},
	} {
		code.Store(int32(tc.serves))
		if got := probe(tc.path, tc.status); got != tc.wantReady {
			t.Errorf("server answers %d, GET %s, want status %d: ready %v, want %v", tc.serves, tc.path, tc.status, got, tc.wantReady)
		}
	}
	// Not HTTP at all (redis answering an HTTP request).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, _ = io.WriteString(c, "-ERR unknown command 'GET'\r\n")
			c.Close()
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if httpReady(c, "/", 0) {
		t.Error("a non-HTTP reply counted as ready")
	}
}

// -wait: the entrypoint waits until the order file appears (written whole
// by a rename, as the host does), returns what it names, and records the
// wait; a termination signal before any order ends the wait as released.
func TestWaitOrder(t *testing.T) {
	dir := t.TempDir()
	orderFile := filepath.Join(dir, "order")
	cfg, err := parseConfig(modeRestart, []string{"-wait", orderFile}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var tm strings.Builder
	s := newSupervisor(cfg, newLogger(io.Discard, "error", "text"), &tm)
	sigs := make(chan os.Signal, 1)
	type result struct {
		o   instancectl.OrderBody
		err error
	}
	got := make(chan result, 1)
	go func() {
		o, err := s.waitOrder(sigs)
		got <- result{o, err}
	}()
	select {
	case r := <-got:
		t.Fatalf("waitOrder returned %+v before any order", r)
	case <-time.After(200 * time.Millisecond):
	}
	if err := os.WriteFile(orderFile+".tmp", []byte(`{"deployment":"web-1a2b3c4d","node":"n2"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(orderFile+".tmp", orderFile); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.err != nil || r.o.Deployment != "web-1a2b3c4d" || r.o.Node != "n2" {
			t.Errorf("waitOrder = %+v, %v; want the order's deployment and node", r.o, r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waitOrder did not see the order within 5 s")
	}
	if !strings.Contains(tm.String(), `"phase":"order"`) {
		t.Errorf("timings %q lack the order phase", tm.String())
	}

	// Released before an order.
	cfg2, _ := parseConfig(modeRestart, []string{"-wait", filepath.Join(t.TempDir(), "order")}, io.Discard)
	s2 := newSupervisor(cfg2, newLogger(io.Discard, "error", "text"), io.Discard)
	sigs2 := make(chan os.Signal, 1)
	sigs2 <- syscall.SIGTERM
	if _, err := s2.waitOrder(sigs2); !errors.Is(err, errReleased) {
		t.Errorf("waitOrder after SIGTERM = %v; want errReleased", err)
	}
	if _, err := parseConfig(modeRestart, []string{"-wait", "rel/order"}, io.Discard); err == nil || !strings.Contains(err.Error(), "-wait") {
		t.Errorf("-wait with a relative path: %v; want an error naming -wait", err)
	}
}

// TestWarm: a slot waiting for its order reads its generation's images
// once and says how many bytes it read; a missing image is reported.
func TestWarm(t *testing.T) {
	ckpt := t.TempDir()
	dir := filepath.Join(ckpt, "3")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, size := range map[string]int{"ckpt_a_1.dmtcp": 3 << 20, "ckpt_b_2.dmtcp": 12345, dmtcpctl.RestartScript: 10} {
		if err := os.WriteFile(filepath.Join(dir, name), make([]byte, size), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	g, err := readGeneration(ckpt, 3)
	if err != nil {
		t.Fatal(err)
	}
	var tm strings.Builder
	s := newSupervisor(&config{}, newLogger(io.Discard, "error", "text"), &tm)
	s.warm(g)
	var line timing
	if err := json.Unmarshal([]byte(strings.TrimSpace(tm.String())), &line); err != nil {
		t.Fatalf("timings %q: %v", tm.String(), err)
	}
	if line.Phase != "warm" || line.Gen != 3 || line.Bytes != 3<<20+12345 || line.Error != "" {
		t.Errorf("warm timing = %+v; want phase warm, gen 3, %d bytes, no error", line, 3<<20+12345)
	}

	g.images = append(g.images, filepath.Join(dir, "ckpt_gone_3.dmtcp"))
	tm.Reset()
	s.warm(g)
	if !strings.Contains(tm.String(), `"error":`) {
		t.Errorf("warm of a missing image: timings %q; want an error", tm.String())
	}
}

// TestAppCapsMatchRuntime: the capabilities a CRIU container's app keeps
// are the ones the runtime documents and grants the container.
func TestAppCapsMatchRuntime(t *testing.T) {
	names := strings.Split(appCapNames, ",")
	if want := runtime.CRIUAppCapabilities(); !slices.Equal(names, want) {
		t.Fatalf("appCapNames = %v; runtime.CRIUAppCapabilities = %v", names, want)
	}
	if len(appCaps) != len(names) {
		t.Fatalf("appCaps has %d entries, appCapNames %d", len(appCaps), len(names))
	}
	for _, n := range names {
		m, err := runtime.CapMask([]string{n})
		if err != nil || m != 1<<appCaps[n] {
			t.Errorf("capability %s: number %d here, mask %#x, %v in the runtime", n, appCaps[n], m, err)
		}
	}
	granted, _ := runtime.CapMask(runtime.CRIUCapabilities())
	kept, _ := runtime.CapMask(names)
	if kept&^granted != 0 {
		t.Errorf("the app keeps %#x that the CRIU container is not granted", kept&^granted)
	}
}

// TestNoCapsKeepRefusesOthers: an app may keep only the documented set.
func TestNoCapsKeepRefusesOthers(t *testing.T) {
	if code := noCaps([]string{"-keep", "SYS_ADMIN", "/bin/true"}); code != exitUsage {
		t.Fatalf("nocaps -keep SYS_ADMIN = %d; want %d", code, exitUsage)
	}
}

// TestNoCapsUnknownUser: nocaps -user of a user the root lacks fails
// naming it, before it changes anything.
func TestNoCapsUnknownUser(t *testing.T) {
	if code := noCaps([]string{"-user", "fogdeploy-no-such-user", "/bin/true"}); code != exitSetup {
		t.Fatalf("nocaps -user fogdeploy-no-such-user = %d; want %d", code, exitSetup)
	}
}

// TestIdentityDirMatchesDeployer: the identity is bound where the
// deployer tells the app to read it.
func TestIdentityDirMatchesDeployer(t *testing.T) {
	if want := path.Dir(spec.IdentityFile); "/"+identityDir != want {
		t.Errorf("the identity is bound at /%s; the deployer names %s", identityDir, want)
	}
}

// TestUnbindable: a release finds the listening ports in the socket
// table, and a port can be bound again once its listener is gone, even
// with a connection it accepted still open; not while a socket without
// SO_REUSEADDR listens there.
func TestUnbindable(t *testing.T) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if !listeningPorts()[listener{port, false}] {
		t.Fatalf("listeningPorts lacks %d", port)
	}
	ports := map[listener]bool{{port, false}: true}
	if u := unbindable(ports); u == nil {
		t.Errorf("port %d is bindable while it is listened on", port)
	}
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Close()
	_ = s.Close() // the app's side closes first: TIME_WAIT once the peer does
	_ = c.Close()
	if u := unbindable(ports); u != nil {
		t.Errorf("port %d after its listener and connection closed: %v; want bindable", port, u.err)
	}
}

// asEntrypoint, set in a child's environment, makes this test binary run
// as the entrypoint (TestMain): the internal modes a test starts (read).
const asEntrypoint = "FOGDEPLOY_TEST_AS_ENTRYPOINT"

func TestMain(m *testing.M) {
	if os.Getenv(asEntrypoint) == "1" {
		os.Exit(Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// TestReadAs: images that only their owner may read (a user's app, 0600)
// are read by a child running as that owner, which says how many bytes it
// read; a file the owner cannot read either is an error naming the uid.
func TestReadAs(t *testing.T) {
	testenv.NeedRoot(t)
	t.Setenv(asEntrypoint, "1")
	// Not t.TempDir: its parent is root's alone, and the child must reach
	// the files and run the binary.
	dir, err := os.MkdirTemp("", "entrypoint-read-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const nobody = 65534
	theirs, roots := filepath.Join(dir, "ckpt_a_1.dmtcp"), filepath.Join(dir, "ckpt_b_2.dmtcp")
	for _, f := range []string{theirs, roots} {
		if err := os.WriteFile(f, make([]byte, 12345), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(theirs, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	// The test binary's own directory is root's alone: a copy the owner
	// may run.
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	s := newSupervisor(&config{}, newLogger(io.Discard, "error", "text"), io.Discard)
	s.self = filepath.Join(dir, "entrypoint")
	if err := os.WriteFile(s.self, self, 0o755); err != nil {
		t.Fatal(err)
	}
	if o, ok := ownerOf(theirs); !ok || o != (owner{nobody, nobody}) {
		t.Errorf("owner of %s = %+v, %v; want uid and gid %d", theirs, o, ok, nobody)
	}
	if n, err := s.readAs(owner{nobody, nobody}, []string{theirs, theirs}); err != nil || n != 2*12345 {
		t.Errorf("read as its owner = %d bytes, %v; want %d, no error", n, err, 2*12345)
	}
	if _, err := s.readAs(owner{nobody, nobody}, []string{theirs, roots}); err == nil || !strings.Contains(err.Error(), "uid 65534") || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("read of root's 0600 file as uid %d = %v; want permission denied naming the uid", nobody, err)
	}
}

// The app's variables are the app's alone: a container whose environment
// names the supervisor's settings (its engines' prefixes, its PATH)
// changes none of them, and the app's environment is its -env flags, not
// the container's.
func TestAppEnvSteersNothing(t *testing.T) {
	t.Setenv("FOG_DMTCP_PREFIX", "/nonexistent-fog")
	t.Setenv("FOG_CRIU_PREFIX", "/fog/root/opt/x")
	t.Setenv("PATH", "/fog/root/bin")
	t.Setenv("SUPERVISOR_ONLY", "1")
	cfg, err := parseConfig(modeLaunch, []string{"-engine", "criu", "-env", "PATH=/app/bin", "-env", "FOG_CRIU_PREFIX=/app", "--", "app"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.prefix != imageDMTCPPrefix || cfg.criuPrefix != imageCRIUPrefix {
		t.Errorf("prefixes %s, %s; want the image's %s, %s whatever the environment says", cfg.prefix, cfg.criuPrefix, imageDMTCPPrefix, imageCRIUPrefix)
	}
	ownEnv()
	if got := os.Environ(); !slices.Equal(got, []string{"PATH=" + ownPath, "LC_ALL=C"}) && !slices.Equal(got, []string{"LC_ALL=C", "PATH=" + ownPath}) {
		t.Errorf("the entrypoint's own environment = %q; want its PATH and locale alone", got)
	}
	s := &supervisor{cfg: cfg}
	env := s.appEnv()
	for _, want := range []string{"PATH=/app/bin", "FOG_CRIU_PREFIX=/app", "HOME=/root"} {
		if !slices.Contains(env, want) {
			t.Errorf("app env %q lacks %s", env, want)
		}
	}
	if slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "SUPERVISOR_ONLY=") }) {
		t.Errorf("app env %q has the container's own variable", env)
	}
	for _, bad := range []string{"NOEQUALS", "=value", "K=a\x00b"} {
		if _, err := parseConfig(modeLaunch, []string{"-env", bad, "--", "app"}, io.Discard); err == nil {
			t.Errorf("-env %q accepted", bad)
		}
	}
}

// A restart ordered lazy (a resume's order) restores lazily under an
// engine that can, as -lazy does; the next order of a recycled container
// that does not ask it restores eagerly again; other engines never do.
func TestOrderedLazy(t *testing.T) {
	for _, c := range []struct {
		eng     engine.Name
		flag    bool
		ordered []bool
		want    []bool
	}{
		{engine.NameCRIU, false, []bool{true, false}, []bool{true, false}},
		{engine.NameCRIU, true, []bool{false}, []bool{true}},
		{engine.NameDMTCP, false, []bool{true}, []bool{false}},
	} {
		dir := t.TempDir()
		args := []string{"-wait", filepath.Join(dir, "order"), "-engine", string(c.eng)}
		if c.flag {
			args = append(args, "-lazy")
		}
		cfg, err := parseConfig(modeRestart, args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		s := newSupervisor(cfg, newLogger(io.Discard, "error", "text"), io.Discard)
		for i, lazy := range c.ordered {
			b, _ := json.Marshal(instancectl.OrderBody{Deployment: "web-1a2b3c4d", Lazy: lazy})
			if err := os.WriteFile(cfg.wait, b, 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := s.waitOrder(make(chan os.Signal)); err != nil {
				t.Fatal(err)
			}
			if got := s.lazyRestore(); got != c.want[i] {
				t.Errorf("%s, -lazy %v, order %d lazy %v: restores lazily %v; want %v", c.eng, c.flag, i, lazy, got, c.want[i])
			}
			_ = os.Remove(cfg.wait)
		}
	}
}
