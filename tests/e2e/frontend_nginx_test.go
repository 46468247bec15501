//go:build !no_ceph

package e2e

import (
	"bufio"
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
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/evaluation"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// frontendNginx is frontend-nginx.json: nginx's steady state direct, through
// the front end of the node it runs on and through the other node's.
type frontendNginx struct {
	// AB is ab -k -c Concurrency for Seconds on each path: requests per
	// second, and ab's mean time per request (ms).
	Concurrency int                `json:"concurrency"`
	Seconds     int                `json:"seconds"`
	RPS         map[string]float64 `json:"rps"`
	MeanMS      map[string]float64 `json:"mean_ms"`
	Failed      map[string]int     `json:"failed"`
	// MedianUS is the median of one client's keep-alive GETs, one after
	// the other, on each path.
	MedianUS map[string]float64 `json:"median_us"`
}

// TestFrontendNginxPoP (make bench, with nginx among its apps): the front
// end's aim on its own load. nginx (configs/apps/nginx.yaml, CRIU) on a
// 2-node PoP, under `ab -k -c 100` direct to its published port, through
// the front end of the node it runs on (the kernel's path) and through
// the other node's (one user-space hop); then one client's keep-alive GETs
// one after the other on each path, for the median added. Three rounds,
// alternating, the best kept: two shared cores. Results:
// frontend-nginx.json.
func TestFrontendNginxPoP(t *testing.T) {
	out := os.Getenv("FOGDEPLOY_BENCH_OUT")
	if out == "" {
		t.Skip("a measurement: make bench runs it, with nginx among its apps (FOGDEPLOY_BENCH_OUT)")
	}
	ab, err := exec.LookPath("ab")
	if err != nil {
		t.Skipf("ab (apache2-utils) is not installed: %v", err)
	}
	f := deploytest.NewFixture(t, "container")
	if _, _, err := f.D.Drivers().CheckEngine(context.Background(), engine.NameCRIU); err != nil {
		testenv.Unavailable(t, "criu", err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	t.Cleanup(cancel)
	fh, err := os.Open("../../configs/apps/nginx.yaml")
	if err != nil {
		t.Fatal(err)
	}
	app, err := spec.ParseApp(fh)
	fh.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.L.Manager.Get(ctx, app.Env); err != nil {
		t.Skipf("environment %s: %v (make bench builds it: bin/fogctl env build nginx -f configs/envs/nginx.build)", app.Env, err)
	}
	app.Name = "e2e-fe-nginx-" + strconv.FormatInt(time.Now().UnixNano()%1e6, 36)
	// Its generations go once the PoP's agents, and their slots, are gone.
	t.Cleanup(func() { f.RemoveGenerations(t, app.Name) })
	p := startPoP(ctx, t, f, app.Name, "fogdeploy/dmtcp:deploytest", "", "n1", "n2")
	if err := p.st.CreateApp(ctx, app, false); err != nil {
		t.Fatal(err)
	}
	api := "http://" + p.apis["n1"]
	dep := createOn(ctx, t, &http.Client{}, api, app.Name, "n1")
	d, err := p.st.Deployment(ctx, dep.ID)
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(d.Endpoint["8080/tcp"])
	paths := []struct{ name, addr string }{
		{"direct", dep.Status.Ports[drivers.PortKey(8080, "tcp")]},
		{"local", net.JoinHostPort(p.frontend("n1"), port)},
		{"remote", net.JoinHostPort(p.frontend("n2"), port)},
	}
	if n := kernelRoutes(t, p, "n1"); n != 1 {
		t.Errorf("n1's kernel routes: %v; want 1", n)
	}
	const conc, secs = 100, 5
	res := frontendNginx{Concurrency: conc, Seconds: secs, RPS: map[string]float64{}, MeanMS: map[string]float64{},
		Failed: map[string]int{}, MedianUS: map[string]float64{}}
	for range 3 {
		for _, path := range paths {
			b, err := exec.CommandContext(ctx, ab, "-q", "-k", "-c", strconv.Itoa(conc), "-t", strconv.Itoa(secs), "-n", "10000000", "-s", "30",
				"http://"+path.addr+"/").CombinedOutput()
			if err != nil {
				t.Fatalf("ab on %s (%s): %v: %s", path.name, path.addr, err, b)
			}
			r, err := evaluation.ParseAB(string(b))
			if err != nil {
				t.Fatal(err)
			}
			res.Failed[path.name] += r.Failed + r.Non2xx
			if r.RPS > res.RPS[path.name] {
				res.RPS[path.name], res.MeanMS[path.name] = r.RPS, r.MeanMS
			}
			med, err := getLoop(ctx, path.addr, 2*time.Second)
			if err != nil {
				t.Fatalf("GETs on %s: %v", path.name, err)
			}
			if v := float64(med.Nanoseconds()) / 1000; res.MedianUS[path.name] == 0 || v < res.MedianUS[path.name] {
				res.MedianUS[path.name] = v
			}
		}
	}
	for _, path := range paths {
		if res.Failed[path.name] != 0 {
			t.Errorf("%s: %d failed or non-2xx requests", path.name, res.Failed[path.name])
		}
		t.Logf("front end nginx %s: %.0f requests/s (%.0f%% of direct), ab's mean %.2f ms; one client's median GET %.0f us (%+.0f us)", path.name,
			res.RPS[path.name], 100*res.RPS[path.name]/res.RPS["direct"], res.MeanMS[path.name], res.MedianUS[path.name],
			res.MedianUS[path.name]-res.MedianUS["direct"])
	}
	b, _ := json.MarshalIndent(res, "", "  ")
	if err := os.WriteFile(filepath.Join(out, "frontend-nginx.json"), append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.st.DeleteDeployment(ctx, dep.ID); err != nil {
		t.Fatal(err)
	}
	p.waitAll(ctx, app.Name, 0)
}

// getLoop sends keep-alive GET / to addr, one after the other, for d, and
// returns the median time to each whole answer. A connection the server
// closes (nginx's keepalive_requests) is made again; its last request is
// not counted.
func getLoop(ctx context.Context, addr string, d time.Duration) (time.Duration, error) {
	var c net.Conn
	var r *bufio.Reader
	defer func() {
		if c != nil {
			c.Close()
		}
	}()
	req := []byte("GET / HTTP/1.1\r\nHost: " + addr + "\r\n\r\n")
	var lat []time.Duration
	for end := time.Now().Add(d); time.Now().Before(end) && ctx.Err() == nil; {
		if c == nil {
			var err error
			if c, err = net.DialTimeout("tcp", addr, 5*time.Second); err != nil {
				return 0, err
			}
			r = bufio.NewReader(c)
		}
		start := time.Now()
		resp, err := roundTrip(c, r, req)
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
			c.Close()
			c = nil
			continue
		}
		if err != nil {
			return 0, err
		}
		if resp != http.StatusOK {
			return 0, fmt.Errorf("GET /: %d", resp)
		}
		lat = append(lat, time.Since(start))
	}
	if len(lat) == 0 {
		return 0, fmt.Errorf("no answer within %s", d)
	}
	slices.Sort(lat)
	return lat[len(lat)/2], nil
}

// roundTrip writes req on c and reads its whole answer, returning its
// status.
func roundTrip(c net.Conn, r *bufio.Reader, req []byte) (int, error) {
	if _, err := c.Write(req); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0, err
	}
	return resp.StatusCode, nil
}
