//go:build !no_ceph

package e2e

import (
	"context"
	"encoding/json"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/scheduler"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// TestMigrateDrainPoP: redis on a 2-node PoP. Under DMTCP and under CRIU
// (light container), one deployment migrated through the hook API while
// a client PINGs it every 10 ms keeps its keys at its new address; the
// time it did not answer (its last answer on the source to its first on
// the target) is measured. Then `fogctl node drain n1` moves 3
// deployments from n1 to n2, each with its key, reports each one's
// downtime, and leaves n1 cordoned with nothing running; a migrate to
// the node it runs on is refused. With FOGDEPLOY_BENCH_OUT (make bench) it
// migrates redis with 256 MiB written (and, under CRIU, 1 GiB), drains 8,
// 64 MiB written in each, and writes migrate-<engine>.json there.
func TestMigrateDrainPoP(t *testing.T) {
	for _, eng := range []engine.Name{engine.NameDMTCP, engine.NameCRIU} {
		t.Run(string(eng), func(t *testing.T) { testMigrateDrain(t, eng) })
	}
}

func testMigrateDrain(t *testing.T, eng engine.Name) {
	ctx, p, f, app := redisOnPoP(t, "e2e-mig", eng, nil, "n1", "n2")
	api := "http://" + p.apis["n1"]
	client := &http.Client{}
	addrOf := func(ports map[string]string) string { return ports[drivers.PortKey(6379, "tcp")] }

	// One migration under a client's load.
	dep := createOn(ctx, t, client, api, app.Name, "n1")
	src := addrOf(dep.Status.Ports)
	if got, err := testenv.RedisDo(ctx, nil, src, "SET", "user", "alice"); err != nil || got != "OK" {
		t.Fatalf("SET: %q, %v", got, err)
	}
	if code, _ := migrateHook(t, client, api, dep.ID, "n1"); code != http.StatusConflict {
		t.Errorf("migrate to the node it runs on: %d; want 409", code)
	}
	down, moved := migrateUnderPings(ctx, t, client, api, dep.ID, src)
	dst := addrOf(moved.Ports)
	if got, err := testenv.RedisDo(ctx, nil, dst, "GET", "user"); err != nil || got != "alice" {
		t.Errorf("after the migration: GET user = %q, %v; want alice", got, err)
	}
	t.Logf("%s: migrated %s from %s to %s: no answer for %s at the client (%s in the agents), checkpoint %d bytes, %s in all",
		eng, dep.ID, moved.From, moved.To, down.Round(time.Millisecond), moved.Downtime.Round(time.Millisecond), moved.Bytes,
		moved.Total.Round(time.Millisecond))
	prepared(ctx, t, p, dep.ID)
	// Its checkpoint was written into memory: the app has no bound it
	// could pass, and the node has room.
	if len(p.logged(checkpointWent("memory", dep.ID))) == 0 {
		t.Errorf("%s: no agent logged that %s's checkpoint went into memory", eng, dep.ID)
	}
	out := os.Getenv("FOGDEPLOY_BENCH_OUT")
	var big bigState
	var huge *hugeState
	if out != "" {
		big = measureBig(ctx, t, p, f, client, api, app, eng)
		if eng == engine.NameCRIU {
			h := measureHuge(ctx, t, p, f, client, api, app)
			huge = &h
		}
	}

	// A drain of n1 with 3 deployments on it (8 for make bench).
	if err := p.st.DeleteDeployment(ctx, dep.ID); err != nil {
		t.Fatal(err)
	}
	n, fill := 3, 0
	if out != "" {
		n, fill = 8, 64<<20 // the drain: 64 MiB written in each
	}
	ids := map[string]string{}
	var full string // one whose memory bound leaves too little for its checkpoint in memory
	for i := range n {
		d := createOn(ctx, t, client, api, app.Name, "n1")
		val := "value-" + string(rune('a'+i))
		if _, err := testenv.RedisDo(ctx, nil, addrOf(d.Status.Ports), "SET", "k", val); err != nil {
			t.Fatal(err)
		}
		size := fill
		if out == "" && i == 0 {
			size, full = 128<<20, d.ID // of redisOnPoP's 256 MiB bound
		}
		if size > 0 {
			if got, err := testenv.RedisDo(ctx, nil, addrOf(d.Status.Ports), "SETRANGE", "fill", strconv.Itoa(size-1), "z"); err != nil || got != strconv.Itoa(size) {
				t.Fatalf("SETRANGE of %d bytes: %q, %v", size, got, err)
			}
		}
		ids[d.ID] = val
	}
	start := time.Now()
	stdout, errOut, rc := p.fogctl(ctx, "node", "drain", "n1", "--parallel", "2", "-o", "json")
	var report []scheduler.Moved
	if err := json.Unmarshal([]byte(stdout), &report); rc != 0 || err != nil || len(report) != n {
		t.Fatalf("fogctl node drain n1 = %d, %v: %s%s; want %d moved", rc, err, stdout, errOut, n)
	}
	drained := time.Since(start)
	t.Logf("%s: drained %d deployments (%d MiB written in each) from n1 in %s", eng, n, fill>>20, drained.Round(time.Millisecond))
	for _, m := range report {
		if m.To != "n2" || m.Error != "" || ids[m.ID] == "" {
			t.Errorf("drain: %+v; want it moved to n2", m)
			continue
		}
		if got, err := testenv.RedisDo(ctx, nil, addrOf(m.Ports), "GET", "k"); err != nil || got != ids[m.ID] {
			t.Errorf("after the drain, %s: GET k = %q, %v; want %q", m.ID, got, err, ids[m.ID])
		}
		t.Logf("  %s: %s to %s, %s without an answer", m.ID, m.From, m.To, m.Downtime.Round(time.Millisecond))
	}
	deps, err := p.st.Deployments(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range deps {
		if d.Node != "n2" || d.Status.Phase != spec.PhaseRunning {
			t.Errorf("after the drain: %s %s on %q; want Running on n2", d.ID, d.Status.Phase, d.Node)
		}
	}
	if nd, err := p.st.Node(ctx, "n1"); err != nil || nd.Cordon == nil {
		t.Errorf("n1 after the drain: %+v, %v; want it cordoned", nd, err)
	}
	if full != "" && len(p.logged(checkpointWent("the node's disk", full))) == 0 {
		t.Errorf("%s: no agent logged that %s's checkpoint (128 MiB written under a 256 MiB bound) went to the node's disk", eng, full)
	}
	// The hand-overs are over: nothing of them stays mounted.
	var left []string
	for i := 0; i < 150; i++ {
		left = slices.DeleteFunc(deploytest.MountsUnder(t, p.dir), func(mp string) bool { return !strings.Contains(mp, "/handoffs/") })
		if len(left) == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Errorf("%s: after the migrations, still mounted in the agents' hand-overs: %v", eng, left)
	}
	if out != "" {
		res := migrationBench{Engine: eng, DowntimeMS: msOf(down), AgentsMS: msOf(moved.Downtime), Bytes: moved.Bytes,
			Drained: n, DrainFilled: int64(fill), DrainMS: msOf(drained), Big: big, Huge: huge}
		for _, m := range report {
			res.DrainDowntimesMS = append(res.DrainDowntimesMS, msOf(m.Downtime))
		}
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(filepath.Join(out, "migrate-"+string(eng)+".json"), append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// checkpointWent matches an agent's line that deployment id's migration
// checkpoint went into memory, or to the node's disk.
func checkpointWent(where, id string) *regexp.Regexp {
	return regexp.MustCompile(`a migration's checkpoint goes (into|to) ` + regexp.QuoteMeta(where) + `" node=\S+ deployment=` + regexp.QuoteMeta(id) + `\b`)
}

// migrationBench is what TestMigrateDrainPoP measured, for make bench.
type migrationBench struct {
	Engine engine.Name `json:"engine"`
	// DowntimeMS is the client's: its last answer from the source to its
	// first from the target; AgentsMS from the suspend's request to
	// Running on the target.
	DowntimeMS float64 `json:"downtime_ms"`
	AgentsMS   float64 `json:"agents_ms"`
	Bytes      int64   `json:"bytes"`
	// Drained deployments moved off a node in DrainMS, each without an
	// answer for DrainDowntimesMS.
	Drained int `json:"drained"`
	// DrainFilled is what was written in each drained instance's memory
	// before the drain (bytes; 0: redis as started).
	DrainFilled      int64     `json:"drain_filled_bytes"`
	DrainMS          float64   `json:"drain_ms"`
	DrainDowntimesMS []float64 `json:"drain_downtimes_ms"`
	// Big is the same redis with 256 MiB written.
	Big bigState `json:"big"`
	// Huge is a migration with 1 GiB written (CRIU only).
	Huge *hugeState `json:"huge,omitempty"`
}

// prepared checks that the target of deployment id's migration made its
// container while the source suspended it (its resume made none), and
// logs the suspend's and the resume's phases.
func prepared(ctx context.Context, t *testing.T, p *pop, id string) {
	t.Helper()
	d, err := p.st.Deployment(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, made := d.Status.Timings.Get(string(deploy.StepContainer)); made {
		t.Errorf("the migration's resume made its container (%s); want the one its target prepared meanwhile", d.Status.Timings)
	}
	evs, _ := p.st.Events(ctx, id)
	for _, ev := range evs {
		if ev.Reason == "suspended" {
			t.Logf("suspended: %s", ev.Message)
		}
	}
	t.Logf("resumed on %s: %s", d.Node, d.Status.Timings)
}

// migrateUnderPings migrates id (answering at src) through the hook API
// to the node placement picks while a client PINGs it every 10 ms, and
// returns the time from its last answer at src to its first at its new
// address, and what the migration reported.
func migrateUnderPings(ctx context.Context, t *testing.T, client *http.Client, api, id, src string) (time.Duration, scheduler.Moved) {
	t.Helper()
	down := directPings(ctx, src)
	time.Sleep(100 * time.Millisecond)
	code, moved := migrateHook(t, client, api, id, "")
	d := down(moved.Ports[drivers.PortKey(6379, "tcp")])
	if code != http.StatusOK || moved.From != "n1" || moved.To != "n2" || d == 0 {
		t.Fatalf("migrate: %d %+v, no answer before and after it (%s)", code, moved, d)
	}
	return d, moved
}

// hugeState is what measureHuge measured.
type hugeState struct {
	Bytes      int64   `json:"bytes"`
	DowntimeMS float64 `json:"downtime_ms"`
	// P99BeforeMS and P99AfterMS are p99Reads' before the migration and
	// in the 2 s after it.
	P99BeforeMS float64 `json:"p99_before_ms"`
	P99AfterMS  float64 `json:"p99_after_ms"`
	// PostCopyMS is how long its memory took to follow it (CRIU).
	PostCopyMS float64 `json:"postcopy_ms,omitempty"`
}

// measureHuge measures, for make bench, the migration of a redis on n1
// with 1 GiB written (app given 2 GiB) to n2 under a client's PINGs, and
// checks the value after.
func measureHuge(ctx context.Context, t *testing.T, p *pop, f *deploytest.Fixture, client *http.Client, api string, small spec.App) hugeState {
	t.Helper()
	const size = 1 << 30
	app, dep, src := largeOnN1(ctx, t, p, client, api, small, "-huge", "2G")
	// Two values of 512 MiB, redis's largest.
	for _, k := range []string{"huge1", "huge2"} {
		if got, err := testenv.RedisDo(ctx, nil, src, "SETRANGE", k, strconv.Itoa(size/2-1), "z"); err != nil || got != strconv.Itoa(size/2) {
			t.Fatalf("SETRANGE of 512 MiB: %q, %v", got, err)
		}
	}
	before := p99Reads(ctx, t, src, "huge1", size/2, time.Second)
	window := postCopyWindow(t, p)
	down, moved := migrateUnderPings(ctx, t, client, api, dep.ID, src)
	after := p99Reads(ctx, t, moved.Ports[drivers.PortKey(6379, "tcp")], "huge1", size/2, 2*time.Second)
	postCopy := window()
	prepared(ctx, t, p, dep.ID)
	for _, k := range []string{"huge1", "huge2"} {
		if got, err := testenv.RedisDo(ctx, nil, moved.Ports[drivers.PortKey(6379, "tcp")], "STRLEN", k); err != nil || got != strconv.Itoa(size/2) {
			t.Errorf("after the migration: STRLEN %s = %q, %v; want %d", k, got, err, size/2)
		}
	}
	t.Logf("1 GiB written: migrated with no answer for %s (checkpoint %d bytes), its memory after it in %s; p99 of a read of 16 bytes: %s before, %s in the 2 s after",
		down.Round(time.Millisecond), moved.Bytes, postCopy.Round(time.Millisecond), before.Round(10*time.Microsecond), after.Round(10*time.Microsecond))
	dropLarge(ctx, t, p, f, app, dep.ID)
	return hugeState{Bytes: moved.Bytes, DowntimeMS: msOf(down), P99BeforeMS: msOf(before), P99AfterMS: msOf(after), PostCopyMS: msOf(postCopy)}
}

// postCopyWindow returns a function that waits (up to 60 s) for n1's next
// post-copy page session to end and returns how long it took: the window
// in which a loss of n1 would lose the instance after it runs on n2.
func postCopyWindow(t *testing.T, p *pop) func() time.Duration {
	t.Helper()
	const name = "fogdeploy_migrate_postcopy_seconds"
	count, sum := metricCount(t, p.apis["n1"], name+"_count"), metricCount(t, p.apis["n1"], name+"_sum")
	return func() time.Duration {
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if metricCount(t, p.apis["n1"], name+"_count") > count {
				return time.Duration((metricCount(t, p.apis["n1"], name+"_sum") - sum) * float64(time.Second))
			}
		}
		t.Errorf("no post-copy page session ended on n1 within a minute of the migration")
		return 0
	}
}

// p99Reads reads 16 bytes of value key (of size bytes) at addr, at a
// random offset every 10 ms for d, and returns the 99th percentile of the
// reads' latency: right after a migration, the app's latency while its
// memory arrives (a read of a page not yet in waits for it).
func p99Reads(ctx context.Context, t *testing.T, addr, key string, size int, d time.Duration) time.Duration {
	t.Helper()
	var lat []time.Duration
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		off := mrand.IntN(size - 16)
		start := time.Now()
		if _, err := testenv.RedisDo(ctx, nil, addr, "GETRANGE", key, strconv.Itoa(off), strconv.Itoa(off+15)); err != nil {
			t.Errorf("GETRANGE %s at %s: %v", key, addr, err)
			return 0
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	return lat[len(lat)*99/100]
}

// bigState is what measureBig measured.
type bigState struct {
	// Bytes is the checkpoint the migration moved.
	Bytes int64 `json:"bytes"`
	// DowntimeMS is the client's, as migrationBench's.
	DowntimeMS float64 `json:"downtime_ms"`
	// ReleaseMS is from a suspend's request to its instance's container
	// gone, its memory back to the node.
	ReleaseMS float64 `json:"release_ms"`
	// ResumeMS is from a resume's request to the app's first answer;
	// RestoreMS the same for a new deployment of the app on that node
	// (its generation restored, checkpoint local).
	ResumeMS  float64 `json:"resume_ms"`
	RestoreMS float64 `json:"restore_ms"`
	// P99BeforeMS and P99AfterMS are p99Reads' before the migration and
	// in the 2 s after it (its memory arriving, after a post-copy).
	P99BeforeMS float64 `json:"p99_before_ms"`
	P99AfterMS  float64 `json:"p99_after_ms"`
	// PostCopyMS is how long its memory took to follow it (CRIU).
	PostCopyMS float64 `json:"postcopy_ms,omitempty"`
}

// measureBig measures, for make bench, a redis on n1 with 256 MiB written
// (a value of that size; app given 1 GiB): its migration to n2 under a client's PINGs,
// then on n2 its suspend until its memory is back, its resume to the
// first answer beside a restore of its app's generation to the first
// answer, and that the value is whole after all of it.
func measureBig(ctx context.Context, t *testing.T, p *pop, f *deploytest.Fixture, client *http.Client, api string, small spec.App, eng engine.Name) bigState {
	t.Helper()
	const size = 256 << 20
	app, dep, src := largeOnN1(ctx, t, p, client, api, small, "-big", "1G")
	if got, err := testenv.RedisDo(ctx, nil, src, "SETRANGE", "big", strconv.Itoa(size-1), "z"); err != nil || got != strconv.Itoa(size) {
		t.Fatalf("SETRANGE of 256 MiB: %q, %v", got, err)
	}
	before := p99Reads(ctx, t, src, "big", size, time.Second)
	window := postCopyWindow(t, p)
	down, moved := migrateUnderPings(ctx, t, client, api, dep.ID, src)
	res := bigState{Bytes: moved.Bytes, DowntimeMS: msOf(down), P99BeforeMS: msOf(before),
		P99AfterMS: msOf(p99Reads(ctx, t, moved.Ports[drivers.PortKey(6379, "tcp")], "big", size, 2*time.Second))}
	if eng == engine.NameCRIU {
		res.PostCopyMS = msOf(window())
	}
	// The phases of the migration's suspend and resume, for the log.
	if evs, err := p.st.Events(ctx, dep.ID); err == nil {
		for _, e := range evs {
			if e.Reason == "suspended" || e.Reason == "resumed" {
				t.Logf("%s: 256 MiB migration: %s: %s", eng, e.Reason, e.Message)
			}
		}
	}
	prepared(ctx, t, p, dep.ID)
	// The suspend, until no container of the app is left (it has no
	// other instance).
	gone := make(chan time.Duration, 1)
	start := time.Now()
	go func() {
		for ctx.Err() == nil {
			if sts, err := f.RT.List(ctx, map[string]string{runtime.LabelApp: app.Name}); err == nil && len(sts) == 0 {
				gone <- time.Since(start)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		gone <- 0
	}()
	suspendWait(t, client, api, dep.ID)
	res.ReleaseMS = msOf(<-gone)
	answered := func(addr string) {
		for ctx.Err() == nil {
			if got, err := testenv.RedisDo(ctx, nil, addr, "PING"); err == nil && got == "PONG" {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	start = time.Now()
	back := resumeWait(t, client, api, dep.ID, "n2")
	answered(back.Ports[drivers.PortKey(6379, "tcp")])
	res.ResumeMS = msOf(time.Since(start))
	start = time.Now()
	fresh := createOn(ctx, t, client, api, app.Name, "n2")
	answered(fresh.Status.Ports[drivers.PortKey(6379, "tcp")])
	res.RestoreMS = msOf(time.Since(start))
	if got, err := testenv.RedisDo(ctx, nil, back.Ports[drivers.PortKey(6379, "tcp")], "STRLEN", "big"); err != nil || got != strconv.Itoa(size) {
		t.Errorf("after migration, suspend and resume: STRLEN big = %q, %v; want %d", got, err, size)
	}
	t.Logf("%s: 256 MiB written: migrated with no answer for %.0f ms (checkpoint %d bytes), its memory after it in %.0f ms, p99 of a read %.2f ms before, %.2f ms in the 2 s after; suspended, memory back in %.0f ms; resumed to its first answer in %.0f ms, a restore of its app in %.0f ms (%.2fx)",
		eng, res.DowntimeMS, res.Bytes, res.PostCopyMS, res.P99BeforeMS, res.P99AfterMS, res.ReleaseMS, res.ResumeMS, res.RestoreMS, res.ResumeMS/res.RestoreMS)
	// Gone, with the app and its generation, before the drain.
	dropLarge(ctx, t, p, f, app, dep.ID, fresh.ID)
	return res
}

// largeOnN1 makes small's app again as one named with suffix, with memory
// and checkpoint size mem, and deploys it on n1: the app, its deployment
// and its redis's address.
func largeOnN1(ctx context.Context, t *testing.T, p *pop, client *http.Client, api string, small spec.App, suffix, mem string) (spec.App, created, string) {
	t.Helper()
	app := small
	app.Name += suffix
	app.Resources.Memory, app.CheckpointSize = mem, mem
	if err := p.st.CreateApp(ctx, app, false); err != nil {
		t.Fatal(err)
	}
	dep := createOn(ctx, t, client, api, app.Name, "n1")
	return app, dep, dep.Status.Ports[drivers.PortKey(6379, "tcp")]
}

// dropLarge undeploys ids and removes app (largeOnN1's) and its
// generations.
func dropLarge(ctx context.Context, t *testing.T, p *pop, f *deploytest.Fixture, app spec.App, ids ...string) {
	t.Helper()
	undeployWait(ctx, t, p, ids...)
	if err := p.st.DeleteApp(ctx, app.Name); err != nil {
		t.Fatal(err)
	}
	f.RemoveGenerations(t, app.Name)
}

// migrateHook migrates id through the hook API to node ("" : placed).
func migrateHook(t *testing.T, client *http.Client, api, id, node string) (int, scheduler.Moved) {
	t.Helper()
	body := ""
	if node != "" {
		body = `{"node":"` + node + `"}`
	}
	req, _ := http.NewRequest(http.MethodPost, api+"/v1/deployments/"+id+"/migrate", strings.NewReader(body))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m scheduler.Moved
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m
}
