package engine

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// Probe tells whether an app is ready to serve. WaitReady runs it until it
// succeeds. There are four: TCPProbe, HTTPProbe, ExecProbe and OutputProbe.
type Probe interface {
	// Probe makes one attempt and returns nil when the app is ready.
	Probe(ctx context.Context) error
	// String names the probe in errors and logs.
	String() string
}

// DialFunc dials a connection, like net.Dialer.DialContext. NetNSDialer
// returns one that dials inside a process's network namespace.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// attemptTimeout bounds one probe attempt.
const attemptTimeout = 2 * time.Second

// TCPProbe is ready when a TCP connection to Addr succeeds, or, with
// Expect, once the reply to Send starts with Expect. A connect-only probe is
// optimistic for a restored server (or one behind a published port): the
// listening socket accepts before the app serves.
type TCPProbe struct {
	Addr   string   // host:port
	Dial   DialFunc // nil: dial from the host's network namespace
	Send   string   // written on each connection, if not ""
	Expect string   // required prefix of the reply, if not ""
}

// Probe implements Probe.
func (p TCPProbe) Probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	c, err := dialer(p.Dial)(ctx, "tcp", p.Addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if p.Send == "" && p.Expect == "" {
		return nil
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	return Exchange(c, p.Send, p.Expect)
}

// Exchange writes send on c (if not "") and reads until the reply starts
// with expect or differs from it, or c fails; it returns an error unless
// the reply starts with expect. The DMTCP container's entrypoint probes
// its app with it too.
func Exchange(c io.ReadWriter, send, expect string) error {
	if send != "" {
		if _, err := io.WriteString(c, send); err != nil {
			return err
		}
	}
	want := []byte(expect)
	got := make([]byte, 0, len(want))
	buf := make([]byte, 512)
	for len(got) < len(want) {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil || !bytes.HasPrefix(want, got[:min(len(got), len(want))]) {
			break
		}
	}
	if !bytes.HasPrefix(got, want) {
		return fmt.Errorf("reply %q does not start with %q", lastLine(got), expect)
	}
	return nil
}

// String implements Probe.
func (p TCPProbe) String() string { return "tcp " + p.Addr }

func dialer(d DialFunc) DialFunc {
	if d != nil {
		return d
	}
	var nd net.Dialer
	return nd.DialContext
}

// HTTPProbe is ready when GET URL answers with Status.
type HTTPProbe struct {
	URL    string   // e.g. http://127.0.0.1:8080/healthz
	Status int      // expected status; 0 means any 2xx
	Dial   DialFunc // nil: dial from the host's network namespace
}

// Probe implements Probe: one GET on a connection of its own, closed after
// the answer; redirects are not followed. There is no client: a transport
// per attempt would start two goroutines for its one connection, and a
// pool hit's probe is on the deploy's critical path, sharing the node's
// cores with every other deploy.
func (p HTTPProbe) Probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL, nil)
	if err != nil {
		return fmt.Errorf("probe %s: %w: %w", p, ErrInvalid, err)
	}
	if req.URL.Scheme != "http" {
		return fmt.Errorf("probe %s: %w: scheme %q (give an http:// URL)", p, ErrInvalid, req.URL.Scheme)
	}
	req.Close = true
	addr := req.URL.Host
	if req.URL.Port() == "" {
		addr = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	c, err := dialer(p.Dial)(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if err := req.Write(c); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	ok := resp.StatusCode == p.Status || (p.Status == 0 && resp.StatusCode/100 == 2)
	if !ok {
		return fmt.Errorf("GET %s: status %d", p.URL, resp.StatusCode)
	}
	return nil
}

// String implements Probe.
func (p HTTPProbe) String() string {
	if p.Status == 0 {
		return "http GET " + p.URL + " (2xx)"
	}
	return fmt.Sprintf("http GET %s (%d)", p.URL, p.Status)
}

// ExecProbe is ready when the command exits with status 0 (and, when Want is
// set, prints it). To probe inside a network namespace, prefix Argv with
// nsenter --net=/proc/PID/ns/net.
type ExecProbe struct {
	Argv []string
	Env  []string // nil: the current environment
	Want string   // required substring of the combined output, if not ""
}

// Probe implements Probe.
func (p ExecProbe) Probe(ctx context.Context) error {
	if len(p.Argv) == 0 {
		return fmt.Errorf("exec probe: empty Argv: %w", ErrInvalid)
	}
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.Argv[0], p.Argv[1:]...)
	cmd.Env = p.Env
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	out = bytes.TrimSpace(out)
	if err != nil {
		return fmt.Errorf("%w: %s", err, lastLine(out))
	}
	if p.Want != "" && !bytes.Contains(out, []byte(p.Want)) {
		return fmt.Errorf("output %q lacks %q", lastLine(out), p.Want)
	}
	return nil
}

// String implements Probe.
func (p ExecProbe) String() string { return "exec " + strings.Join(p.Argv, " ") }

func lastLine(b []byte) string {
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	if len(b) > 200 {
		b = b[:200]
	}
	return string(b)
}

// OutputProbe is ready once the app has printed Phrase. Log must be the
// LogTail behind the app's Stdout (or Stderr).
type OutputProbe struct {
	Log    *LogTail
	Phrase string

	once sync.Once
	seen <-chan struct{}
}

// NewOutputProbe returns a probe that watches log for phrase; output written
// before the call counts as long as log still holds it.
func NewOutputProbe(log *LogTail, phrase string) *OutputProbe {
	p := &OutputProbe{Log: log, Phrase: phrase}
	p.watch()
	return p
}

func (p *OutputProbe) watch() <-chan struct{} {
	p.once.Do(func() {
		if p.Log != nil {
			p.seen = p.Log.Watch(p.Phrase)
		}
	})
	return p.seen
}

// Probe implements Probe. It blocks until the phrase appears or ctx is done.
func (p *OutputProbe) Probe(ctx context.Context) error {
	seen := p.watch()
	if seen == nil {
		return fmt.Errorf("output probe %q: no LogTail: %w", p.Phrase, ErrInvalid)
	}
	select {
	case <-seen:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%q not printed yet", p.Phrase)
	}
}

// String implements Probe.
func (p *OutputProbe) String() string { return fmt.Sprintf("output %q", p.Phrase) }

// ReadyOptions bound WaitReady.
type ReadyOptions struct {
	// Timeout bounds the whole wait; 0 means 30 s.
	Timeout time.Duration
	// Interval is the pause between attempts; 0 means 20 ms.
	Interval time.Duration
	// Log, if set, supplies the app's last lines to a timeout error.
	Log *LogTail
	// LogLines is how many lines to include; 0 means 20.
	LogLines int
	// Process, if set, ends the wait early when the app exits.
	Process Process
}

// WaitReady runs p until it succeeds and returns how long that took. On
// timeout the error wraps ErrNotReady and carries the last attempt's error
// and the app's last log lines; if the process exits first, it wraps
// ErrExited too.
func WaitReady(ctx context.Context, p Probe, opt ReadyOptions) (time.Duration, error) {
	if opt.Timeout <= 0 {
		opt.Timeout = 30 * time.Second
	}
	if opt.Interval <= 0 {
		opt.Interval = 20 * time.Millisecond
	}
	if opt.LogLines <= 0 {
		opt.LogLines = 20
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, opt.Timeout)
	defer cancel()
	// Attempts run under pctx, which also ends when the app exits, so a
	// blocking probe (OutputProbe) notices.
	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	var exited <-chan struct{}
	if opt.Process != nil {
		ch := make(chan struct{})
		exited = ch
		go func() {
			if _, err := opt.Process.Wait(ctx); err == nil {
				close(ch)
				pcancel()
			}
		}()
	}
	fail := func(cause, last error) error {
		err := fmt.Errorf("%s not ready after %s: %w", p, time.Since(start).Round(time.Millisecond), cause)
		if last != nil {
			err = fmt.Errorf("%w (last attempt: %v)", err, last)
		}
		if opt.Log != nil {
			err = WithOutput(err, "the app", opt.Log.Last(opt.LogLines))
		}
		return err
	}
	var last error
	for {
		last = p.Probe(pctx)
		if last == nil {
			return time.Since(start), nil
		}
		select {
		case <-exited:
			return time.Since(start), fail(errors.Join(ErrNotReady, ErrExited), last)
		case <-ctx.Done():
			return time.Since(start), fail(ErrNotReady, last)
		case <-time.After(opt.Interval):
		}
	}
}
