//go:build !no_ceph

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/instancectl"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// TestSuspendResumePoP: a redis on a 2-node PoP, under DMTCP and under
// CRIU in the light container. Keys written into its memory and a file
// written into its root before a suspend are there after a resume on the
// other node, under the same ID and identity seed, at a new address; suspended, it runs
// nowhere (no container of it) and `fogctl ps` says Suspended; it is
// suspended again after the resume and resumed back on the first node,
// with everything still there; a suspended deployment that is undeployed
// leaves no image; refused requests (a resume of a running deployment, a
// suspend of an unknown one, a bad node) change nothing.
func TestSuspendResumePoP(t *testing.T) {
	for _, eng := range []engine.Name{engine.NameDMTCP, engine.NameCRIU} {
		t.Run(string(eng), func(t *testing.T) { testSuspendResume(t, eng) })
	}
}

func testSuspendResume(t *testing.T, eng engine.Name) {
	// Its SAVE writes a file into its root.
	ctx, p, f, app := redisOnPoP(t, "e2e-susp", eng, func(a *spec.App) {
		a.Command = append(a.Command, "--dir", "/srv", "--dbfilename", "suspend-test.rdb")
	}, "n1", "n2")
	api := "http://" + p.apis["n1"]
	client := &http.Client{}

	first := createOn(ctx, t, client, api, app.Name, "n1")
	addr := first.Status.Ports[drivers.PortKey(6379, "tcp")]
	redis := func(addr string, args ...string) string {
		t.Helper()
		got, err := testenv.RedisDo(ctx, nil, addr, args...)
		if err != nil {
			t.Fatalf("redis %v at %s: %v", args, addr, err)
		}
		return got
	}
	// State in memory, and a file in the instance's root.
	redis(addr, "SET", "in-memory", "before-suspend")
	if got := redis(addr, "SAVE"); got != "OK" {
		t.Fatalf("SAVE: %q", got)
	}
	redis(addr, "SET", "after-save", "memory-only")
	seed0 := checkFile(t, p, "n1", first.ID)

	// Refused requests change nothing.
	if code, _ := lifecycle(t, client, api, first.ID, "resume", ""); code != http.StatusConflict {
		t.Errorf("resume of a Running deployment: %d; want 409", code)
	}
	if code, _ := lifecycle(t, client, api, "no-such-deployment", "suspend", ""); code != http.StatusNotFound {
		t.Errorf("suspend of an unknown deployment: %d; want 404", code)
	}

	suspended := suspendWait(t, client, api, first.ID)
	if left := containersOf(t, f, app.Name); len(left) > 0 {
		t.Errorf("suspended, app %s still has containers %v", app.Name, left)
	}
	out, _, code := p.fogctl(ctx, "ps", "-o", "json")
	var ps []state.Deployment
	if err := json.Unmarshal([]byte(out), &ps); code != 0 || err != nil || len(ps) != 1 || ps[0].Status.Phase != spec.PhaseSuspended || ps[0].Node != "" {
		t.Errorf("fogctl ps -o json while suspended = %d, %v: %s; want it Suspended on no node", code, err, out)
	}
	t.Logf("suspended: checkpoint %d bytes, writable image %d bytes used (%s)", suspended.Suspension.Bytes, suspended.Suspension.EnvBytes, suspended.Suspension.Timings)
	if code, body := lifecycle(t, client, api, first.ID, "resume", `{"node":"bad node"}`); code != http.StatusBadRequest || body["field"] != "node" {
		t.Errorf("resume on a bad node name: %d %v; want 400 naming node", code, body)
	}

	// Resumed on n2: same ID, same state, a new address.
	resumed := resumeWait(t, client, api, first.ID, "n2")
	addr2 := resumed.Ports[drivers.PortKey(6379, "tcp")]
	checkState := func(where, addr string) {
		t.Helper()
		if got := redis(addr, "GET", "in-memory"); got != "before-suspend" {
			t.Errorf("%s: GET in-memory = %q; want before-suspend", where, got)
		}
		if got := redis(addr, "GET", "after-save"); got != "memory-only" {
			t.Errorf("%s: GET after-save = %q; want memory-only", where, got)
		}
	}
	checkState("resumed on n2", addr2)
	if seed := checkFile(t, p, "n2", first.ID); seed != seed0 {
		t.Errorf("the identity seed after the resume: %q; want %q, the instance's before its suspend", seed, seed0)
	}

	// Suspended again, and back on n1. Its writable image, a clone of its
	// first suspension's, is flattened by this suspend, and the first
	// suspension's image goes: the chain stays one clone deep.
	again := suspendWait(t, client, api, first.ID)
	if again.Suspension.Parents != nil {
		t.Errorf("suspended again: parents %v; want none (flattened)", again.Suspension.Parents)
	}
	if _, err := f.L.Store.Stat(ctx, suspended.Suspension.Env.Image); !errors.Is(err, layering.ErrNotFound) {
		t.Errorf("the first suspension's writable image %s after the second suspend: %v; want it removed", suspended.Suspension.Env.Image, err)
	}
	back := resumeWait(t, client, api, first.ID, "n1")
	checkState("resumed again on n1", back.Ports[drivers.PortKey(6379, "tcp")])
	if again := checkFile(t, p, "n1", first.ID); again != seed0 {
		t.Errorf("the identity seed after a second resume: %q; want %q, the same instance's", again, seed0)
	}

	// A suspended deployment undeployed leaves no image.
	suspendWait(t, client, api, first.ID)
	req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, api+"/v1/deployments/"+first.ID, nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("DELETE of a suspended deployment: %d", resp.StatusCode)
	}
	imgs, err := f.L.Store.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range imgs {
		if strings.Contains(img, first.ID) {
			t.Errorf("image %s of the undeployed suspended deployment is left", img)
		}
	}
	if sts, _ := p.st.Statuses(ctx); len(sts) > 0 {
		t.Errorf("statuses left after the undeploy: %v", sts)
	}
}

// created is a deployment the hook API created: its ID and status.
type created struct {
	ID     string
	Status state.Status
}

// createOn deploys app on node through the hook API and waits until it runs.
func createOn(ctx context.Context, t *testing.T, client *http.Client, api, app, node string) created {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, api+"/v1/deployments?wait=3m",
		strings.NewReader(`{"app":"`+app+`","node":"`+node+`","mode":"restore"}`))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var cr struct {
		ID     string        `json:"id"`
		Status *state.Status `json:"status"`
	}
	if err := json.Unmarshal(b, &cr); resp.StatusCode != http.StatusCreated || err != nil || cr.Status == nil || cr.Status.Phase != spec.PhaseRunning {
		t.Fatalf("POST /v1/deployments: %d %v: %s", resp.StatusCode, err, b)
	}
	return created{cr.ID, *cr.Status}
}

// lifecycle POSTs a suspend or resume of id with body and returns the
// answer's code and JSON.
func lifecycle(t *testing.T, _ *http.Client, api, id, verb, body string) (int, map[string]any) {
	t.Helper()
	return hook(t, http.MethodPost, api+"/v1/deployments/"+id+"/"+verb+"?wait=3m", "", body)
}

// suspendWait suspends id and returns its status once Suspended.
func suspendWait(t *testing.T, client *http.Client, api, id string) state.Status {
	t.Helper()
	code, body := lifecycle(t, client, api, id, "suspend", "")
	st := statusOf(t, body)
	if code != http.StatusAccepted || st.Phase != spec.PhaseSuspended || st.Suspension == nil {
		t.Fatalf("suspend of %s: %d %v; want 202 and Suspended", id, code, body)
	}
	return st
}

// resumeWait resumes id on node and returns its status once Running.
func resumeWait(t *testing.T, client *http.Client, api, id, node string) state.Status {
	t.Helper()
	code, body := lifecycle(t, client, api, id, "resume", `{"node":"`+node+`"}`)
	st := statusOf(t, body)
	if code != http.StatusAccepted || st.Phase != spec.PhaseRunning || st.Node != node || st.Ports[drivers.PortKey(6379, "tcp")] == "" {
		t.Fatalf("resume of %s on %s: %d %v; want 202, Running there with an address", id, node, code, body)
	}
	t.Logf("resumed on %s: %s", node, st.Timings)
	return st
}

func statusOf(t *testing.T, body map[string]any) state.Status {
	t.Helper()
	b, _ := json.Marshal(body["status"])
	var st state.Status
	_ = json.Unmarshal(b, &st)
	return st
}

// checkFile checks that the file redis saved before the first suspend is
// in the root of deployment id's instance on node, as its agent mounted it,
// and returns the identity seed the instance reads.
func checkFile(t *testing.T, p *pop, node, id string) string {
	t.Helper()
	recs, _ := filepath.Glob(filepath.Join(p.dir, node, "*", "deployments", id+".json"))
	if len(recs) != 1 {
		t.Fatalf("no record of %s on %s (%v)", id, node, recs)
	}
	b, err := os.ReadFile(recs[0])
	if err != nil {
		t.Fatal(err)
	}
	var rec deploy.Deployment
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Handle == nil {
		t.Fatalf("the record of %s on %s has no instance", id, node)
	}
	if _, err := os.Stat(filepath.Join(rec.Handle.EnvPath, "srv", "suspend-test.rdb")); err != nil {
		t.Errorf("the file written before the suspend, in the root of %s on %s: %v", id, node, err)
	}
	b, err = os.ReadFile(filepath.Join(rec.Handle.CtlPath, instancectl.IdentityDir, filepath.Base(spec.IdentityFile)))
	var ident spec.Identity
	if err != nil || json.Unmarshal(b, &ident) != nil || ident.Instance != id || ident.Seed == "" || ident.Node != node {
		t.Errorf("the identity %s reads on %s: %s, %v; want its ID, this node and a seed", id, node, b, err)
	}
	return ident.Seed
}

// containersOf lists the containers of app.
func containersOf(t *testing.T, f *deploytest.Fixture, app string) []string {
	t.Helper()
	sts, err := f.RT.List(context.Background(), map[string]string{runtime.LabelApp: app})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range sts {
		names = append(names, s.Name)
	}
	return names
}

// TestIdleSuspendPoP: a redis with `suspend_after: 6s` is not suspended
// while a client holds a connection to it, even an idle one; once the
// client has gone it is suspended within its suspend_after and two
// samples, says why in its events, and the user's next connection to its
// endpoint wakes it, with its key.
func TestIdleSuspendPoP(t *testing.T) {
	ctx, p, _, app := redisOnPoP(t, "e2e-idle", engine.NameDMTCP, func(a *spec.App) {
		a.SuspendAfter = spec.Duration(6 * time.Second)
	}, "n1")
	api := "http://" + p.apis["n1"]
	client := &http.Client{}
	dep := createOn(ctx, t, client, api, app.Name, "n1")
	addr := dep.Status.Ports[drivers.PortKey(6379, "tcp")]
	if _, err := testenv.RedisDo(ctx, nil, addr, "SET", "k", "kept"); err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Second)
	if d, _ := p.st.Deployment(ctx, dep.ID); d.Status.Phase != spec.PhaseRunning || d.Suspend {
		t.Fatalf("with a client's connection open for 10 s: %s (suspend asked: %v); want Running", d.Status.Phase, d.Suspend)
	}
	conn.Close()
	closed := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	d, err := p.st.Follow(wctx, dep.ID, func(d state.Deployment) bool { return d.Status.Phase == spec.PhaseSuspended })
	if err != nil {
		t.Fatalf("not suspended within 30 s of the client leaving: %s, %v", d.Status.Phase, err)
	}
	t.Logf("suspended %s after the client left", time.Since(closed).Round(100*time.Millisecond))
	evs, _ := p.st.Events(ctx, dep.ID)
	if !slices.ContainsFunc(evs, func(e state.Event) bool { return e.Reason == "idle" && strings.Contains(e.Message, "suspend_after 6s") }) {
		t.Errorf("events %+v; want one saying it was idle", evs)
	}
	// The user's next request, at the deployment's endpoint, wakes it.
	ep := net.JoinHostPort(p.frontend("n1"), strconv.Itoa(d.Endpoint["6379/tcp"]))
	start := time.Now()
	if got, err := testenv.RedisDo(ctx, nil, ep, "GET", "k"); err != nil || got != "kept" {
		t.Errorf("a connection to the idle-suspended deployment's endpoint %s: GET k = %q, %v; want it woken, with its key", ep, got, err)
	}
	t.Logf("woken by a connection and answered in %s", time.Since(start).Round(time.Millisecond))
	evs, _ = p.st.Events(ctx, dep.ID)
	if !slices.ContainsFunc(evs, func(e state.Event) bool { return e.Reason == "woken" }) {
		t.Errorf("events %+v; want one saying it was woken", evs)
	}
}
