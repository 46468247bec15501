// A migration's checkpoint node to node (internal/deploy/handoff.go keeps it on the source): the
// source serves it to the one node etcd places the deployment on, which shows the hand-over's
// secret (state.Handoff); the target reads it into its resume, or, once the source has sealed its
// durable copy, from the cluster. A source that is lost before either is the instance's loss.

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fogdeploy/fogdeploy/internal/apiauth"
	"github.com/fogdeploy/fogdeploy/internal/ckptstream"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/gencache"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// ErrLostInMigration: the node a migration came from failed before the
// instance's checkpoint had moved, or had a durable copy in the cluster.
var ErrLostInMigration = errors.New("lost during migration")

// handoffPath is the route of a hand-over on the source's API; nodeHeader
// names the node that reads it.
const (
	handoffPath = "/v1/handoffs/"
	nodeHeader  = "Fogdeploy-Node"
)

// handoffWait bounds how long a target waits for a hand-over whose source
// does not serve it while its node is alive (an agent restarting).
const handoffWait = 60 * time.Second

// handoffMetrics count what hand-overs moved, and how long a suspension
// stayed on its source alone.
type handoffMetrics struct {
	bytes   *prometheus.CounterVec
	reads   *prometheus.CounterVec
	early   *prometheus.CounterVec
	durable prometheus.Histogram
}

func newHandoffMetrics(reg prometheus.Registerer) handoffMetrics {
	m := handoffMetrics{
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fogdeploy_handoff_bytes_total", Help: "Checkpoint bytes moved node to node by migrations, by direction (sent, received).",
		}, []string{"direction"}),
		reads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fogdeploy_handoff_reads_total", Help: "Hand-overs asked of this node, by result (served, refused, failed).",
		}, []string{"result"}),
		early: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fogdeploy_handoff_early_reads_total",
			Help: "Checkpoints this node read as a migration's prepared target before their suspension was sealed, by result (read, failed: its resume read it again).",
		}, []string{"result"}),
		durable: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fogdeploy_handoff_durable_seconds",
			Help:    "Time from a migration's checkpoint to its durable copy sealed in the cluster: the window in which a loss of this node loses the instance unless its target has it.",
			Buckets: []float64{0.25, 0.5, 1, 2, 4, 8, 16, 32},
		}),
	}
	reg.MustRegister(m.bytes, m.reads, m.early, m.durable)
	return m
}

// serveHandoff streams hand-over id's checkpoint to the node that shows
// its secret and on which etcd places the deployment; any other caller
// is refused (403), and nothing is read.
func (a *agent) serveHandoff(w http.ResponseWriter, r *http.Request) {
	id, node := r.PathValue("id"), r.Header.Get(nodeHeader)
	if a.d == nil {
		writeJSON(w, http.StatusNotFound, apiError{Error: "this agent runs no deployer"})
		return
	}
	if spec.ValidateID(id) != nil || node == "" {
		a.refuseHandoff(w, r, http.StatusBadRequest, fmt.Errorf("a hand-over is asked as GET %s<deployment> with the %s header", handoffPath, nodeHeader), "")
		return
	}
	h, dir, done, ok := a.openHandoff(w, r, id, node)
	if !ok {
		return
	}
	defer done()
	// Its target restores lazily, and fetches later the pages a lazy
	// restore reads from a page server (pages.go): they stay here.
	var holes map[string][]ckptstream.Extent
	if r.URL.RawQuery == pagesQuery {
		if pages := pagesOf(dir); pages != nil {
			holes = deploy.StreamHoles(pages)
			pages.Close()
			a.pages.expect(id)
			w.Header().Set(pagesHeader, "remote")
		}
	}
	w.Header().Set("Content-Type", "application/x-tar")
	w.Header().Set("Fogdeploy-Bytes", fmt.Sprint(h.Bytes))
	start := time.Now()
	n, err := ckptstream.WriteWithout(r.Context(), w, dir, holes)
	a.m.handoff.bytes.WithLabelValues("sent").Add(float64(n))
	if err != nil {
		a.m.handoff.reads.WithLabelValues("failed").Inc()
		a.log.Warn("hand-over cut short", "deployment", id, "node", node, "bytes", n, "err", err)
		return
	}
	a.m.handoff.reads.WithLabelValues("served").Inc()
	a.log.Info("hand-over sent", "deployment", id, "node", node, "bytes", n, "pages_later", holes != nil, "ms", time.Since(start).Milliseconds())
}

// openHandoff opens deployment id's hand-over for node, which asks it
// with request r, and answers r itself when it may not: without the
// hand-over's secret, or when etcd does not place the deployment on node
// for a resume from that checkpoint (403), once the checkpoint is in the
// cluster (410), or while etcd does not answer (503). What a caller
// reads, the hand-over's checkpoint or its pages, goes through here.
func (a *agent) openHandoff(w http.ResponseWriter, r *http.Request, id, node string) (h deploy.Handoff, dir string, done func(), ok bool) {
	h, dir, done, err := a.d.Handoffs().Open(id, apiauth.BearerToken(r.Header.Get("Authorization")))
	if errors.Is(err, deploy.ErrDurable) {
		writeJSON(w, http.StatusGone, apiError{Error: err.Error(), Hint: "read it from the suspension's image in the cluster"})
		return h, "", nil, false
	}
	if err != nil {
		a.refuseHandoff(w, r, http.StatusForbidden, fmt.Errorf("no hand-over of deployment %s for this token", id),
			"only a migration's target, with the secret etcd holds for it, reads its checkpoint")
		return h, "", nil, false
	}
	placed, err := a.st.HandoffTarget(r.Context(), id, node, h.Ckpt)
	if err != nil {
		done()
		a.m.handoff.reads.WithLabelValues("failed").Inc()
		writeJSON(w, http.StatusServiceUnavailable, apiError{Error: err.Error(), Hint: "asked again once etcd answers"})
		return h, "", nil, false
	}
	if !placed {
		done()
		a.refuseHandoff(w, r, http.StatusForbidden, fmt.Errorf("deployment %s is not placed on node %s for a resume from this checkpoint", id, node),
			"a node reads a migration's checkpoint only while etcd places the migration on it")
		return h, "", nil, false
	}
	return h, dir, done, true
}

// refuseHandoff answers r with code and err, counted; a flood of refusals
// logs one line per 10 s.
func (a *agent) refuseHandoff(w http.ResponseWriter, r *http.Request, code int, err error, fix string) {
	a.m.handoff.reads.WithLabelValues("refused").Inc()
	if a.refusals.allow(10 * time.Second) {
		a.log.Warn("hand-over refused (fogdeploy_handoff_reads_total{result=\"refused\"} counts them all)", "deployment", r.PathValue("id"),
			"node", r.Header.Get(nodeHeader), "remote", r.RemoteAddr, "err", err)
	}
	writeJSON(w, code, apiError{Error: err.Error(), Hint: fix})
}

// handoffHold is how long a source waits for its target to run the
// instance from the checkpoint it read before it writes the checkpoint's
// durable copy into the cluster (which, written at once, would share the
// node's and the cluster's CPU with the target's resume).
const handoffHold = 10 * time.Second

// followHandoff follows deployment id, whose checkpoint this node hands
// over, in the background: once it runs again (from what its target
// read) or is gone, the hand-over is over (its image and files go); if it
// does not run within handoffHold, its durable copy is written, and the
// hand-over goes once it runs. One follower per hand-over.
func (a *agent) followHandoff(ctx context.Context, id string) {
	h, err := a.d.Handoffs().Get(id)
	if err != nil {
		return
	}
	if _, dup := a.following.LoadOrStore(id, true); dup {
		return
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		defer a.following.Delete(id)
		stored := h.Durable
		next := time.Now().Add(handoffHold)
		for {
			fctx, cancel := context.WithDeadline(ctx, next)
			_, err := a.st.Follow(fctx, id, func(d state.Deployment) bool { return a.handoffOver(d, h) })
			cancel()
			switch {
			case err == nil || errors.Is(err, state.ErrNotFound):
				// A target still fetching its pages reads them here.
				a.pages.wait(ctx, id, pagesHold)
				if err := a.st.EndHandoff(ctx, id, h.Ckpt); err != nil {
					a.log.Warn("removing the record of a hand-over that is over; it goes with its deployment", "deployment", id, "err", err)
				}
				a.d.Handoffs().Finish(ctx, id)
				return
			case ctx.Err() != nil:
				return // the next start follows it again
			case errors.Is(err, context.DeadlineExceeded):
				if !stored {
					a.log.Info("hand-over: the deployment does not run yet; writing its checkpoint's durable copy", "deployment", id, "after", handoffHold)
				}
				// Asked again every 30 s: nothing once made or under way,
				// a copy that failed made anew.
				a.d.Handoffs().Store(ctx, id, a.handoffDurable)
				stored, next = true, time.Now().Add(30*time.Second)
			default:
				time.Sleep(time.Second) // etcd: followed again
			}
		}
	}()
}

// handoffOver reports whether deployment d needs hand-over h's checkpoint
// no more: it runs again from it (Running without a suspension, on
// another node, or on this one from a resume made after the checkpoint
// was kept), or a later suspension replaced it.
func (a *agent) handoffOver(d state.Deployment, h deploy.Handoff) bool {
	if s := d.Status.Suspension; s != nil && s.Ckpt.Image != "" && s.Ckpt.Image != h.Ckpt {
		return true
	}
	if d.Status.Phase != spec.PhaseRunning || d.Status.Suspension != nil {
		return false
	}
	if d.Status.Node != a.c.Node.Name {
		return true
	}
	rec, err := a.d.Records().Load(d.ID)
	return err == nil && rec.Phase == spec.PhaseRunning && rec.Created.After(h.Kept)
}

// recoverHandoffs follows the hand-overs a previous run of the agent left.
func (a *agent) recoverHandoffs(ctx context.Context) {
	a.d.Handoffs().SweepFiles(func(id string) bool {
		rec, err := a.d.Records().Load(id)
		return err == nil && rec.Phase == spec.PhaseSuspending
	})
	hos, err := a.d.Handoffs().List()
	if err != nil {
		a.log.Warn("listing the hand-overs a previous run left; followed at the next start", "err", err)
		return
	}
	for _, h := range hos {
		a.log.Info("hand-over left by a previous run: following its deployment", "deployment", h.ID, "durable", h.Durable)
		a.followHandoff(ctx, h.ID)
	}
}

// logGate lets a line through at most once per period.
type logGate struct{ last atomic.Int64 }

func (g *logGate) allow(every time.Duration) bool {
	now, last := time.Now().UnixNano(), g.last.Load()
	return now-last >= int64(every) && g.last.CompareAndSwap(last, now)
}

// handoffDurable records in etcd that hand-over h's checkpoint is sealed
// in the cluster.
func (a *agent) handoffDurable(ctx context.Context, h deploy.Handoff, after time.Duration) {
	a.m.handoff.durable.Observe(after.Seconds())
	if rec, err := a.d.Records().Load(h.ID); err == nil && (rec.Phase == spec.PhaseSuspending || rec.Phase == spec.PhaseSuspended) {
		// Its suspension is not in etcd yet: recordSuspended records it
		// durable.
		return
	}
	for i := 0; ; i++ {
		err := a.st.MarkDurable(ctx, h.ID, h.Ckpt)
		if err == nil || ctx.Err() != nil || i == 4 {
			if err != nil {
				a.log.Warn("recording a hand-over durable; its target reads the checkpoint from the cluster once the source says so", "deployment", h.ID, "err", err)
			}
			return
		}
		time.Sleep(time.Duration(i+1) * 200 * time.Millisecond)
	}
}

// fetchHandoff brings the checkpoint of suspension susp of deployment id
// to this node for its resume: from the node that holds it (the source's
// hand-over; this node's own when it comes back), or from the cluster
// once it is sealed there. A source lost before either is
// ErrLostInMigration.
//
// Where the resume restores lazily under an engine that reads pages from
// another node (remotePages), the source's hand-over comes without them,
// and the restore fetches them from the source after it runs (pages.go),
// through agent, which outlives the resume.
func (a *agent) fetchHandoff(agent context.Context, id string, susp spec.Suspension) deploy.FetchCheckpoint {
	return func(ctx context.Context, dst string, fromCluster func(context.Context) error) error {
		if susp.Pending == a.c.Node.Name {
			err := a.d.Handoffs().CopyTo(ctx, id, dst)
			if errors.Is(err, deploy.ErrNoHandoff) || errors.Is(err, deploy.ErrDurable) {
				return a.fromCluster(ctx, dst, fromCluster)
			}
			return err
		}
		deadline := time.Now().Add(handoffWait)
		for {
			h, err := a.st.Handoff(ctx, id)
			switch {
			case errors.Is(err, state.ErrNotFound):
				return a.fromCluster(ctx, dst, fromCluster) // durable
			case err != nil:
				return err
			}
			later, err := a.readHandoff(ctx, id, h, dst, susp.Bytes, remotePages(susp))
			if err == nil && later {
				err = a.pagesLater(agent, id, h, dst)
			}
			if err == nil || errors.Is(err, ckptstream.ErrRefused) || ctx.Err() != nil {
				return err
			}
			if errors.Is(err, deploy.ErrDurable) {
				return a.fromCluster(ctx, dst, fromCluster)
			}
			src, nerr := a.st.Node(ctx, h.Node)
			if nerr == nil && !src.Ready || errors.Is(nerr, state.ErrNotFound) {
				return hint.With(fmt.Errorf("%w: source node %s failed before its checkpoint had moved (%v)", ErrLostInMigration, h.Node, err),
					"the instance's state is lost; deploy the app anew")
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("reading deployment %s's checkpoint from node %s for %s: %w", id, h.Node, handoffWait, err)
			}
			a.log.Warn("hand-over not read; asked again", "deployment", id, "source", h.Node, "err", err)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
}

// fromCluster empties dst and copies the checkpoint from the cluster.
func (a *agent) fromCluster(ctx context.Context, dst string, fromCluster func(context.Context) error) error {
	if err := gencache.EmptyDir(dst); err != nil {
		return err
	}
	return fromCluster(ctx)
}

// readHandoff reads hand-over h of deployment id from its source into
// dst (emptied first), at most a little more than the checkpoint's bytes;
// with pages, without the pages a lazy restore fetches later, if the
// source can leave them out (later).
func (a *agent) readHandoff(ctx context.Context, id string, h state.Handoff, dst string, bytes int64, pages bool) (later bool, err error) {
	if err := gencache.EmptyDir(dst); err != nil {
		return false, err
	}
	// Bounded: a source that stalls is asked again, or found lost.
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second+time.Duration(bytes/(10<<20))*time.Second)
	defer cancel()
	query := ""
	if pages {
		query = pagesQuery
	}
	req, client, err := a.handoffRequest(ctx, id, h, "", query)
	if err != nil {
		return false, err
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusGone:
		return false, deploy.ErrDurable
	default:
		return false, fmt.Errorf("node %s answered %s to the hand-over of %s: %s", h.Node, resp.Status, id, errorBody(resp))
	}
	later = pages && resp.Header.Get(pagesHeader) == "remote"
	n, err := ckptstream.Read(ctx, resp.Body, dst, bytes+bytes/8+64<<20)
	a.m.handoff.bytes.WithLabelValues("received").Add(float64(n))
	if err != nil {
		return false, fmt.Errorf("hand-over of %s from node %s: %w", id, h.Node, err)
	}
	a.log.Info("hand-over received", "deployment", id, "source", h.Node, "bytes", n, "pages_later", later, "ms", time.Since(start).Milliseconds())
	return later, nil
}

// handoffRequest is a GET of hand-over h of deployment id (at sub under
// it, with query) from its source's agent, as this node, with the
// hand-over's secret, and the client that reaches that agent.
func (a *agent) handoffRequest(ctx context.Context, id string, h state.Handoff, sub, query string) (*http.Request, *http.Client, error) {
	src, err := a.st.Node(ctx, h.Node)
	if err != nil {
		return nil, nil, err
	}
	u, client, err := a.peer(src)
	if err != nil {
		return nil, nil, err
	}
	u.Path, u.RawQuery = handoffPath+id+sub, query
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+h.Token)
	req.Header.Set(nodeHeader, a.c.Node.Name)
	return req, client, nil
}

// pagesLater makes dst, a checkpoint read without the pages its lazy
// restore fetches from hand-over h's source, that restore's: a partial
// copy (never the node's copy of the checkpoint for another restore), with
// the socket of its page server, which relays to the source.
func (a *agent) pagesLater(ctx context.Context, id string, h state.Handoff, dst string) error {
	if err := gencache.MarkPartial(dst); err != nil {
		return err
	}
	ln, err := engine.ListenPages(dst)
	if err != nil {
		return err
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		a.relayPages(ctx, id, h, ln)
	}()
	return nil
}

// peer is the base URL of node n's agent API and the client that calls it:
// over TLS, verified against agent.ca_file (or the system's roots).
func (a *agent) peer(n state.Node) (*url.URL, *http.Client, error) {
	raw := n.API
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, nil, fmt.Errorf("node %s registered the API address %q: want host:port or https://host:port", n.Name, n.API)
	}
	if u.Scheme == "http" {
		return &url.URL{Scheme: "http", Host: u.Host}, http.DefaultClient, nil
	}
	cfg, err := apiauth.ClientTLS(a.c.Agent.CAFile)
	if err != nil {
		return nil, nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = cfg
	return &url.URL{Scheme: "https", Host: u.Host}, &http.Client{Transport: tr}, nil
}

// errorBody is the error an agent's answer gives, or its status.
func errorBody(resp *http.Response) string {
	var e apiError
	if err := json.NewDecoder(io.LimitReader(resp.Body, MaxRequestBytes)).Decode(&e); err != nil || e.Error == "" {
		return resp.Status
	}
	return e.Error
}
