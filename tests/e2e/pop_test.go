//go:build !no_ceph

// Package e2e runs a PoP of several pop-agent processes on one machine
// against one etcd, the dev Ceph and the dev dockerd, and checks what an
// operator and a mobile-app backend observe.
package e2e

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/devenv"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
	"github.com/fogdeploy/fogdeploy/pop-agent/agent"
	clientv3 "go.etcd.io/etcd/client/v3"
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

func repoRoot() string {
	_, file, _, _ := goruntime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

type pop struct {
	t      *testing.T
	bin    string
	dir    string
	env    []string
	st     *state.Store
	agents map[string]*exec.Cmd
	apis   map[string]string
}

// startAgent runs pop-agent NAME as its own process; with token, the hook
// API requires it.
func (p *pop) startAgent(name, token string) {
	t := p.t
	port := freePort(t)
	args := []string{"--node", name, "--state-dir", filepath.Join(p.dir, name), "--listen", "127.0.0.1:" + strconv.Itoa(port)}
	env := p.env
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
	for i := 0; i < 300; i++ {
		if resp, err := http.Get("http://" + p.apis[name] + "/healthz"); err == nil {
			resp.Body.Close()
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	out, _ := os.ReadFile(logf.Name())
	t.Fatalf("agent %s did not start:\n%s", name, out)
}

func (p *pop) stopAgent(name string, sig syscall.Signal) {
	cmd := p.agents[name]
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	_, _ = cmd.Process.Wait()
	delete(p.agents, name)
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
			case deploy.PhaseRunning:
				running++
			case deploy.PhaseFailed:
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

// TestPoP: 3 agents; 6 deploys without --node spread over the nodes, with
// exactly one checkpoint and 5 restores, all Running with per-phase
// timings; the hook API deploys and refuses bad input (4xx, nothing
// written); a killed agent's node turns NotReady after the lease TTL; a
// restarted agent re-adopts its instances and undeploys what was withdrawn
// meanwhile.
func TestPoP(t *testing.T) {
	f := deploytest.NewFixture(t, "container")
	if _, _, err := f.D.CheckEngine(context.Background(), engine.NameDMTCP); err != nil {
		testenv.Unavailable(t, testenv.DMTCP, err.Error())
	}
	c := testenv.CephCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	dir, err := os.MkdirTemp("", "fogdeploy-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "pop-agent")
	build := exec.CommandContext(ctx, "go", "build", "-tags=pacific", "-o", bin, "./pop-agent")
	build.Dir = repoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build pop-agent: %v\n%s", err, out)
	}

	// One etcd for the PoP: the embedded one, in this process.
	endpoint := "127.0.0.1:" + strconv.Itoa(freePort(t))
	ectx, ecancel := context.WithCancel(context.Background())
	edone := make(chan error, 1)
	go func() {
		edone <- state.Embedded(ectx, filepath.Join(dir, "etcd"), endpoint, slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() { ecancel(); <-edone })
	var st *state.Store
	for i := 0; i < 100; i++ {
		if st, err = state.Open(ctx, state.Config{Endpoints: []string{endpoint}, DialTimeout: time.Second}); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("embedded etcd: %v", err)
	}
	t.Cleanup(func() { st.Close() }) // after the cleanup below, which uses it

	p := &pop{t: t, bin: bin, dir: dir, st: st, agents: map[string]*exec.Cmd{}, apis: map[string]string{},
		env: append(os.Environ(), "FOGDEPLOY_ETCD_ENDPOINTS="+endpoint, "FOGDEPLOY_DMTCP_IMAGE=fogdeploy/dmtcp:deploytest",
			devenv.EnvCephConf+"="+c.Conf, devenv.EnvCephKeyring+"="+c.Keyring, devenv.EnvCephPool+"="+c.Pool,
			devenv.EnvDockerHost+"="+devenv.Lookup(devenv.EnvDockerHost, devenv.DockerHost()))}
	const token = "e2e-token-0123456789abcdef"
	for i, n := range []string{"n1", "n2", "n3"} {
		tok := ""
		if i == 2 {
			tok = token
		}
		p.startAgent(n, tok)
	}
	app := deploytest.RedisApp("e2e-redis-"+strconv.FormatInt(time.Now().UnixNano()%1e6, 36), f.Env, engine.NameDMTCP)
	t.Cleanup(func() {
		// Withdraw everything, let the agents undo it, then stop them.
		cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer ccancel()
		deps, _ := st.Deployments(cctx)
		for _, d := range deps {
			_ = st.DeleteDeployment(cctx, d.ID)
		}
		for i := 0; i < 300 && cctx.Err() == nil; i++ {
			r, _ := st.Client().Get(cctx, state.Prefix+"status/", clientCountOnly()...)
			if r != nil && r.Count == 0 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		for n := range p.agents {
			p.stopAgent(n, syscall.SIGTERM)
		}
		f.RemoveGenerations(t, app.Name)
		if sts, _ := f.RT.List(context.Background(), map[string]string{runtime.LabelApp: app.Name}); len(sts) > 0 {
			t.Errorf("containers left: %d", len(sts))
		}
		if !t.Failed() {
			os.RemoveAll(dir)
		} else {
			t.Logf("agent logs kept in %s", dir)
		}
	})
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
		if len(d.Status.Timings) < 5 || d.Status.Ports["6379/tcp"] == "" {
			t.Errorf("%s: timings %v, ports %v", d.ID, d.Status.Timings, d.Status.Ports)
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

	// The hook API.
	count := func() int64 {
		r, err := st.Client().Get(ctx, state.DeploymentsPrefix, clientCountOnly()...)
		if err != nil {
			t.Fatal(err)
		}
		return r.Count
	}
	before := count()
	api1, api3 := "http://"+p.apis["n1"]+"/v1/deployments", "http://"+p.apis["n3"]+"/v1/deployments"
	for _, bad := range []struct {
		name, url, token, body string
		code                   int
	}{
		{"unknown app", api1, "", `{"app":"no-such-app"}`, 404},
		{"unknown node", api1, "", `{"app":"` + app.Name + `","node":"n9"}`, 404},
		{"malformed", api1, "", `{"app":`, 400},
		{"unknown field", api1, "", `{"app":"` + app.Name + `","replicas":3}`, 400},
		{"bad name", api1, "", `{"app":"Bad Name"}`, 400},
		{"oversized", api1, "", `{"app":"` + strings.Repeat("a", 20000) + `"}`, 413},
		{"no token", api3, "", `{"app":"` + app.Name + `"}`, 401},
		{"wrong token", api3, "nope", `{"app":"` + app.Name + `"}`, 401},
	} {
		if code, body := hook(t, "POST", bad.url, bad.token, bad.body); code != bad.code || body["error"] == nil {
			t.Errorf("%s: %d %v; want %d with an error message", bad.name, code, body, bad.code)
		}
	}
	if after := count(); after != before {
		t.Errorf("bad requests wrote %d deployments", after-before)
	}
	code, body := hook(t, "POST", api3, token, `{"app":"`+app.Name+`","labels":{"user":"alice"}}`)
	if code != 201 {
		t.Fatalf("hook create: %d %v", code, body)
	}
	id := body["id"].(string)
	p.waitAll(ctx, app.Name, 7)
	if code, body := hook(t, "GET", api3+"/"+id, token, ""); code != 200 || body["status"].(map[string]any)["phase"] != deploy.PhaseRunning {
		t.Errorf("hook get: %d %v", code, body)
	}
	if code, _ := hook(t, "DELETE", api3+"/"+id, token, ""); code != 202 {
		t.Errorf("hook delete: %d", code)
	}

	// Kill n2 outright: its node turns NotReady once its lease expires.
	p.stopAgent("n2", syscall.SIGKILL)
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
		if !ready["n2"] && ready["n1"] && ready["n3"] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node n2 still Ready 15 s after its agent was killed: %v", ready)
		}
		time.Sleep(250 * time.Millisecond)
	}
	// While n2 is down, withdraw one of its deployments; the restarted
	// agent keeps the other (still running) and undeploys the withdrawn one.
	var n2 []string
	for _, d := range deps {
		if d.Node == "n2" {
			n2 = append(n2, d.ID)
		}
	}
	if err := st.DeleteDeployment(ctx, n2[0]); err != nil {
		t.Fatal(err)
	}
	p.startAgent("n2", "")
	for i := 0; ; i++ {
		d, err := st.Deployment(ctx, n2[1])
		r, _ := st.Client().Get(ctx, state.Prefix+"status/"+n2[0], clientCountOnly()...)
		if err == nil && d.Status.Phase == deploy.PhaseRunning && r != nil && r.Count == 0 {
			break
		}
		if i > 300 {
			t.Fatalf("after restarting n2: %s is %q, withdrawn %s still has a status", n2[1], d.Status.Phase, n2[0])
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got, err := testenv.RedisDo(ctx, nil, deploymentAddr(ctx, t, st, n2[1]), "PING"); err != nil || got != "PONG" {
		t.Errorf("re-adopted %s: PING = %q, %v", n2[1], got, err)
	}
}

func deploymentAddr(ctx context.Context, t *testing.T, st *state.Store, id string) string {
	d, err := st.Deployment(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return d.Status.Ports["6379/tcp"]
}

func createDeployment(ctx context.Context, st *state.Store, app string) (state.Desired, error) {
	return agent.Create(ctx, st, agent.CreateRequest{App: app}, "e2e")
}

func clientCountOnly() []clientv3.OpOption {
	return []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCountOnly()}
}
