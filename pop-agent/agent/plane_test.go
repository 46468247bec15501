package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fogdeploy/fogdeploy/internal/config"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// The fence's decision: what the node remembers against what etcd says.
func TestJudge(t *testing.T) {
	made := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	mem := memory{PoP: "aaaa", PoPCreated: made, ClusterID: 0xc1, Revision: 100}
	pop := func(id string) *state.PoP { return &state.PoP{ID: id, Created: made} }
	behind := mem
	behind.Behind = "etcd answered at revision 60, behind revision 100 that this node saw"
	for _, tc := range []struct {
		name     string
		m        memory
		o        observed
		triggers []string
		reason   string // a part of the reason
		sticky   bool
	}{
		{"fresh node, empty etcd: adopts", memory{}, observed{Header: state.Header{ClusterID: 0xc9, Revision: 1}}, nil, "", false},
		{"fresh node, any etcd: adopts", memory{}, observed{Header: state.Header{ClusterID: 0xc9, Revision: 7}, PoP: pop("bbbb")}, nil, "", false},
		{"the same etcd, same revision", mem, observed{Header: state.Header{ClusterID: 0xc1, Revision: 100}, PoP: pop("aaaa")}, nil, "", false},
		{"the same etcd, further on", mem, observed{Header: state.Header{ClusterID: 0xc1, Revision: 5000}, PoP: pop("aaaa")}, nil, "", false},
		{"emptied (keys deleted)", mem, observed{Header: state.Header{ClusterID: 0xc1, Revision: 180}}, []string{triggerEmptied},
			"etcd has no PoP record (/fogdeploy/pop), while this node remembers PoP aaaa made 2025-01-02T03:04:05Z: etcd was emptied or replaced", false},
		{"restarted empty (same cluster ID, new data)", mem, observed{Header: state.Header{ClusterID: 0xc1, Revision: 3}}, []string{triggerEmptied, triggerBehind},
			"etcd answered at revision 3, behind revision 100 that this node saw", false},
		{"a new cluster, empty", mem, observed{Header: state.Header{ClusterID: 0xc9, Revision: 500}}, []string{triggerEmptied, triggerOtherCluster},
			"etcd is cluster c9, while this node remembers cluster c1", false},
		{"another PoP's etcd, behind", mem, observed{Header: state.Header{ClusterID: 0xc9, Revision: 90}, PoP: pop("bbbb")},
			[]string{triggerOtherPoP, triggerOtherCluster, triggerBehind}, "etcd holds PoP bbbb", false},
		{"a PoP record made anew in the same etcd", mem, observed{Header: state.Header{ClusterID: 0xc1, Revision: 300}, PoP: pop("bbbb")}, []string{triggerOtherPoP},
			"while this node remembers PoP aaaa: it is another PoP's etcd, or one made anew", false},
		{"restored from an older backup", mem, observed{Header: state.Header{ClusterID: 0xc1, Revision: 60}, PoP: pop("aaaa")}, []string{triggerBehind},
			"behind revision 100 that this node saw: it lost writes (a restore of an older backup), whatever it answers later", true},
		{"restored from an older backup into a new cluster", mem, observed{Header: state.Header{ClusterID: 0xc9, Revision: 60}, PoP: pop("aaaa")},
			[]string{triggerOtherCluster, triggerBehind}, "a restore of an older backup", true},
		{"restored into a new cluster, revision bumped", mem, observed{Header: state.Header{ClusterID: 0xc9, Revision: 1e9}, PoP: pop("aaaa")},
			[]string{triggerOtherCluster}, "another etcd cluster", false},
		{"once behind, caught up: still fenced", behind, observed{Header: state.Header{ClusterID: 0xc1, Revision: 5000}, PoP: pop("aaaa")},
			[]string{triggerBehind}, "etcd answered at revision 60", true},
		{"once behind, and emptied", behind, observed{Header: state.Header{ClusterID: 0xc1, Revision: 5000}},
			[]string{triggerEmptied, triggerBehind}, "etcd was emptied or replaced; etcd answered at revision 60", true},
	} {
		v := judge(tc.m, tc.o)
		if !slices.Equal(v.Triggers, tc.triggers) || v.fenced() != (tc.triggers != nil) || !strings.Contains(v.Reason, tc.reason) || v.Sticky != tc.sticky {
			t.Errorf("%s: judge = %+v; want triggers %v, a reason with %q, sticky %v", tc.name, v, tc.triggers, tc.reason, tc.sticky)
		}
		// What to do: a fence that lifts by itself once etcd is back, or
		// one that an operator lifts.
		if h := v.hint(); v.fenced() && (!strings.Contains(h, "--adopt-pop") || v.Sticky != strings.Contains(h, "does not lift by itself")) {
			t.Errorf("%s: hint %q", tc.name, h)
		}
	}
}

// The memory file: written atomically (no temporary file left, mode
// 0600), read back; a missing one is a fresh node; a corrupt one is an
// error.
func TestMemoryFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, memoryFile)
	if m, err := loadMemory(path); err != nil || !m.fresh() {
		t.Fatalf("no file: %+v, %v; want a fresh memory", m, err)
	}
	want := memory{PoP: "ab12", PoPCreated: time.Now().UTC().Round(0), ClusterID: 1<<63 + 5, Revision: 42}
	if err := saveMemory(path, want); err != nil {
		t.Fatal(err)
	}
	if got, err := loadMemory(path); err != nil || got != want {
		t.Errorf("loaded %+v, %v; want %+v (a cluster ID beyond 2^53 too)", got, err, want)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the memory file: %v, %v; want mode 0600", fi, err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*.tmp")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
	for name, content := range map[string]string{"truncated": `{"pop":"ab12","clu`, "not JSON": "\x00\x00\x00", "empty": "", "no PoP": `{"cluster_id":5}`} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if m, err := loadMemory(path); err == nil {
			t.Errorf("a %s memory file loaded as %+v", name, m)
		}
	}
	// Saving over a corrupt one replaces it.
	if err := saveMemory(path, want); err != nil {
		t.Fatal(err)
	}
	if got, err := loadMemory(path); err != nil || got != want {
		t.Errorf("after saving over a corrupt file: %+v, %v", got, err)
	}
}

// fakeRecords is the node's deployer as the reconciler asks it: Running
// records, whose instances live; Undeploy removes one and says so.
type fakeRecords struct {
	mu         sync.Mutex
	recs       map[string]deploy.Deployment
	undeployed []string
}

func newFakeRecords(ids ...string) *fakeRecords {
	f := &fakeRecords{recs: map[string]deploy.Deployment{}}
	for _, id := range ids {
		f.recs[id] = deploy.Deployment{ID: id, App: "web", Instance: spec.Instance{Node: "n1", Phase: spec.PhaseRunning, Mode: spec.ModeRestore}}
	}
	return f
}

func (f *fakeRecords) List() ([]deploy.Deployment, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []deploy.Deployment
	for _, r := range f.recs {
		out = append(out, r)
	}
	return out, nil
}

func (f *fakeRecords) Load(id string) (deploy.Deployment, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r, ok := f.recs[id]; ok {
		return r, nil
	}
	return deploy.Deployment{}, fmt.Errorf("deployment %s: %w", id, spec.ErrNotFound)
}

func (f *fakeRecords) Alive(context.Context, string) (bool, error) { return true, nil }
func (f *fakeRecords) CutOff(context.Context, string) error        { return nil }

func (f *fakeRecords) Undeploy(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.recs[id]; !ok {
		return spec.ErrNotFound
	}
	delete(f.recs, id)
	f.undeployed = append(f.undeployed, id)
	return nil
}

func (f *fakeRecords) gone() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.undeployed)
}

// syncBuffer is a log that the test reads while the agent writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testAgent is an agent of node n1 on st, with fake records and no
// deployer, its memory in dir; its log is returned too.
func testAgent(t *testing.T, st *state.Store, dir string, recs *fakeRecords) (*agent, *syncBuffer) {
	t.Helper()
	c := config.Default()
	c.Node.Name, c.Node.StateDir = "n1", dir
	c.Agent.Recycle = config.Off // undeploys go to the fake records
	c.Agent.ReconcileInterval = 200 * time.Millisecond
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	a := &agent{c: c, st: st, log: log, m: newMetrics(prometheus.NewRegistry()), node: state.Node{Name: "n1", Capacity: 4},
		recs: recs, pool: newPoolKeeper(), plane: newPlane(filepath.Join(dir, memoryFile), st, log)}
	a.plane.changed = a.fenceChanged
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the agent's log:\n%s", logs)
		}
	})
	return a, logs
}

// waitFor polls cond for up to 30 s (a loaded machine: an etcd that
// starts again, a lease that lapses, a node that registers again).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting until %s", what)
}

// healthz asks the agent's /healthz without a token (as a load balancer
// would, with tokens configured) and with the admin's view (no keys).
func healthz(t *testing.T, a *agent) (int, map[string]any) {
	t.Helper()
	srv := httptest.NewServer(a.serveHealthz(&hooks{a: a}, "fuse", []engine.Name{"dmtcp"}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

// The fault in a unit: etcd is emptied while the node runs two instances.
// Before, a withdrawn deployment is undeployed (the reconciler acts);
// after, nothing is: the watch's deletes, the resyncs and the pool's
// refill act on nothing, the agent says why once in its log at Error, in
// /healthz (503, "fenced") and in its node record. Once etcd is back
// (restored: the PoP record and the deployment), it acts again.
func TestFenceWhenEtcdIsEmptied(t *testing.T) {
	st := statetest.Store(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	recs := newFakeRecords("web-1", "web-2")
	a, logs := testAgent(t, st, t.TempDir(), recs)
	for _, id := range []string{"web-1", "web-2"} {
		if err := st.CreateDeployment(ctx, state.Desired{ID: id, App: "web", Node: "n1"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.plane.start(ctx, false, 2); err != nil {
		t.Fatal(err)
	}
	pop, _, err := st.PoP(ctx)
	if err != nil || pop == nil {
		t.Fatalf("a fresh node's start made no PoP record: %v, %v", pop, err)
	}
	if m, err := loadMemory(filepath.Join(a.c.Node.StateDir, memoryFile)); err != nil || m.PoP != pop.ID || m.ClusterID == 0 || m.Revision == 0 {
		t.Fatalf("memory after the first start = %+v, %v; want PoP %s, the cluster and a revision", m, err, pop.ID)
	}
	sess, err := st.Register(ctx, a.nodeRecord(), 30)
	if err != nil {
		t.Fatal(err)
	}
	a.sess = sess
	if code, body := healthz(t, a); code != http.StatusOK || body["status"] != "ok" {
		t.Errorf("/healthz before = %d %v; want 200 ok", code, body)
	}
	done := make(chan struct{})
	go func() { a.reconcile(ctx); close(done) }()
	defer func() { cancel(); <-done; a.wg.Wait() }()

	// The reconciler acts: a deployment withdrawn is undeployed.
	if err := st.DeleteDeployment(ctx, "web-2"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "web-2 is undeployed", func() bool { return slices.Equal(recs.gone(), []string{"web-2"}) })

	// etcd is emptied.
	statetest.Wipe(ctx, t, st)
	waitFor(t, "the agent is fenced", func() bool { return a.plane.err() != nil })
	time.Sleep(5 * a.c.Agent.ReconcileInterval) // resyncs and checks on the empty etcd
	a.refill(ctx)                               // no deployer: it would panic if it went on
	a.undeploy(ctx, "web-1")                    // what a stray event would do
	a.wg.Wait()
	if got := recs.gone(); !slices.Equal(got, []string{"web-2"}) {
		t.Errorf("undeployed on an emptied etcd: %v; want web-2 only (before the wipe)", got)
	}
	if _, err := recs.Load("web-1"); err != nil {
		t.Errorf("web-1's record is gone: %v", err)
	}
	v, _ := a.plane.status()
	if !slices.Contains(v.Triggers, triggerEmptied) || !strings.Contains(v.Reason, "remembers PoP "+pop.ID) {
		t.Errorf("fence = %+v; want it to say etcd was emptied, naming PoP %s", v, pop.ID)
	}
	code, body := healthz(t, a)
	if code != http.StatusServiceUnavailable || body["status"] != "fenced" || !strings.Contains(fmt.Sprint(body["etcd"]), "etcd has no PoP record") ||
		!strings.Contains(fmt.Sprint(body["etcd"]), "--adopt-pop") {
		t.Errorf("/healthz while fenced = %d %v; want 503, fenced, why and what to do", code, body)
	}
	if cp, _ := body["control_plane"].(map[string]any); cp["fenced"] != true || cp["pop"] != pop.ID {
		t.Errorf("/healthz control_plane = %v", body["control_plane"])
	}
	// The hook API writes nothing into the emptied etcd: a create, a
	// delete, a suspend, a resume and a migration answer 503 with why.
	mux := http.NewServeMux()
	(&hooks{a: a}).register(mux)
	api := httptest.NewServer(mux)
	for _, req := range []struct{ method, path, body string }{
		{"POST", "/v1/deployments", `{"app":"web"}`}, {"DELETE", "/v1/deployments/web-1", ""},
		{"POST", "/v1/deployments/web-1/suspend", ""}, {"POST", "/v1/deployments/web-1/resume", ""}, {"POST", "/v1/deployments/web-1/migrate", "{}"},
	} {
		r, _ := http.NewRequest(req.method, api.URL+req.path, strings.NewReader(req.body))
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		var e apiError
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(e.Error, "etcd has no PoP record") || !strings.Contains(e.Hint, "--adopt-pop") {
			t.Errorf("%s %s while fenced = %d %+v; want 503 with why and what to do", req.method, req.path, resp.StatusCode, e)
		}
	}
	api.Close()
	if ds, err := st.Deployments(ctx); err != nil || len(ds) != 0 {
		t.Errorf("deployments in the emptied etcd after the hook calls = %v, %v; want none", ds, err)
	}
	n, err := st.Node(ctx, "n1")
	if err != nil || !strings.Contains(n.Fence(), "etcd has no PoP record") || !n.Ready {
		t.Errorf("node record while fenced = %+v, %v; want Ready with the %s problem", n, err, state.ProblemControlPlane)
	}
	if _, _, err := st.PoP(ctx); err != nil {
		t.Fatal(err)
	} else if p, _, _ := st.PoP(ctx); p != nil {
		t.Errorf("the fenced agent made a PoP record: %+v", p)
	}
	if got := strings.Count(logs.String(), "level=ERROR msg=\"control plane fenced"); got != 1 {
		t.Errorf("the fence is logged at Error %d times; want once:\n%s", got, logs)
	}
	// Neither the watch's delete of web-1 nor a resync asked for an
	// undeploy: the one refused is the test's own.
	if got := strings.Count(logs.String(), "not undeploying"); got != 1 {
		t.Errorf("%d undeploys were asked and refused; want 1 (the test's):\n%s", got, logs)
	}

	// Restored: the PoP record and the deployment are back (a newer
	// revision). The agent acts again, and web-1 stays.
	b, _ := json.Marshal(pop)
	if _, err := st.Client().Put(ctx, state.PoPKey, string(b)); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateDeployment(ctx, state.Desired{ID: "web-1", App: "web", Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the fence is lifted", func() bool { return a.plane.err() == nil })
	time.Sleep(3 * a.c.Agent.ReconcileInterval)
	if got := recs.gone(); !slices.Equal(got, []string{"web-2"}) {
		t.Errorf("undeployed after the restore: %v; want web-2 only", got)
	}
	if n, err := st.Node(ctx, "n1"); err != nil || n.Fence() != "" {
		t.Errorf("node record after the restore = %+v, %v; want no fence", n, err)
	}
	if !strings.Contains(logs.String(), "etcd is the one this node knew again") {
		t.Errorf("the log does not say the fence was lifted:\n%s", logs)
	}
	if code, _ := healthz(t, a); code != http.StatusOK {
		t.Errorf("/healthz after the restore = %d; want 200", code)
	}
}

// At start: a node that remembers a PoP and holds deployments is fenced by
// an empty etcd, by an etcd behind its revision, and by an unreadable
// memory; one that holds none adopts; --adopt-pop adopts (making the PoP
// record anew), and the node then acts on that etcd.
func TestFenceAtStart(t *testing.T) {
	st := statetest.Store(t)
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, memoryFile)
	quiet := slog.New(slog.DiscardHandler)

	// First start: adopts, making the record.
	p := newPlane(path, st, quiet)
	if err := p.start(ctx, false, 0); err != nil {
		t.Fatal(err)
	}
	first, _, _ := st.PoP(ctx)
	mem, _ := loadMemory(path)

	// etcd emptied while the agent was down.
	statetest.Wipe(ctx, t, st)
	p = newPlane(path, st, quiet)
	if err := p.start(ctx, false, 3); err != nil {
		t.Fatal(err)
	}
	if err := p.err(); !errors.Is(err, state.ErrFenced) {
		t.Errorf("restart on an emptied etcd, holding deployments: %v; want fenced", err)
	}
	if pop, _, _ := st.PoP(ctx); pop != nil {
		t.Errorf("the fenced start made a PoP record %+v", pop)
	}

	// Behind the revision the node saw (a restore of an older backup):
	// the PoP record is there, the revision 10 behind.
	b, _ := json.Marshal(first)
	r, err := st.Client().Put(ctx, state.PoPKey, string(b))
	if err != nil {
		t.Fatal(err)
	}
	ahead := mem
	ahead.Revision = r.Header.Revision + 10
	if err := saveMemory(path, ahead); err != nil {
		t.Fatal(err)
	}
	p = newPlane(path, st, quiet)
	if err := p.start(ctx, false, 1); err != nil {
		t.Fatal(err)
	}
	if v, _ := p.status(); !slices.Equal(v.Triggers, []string{triggerBehind}) || !v.Sticky {
		t.Errorf("an etcd behind the node's revision: %+v; want fenced (behind)", v)
	}
	// Writes to it catch up with the node's revision: it stays fenced,
	// also after a restart, and the memory keeps its revision.
	for i := range 20 {
		if _, err := st.Client().Put(ctx, state.Prefix+"events/x", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	p.seen(state.Header{ClusterID: mem.ClusterID, Revision: ahead.Revision + 20})
	if err := p.check(ctx); !errors.Is(err, state.ErrFenced) {
		t.Errorf("check once the revision caught up: %v; want still fenced", err)
	}
	if err := p.flush(); err != nil {
		t.Fatal(err)
	}
	if m, _ := loadMemory(path); m.Revision != ahead.Revision || !strings.Contains(m.Behind, "behind revision") {
		t.Errorf("the memory of a fenced node: %+v; want its revision, and that etcd answered behind it", m)
	}
	p = newPlane(path, st, quiet)
	if err := p.start(ctx, false, 1); err != nil {
		t.Fatal(err)
	}
	if v, _ := p.status(); !slices.Equal(v.Triggers, []string{triggerBehind}) {
		t.Errorf("restarted after etcd answered behind and caught up: %+v; want still fenced", v)
	}

	// A corrupt PoP record fences too.
	if _, err := st.Client().Put(ctx, state.PoPKey, "not JSON"); err != nil {
		t.Fatal(err)
	}
	if err := p.check(ctx); !errors.Is(err, state.ErrFenced) || !strings.Contains(err.Error(), "PoP record /fogdeploy/pop is unreadable") {
		t.Errorf("check on a corrupt PoP record: %v; want fenced, saying so", err)
	}

	// A corrupt memory fences a node that holds deployments.
	if err := os.WriteFile(path, []byte(`{"pop":`), 0o600); err != nil {
		t.Fatal(err)
	}
	p = newPlane(path, st, quiet)
	if err := p.start(ctx, false, 1); err != nil {
		t.Fatal(err)
	}
	if v, _ := p.status(); !slices.Equal(v.Triggers, []string{triggerUnreadable}) || !strings.Contains(v.Reason, path) {
		t.Errorf("an unreadable memory: %+v; want fenced, naming the file", v)
	}

	// One that holds nothing adopts what it finds, at Warn (no fence).
	statetest.Wipe(ctx, t, st)
	logs := &syncBuffer{}
	p = newPlane(path, st, slog.New(slog.NewTextHandler(logs, nil)))
	if err := p.start(ctx, false, 0); err != nil {
		t.Fatal(err)
	}
	second, _, _ := st.PoP(ctx)
	if err := p.err(); err != nil || second == nil || second.ID == first.ID {
		t.Errorf("a node holding nothing on an emptied etcd: %v, PoP %+v; want it adopted with a new PoP record", err, second)
	}
	if out := logs.String(); strings.Contains(out, "level=ERROR") || !strings.Contains(out, "level=WARN msg=\"control plane: adopted etcd's PoP\" why=\"this node holds no deployment\"") {
		t.Errorf("log of a node adopting because it holds nothing:\n%s", out)
	}

	// --adopt-pop: the etcd is emptied again; a node holding deployments
	// adopts it when told to.
	statetest.Wipe(ctx, t, st)
	p = newPlane(path, st, quiet)
	if err := p.start(ctx, true, 5); err != nil {
		t.Fatal(err)
	}
	third, h, _ := st.PoP(ctx)
	m, err := loadMemory(path)
	if p.err() != nil || third == nil || third.ID == second.ID || err != nil || m.PoP != third.ID || m.Revision != h.Revision {
		t.Errorf("--adopt-pop: fence %v, PoP %+v, memory %+v (%v); want the new PoP remembered", p.err(), third, m, err)
	}
	if err := p.check(ctx); err != nil {
		t.Errorf("check after --adopt-pop: %v", err)
	}
}

// The fault test's scenario: etcd stops and starts again empty on the
// same address (a new data directory: the same cluster ID, a low
// revision). The agent's lease is gone with it; it registers again, and
// is fenced: nothing is undeployed, and its node record in the new etcd
// says why. Then etcd starts again on its own data: the agent acts again
// by itself, and its instance stays (still desired there).
func TestFenceWhenEtcdRestartsEmpty(t *testing.T) {
	testenv.SkipShort(t, testenv.Etcd) // seconds of load or of an etcd restarted: not a unit test
	endpoint := testenv.EtcdAddr(t)
	start := func(dir string) (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- state.Embedded(ctx, dir, endpoint, slog.New(slog.DiscardHandler)) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("embedded etcd: %v", err)
			}
		}
	}
	data := t.TempDir()
	stop := start(data)
	defer func() { stop() }() // last: once the client is closed, it stops at once
	var st *state.Store
	waitFor(t, "etcd answers", func() bool {
		var err error
		st, err = state.Open(context.Background(), state.Config{Endpoints: []string{endpoint}, DialTimeout: time.Second})
		return err == nil
	})
	defer st.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	recs := newFakeRecords("web-1")
	a, logs := testAgent(t, st, t.TempDir(), recs)
	a.c.Agent.LeaseTTL = 2
	if err := st.CreateDeployment(ctx, state.Desired{ID: "web-1", App: "web", Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	if err := a.plane.start(ctx, false, 1); err != nil {
		t.Fatal(err)
	}
	for range 20 { // a revision well above the new etcd's
		if err := st.SetStatus(ctx, "web-1", state.Status{Instance: spec.Instance{Phase: spec.PhaseRunning, Node: "n1"}}); err != nil {
			t.Fatal(err)
		}
	}
	sess, err := st.Register(ctx, a.nodeRecord(), a.c.Agent.LeaseTTL)
	if err != nil {
		t.Fatal(err)
	}
	a.sess = sess
	var loops sync.WaitGroup
	loops.Go(func() { a.reconcile(ctx) })
	loops.Go(func() { a.keepRegistered(ctx) })
	defer func() { cancel(); loops.Wait(); a.wg.Wait() }()
	time.Sleep(3 * a.c.Agent.ReconcileInterval) // resyncs, not fenced
	if err := a.plane.err(); err != nil {
		t.Fatalf("fenced before the fault: %v\n%s", err, logs)
	}

	stop()
	stop = start(t.TempDir()) // empty
	waitFor(t, "the agent is fenced", func() bool { return a.plane.err() != nil })
	v, _ := a.plane.status()
	if !slices.Equal(v.Triggers, []string{triggerEmptied, triggerBehind}) || v.Sticky {
		t.Errorf("fence after etcd restarted empty: %+v; want emptied and behind (the same cluster ID), lifting once etcd is back", v)
	}
	waitFor(t, "the node registers in the new etcd, fenced", func() bool {
		n, err := st.Node(ctx, "n1")
		return err == nil && n.Ready && strings.Contains(n.Fence(), "etcd has no PoP record")
	})
	time.Sleep(5 * a.c.Agent.ReconcileInterval)
	if got := recs.gone(); len(got) > 0 {
		t.Errorf("undeployed after etcd restarted empty: %v", got)
	}
	if pop, _, err := st.PoP(ctx); err != nil || pop != nil {
		t.Errorf("the new etcd's PoP record: %+v, %v; want none (a fenced agent makes none)", pop, err)
	}
	if got := strings.Count(logs.String(), "level=ERROR msg=\"control plane fenced"); got != 1 {
		t.Errorf("the fence is logged at Error %d times; want once:\n%s", got, logs)
	}

	// etcd on its own data again.
	stop()
	stop = start(data)
	waitFor(t, "the fence lifts", func() bool { return a.plane.err() == nil })
	waitFor(t, "the node's record has no fence", func() bool {
		n, err := st.Node(ctx, "n1")
		return err == nil && n.Ready && n.Fence() == ""
	})
	time.Sleep(3 * a.c.Agent.ReconcileInterval)
	if got := recs.gone(); len(got) > 0 {
		t.Errorf("undeployed once etcd was back: %v", got)
	}
}

// Answers applied out of order: an older one neither lifts nor sets a
// fence that a newer one decided, and its caller acts only if neither
// fences.
func TestStaleAnswers(t *testing.T) {
	p := &plane{path: filepath.Join(t.TempDir(), memoryFile), log: slog.New(slog.DiscardHandler), mem: memory{PoP: "aaaa", ClusterID: 1, Revision: 10}}
	fenced := verdict{Triggers: []string{triggerEmptied}, Reasons: []string{"gone"}, Reason: "gone"}
	ctx := context.Background()
	p.asked = 2
	if err := p.apply(ctx, observed{Header: state.Header{ClusterID: 1, Revision: 20}, seq: 2}, fenced); !errors.Is(err, state.ErrFenced) {
		t.Fatalf("the newer answer: %v; want fenced", err)
	}
	if err := p.apply(ctx, observed{Header: state.Header{ClusterID: 1, Revision: 15}, PoP: &state.PoP{ID: "aaaa"}, seq: 1}, verdict{}); !errors.Is(err, state.ErrFenced) {
		t.Errorf("an older answer that would act: %v; want the newer fence", err)
	}
	if p.err() == nil {
		t.Errorf("an older answer lifted the fence")
	}
	p.asked = 4
	if err := p.apply(ctx, observed{Header: state.Header{ClusterID: 1, Revision: 30}, PoP: &state.PoP{ID: "aaaa"}, seq: 4}, verdict{}); err != nil || p.err() != nil {
		t.Fatalf("a newer answer that acts: %v, %v", err, p.err())
	}
	if err := p.apply(ctx, observed{seq: 3}, fenced); !errors.Is(err, state.ErrFenced) || p.err() != nil {
		t.Errorf("an older fencing answer: %v (fence now %v); want its caller refused, the state unchanged", err, p.err())
	}
}
