package agent

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fogdeploy/fogdeploy/internal/apiauth"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// TestHookLoad: one client opens 200 long polls at once and creates 50
// deployments a second for 4 s. It gets 429s with hints beyond its bounds
// (16 long polls, 64 deployments held), the agent's requests to etcd stay
// within a bound set by what was accepted (a long poll follows the
// agent's one watch: one read when it starts, none while it waits; a
// refused request reads nothing), and another client's requests are
// answered meanwhile.
func TestHookLoad(t *testing.T) {
	testenv.SkipShort(t, testenv.Etcd) // seconds of load or of an etcd restarted: not a unit test
	endpoint, seed := statetest.Start(t)
	ctx := context.Background()
	if err := seed.CreateApp(ctx, spec.App{Name: "chat", Env: "e", Command: []string{"x"},
		Ready: spec.Readiness{Kind: spec.ReadyOutput, Phrase: "up"}}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := seed.Register(ctx, state.Node{Name: "n1", Capacity: 1000}, 30); err != nil {
		t.Fatal(err)
	}
	// The agent's own store, its requests to etcd counted as its
	// fogdeploy_etcd_requests_total counts them.
	var requests atomic.Int64
	st, err := state.Open(ctx, state.Config{Endpoints: []string{endpoint}, DialTimeout: time.Second,
		Requests: func(string) { requests.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	wctx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	st.Watch(wctx, slog.New(slog.DiscardHandler))
	for deadline := time.Now().Add(10 * time.Second); !st.Watching(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the agent's view was not loaded in 10 s")
		}
	}

	const operator = "0123456789abcdef-operator"
	loud, quiet := apiauth.NewToken(), apiauth.NewToken()
	sec := credentials(t, operator,
		entry("loud", loud, "  apps: [chat]\n  rate: 1000\n  burst: 1000\n")+ // default bounds: 16 waits, 64 deployments
			entry("quiet", quiet, "  apps: [chat]\n"), nil)
	a := &agent{st: st, m: newMetrics(prometheus.NewRegistry())}
	h := &hooks{a: a, keys: sec.keys}
	api := serveHooks(t, h)
	create := func(tok string) (int, map[string]any) {
		code, _, v := api.do("POST", "/v1/deployments", tok, `{"app":"chat"}`)
		return code, v
	}
	code, v := create(loud)
	if code != 201 {
		t.Fatalf("create: %d %v", code, v)
	}
	mine := v["id"].(string)
	code, v = create(quiet)
	if code != 201 {
		t.Fatalf("create: %d %v", code, v)
	}
	theirs := v["id"].(string)

	start := requests.Load()
	var wg, creates sync.WaitGroup
	var mu sync.Mutex
	pollCodes, createCodes := map[int]int{}, map[int]int{}
	var hints []string
	const polls = 200
	for range polls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Held until their wait ends, after the load.
			code, _, v := api.do("GET", "/v1/deployments/"+mine+"?wait=12s&after=2100-01-01T00:00:00Z", loud, "")
			mu.Lock()
			defer mu.Unlock()
			pollCodes[code]++
			if code == 429 {
				hints = append(hints, fmt.Sprint(v["hint"]))
			}
		}()
	}
	// 50 creates a second for 4 s, each on its own.
	tick := time.NewTicker(20 * time.Millisecond)
	for range 200 {
		<-tick.C
		creates.Add(1)
		go func() {
			defer creates.Done()
			code, v := create(loud)
			mu.Lock()
			defer mu.Unlock()
			createCodes[code]++
			if code == 429 {
				hints = append(hints, fmt.Sprint(v["hint"]))
			}
		}()
	}
	tick.Stop()
	// Meanwhile (the polls are still held) the other client reads.
	var slowest time.Duration
	for range 20 {
		t0 := time.Now()
		if code, _, v := api.do("GET", "/v1/deployments/"+theirs, quiet, ""); code != 200 {
			t.Errorf("another client's read under the load: %d %v", code, v)
		}
		slowest = max(slowest, time.Since(t0))
		time.Sleep(20 * time.Millisecond)
	}
	creates.Wait()
	// The held long polls wait on: they cost etcd nothing meanwhile.
	held := requests.Load()
	time.Sleep(3 * time.Second)
	if n := requests.Load() - held; n != 0 {
		t.Errorf("the agent made %d requests of etcd in 3 s while only long polls were held; want none (they follow its watch)", n)
	}
	wg.Wait()
	used := requests.Load() - start

	if pollCodes[200] != 16 || pollCodes[429] != polls-16 {
		t.Errorf("200 long polls at once: %v; want 16 (the default bound) answered at their wait and %d 429s", pollCodes, polls-16)
	}
	if createCodes[201] != 63 || createCodes[429] != 200-63 {
		t.Errorf("200 creates at 50/s from a client holding 1: %v; want 63 made (the default quota is 64) and 137 429s", createCodes)
	}
	if slices.Contains(hints, "<nil>") || len(hints) == 0 {
		t.Errorf("a 429 without a hint")
	}
	bound := int64(2*createCodes[201] + pollCodes[200] + 20 + 10)
	if used > bound {
		t.Errorf("the agent made %d requests of etcd under the load; want at most %d (2 per create made, 1 per long poll held, 1 per read)", used, bound)
	}
	// Not a measure of speed (the bench's): another client is not made to
	// wait behind the load.
	if slowest > 2*time.Second {
		t.Errorf("another client's slowest read under the load: %v; want it answered without waiting for the load (under 2 s)", slowest)
	}
	t.Logf("etcd requests under the load: %d (bound %d); other client's slowest read: %v; polls %v; creates %v", used, bound, slowest, pollCodes, createCodes)
}
