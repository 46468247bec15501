// A migration's memory after its instance runs (post-copy): the target restores lazily from a
// hand-over read without the pages a lazy restore can fetch later, and its `criu lazy-pages`
// fetches them from the source's hand-over through the agents' API (the source serves them with
// engine.Pages; the target relays between the restore and the source). The source keeps the
// hand-over until the restore says it has every page: until then the instance's memory is on
// the source only.

package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

const (
	// pagesQuery asks a hand-over without the pages its target's lazy
	// restore fetches later; pagesHeader in the answer says the source
	// left them out (else the whole checkpoint came).
	pagesQuery  = "pages=remote"
	pagesHeader = "Fogdeploy-Pages"
	// pagesProtocol is the protocol a target's page session upgrades to.
	pagesProtocol = "fogdeploy-criu-pages"
	// pagesAccept bounds the target's wait for its restore to ask for
	// the pages, and pagesIdle a session's wait for a request (a lazy
	// restore asks back to back until every page is in).
	pagesAccept = 2 * time.Minute
	pagesIdle   = time.Minute
	// pagesHold bounds the source's wait for the page session of a
	// hand-over it sent without its pages, once its deployment runs.
	pagesHold = 2 * time.Minute
)

// pagesMetrics are the page sessions of post-copy migrations.
type pagesMetrics struct {
	sessions *prometheus.CounterVec
	seconds  prometheus.Histogram
}

func newPagesMetrics(reg prometheus.Registerer) pagesMetrics {
	m := pagesMetrics{
		sessions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fogdeploy_migrate_page_sessions_total",
			Help: "Page sessions of post-copy migrations, by side (source, target) and result (done: the restore had every page; cut: it ended first, and the instance's memory with it).",
		}, []string{"side", "result"}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fogdeploy_migrate_postcopy_seconds",
			Help:    "Time from a post-copy migration's restore asking for its pages to its last page (on the source): the window in which a loss of the source loses the instance.",
			Buckets: []float64{0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32},
		}),
	}
	reg.MustRegister(m.sessions, m.seconds)
	return m
}

// pageSessions are the hand-overs this node sent without their pages,
// whose page sessions it waits for before it lets them go.
type pageSessions struct {
	mu sync.Mutex
	// by deployment: closed once the session ended (or never came).
	open map[string]chan struct{}
}

// expect records that deployment id's target will ask for its pages.
func (ps *pageSessions) expect(id string) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.open == nil {
		ps.open = map[string]chan struct{}{}
	}
	if _, ok := ps.open[id]; !ok {
		ps.open[id] = make(chan struct{})
	}
}

// end records that deployment id's page session is over.
func (ps *pageSessions) end(id string) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ch, ok := ps.open[id]; ok {
		close(ch)
		delete(ps.open, id)
	}
}

// wait blocks until deployment id's page session, if one is expected,
// is over, or for at most limit.
func (ps *pageSessions) wait(ctx context.Context, id string, limit time.Duration) {
	ps.mu.Lock()
	ch, ok := ps.open[id]
	ps.mu.Unlock()
	if !ok {
		return
	}
	select {
	case <-ch:
	case <-ctx.Done():
	case <-time.After(limit):
		ps.end(id)
	}
}

// remotePages reports whether a resume of susp on this node fetches its
// memory after it runs: a lazy resume under an engine that can read pages
// from another node.
func remotePages(susp spec.Suspension) bool {
	return deploy.LazyResume(susp) && engine.Of(susp.Engine).RemotePages
}

// pagesOf opens the memory of hand-over dir's checkpoint for a page
// server; nil if its engine cannot serve it.
func pagesOf(dir string) *engine.Pages {
	p, err := engine.OpenPagesIn(dir)
	if err != nil {
		return nil
	}
	return p
}

// servePages answers the page session of hand-over id's target: after the
// hand-over's own checks (its secret, and etcd placing the deployment on
// the asking node), the connection is upgraded to CRIU's page-server
// protocol and served from the hand-over's files until the target's
// restore has every page.
func (a *agent) servePages(w http.ResponseWriter, r *http.Request) {
	id, node := r.PathValue("id"), r.Header.Get(nodeHeader)
	if a.d == nil {
		writeJSON(w, http.StatusNotFound, apiError{Error: "this agent runs no deployer"})
		return
	}
	if spec.ValidateID(id) != nil || node == "" || r.Header.Get("Upgrade") != pagesProtocol {
		a.refuseHandoff(w, r, http.StatusBadRequest, fmt.Errorf("a page session is asked as GET %s<deployment>/pages with the %s header, upgrading to %s",
			handoffPath, nodeHeader, pagesProtocol), "")
		return
	}
	_, dir, done, ok := a.openHandoff(w, r, id, node)
	if !ok {
		return
	}
	defer done()
	// Its target asks: the hand-over is kept until the session ends.
	defer a.pages.end(id)
	pages := pagesOf(dir)
	if pages == nil {
		writeJSON(w, http.StatusConflict, apiError{Error: fmt.Sprintf("the checkpoint of %s cannot be served page by page", id)})
		return
	}
	defer pages.Close()
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, apiError{Error: err.Error()})
		return
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Time{})
	if _, err := io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "+pagesProtocol+"\r\n\r\n"); err != nil {
		return
	}
	start := time.Now()
	st, err := pages.Serve(r.Context(), &idleConn{Conn: conn, r: brw.Reader})
	a.m.handoff.bytes.WithLabelValues("sent").Add(float64(st.Bytes))
	if err != nil || !st.Closed {
		a.m.pages.sessions.WithLabelValues("source", "cut").Inc()
		a.log.Error("page session cut before its restore had every page: the instance on the target loses its memory", "deployment", id, "node", node,
			"requests", st.Requests, "bytes", st.Bytes, "ms", time.Since(start).Milliseconds(), "err", err)
		return
	}
	a.m.pages.sessions.WithLabelValues("source", "done").Inc()
	a.m.pages.seconds.Observe(time.Since(start).Seconds())
	a.log.Info("pages sent: the target has the instance's whole memory", "deployment", id, "node", node,
		"requests", st.Requests, "bytes", st.Bytes, "ms", time.Since(start).Milliseconds())
}

// idleConn reads from r (the connection's buffered reader) and gives up
// on a peer silent for pagesIdle.
type idleConn struct {
	net.Conn
	r io.Reader
}

func (c *idleConn) Read(p []byte) (int, error) {
	_ = c.Conn.SetReadDeadline(time.Now().Add(pagesIdle))
	return c.r.Read(p)
}

// relayPages serves ln, the page server socket in the directory of a
// checkpoint read without its pages, for the lazy restore of deployment
// id: it relays between the restore's `criu lazy-pages` and its page
// session with the hand-over's source, until the restore has every page.
// A session cut before then leaves the restored app stopped (the engine
// stops it), and the deployment Failed: its memory is lost.
func (a *agent) relayPages(ctx context.Context, id string, h state.Handoff, ln *net.UnixListener) {
	defer ln.Close()
	_ = ln.SetDeadline(time.Now().Add(pagesAccept))
	local, err := ln.AcceptUnix()
	if err != nil {
		a.log.Warn("no restore asked for the pages of its checkpoint", "deployment", id, "err", err)
		return
	}
	defer local.Close()
	start := time.Now()
	remote, err := a.dialPages(ctx, id, h)
	if err != nil {
		a.pagesLost(ctx, id, h, 0, start, err)
		return
	}
	defer remote.Close()
	var sent int64
	var closed bool
	reqs, pages := make(chan error, 1), make(chan error, 1)
	go func() {
		var err error
		closed, err = engine.RelayPageRequests(remote, local)
		reqs <- err
	}()
	go func() {
		var err error
		sent, err = io.Copy(local, remote)
		pages <- err
	}()
	// The restore closes the session once it has every page: its close
	// request, the source's answer, the source's end of the connection.
	var perr, rerr error
	select {
	case perr = <-pages:
	case <-ctx.Done():
		perr = ctx.Err()
	}
	_ = remote.Close()
	_ = local.Close()
	rerr = <-reqs
	a.m.handoff.bytes.WithLabelValues("received").Add(float64(sent))
	if !closed || perr != nil {
		a.pagesLost(ctx, id, h, sent, start, errors.Join(perr, rerr, errors.New("no close from the restore")))
		return
	}
	a.m.pages.sessions.WithLabelValues("target", "done").Inc()
	a.log.Info("pages received: the instance has its whole memory", "deployment", id, "source", h.Node, "bytes", sent, "ms", time.Since(start).Milliseconds())
}

// pagesLost records deployment id lost: its page session with the source
// ended before its restore had every page, so the app it restored was
// stopped (a page it lacks would read as zeros), and nothing holds its
// memory now but the source's hand-over, which a cut session means is out
// of reach.
func (a *agent) pagesLost(ctx context.Context, id string, h state.Handoff, got int64, start time.Time, cause error) {
	a.m.pages.sessions.WithLabelValues("target", "cut").Inc()
	err := fmt.Errorf("%w: source node %s failed before its memory had moved (page session cut after %d MiB, %s: %v)",
		ErrLostInMigration, h.Node, got>>20, time.Since(start).Round(time.Millisecond), cause)
	a.spawn(ctx, id, func(ctx context.Context) {
		// After the resume (spawn waits for it): one that failed left
		// the deployment Suspended, its hand-over intact.
		dep, derr := a.st.Deployment(ctx, id)
		if derr != nil || dep.Status.Phase != spec.PhaseRunning || dep.Status.Node != a.c.Node.Name {
			a.log.Warn("page session cut; the resume it served did not run", "deployment", id, "err", err)
			return
		}
		if cerr := a.clean(ctx, id); cerr != nil {
			a.log.Warn("removing what is left of an instance lost during its migration", "deployment", id, "err", cerr)
		}
		st := dep.Status
		st.Suspension = nil
		a.fail(ctx, state.Desired{ID: id, App: dep.App}, &st, err)
	})
}

// dialPages opens the page session of hand-over h of deployment id with
// its source: the hand-over's request, upgraded to the page protocol.
func (a *agent) dialPages(ctx context.Context, id string, h state.Handoff) (io.ReadWriteCloser, error) {
	req, client, err := a.handoffRequest(ctx, id, h, "/pages", "")
	if err != nil {
		return nil, err
	}
	// HTTP/1.1: an upgrade is a connection of its own.
	if tr, ok := client.Transport.(*http.Transport); ok {
		tr = tr.Clone()
		tr.ForceAttemptHTTP2, tr.TLSNextProto = false, map[string]func(string, *tls.Conn) http.RoundTripper{}
		tr.ResponseHeaderTimeout = 10 * time.Second
		client = &http.Client{Transport: tr}
	} else {
		client = &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, ResponseHeaderTimeout: 10 * time.Second}}
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", pagesProtocol)
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		return nil, fmt.Errorf("node %s answered %s to the page session of %s: %s", h.Node, resp.Status, id, errorBody(resp))
	}
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		resp.Body.Close()
		return nil, fmt.Errorf("node %s: the page session of %s is not a connection", h.Node, id)
	}
	return rwc, nil
}
