//go:build !no_ceph

// Package e2e runs a PoP of several pop-agent processes on one machine
// against one etcd, the dev Ceph and the dev dockerd, and checks what an
// operator and a mobile-app backend observe.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/devenv"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/scheduler"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

type pop struct {
	t      *testing.T
	bin    string
	dir    string
	env    []string
	st     *state.Store
	agents map[string]*exec.Cmd
	apis   map[string]string
	// frontends are the agents' front-end addresses, one per node name
	// (127.0.1.N: the dev PoP's are 127.0.0.N), kept across restarts.
	frontends map[string]string
}

// frontend is node name's front-end address.
func (p *pop) frontend(name string) string {
	if a, ok := p.frontends[name]; ok {
		return a
	}
	a := "127.0.1." + strconv.Itoa(len(p.frontends)+1)
	p.frontends[name] = a
	return a
}

// startAgent runs pop-agent NAME as its own process; with token, the hook
// API requires it.
func (p *pop) startAgent(name, token string) {
	t := p.t
	port := freePort(t)
	args := []string{"--node", name, "--state-dir", filepath.Join(p.dir, name), "--listen", "127.0.0.1:" + strconv.Itoa(port)}
	env := append(p.env, "FOGDEPLOY_FRONTEND_LISTEN="+p.frontend(name))
	if token == "" {
		args = append(args, "--dev")
	} else {
		tf := filepath.Join(p.dir, name+".token")
		if err := os.WriteFile(tf, []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		env = append(env, "FOGDEPLOY_TOKEN_FILE="+tf)
	}
	logf, err := os.Create(filepath.Join(p.dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(p.bin, args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.agents[name], p.apis[name] = cmd, "127.0.0.1:"+strconv.Itoa(port)
	// An agent serves once it has recovered what its node holds: undoing a
	// deployment whose instance does not stop takes up to the driver's stop
	// timeout and the deployer's stop grace (10 + 30 s), as after a kill in
	// the middle of an undeploy.
	for i := 0; i < 600; i++ {
		if resp, err := http.Get("http://" + p.apis[name] + "/healthz"); err == nil {
			resp.Body.Close()
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	out, _ := os.ReadFile(logf.Name())
	t.Fatalf("agent %s did not start:\n%s", name, out)
}

// logged returns every match of re in the agents' logs: the names they
// gave what they made, told apart from what another PoP's agents on the
// same dockerd made.
func (p *pop) logged(re *regexp.Regexp) map[string]bool {
	p.t.Helper()
	logs, err := filepath.Glob(filepath.Join(p.dir, "*.log"))
	if err != nil {
		p.t.Fatal(err)
	}
	found := map[string]bool{}
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			p.t.Fatal(err)
		}
		for _, m := range re.FindAll(b, -1) {
			found[string(m)] = true
		}
	}
	return found
}

// fogctl runs fogctl against the PoP and returns its stdout, stderr and
// exit code.
func (p *pop) fogctl(ctx context.Context, args ...string) (string, string, int) {
	cmd := exec.CommandContext(ctx, filepath.Join(filepath.Dir(p.bin), "fogctl"), args...)
	cmd.Env = p.env
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		p.t.Fatalf("fogctl %v: %v", args, err)
	}
	return stdout.String(), stderr.String(), code
}

func (p *pop) stopAgent(name string, sig syscall.Signal) {
	cmd := p.agents[name]
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	ps, err := cmd.Process.Wait()
	delete(p.agents, name)
	// Told to stop, an agent drains its hooks, stops its loops, waits for
	// the operations under way and exits 0.
	if sig == syscall.SIGTERM && err == nil && !ps.Success() {
		p.t.Errorf("agent %s: %v after SIGTERM; want a clean shutdown (exit 0)", name, ps)
	}
}

func (p *pop) waitAll(ctx context.Context, app string, n int) []state.Deployment {
	t := p.t
	for ctx.Err() == nil {
		deps, err := p.st.Deployments(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var mine []state.Deployment
		running := 0
		for _, d := range deps {
			if d.App != app {
				continue
			}
			mine = append(mine, d)
			switch d.Status.Phase {
			case spec.PhaseRunning:
				running++
			case spec.PhaseFailed:
				t.Fatalf("deployment %s failed on %s: %s", d.ID, d.Node, d.Status.Error)
			}
		}
		if running == n && len(mine) == n {
			return mine
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%d deployments of %s not Running in time", n, app)
	return nil
}

func hook(t *testing.T, method, url, token, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var v map[string]any
	_ = json.Unmarshal(b, &v)
	return resp.StatusCode, v
}

// binaries are pop-agent and fogctl as built once for the test process
// (built).
var binaries struct {
	once sync.Once
	dir  string
	err  error
}

// built returns the directory of pop-agent and fogctl, built from the
// repository the first time a test asks: a build costs seconds, the same
// for every PoP a test starts.
func built(t *testing.T) string {
	t.Helper()
	binaries.once.Do(func() {
		dir, err := os.MkdirTemp("", "fogdeploy-e2e-bin-")
		if err != nil {
			binaries.err = err
			return
		}
		binaries.dir = dir
		for _, b := range []string{"pop-agent", "fogctl"} {
			build := exec.Command("go", "build", "-tags=pacific", "-o", filepath.Join(dir, b), "./"+b)
			build.Dir = deploytest.RepoRoot()
			if out, err := build.CombinedOutput(); err != nil {
				binaries.err = fmt.Errorf("build %s: %v\n%s", b, err, out)
				return
			}
		}
	})
	if binaries.err != nil {
		t.Fatal(binaries.err)
	}
	return binaries.dir
}

// TestMain removes the binaries the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	if binaries.dir != "" {
		os.RemoveAll(binaries.dir)
	}
	os.Exit(code)
}

// startPoP builds pop-agent, starts an embedded etcd in this process and
// one agent process per name (the last one with the hook token, if any),
// running DMTCP apps with dmtcpImage. Cleanup withdraws every deployment,
// waits for the agents to undo them, stops the agents and checks that no
// container of app is left.
func startPoP(ctx context.Context, t *testing.T, f *deploytest.Fixture, app, dmtcpImage, token string, names ...string) *pop {
	c := testenv.CephCluster(t)
	dir, err := os.MkdirTemp("", "fogdeploy-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	bins := built(t)
	bin := filepath.Join(bins, "pop-agent")

	// One etcd for the PoP: the embedded one, in this process; it closes
	// after the cleanup below, which uses it.
	endpoint, st := statetest.Start(t)

	p := &pop{t: t, bin: bin, dir: dir, st: st, agents: map[string]*exec.Cmd{}, apis: map[string]string{}, frontends: map[string]string{},
		// No spare slots unless a test asks for them (a later value wins).
		env: append(os.Environ(), "FOGDEPLOY_SPARE_SLOTS=0", "FOGDEPLOY_ETCD_ENDPOINTS="+endpoint, "FOGDEPLOY_DMTCP_IMAGE="+dmtcpImage,
			"FOGDEPLOY_BOOT_IMAGE=fogdeploy/boot:deploytest",
			devenv.EnvCephConf+"="+c.Conf, devenv.EnvCephKeyring+"="+c.Keyring, devenv.EnvCephPool+"="+c.Pool,
			devenv.EnvDockerHost+"="+devenv.Lookup(devenv.EnvDockerHost, devenv.DockerHost()))}
	for i, n := range names {
		tok := ""
		if i == len(names)-1 {
			tok = token
		}
		p.startAgent(n, tok)
	}
	t.Cleanup(func() {
		// Withdraw everything, let the agents undo it, then stop them.
		cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer ccancel()
		deps, _ := st.Deployments(cctx)
		for _, d := range deps {
			// A suspended one's images go with it.
			_ = scheduler.Undeploy(cctx, st, f.L.Store, d.ID)
		}
		for i := 0; i < 300 && cctx.Err() == nil; i++ {
			if n, err := statetest.CountNow(cctx, st, "status/"); err == nil && n == 0 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		for n := range p.agents {
			p.stopAgent(n, syscall.SIGTERM)
		}
		f.RemoveGenerations(t, app)
		if sts, _ := f.RT.List(context.Background(), map[string]string{runtime.LabelApp: app}); len(sts) > 0 {
			t.Errorf("containers left: %d", len(sts))
		}
		deploytest.AssertNothingLeft(t, f, app, false)
		if !t.Failed() && os.Getenv("FOGDEPLOY_KEEP_LOGS") == "" {
			os.RemoveAll(dir)
		} else {
			t.Logf("agent logs kept in %s", dir)
		}
	})
	return p
}

// TestPoP: 3 agents; 6 deploys without --node spread over the nodes, with
// exactly one checkpoint and 5 restores, all Running with per-phase
// timings.
func TestPoP(t *testing.T) {
	f := deploytest.NewFixture(t, "container")
	if _, _, err := f.D.Drivers().CheckEngine(context.Background(), engine.NameDMTCP); err != nil {
		testenv.Unavailable(t, testenv.DMTCP, err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	app := deploytest.RedisApp("e2e-redis-"+strconv.FormatInt(time.Now().UnixNano()%1e6, 36), f.Env, engine.NameDMTCP)
	p := startPoP(ctx, t, f, app.Name, "fogdeploy/dmtcp:deploytest", "", "n1", "n2", "n3")
	st := p.st
	if err := st.CreateApp(ctx, app, false); err != nil {
		t.Fatal(err)
	}

	// 6 deploys, placed by the scoring function (the path of fogctl deploy).
	for range 6 {
		if _, err := createDeployment(ctx, st, app.Name); err != nil {
			t.Fatal(err)
		}
	}
	deps := p.waitAll(ctx, app.Name, 6)
	perNode, booted := map[string]int{}, 0
	for _, d := range deps {
		perNode[d.Node]++
		if d.Status.Booted {
			booted++
		}
		if d.Status.Mode != spec.ModeRestore || len(d.Status.Timings) < 5 || d.Status.Ports["6379/tcp"] == "" {
			t.Errorf("%s: mode %q, timings %v, ports %v; want a restore with its phases and port", d.ID, d.Status.Mode, d.Status.Timings, d.Status.Ports)
		}
		if got, err := testenv.RedisDo(ctx, nil, d.Status.Ports["6379/tcp"], "PING"); err != nil || got != "PONG" {
			t.Errorf("%s on %s: PING = %q, %v", d.ID, d.Node, got, err)
		}
	}
	if len(perNode) != 3 || perNode["n1"] != 2 || perNode["n2"] != 2 || perNode["n3"] != 2 {
		t.Errorf("instances per node = %v; want 2 on each of 3", perNode)
	}
	gens, err := st.Checkpoints(ctx, app.Name)
	if err != nil || len(gens) != 1 || booted != 1 {
		t.Errorf("checkpoints = %d (%v), booted deployments = %d; want exactly one of each", len(gens), err, booted)
	}
	out, errOut, code := p.fogctl(ctx, "ps", "-o", "json")
	var ps []state.Deployment
	if err := json.Unmarshal([]byte(out), &ps); code != 0 || err != nil || len(ps) != 6 || len(ps[0].Status.Timings) < 5 {
		t.Errorf("fogctl ps -o json = %d, %v, %d deployments; want 6 with their phases\n%s", code, err, len(ps), errOut)
	}

	// A refresh seals generation 2; later deploys restore it; generation 1
	// cannot be removed while instances use it.
	out, errOut, code = p.fogctl(ctx, "checkpoint", "refresh", app.Name, "-o", "json")
	var g spec.Generation
	if err := json.Unmarshal([]byte(out), &g); code != 0 || err != nil || g.Gen != 2 || g.Bytes <= 0 {
		t.Fatalf("fogctl checkpoint refresh = %d, %v, %+v\n%s", code, err, g, errOut)
	}
	if !strings.Contains(errOut, "checkpoint") || !strings.Contains(errOut, "seal") {
		t.Errorf("refresh did not show its phases:\n%s", errOut)
	}
	out, errOut, code = p.fogctl(ctx, "deploy", app.Name, "--wait", "-o", "json")
	var d state.Deployment
	if err := json.Unmarshal([]byte(out), &d); code != 0 || err != nil || d.Status.Gen != 2 || d.Status.Mode != spec.ModeRestore {
		t.Errorf("deploy after the refresh = %d, %v, gen %d mode %q; want a restore of generation 2\n%s", code, err, d.Status.Gen, d.Status.Mode, errOut)
	}
	if _, errOut, code = p.fogctl(ctx, "checkpoint", "rm", app.Name, "1"); code == 0 || !strings.Contains(errOut, "used by 6") {
		t.Errorf("checkpoint rm of a generation in use = exit %d:\n%s", code, errOut)
	}
	if out, _, _ := p.fogctl(ctx, "checkpoint", "ls", app.Name, "-o", "json"); strings.Count(out, `"gen"`) != 2 {
		t.Errorf("checkpoint ls after a refused rm:\n%s", out)
	}
}

// TestPoPWithoutEngine needs no checkpoint engine, so it runs on every CI
// machine: 2 agents on nodes without DMTCP boot the app normally; the hook
// API deploys (also with mode boot) and refuses bad input (4xx, nothing
// written); a killed agent's node turns NotReady after the lease TTL; a
// restarted agent re-adopts its instances and undeploys what was withdrawn
// meanwhile.
func TestPoPWithoutEngine(t *testing.T) {
	f := deploytest.NewBootFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	app := deploytest.BusyboxHTTPApp("e2e-web-"+strconv.FormatInt(time.Now().UnixNano()%1e6, 36), f.Env)
	const token = "e2e-token-0123456789abcdef"
	p := startPoP(ctx, t, f, app.Name, "fogdeploy/dmtcp:absent", token, "n1", "n2")
	st := p.st
	if err := st.CreateApp(ctx, app, false); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if _, err := createDeployment(ctx, st, app.Name); err != nil {
			t.Fatal(err)
		}
	}
	deps := p.waitAll(ctx, app.Name, 4)
	perNode := map[string]int{}
	for _, d := range deps {
		perNode[d.Node]++
		if d.Status.Mode != spec.ModeBoot || !strings.Contains(d.Status.BootReason, "no checkpoint engine") {
			t.Errorf("%s: mode %q reason %q; want boot, for want of an engine", d.ID, d.Status.Mode, d.Status.BootReason)
		}
		if body := testenv.HTTPGet(ctx, t, "http://"+d.Status.Ports["8080/tcp"]+"/"); !strings.HasPrefix(body, "served by ") {
			t.Errorf("%s on %s answers %q", d.ID, d.Node, body)
		}
	}
	if perNode["n1"] != 2 || perNode["n2"] != 2 {
		t.Errorf("instances per node = %v; want 2 on each of 2", perNode)
	}
	if gens, err := st.Checkpoints(ctx, app.Name); err != nil || len(gens) != 0 {
		t.Errorf("checkpoints = %v, %v; want none", gens, err)
	}
	// Live deployments are never garbage, however young (what another
	// test left in the same cluster may be).
	out, errOut, code := p.fogctl(ctx, "gc", "--dry-run", "--min-age", "0s", "-o", "json")
	var plan []struct {
		Name   string   `json:"name"`
		Images []string `json:"images"`
	}
	if err := json.Unmarshal([]byte(out), &plan); code != 0 || err != nil {
		t.Errorf("fogctl gc --dry-run with 4 deployments running = exit %d, %v: %s\n%s", code, err, out, errOut)
	}
	for _, it := range plan {
		if strings.Contains(it.Name, app.Name) || slices.ContainsFunc(it.Images, func(img string) bool { return strings.Contains(img, app.Name) }) {
			t.Errorf("fogctl gc --dry-run with 4 deployments running would remove %s %v, of the running app %s", it.Name, it.Images, app.Name)
		}
	}
	// Each node says why it has no DMTCP engine: the configured image is absent.
	out, errOut, code = p.fogctl(ctx, "node", "ls")
	if code != 0 || strings.Count(out, "no dmtcp: driver unavailable: DMTCP image fogdeploy/dmtcp:absent is not on this node") != 2 ||
		!strings.Contains(out, "make dmtcp-image") {
		t.Errorf("fogctl node ls on nodes without a DMTCP image = exit %d:\n%s%s", code, out, errOut)
	}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 7 && (f[0] == "n1" || f[0] == "n2") && strings.Contains(f[5], "dmtcp") {
			t.Errorf("node %s lists the dmtcp engine without a DMTCP image: %s", f[0], l)
		}
	}
	if out, _, _ := p.fogctl(ctx, "node", "ls", "-o", "json"); !strings.Contains(out, `"problems"`) {
		t.Errorf("fogctl node ls -o json has no problems:\n%s", out)
	}
	before := len(deps)
	if _, errOut, code := p.fogctl(ctx, "checkpoint", "refresh", app.Name); code == 0 || !strings.Contains(errOut, "no node has the dmtcp engine") {
		t.Errorf("checkpoint refresh without an engine = exit %d:\n%s", code, errOut)
	}
	if all, _ := st.Deployments(ctx); len(all) != before {
		t.Errorf("a refused refresh left %d deployment records", len(all)-before)
	}
	if _, errOut, code := p.fogctl(ctx, "deploy", app.Name, "--mode", "fast"); code != 2 || !strings.Contains(errOut, "--mode") {
		t.Errorf("deploy --mode fast = exit %d; want 2 (usage) naming --mode:\n%s", code, errOut)
	}

	// The hook API.
	count := func() int64 { return statetest.Count(ctx, t, st, "deployments/") }
	before = int(count())
	api1, api2 := "http://"+p.apis["n1"]+"/v1/deployments", "http://"+p.apis["n2"]+"/v1/deployments"
	for _, bad := range []struct {
		name, url, token, body string
		code                   int
	}{
		{"unknown app", api1, "", `{"app":"no-such-app"}`, 404},
		{"unknown node", api1, "", `{"app":"` + app.Name + `","node":"n9"}`, 404},
		{"malformed", api1, "", `{"app":`, 400},
		{"unknown field", api1, "", `{"app":"` + app.Name + `","replicas":3}`, 400},
		{"bad name", api1, "", `{"app":"Bad Name"}`, 400},
		{"bad mode", api1, "", `{"app":"` + app.Name + `","mode":"fast"}`, 400},
		{"oversized", api1, "", `{"app":"` + strings.Repeat("a", 20000) + `"}`, 413},
		{"no token", api2, "", `{"app":"` + app.Name + `"}`, 401},
		{"wrong token", api2, "nope", `{"app":"` + app.Name + `"}`, 401},
	} {
		if code, body := hook(t, "POST", bad.url, bad.token, bad.body); code != bad.code || body["error"] == nil {
			t.Errorf("%s: %d %v; want %d with an error message", bad.name, code, body, bad.code)
		}
	}
	if after := int(count()); after != before {
		t.Errorf("bad requests wrote %d deployments", after-before)
	}
	code, body := hook(t, "POST", api2, token, `{"app":"`+app.Name+`","mode":"boot","labels":{"user":"alice"}}`)
	if code != 201 {
		t.Fatalf("hook create: %d %v", code, body)
	}
	id := body["id"].(string)
	p.waitAll(ctx, app.Name, 5)
	if code, body := hook(t, "GET", api2+"/"+id, token, ""); code != 200 || body["status"].(map[string]any)["phase"] != string(spec.PhaseRunning) ||
		body["status"].(map[string]any)["boot_reason"] != "requested" {
		t.Errorf("hook get: %d %v; want Running, booted as requested", code, body)
	}
	if code, _ := hook(t, "DELETE", api2+"/"+id, token, ""); code != 202 {
		t.Errorf("hook delete: %d", code)
	}

	// Kill n1 outright: its node turns NotReady once its lease expires.
	p.stopAgent("n1", syscall.SIGKILL)
	deadline := time.Now().Add(15 * time.Second)
	for {
		nodes, err := st.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ready := map[string]bool{}
		for _, n := range nodes {
			ready[n.Name] = n.Ready
		}
		if !ready["n1"] && ready["n2"] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node n1 still Ready 15 s after its agent was killed: %v", ready)
		}
		time.Sleep(250 * time.Millisecond)
	}
	// While n1 is down, withdraw one of its deployments; the restarted
	// agent keeps the other (still running) and undeploys the withdrawn one.
	var n1 []string
	for _, d := range deps {
		if d.Node == "n1" {
			n1 = append(n1, d.ID)
		}
	}
	if err := st.DeleteDeployment(ctx, n1[0]); err != nil {
		t.Fatal(err)
	}
	p.startAgent("n1", "")
	for i := 0; ; i++ {
		d, err := st.Deployment(ctx, n1[1])
		left, cerr := statetest.CountNow(ctx, st, "status/"+n1[0])
		if err == nil && d.Status.Phase == spec.PhaseRunning && cerr == nil && left == 0 {
			break
		}
		if i > 300 {
			t.Fatalf("after restarting n1: %s is %q, withdrawn %s still has a status", n1[1], d.Status.Phase, n1[0])
		}
		time.Sleep(100 * time.Millisecond)
	}
	d, err := st.Deployment(ctx, n1[1])
	if err != nil {
		t.Fatal(err)
	}
	if body := testenv.HTTPGet(ctx, t, "http://"+d.Status.Ports["8080/tcp"]+"/"); !strings.HasPrefix(body, "served by ") {
		t.Errorf("re-adopted %s answers %q", n1[1], body)
	}
}

func createDeployment(ctx context.Context, st *state.Store, app string) (state.Desired, error) {
	return scheduler.Create(ctx, st, scheduler.Request{App: app}, "e2e")
}

// redisOnPoP is the start of the PoP tests of a redis app: a node fixture
// with the DMTCP container driver, each engine the app needs (skipping, or
// failing when required, without one), a context of 15 minutes, and
// RedisApp of engine eng named prefix-<random>, which configure adjusts
// before the PoP of nodes starts and the app is created in its state.
func redisOnPoP(t *testing.T, prefix string, eng engine.Name, configure func(*spec.App), nodes ...string) (context.Context, *pop, *deploytest.Fixture, spec.App) {
	t.Helper()
	f := deploytest.NewFixture(t, "container")
	need := []engine.Name{eng}
	if eng == spec.EngineAuto {
		need = []engine.Name{engine.NameDMTCP, engine.NameCRIU}
	}
	for _, e := range need {
		if _, _, err := f.D.Drivers().CheckEngine(context.Background(), e); err != nil {
			testenv.Unavailable(t, string(e), err.Error())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	t.Cleanup(cancel)
	app := deploytest.RedisApp(prefix+"-"+strconv.FormatInt(time.Now().UnixNano()%1e6, 36), f.Env, eng)
	if configure != nil {
		configure(&app)
	}
	p := startPoP(ctx, t, f, app.Name, "fogdeploy/dmtcp:deploytest", "", nodes...)
	if app.Frontend.OnDemand {
		// Through fogctl, whose configuration gives the PoP's endpoints
		// (the app's shared endpoint takes its ports at its creation).
		b, err := json.Marshal(app)
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(t.TempDir(), "app.json")
		if err := os.WriteFile(file, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if out, errOut, rc := p.fogctl(ctx, "app", "create", "-f", file); rc != 0 {
			t.Fatalf("fogctl app create -f %s = %d: %s%s", file, rc, out, errOut)
		}
		return ctx, p, f, app
	}
	if err := p.st.CreateApp(ctx, app, false); err != nil {
		t.Fatal(err)
	}
	return ctx, p, f, app
}
