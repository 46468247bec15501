// The readiness probe the entrypoint runs against its app, timed for the host.

package main

import (
	"bufio"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/engine"
)

// probe reports the time until the app answers on cfg.ready: until a
// connection is accepted, or, with -ready-expect, until the reply to
// -ready-send starts with the expected bytes, or, with -ready-http, until
// a GET is answered with the ready status. (A restored listening socket
// accepts connections before the app runs again, so a connect-only probe
// is optimistic after a restart.)
//
// It gives up once gone (the instance's appGone) is closed: in a recycled
// container, a probe of an instance released before it was ready never
// reports for the next.
func (s *supervisor) probe(phase string, gen int, since time.Time, gone <-chan struct{}) {
	deadline := since.Add(s.cfg.readyTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-gone:
			return
		default:
		}
		if s.probeOnce() {
			s.tm.record(phase, gen, since, 0, nil)
			s.log.Info("app ready", "addr", s.cfg.ready, "ms", time.Since(since).Milliseconds())
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.log.Warn("app not ready in time", "addr", s.cfg.ready, "timeout", s.cfg.readyTimeout)
}

func (s *supervisor) probeOnce() bool {
	c, err := net.DialTimeout("tcp", s.cfg.ready, 200*time.Millisecond)
	if err != nil {
		return false
	}
	defer c.Close()
	if s.cfg.readyHTTP != "" {
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		return httpReady(c, s.cfg.readyHTTP, s.cfg.readyStatus)
	}
	if s.cfg.readyExpect == "" && s.cfg.readySend == "" {
		return true
	}
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	return engine.Exchange(c, s.cfg.readySend, s.cfg.readyExpect) == nil
}

// httpReady sends GET path on c and reports whether the status line that
// comes back carries status (any 2xx when status is 0), as the deployer's
// HTTP readiness probe decides.
func httpReady(c io.ReadWriter, path string, status int) bool {
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.0\r\nHost: 127.0.0.1\r\nUser-Agent: fogdeploy-entrypoint\r\n\r\n"); err != nil {
		return false
	}
	line, err := bufio.NewReader(io.LimitReader(c, 512)).ReadString('\n')
	if err != nil && line == "" {
		return false
	}
	f := strings.Fields(line)
	if len(f) < 2 || !strings.HasPrefix(f[0], "HTTP/") {
		return false
	}
	code, err := strconv.Atoi(f[1])
	if err != nil {
		return false
	}
	return code == status || (status == 0 && code/100 == 2)
}
