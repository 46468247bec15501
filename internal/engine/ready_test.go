package engine

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestLogTailKeepsLastLines(t *testing.T) {
	l := NewLogTail(3)
	for _, s := range []string{"one\ntwo\n", "thr", "ee\r\nfour\nfive\n", "partial"} {
		if _, err := l.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	got := strings.Join(l.Lines(), "|")
	if want := "three|four|five|partial"; got != want {
		t.Fatalf("Lines = %q, want %q", got, want)
	}
	if got := strings.Join(l.Last(2), "|"); got != "five|partial" {
		t.Fatalf("Last(2) = %q", got)
	}
}

func TestLogTailWatch(t *testing.T) {
	l := NewLogTail(2)
	l.Write([]byte("early: Ready to accept connections\n"))
	select {
	case <-l.Watch("Ready to accept"):
	default:
		t.Fatal("a phrase already kept must count")
	}
	later := l.Watch("listening on :8080")
	l.Write([]byte("x\nlistening on "))
	select {
	case <-later:
		t.Fatal("half a phrase matched")
	default:
	}
	l.Write([]byte(":8080\n"))
	select {
	case <-later:
	case <-time.After(time.Second):
		t.Fatal("phrase split across writes not seen")
	}
}

func TestTCPProbe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := (TCPProbe{Addr: addr}).Probe(context.Background()); err != nil {
		t.Fatalf("open port: %v", err)
	}
	ln.Close()
	if err := (TCPProbe{Addr: addr}).Probe(context.Background()); err == nil {
		t.Fatal("closed port reported ready")
	}
}

func TestHTTPProbe(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
			w.WriteHeader(http.StatusNoContent)
		case "/moved":
			http.Redirect(w, r, "/healthz", http.StatusFound)
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	for _, c := range []struct {
		path   string
		status int
		ok     bool
	}{
		{"/healthz", 0, true},
		{"/healthz", 204, true},
		{"/healthz", 200, false},
		{"/down", 0, false},
		{"/down", 503, true},
		{"/moved", 302, true}, // redirects are not followed
		{"/moved", 0, false},
	} {
		err := HTTPProbe{URL: srv.URL + c.path, Status: c.status}.Probe(ctx)
		if (err == nil) != c.ok {
			t.Errorf("GET %s want %d: err = %v, want ok=%v", c.path, c.status, err, c.ok)
		}
	}
}

// The probe's one connection: dialed with Dial, to the URL's host, asking
// the server to close it; other schemes are refused as invalid.
func TestHTTPProbeConnection(t *testing.T) {
	var closeAsked atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		closeAsked.Store(r.Close)
		io.WriteString(w, strings.Repeat("x", 100000)) // more than the probe reads
	}))
	defer srv.Close()
	ctx := context.Background()
	var dialed []string
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		dialed = append(dialed, addr)
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	if err := (HTTPProbe{URL: srv.URL + "/", Dial: dial}).Probe(ctx); err != nil {
		t.Fatalf("probe: %v", err)
	}
	if want := strings.TrimPrefix(srv.URL, "http://"); len(dialed) != 1 || dialed[0] != want {
		t.Errorf("dialed %q, want one connection to %s", dialed, want)
	}
	if !closeAsked.Load() {
		t.Error("the request did not ask the server to close the connection")
	}
	err := (HTTPProbe{URL: "https://127.0.0.1:1/"}).Probe(ctx)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "http://") {
		t.Errorf("https URL: %v, want ErrInvalid asking for an http:// URL", err)
	}
	// A server that closes without answering is not ready.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if err := (HTTPProbe{URL: "http://" + ln.Addr().String() + "/"}).Probe(ctx); err == nil {
		t.Error("a server that closes at once: ready")
	}
}

func TestExecProbe(t *testing.T) {
	ctx := context.Background()
	if err := (ExecProbe{Argv: []string{"sh", "-c", "echo PONG"}, Want: "PONG"}).Probe(ctx); err != nil {
		t.Fatal(err)
	}
	if err := (ExecProbe{Argv: []string{"sh", "-c", "echo LOADING"}, Want: "PONG"}).Probe(ctx); err == nil {
		t.Fatal("wrong output reported ready")
	}
	err := (ExecProbe{Argv: []string{"sh", "-c", "echo connection refused; exit 1"}}).Probe(ctx)
	if err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("failing command: %v, want its output in the error", err)
	}
	if err := (ExecProbe{}).Probe(ctx); !errors.Is(err, ErrInvalid) {
		t.Fatalf("empty argv: %v", err)
	}
}

func TestOutputProbe(t *testing.T) {
	l := NewLogTail(10)
	p := NewOutputProbe(l, "Ready to accept connections")
	go func() {
		time.Sleep(30 * time.Millisecond)
		l.Write([]byte("* Ready to accept connections tcp\n"))
	}()
	if _, err := WaitReady(context.Background(), p, ReadyOptions{Timeout: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
}

func TestWaitReadyTimeoutShowsLog(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	l := NewLogTail(5)
	l.Write([]byte("starting\nFATAL: cannot read /etc/app.conf\n"))
	_, err := WaitReady(context.Background(), TCPProbe{Addr: addr}, ReadyOptions{Timeout: 150 * time.Millisecond, Log: l})
	if !errors.Is(err, ErrNotReady) {
		t.Fatalf("err = %v, want ErrNotReady", err)
	}
	for _, want := range []string{"tcp " + addr, "last attempt", "FATAL: cannot read /etc/app.conf"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

// exitedProcess is a Process that has already exited.
type exitedProcess struct{}

func (exitedProcess) Pid() int                          { return 1 }
func (exitedProcess) Wait(context.Context) (int, error) { return 3, nil }
func (exitedProcess) Signal(os.Signal) error            { return ErrExited }
func (exitedProcess) Stop(context.Context) error        { return nil }
func (exitedProcess) Timings() Timings                  { return Timings{} }

func TestWaitReadyStopsWhenAppExits(t *testing.T) {
	start := time.Now()
	_, err := WaitReady(context.Background(), NewOutputProbe(NewLogTail(1), "never"),
		ReadyOptions{Timeout: 10 * time.Second, Process: exitedProcess{}})
	if !errors.Is(err, ErrExited) || !errors.Is(err, ErrNotReady) {
		t.Fatalf("err = %v, want ErrExited and ErrNotReady", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v; an exited app should end the wait at once", d)
	}
}
