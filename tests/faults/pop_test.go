//go:build !no_ceph

package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// Settings of every agent (and fogctl) of a test PoP: short timeouts, so
// that a fault shows within seconds.
const (
	cephTimeout       = 5 * time.Second  // ceph.timeout: each librados/librbd operation
	mapperTimeout     = 10 * time.Second // mapper.timeout: each mapping step
	leaseTTL          = 3                // agent.lease_ttl, seconds
	reconcileInterval = 2 * time.Second  // agent.reconcile_interval
	readyTimeout      = 15 * time.Second // the app's readiness
	// fogctlBound bounds one fogctl call of a test: one that runs longer
	// waits on an agent that hangs, and fails the test with the agents'
	// long-waiting goroutines.
	fogctlBound = 2 * time.Minute
)

// pop is one PoP: a `pop-agent etcd` process and pop-agent processes, with
// their state under dir.
type pop struct {
	t      *testing.T
	s      *services
	dir    string
	env    []string
	etcd   *exec.Cmd
	addr   string // etcd client address
	st     *state.Store
	agents map[string]*agentProc
	atEnd  []func() // run by cleanup once the agents are stopped
	hung   string   // what hung (a fogctl call over fogctlBound), said last
}

type agentProc struct {
	cmd   *exec.Cmd
	api   string // host:port of /healthz and the hook API
	log   string
	state string
}

// newPoP starts etcd and one agent per node name. Cleanup withdraws every
// deployment, waits for the agents to undo them, and stops everything.
func newPoP(ctx context.Context, t *testing.T, s *services, nodes ...string) *pop {
	t.Helper()
	// Not t.TempDir: its RemoveAll would walk into a mount a failed test
	// left, and delete the files of an RBD image through it.
	dir, err := os.MkdirTemp("", "fdf-pop-")
	if err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf("ceph:\n  timeout: %s\nmapper:\n  timeout: %s\nagent:\n  lease_ttl: %d\n  reconcile_interval: %s\n",
		cephTimeout, mapperTimeout, leaseTTL, reconcileInterval)
	if err := os.WriteFile(filepath.Join(dir, "fogdeploy.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &pop{t: t, s: s, dir: dir, agents: map[string]*agentProc{}}
	p.startEtcd(ctx)
	p.env = append(append(os.Environ(), s.clientEnv()...), "FOGDEPLOY_CONFIG="+filepath.Join(dir, "fogdeploy.yaml"),
		"FOGDEPLOY_ETCD_ENDPOINTS="+p.addr, "FOGDEPLOY_BOOT_IMAGE="+bootImage, "FOGDEPLOY_DMTCP_IMAGE=fogdeploy/dmtcp:absent",
		"GOTRACEBACK=all", // dumpAgents: every goroutine
		// No spare slots and no front end: what these tests break is the
		// rest (tests/e2e has the front end's).
		"FOGDEPLOY_SPARE_SLOTS=0", "FOGDEPLOY_FRONTEND_LISTEN=off")
	t.Cleanup(p.cleanup)
	for _, n := range nodes {
		p.startAgent(ctx, n, filepath.Join(dir, n))
	}
	return p
}

func (p *pop) cleanup() {
	t := p.t
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if p.etcd == nil {
		p.startEtcd(ctx)
	}
	if deps, err := p.st.Deployments(ctx); err == nil {
		for _, d := range deps {
			_ = p.st.DeleteDeployment(ctx, d.ID)
		}
	}
	// An agent that died (a failed test) is started again to undo its part.
	for n, a := range p.agents {
		if !p.alive(n) {
			delete(p.agents, n)
			if err := p.tryStartAgent(ctx, n, a.state); err != nil {
				t.Errorf("restarting agent %s to clean up: %v", n, err)
			}
		}
	}
	for ctx.Err() == nil {
		if n, err := statetest.CountNow(ctx, p.st, "status/"); err == nil && n == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for n := range p.agents {
		p.stopAgent(n, syscall.SIGTERM)
	}
	p.stopEtcd()
	for _, f := range p.atEnd {
		f()
	}
	if m := mountsUnder(p.dir); len(m) > 0 || t.Failed() {
		t.Logf("agent logs and state kept in %s (mounts: %v)", p.dir, m)
		for _, a := range p.agentLogs() {
			t.Logf("%s", a)
		}
		if p.hung != "" {
			// Last, where a truncated output still shows it.
			t.Logf("%s; the agents' goroutines that waited a minute or more:\n%s", p.hung, strings.Join(p.longWaits(), "\n"))
		}
		return
	}
	_ = os.RemoveAll(p.dir)
}

// agentLogs returns the tail of each agent's log.
func (p *pop) agentLogs() []string {
	logs, _ := filepath.Glob(filepath.Join(p.dir, "*.log"))
	var out []string
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) > 40 {
			lines = lines[len(lines)-40:]
		}
		out = append(out, "--- "+filepath.Base(l)+"\n"+strings.Join(lines, "\n"))
	}
	return out
}

// dumpAgents makes every agent print its goroutines (SIGQUIT: the Go
// runtime writes them to the agent's log and exits); cleanup starts them
// again to undo their part.
func (p *pop) dumpAgents() {
	for n, a := range p.agents {
		if !p.alive(n) {
			continue
		}
		_ = a.cmd.Process.Signal(syscall.SIGQUIT)
		for deadline := time.Now().Add(5 * time.Second); p.alive(n) && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// longWaits returns, from the goroutine dumps in the agents' logs, the
// goroutines blocked for a minute or more: their header and the project's
// frames.
func (p *pop) longWaits() []string {
	var out []string
	logs, _ := filepath.Glob(filepath.Join(p.dir, "*.log"))
	for _, l := range logs {
		n := strings.TrimSuffix(filepath.Base(l), ".log")
		b, _ := os.ReadFile(l)
		for _, g := range strings.Split(string(b), "\n\n") {
			head, rest, _ := strings.Cut(strings.TrimSpace(g), "\n")
			if !strings.HasPrefix(head, "goroutine ") || !strings.Contains(head, "minutes]") {
				continue
			}
			// The innermost two calls (a cgo call into Ceph shows there),
			// then the project's own.
			frames, calls := []string{n + ": " + head}, 0
			for _, l := range strings.Split(rest, "\n") {
				if strings.HasPrefix(l, "\t") || l == "" {
					continue
				}
				if calls++; (calls <= 2 || strings.Contains(l, "fogdeploy/")) && len(frames) < 10 {
					frames = append(frames, "    "+l)
				}
			}
			out = append(out, strings.Join(frames, "\n"))
		}
	}
	if len(out) == 0 {
		out = append(out, "(none)")
	}
	return out
}

// startEtcd runs `pop-agent etcd` on the PoP's etcd address and data
// directory: a free port the first time, the same port and data after a
// stop.
func (p *pop) startEtcd(ctx context.Context) {
	t := p.t
	t.Helper()
	fresh := p.addr == ""
	for attempt := 0; attempt < 4; attempt++ {
		if fresh {
			p.addr = testenv.EtcdAddr(t) // its peer port may be taken meanwhile: retried
		}
		logf, err := os.OpenFile(filepath.Join(p.dir, "etcd.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(filepath.Join(p.s.bin, "pop-agent"), "etcd", "--data-dir", filepath.Join(p.dir, "etcd"), "--listen", p.addr)
		cmd.Stdout, cmd.Stderr = logf, logf
		err = cmd.Start()
		logf.Close()
		if err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		if p.etcdAnswers(ctx, exited) {
			p.etcd = cmd
			return
		}
		_ = cmd.Process.Kill()
		<-exited
		if p.st != nil {
			p.st.Close()
			p.st = nil
		}
		if !fresh {
			break
		}
	}
	out, _ := os.ReadFile(filepath.Join(p.dir, "etcd.out"))
	t.Fatalf("pop-agent etcd at %s did not answer:\n%s", p.addr, out)
}

// etcdAnswers waits up to 30 s until etcd answers, or its process exits.
func (p *pop) etcdAnswers(ctx context.Context, exited <-chan struct{}) bool {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return false
		default:
		}
		c, err := net.DialTimeout("tcp", p.addr, time.Second)
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		c.Close()
		if p.st == nil {
			if st, err := state.Open(ctx, state.Config{Endpoints: []string{p.addr}, DialTimeout: time.Second}); err == nil {
				p.st = st
			}
		}
		if p.st != nil {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			_, err := p.st.Client().Get(sctx, state.Prefix+"probe")
			cancel()
			if err == nil {
				return true
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

// stopEtcd stops etcd (SIGTERM) and waits until it is gone. The test's
// own client goes too (startEtcd opens a new one).
func (p *pop) stopEtcd() {
	if p.etcd == nil {
		return
	}
	_ = p.etcd.Process.Signal(syscall.SIGTERM)
	for {
		if err := p.etcd.Process.Signal(syscall.Signal(0)); err != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.etcd = nil
	p.st.Close()
	p.st = nil
}

// startAgent runs pop-agent for node name with its state in stateDir.
func (p *pop) startAgent(ctx context.Context, name, stateDir string) {
	p.t.Helper()
	if err := p.tryStartAgent(ctx, name, stateDir); err != nil {
		p.t.Fatal(err)
	}
}

func (p *pop) tryStartAgent(ctx context.Context, name, stateDir string) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	api := l.Addr().String()
	l.Close()
	logPath := filepath.Join(p.dir, name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(p.s.bin, "pop-agent"), "--node", name, "--state-dir", stateDir, "--listen", api, "--dev")
	cmd.Env, cmd.Stdout, cmd.Stderr = p.env, logf, logf
	err = cmd.Start()
	logf.Close()
	if err != nil {
		return err
	}
	go func() { _ = cmd.Wait() }()
	p.agents[name] = &agentProc{cmd: cmd, api: api, log: logPath, state: stateDir}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if h, err := p.healthz(ctx, name); err == nil && h.Status == "ok" {
			return nil
		}
		if time.Now().After(deadline) || !p.alive(name) {
			out, _ := os.ReadFile(logPath)
			return fmt.Errorf("agent %s did not start:\n%s", name, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// alive reports whether the agent process of node runs.
func (p *pop) alive(node string) bool {
	a := p.agents[node]
	return a != nil && a.cmd.Process.Signal(syscall.Signal(0)) == nil
}

func (p *pop) stopAgent(node string, sig syscall.Signal) {
	a := p.agents[node]
	if a == nil {
		return
	}
	_ = a.cmd.Process.Signal(sig)
	for p.alive(node) {
		time.Sleep(20 * time.Millisecond)
	}
	delete(p.agents, node)
}

// health is the answer of GET /healthz.
type health struct {
	Status string `json:"status"`
	Etcd   string `json:"etcd"`
	Node   string `json:"node"`
}

func (p *pop) healthz(ctx context.Context, node string) (health, error) {
	var h health
	body, code, err := get(ctx, "http://"+p.agents[node].api+"/healthz")
	if err != nil {
		return h, err
	}
	if code != http.StatusOK {
		return h, fmt.Errorf("/healthz: HTTP %d: %s", code, body)
	}
	return h, json.Unmarshal([]byte(body), &h)
}

// get returns the body and status of GET url, within 3 s.
func get(ctx context.Context, url string) (string, int, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b)), resp.StatusCode, err
}

// serves checks that a deployment's app answers with its page.
func serves(ctx context.Context, d state.Deployment) error {
	addr := d.Status.Ports["8080/tcp"]
	if addr == "" {
		return fmt.Errorf("%s publishes no 8080/tcp (status %+v)", d.ID, d.Status)
	}
	body, code, err := get(ctx, "http://"+addr+"/")
	if err != nil {
		return fmt.Errorf("%s at %s: %w", d.ID, addr, err)
	}
	if code != http.StatusOK || !strings.HasPrefix(body, "served by ") {
		return fmt.Errorf("%s at %s: HTTP %d %q", d.ID, addr, code, body)
	}
	return nil
}

// fogctl runs fogctl against the PoP: stdout, stderr and exit code.
func (p *pop) fogctl(ctx context.Context, args ...string) (string, string, int) {
	p.t.Helper()
	cctx, cancel := context.WithTimeout(ctx, fogctlBound)
	defer cancel()
	cmd := exec.CommandContext(cctx, filepath.Join(p.s.bin, "fogctl"), args...)
	cmd.Env = p.env
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	if cctx.Err() != nil {
		p.hung = fmt.Sprintf("fogctl %s ran %s without end (%v)", strings.Join(args, " "), time.Since(start).Round(time.Second), cctx.Err())
		p.dumpAgents()
		p.t.Fatalf("%s\n%s%s", p.hung, stdout.String(), stderr.String())
	}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return stdout.String(), stderr.String(), ee.ExitCode()
	case err != nil:
		p.t.Fatalf("fogctl %v: %v", args, err)
	}
	return stdout.String(), stderr.String(), 0
}

// deploy runs `fogctl deploy APP --node NODE --mode boot --wait -o json`
// and returns the deployment it reports Running.
func (p *pop) deploy(ctx context.Context, app, node string) state.Deployment {
	p.t.Helper()
	out, errOut, code := p.fogctl(ctx, "deploy", app, "--node", node, "--mode", "boot", "--wait", "-o", "json")
	var d state.Deployment
	if err := json.Unmarshal([]byte(out), &d); code != 0 || err != nil || d.Status.Phase != spec.PhaseRunning {
		p.t.Fatalf("fogctl deploy %s --node %s = exit %d, %v, %+v\n%s", app, node, code, err, d.Status, errOut)
	}
	return d
}

// ps returns `fogctl ps -o json` by deployment ID.
func (p *pop) ps(ctx context.Context) map[string]state.Deployment {
	p.t.Helper()
	out, errOut, code := p.fogctl(ctx, "ps", "-o", "json")
	var deps []state.Deployment
	if err := json.Unmarshal([]byte(out), &deps); code != 0 || err != nil {
		p.t.Fatalf("fogctl ps -o json = exit %d, %v\n%s", code, err, errOut)
	}
	m := map[string]state.Deployment{}
	for _, d := range deps {
		m[d.ID] = d
	}
	return m
}

// app creates busybox httpd as app name (deploytest.BusyboxHTTPApp); with
// a delay, it sleeps that long before it serves.
func (p *pop) app(ctx context.Context, name string, delay time.Duration) string {
	p.t.Helper()
	a := deploytest.BusyboxHTTPApp(name+"-"+strconv.FormatInt(time.Now().UnixNano()%1e6, 36), envName)
	a.Ready.Timeout = spec.Duration(readyTimeout)
	if delay > 0 {
		a.Command[len(a.Command)-1] = fmt.Sprintf("busybox sleep %d && %s", int(delay.Seconds()), a.Command[len(a.Command)-1])
	}
	if err := p.st.CreateApp(ctx, a, false); err != nil {
		p.t.Fatal(err)
	}
	return a.Name
}

// waitFor polls cond every 200 ms until it returns nil, and fails t with
// its last error after timeout.
func waitFor(ctx context.Context, t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// holdsFor checks cond every 200 ms for d and fails t at the first error:
// a condition that must hold during a whole fault.
func holdsFor(ctx context.Context, t *testing.T, d time.Duration, what string, cond func() error) {
	t.Helper()
	end := time.Now().Add(d)
	n := 0
	for time.Now().Before(end) && ctx.Err() == nil {
		if err := cond(); err != nil {
			t.Fatalf("%s: broken after %d checks: %v", what, n, err)
		}
		n++
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("%s: held for %s (%d checks)", what, d, n)
}

// leaks counts what deployments of app can leave: its RBD images, the
// rbd-fuse processes, loop devices and mounts under the PoP's directory
// (but the mount points in except), and the containers of app.
type leaks struct {
	Images, Fuse, Loops, Mounts, Containers int
}

// nodeLeaks counts what is on the node (no Ceph call, so it works while
// the cluster does not answer); the nodes' copies of environments are not
// leaks (deploytest.OfLower).
func (p *pop) nodeLeaks(ctx context.Context, app string, except ...string) leaks {
	p.t.Helper()
	var l leaks
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, c := range procs {
		b, _ := os.ReadFile(c)
		if strings.HasPrefix(string(b), "rbd-fuse\x00") && strings.Contains(string(b), p.dir+"/") && !deploytest.OfLower(string(b)) {
			l.Fuse++
		}
	}
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, bf := range loops {
		b, _ := os.ReadFile(bf)
		if strings.HasPrefix(string(b), p.dir+"/") && !deploytest.OfLower(string(b)) {
			l.Loops++
		}
	}
	for _, m := range mountsUnder(p.dir) {
		skip := deploytest.OfLower(m)
		for _, e := range except {
			skip = skip || m == e
		}
		if !skip {
			l.Mounts++
		}
	}
	sts, err := p.s.dc.ContainerList(ctx, container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", runtime.LabelApp+"="+app))})
	if err != nil {
		p.t.Fatal(err)
	}
	l.Containers = len(sts)
	return l
}

// leaks is nodeLeaks with the RBD images of app's deployments.
func (p *pop) leaks(ctx context.Context, app string, except ...string) leaks {
	p.t.Helper()
	l := p.nodeLeaks(ctx, app, except...)
	n, err := p.images(ctx, app)
	if err != nil {
		p.t.Fatal(err)
	}
	l.Images = n
	return l
}

// images counts the RBD images of app's deployments.
func (p *pop) images(ctx context.Context, app string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "rbd", "-c", p.s.conf, "--keyring", p.s.keyring, "ls", "-p", p.s.pool).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("rbd ls: %w: %s", err, out)
	}
	n := 0
	for _, name := range strings.Fields(string(out)) {
		if strings.HasPrefix(name, catalog.InstancePrefix+app+"-") && !catalog.IsLowerName(name) {
			n++
		}
	}
	return n, nil
}

// unchanged checks that both agents run, every one of deps answers, and
// the nodes hold what they held (running: nodeLeaks then).
func (p *pop) unchanged(ctx context.Context, app string, deps []state.Deployment, running leaks) error {
	for n := range p.agents {
		if !p.alive(n) {
			return fmt.Errorf("agent %s exited", n)
		}
	}
	for _, d := range deps {
		if err := serves(ctx, d); err != nil {
			return err
		}
	}
	if got := p.nodeLeaks(ctx, app); got != running {
		return fmt.Errorf("on the nodes: %+v; before: %+v", got, running)
	}
	return nil
}

// undeployAll withdraws every deployment with fogctl and waits until the
// agents removed them.
func (p *pop) undeployAll(ctx context.Context) {
	p.t.Helper()
	for id := range p.ps(ctx) {
		if _, errOut, code := p.fogctl(ctx, "undeploy", id, "--wait"); code != 0 {
			p.t.Fatalf("fogctl undeploy %s --wait = exit %d\n%s", id, code, errOut)
		}
	}
}

// logHas reports whether node's agent log holds s.
func (p *pop) logHas(node, s string) bool {
	b, _ := os.ReadFile(p.agents[node].log)
	return strings.Contains(string(b), s)
}
