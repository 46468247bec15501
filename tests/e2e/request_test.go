//go:build !no_ceph

package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
	"github.com/fogdeploy/fogdeploy/pop-agent/agent"
)

// requestHit is one pool hit as a mobile backend sees it.
type requestHit struct {
	// Create is the hook POST with ?wait, up to its answer (the
	// instance Running with its address); Answer is from there to the
	// app's first answer (a redis PING); Total both.
	CreateMS float64 `json:"create_ms"`
	AnswerMS float64 `json:"answer_ms"`
	TotalMS  float64 `json:"total_ms"`
	// AgentMS is the sum of the deployment's own phases, as the node's
	// agent recorded them.
	AgentMS float64 `json:"agent_ms"`
	Node    string  `json:"node"`
}

// RequestPath is what TestRequestPathPoP measured: pool hits restored
// ahead on a 3-node PoP, from a client's hook POST to the app's first
// answer, beside the agents' own phases.
type RequestPath struct {
	Nodes    int          `json:"nodes"`
	Hits     []requestHit `json:"hits"`
	TotalP50 float64      `json:"total_p50_ms"`
	TotalP90 float64      `json:"total_p90_ms"`
	AgentP50 float64      `json:"agent_p50_ms"`
}

// TestRequestPathPoP: an app with a pool of 1 slot restored ahead on each
// of 3 nodes; a client, over one keep-alive connection, deploys it with
// `POST /v1/deployments?wait=30s` and sends the app its first request at
// the address in the answer, 10 times (BENCH_REPS), each a pool hit; the
// deployment is then deleted and the pool refills before the next. It
// reports the client's time beside the agent's phases (p50, p90), and,
// with FOGDEPLOY_BENCH_OUT, writes them there as request-path.json for
// `make bench`.
func TestRequestPathPoP(t *testing.T) {
	nodes := []string{"n1", "n2", "n3"}
	ctx, p, _, app := redisOnPoP(t, "e2e-req", engine.NameDMTCP, func(a *spec.App) { one := 1; a.Pool = &one }, nodes...)
	reps := 10
	if v, err := strconv.Atoi(os.Getenv("BENCH_REPS")); err == nil && v > 0 {
		reps = max(v*2, reps)
	}
	api := "http://" + p.apis[nodes[0]]
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}

	// The first deploy makes the generation; the pools then fill.
	first := createWait(ctx, t, client, api, app.Name)
	deleteAndSettle(ctx, t, p, client, api, first.ID)
	waitPoolsAhead(ctx, t, p.st, app.Name, len(nodes))

	var res RequestPath
	res.Nodes = len(nodes)
	for i := range reps {
		start := time.Now()
		cr := createWait(ctx, t, client, api, app.Name)
		created := time.Since(start)
		st := cr.Status
		if st.Pool != spec.PoolHit || !st.Ahead {
			t.Fatalf("hit %d: pool %q ahead %v; want a hit on a slot restored ahead (%s)", i, st.Pool, st.Ahead, st.Reason)
		}
		addr := st.Ports[drivers.PortKey(6379, "tcp")]
		if got, err := testenv.RedisDo(ctx, nil, addr, "PING"); err != nil || got != "PONG" {
			t.Fatalf("hit %d: first request to %s: %q, %v", i, addr, got, err)
		}
		total := time.Since(start)
		var agentPart time.Duration
		for _, ph := range st.Timings {
			agentPart += ph.Duration
		}
		h := requestHit{CreateMS: msOf(created), AnswerMS: msOf(total - created), TotalMS: msOf(total),
			AgentMS: msOf(agentPart), Node: cr.Node}
		res.Hits = append(res.Hits, h)
		t.Logf("hit %d on %s: client %.1f ms (create %.1f, first answer %.1f), agent's phases %.1f ms: %s",
			i, h.Node, h.TotalMS, h.CreateMS, h.AnswerMS, h.AgentMS, st.Timings.String())
		deleteAndSettle(ctx, t, p, client, api, cr.ID)
		waitPoolsAhead(ctx, t, p.st, app.Name, len(nodes))
	}
	var totals, agents []float64
	for _, h := range res.Hits {
		totals, agents = append(totals, h.TotalMS), append(agents, h.AgentMS)
	}
	res.TotalP50, res.TotalP90, res.AgentP50 = quantile(totals, 0.5), quantile(totals, 0.9), quantile(agents, 0.5)
	t.Logf("request path, %d pool hits on %d nodes: client p50 %.1f ms, p90 %.1f ms; agent's phases p50 %.1f ms",
		len(res.Hits), res.Nodes, res.TotalP50, res.TotalP90, res.AgentP50)
	if out := os.Getenv("FOGDEPLOY_BENCH_OUT"); out != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(filepath.Join(out, "request-path.json"), append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// quantile is the nearest-rank q-quantile of vs.
func quantile(vs []float64, q float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	i := int(float64(len(s))*q+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}

// createWait deploys app through the hook API and waits for it to run.
func createWait(ctx context.Context, t *testing.T, client *http.Client, api, app string) agent.CreateResponse {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, api+"/v1/deployments?wait=60s",
		strings.NewReader(`{"app":"`+app+`"}`))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var cr agent.CreateResponse
	if err := json.Unmarshal(b, &cr); resp.StatusCode != http.StatusCreated || err != nil {
		t.Fatalf("POST /v1/deployments: %d %v: %s", resp.StatusCode, err, b)
	}
	if cr.Status == nil || cr.Status.Phase != spec.PhaseRunning {
		t.Fatalf("POST /v1/deployments?wait: not Running: %s", b)
	}
	return cr
}

// deleteAndSettle deletes deployment id and waits until its status is gone.
func deleteAndSettle(ctx context.Context, t *testing.T, p *pop, client *http.Client, api, id string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, api+"/v1/deployments/"+id, nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("DELETE %s: %d", id, resp.StatusCode)
	}
	for ctx.Err() == nil {
		sts, err := p.st.Statuses(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := sts[id]; !ok {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("deployment %s not undone in time", id)
}

// waitPoolsAhead waits until n nodes each hold an idle slot of app restored ahead.
func waitPoolsAhead(ctx context.Context, t *testing.T, st *state.Store, app string, n int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		pools, err := st.Pools(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		full := 0
		for _, pl := range pools {
			if pl.App == app && pl.Idle >= 1 && pl.Ahead >= 1 {
				full++
			}
		}
		if full == n {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("pools of %s not full and ahead on %d nodes in time", app, n)
}
