// The control plane's fence: an agent acts on etcd's word (deploys, undeploys, drops pool slots)
// only while etcd is the one it knew. It remembers, in its state directory, the PoP's identity
// (state.PoPKey), etcd's cluster ID and the highest revision it saw; an etcd that lacks the PoP
// record or holds another, is another cluster, or is behind that revision (emptied, replaced, or
// restored from an older backup) fences the agent: it keeps every instance and slot, acts on
// nothing, and says why in its log, /healthz and its node record, until etcd is the one it knew
// again or an operator adopts the new one (--adopt-pop). An etcd with this PoP's record that answered
// behind the revision the node saw (an older backup) keeps it fenced whatever it answers later.

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fogdeploy/fogdeploy/internal/atomicfile"
	"github.com/fogdeploy/fogdeploy/internal/config"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// memoryFile is the name of the node's memory of its PoP's etcd, in its
// state directory.
const memoryFile = "control-plane.json"

// memorySaveEvery bounds how often a newer revision is written to the
// memory file (it is written at shutdown too). A crash loses at most that
// much: the node then remembers a lower revision, which only makes the
// fence less strict.
const memorySaveEvery = 5 * time.Second

// memory is what a node remembers of its PoP's etcd.
type memory struct {
	// PoP is the ID of the PoP record (state.PoP) the node acted on.
	PoP        string    `json:"pop"`
	PoPCreated time.Time `json:"pop_created"`
	// ClusterID is etcd's cluster ID.
	ClusterID uint64 `json:"cluster_id"`
	// Revision is the highest etcd revision the node saw.
	Revision int64 `json:"revision"`
	// Behind, once an etcd with this PoP's record answered behind
	// Revision (a restore of an older backup), says so: its history is not
	// the one the node acted on, and a revision that catches up later
	// (writes to it) proves nothing. Only adopting an etcd lifts it.
	Behind string    `json:"behind,omitempty"`
	Saved  time.Time `json:"saved"`
}

// fresh says whether the node remembers nothing (its first start).
func (m memory) fresh() bool { return m == memory{} }

// loadMemory reads the memory file: the zero memory if there is none, an
// error if it cannot be read or parsed.
func loadMemory(path string) (memory, error) {
	var m memory
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	} else if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return memory{}, fmt.Errorf("%s: %w", path, err)
	}
	if m.PoP == "" || m.ClusterID == 0 {
		return memory{}, fmt.Errorf("%s names no PoP or cluster", path)
	}
	return m, nil
}

// saveMemory replaces the memory file atomically and durably (a temporary
// file, synced, renamed over it, and its directory synced).
func saveMemory(path string, m memory) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(path, append(b, '\n'), 0o600, true); err != nil {
		return fmt.Errorf("saving %s: %w", path, err)
	}
	return nil
}

// observed is what etcd says now: which cluster answered at which
// revision, and its PoP record (nil: none).
type observed struct {
	state.Header
	PoP *state.PoP
	// seq orders the requests: a later one sees a state at least as new.
	seq uint64
}

// Triggers of the fence.
const (
	triggerEmptied      = "emptied"       // no PoP record, while the node remembers one
	triggerOtherPoP     = "other_pop"     // another PoP record than the node remembers
	triggerOtherCluster = "other_cluster" // another etcd cluster
	triggerBehind       = "behind"        // a lower revision than the node saw
	triggerUnreadable   = "unreadable"    // the node's memory cannot be read
)

// verdict is the fence's decision: the node may act when Reason is empty.
type verdict struct {
	Triggers []string `json:"triggers,omitempty"`
	// Reasons say why, one per trigger; Reason is all of them.
	Reasons []string `json:"-"`
	Reason  string   `json:"reason,omitempty"`
	// Sticky: the fence stays whatever etcd answers later (an etcd with
	// this PoP's record answered behind what the node saw).
	Sticky bool `json:"sticky,omitempty"`
}

func (v verdict) fenced() bool { return v.Reason != "" }

// why is the reason of trigger, or "".
func (v verdict) why(trigger string) string {
	if i := slices.Index(v.Triggers, trigger); i >= 0 {
		return v.Reasons[i]
	}
	return ""
}

// hint says what to do about the fence.
func (v verdict) hint() string {
	const keep = "instances and warm-pool slots keep running; "
	const adopt = "check that etcd's apps and deployments are what the PoP should run, then restart this agent once with --adopt-pop " +
		"(it then undeploys what that etcd does not hold)"
	if v.Sticky {
		return keep + "that etcd lost writes this node saw (deployments made since are missing from it), and the fence does not lift by itself: " + adopt
	}
	return keep + "bring back the etcd this node knew (its endpoints, its data directory), and the fence lifts by itself; or, if this etcd replaces it on purpose, " + adopt
}

// judge decides whether a node that remembers m may act on an etcd that
// answers o. A node that remembers nothing may (it adopts what it finds).
func judge(m memory, o observed) verdict {
	if m.fresh() {
		return verdict{}
	}
	var v verdict
	add := func(trigger, reason string) {
		v.Triggers = append(v.Triggers, trigger)
		v.Reasons = append(v.Reasons, reason)
	}
	switch {
	case o.PoP == nil && m.PoP != "":
		add(triggerEmptied, fmt.Sprintf("etcd has no PoP record (%s), while this node remembers PoP %s made %s: etcd was emptied or replaced",
			state.PoPKey, m.PoP, m.PoPCreated.Format(time.RFC3339)))
	case o.PoP != nil && m.PoP != "" && o.PoP.ID != m.PoP:
		add(triggerOtherPoP, fmt.Sprintf("etcd holds PoP %s (made %s), while this node remembers PoP %s: it is another PoP's etcd, or one made anew",
			o.PoP.ID, o.PoP.Created.Format(time.RFC3339), m.PoP))
	}
	if m.ClusterID != 0 && o.ClusterID != m.ClusterID {
		add(triggerOtherCluster, fmt.Sprintf("etcd is cluster %x, while this node remembers cluster %x: it is another etcd cluster", o.ClusterID, m.ClusterID))
	}
	// Behind: with this PoP's record, a restore of an older backup, which
	// no later revision redeems; without it, an empty or another etcd,
	// which says nothing of this PoP's history (the fence lifts once the
	// etcd the node knew is back).
	switch {
	case m.Behind != "":
		add(triggerBehind, m.Behind)
		v.Sticky = true
	case o.Revision < m.Revision && o.PoP != nil && o.PoP.ID == m.PoP:
		add(triggerBehind, fmt.Sprintf("etcd answered at revision %d, behind revision %d that this node saw: it lost writes (a restore of an older backup), "+
			"whatever it answers later", o.Revision, m.Revision))
		v.Sticky = true
	case o.Revision < m.Revision:
		add(triggerBehind, fmt.Sprintf("etcd answered at revision %d, behind revision %d that this node saw", o.Revision, m.Revision))
	}
	v.Reason = strings.Join(v.Reasons, "; ")
	return v
}

// plane is the agent's fence.
type plane struct {
	path string
	st   *state.Store
	log  *slog.Logger
	// changed, if set, is called after every change of verdict (the agent
	// writes its node record).
	changed func(context.Context)

	mu     sync.Mutex
	mem    memory
	memErr error // the memory file was unreadable: fenced until adopted
	dirty  bool  // mem.Revision is newer than the file's
	v      verdict
	since  time.Time // when the current fence began
	// asked and applied are the seq of the last request made and of the
	// last one whose verdict was applied (an older answer is not).
	asked, applied uint64
	// published, if set, holds mem.Revision for readers without the lock
	// (the stamps on the images the node makes, stamp.go).
	published *atomic.Int64
}

// publish makes the plane keep to the revision the node has seen (0
// while its memory is unreadable). The caller reads it when it stamps
// an image.
func (p *plane) publish(to *atomic.Int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.published = to
	p.publishLocked()
}

// publishLocked stores mem.Revision where publish said; p.mu is held.
func (p *plane) publishLocked() {
	if p.published == nil {
		return
	}
	if p.memErr != nil {
		p.published.Store(0)
		return
	}
	p.published.Store(p.mem.Revision)
}

// newPlane reads the node's memory from path.
func newPlane(path string, st *state.Store, log *slog.Logger) *plane {
	p := &plane{path: path, st: st, log: log}
	p.mem, p.memErr = loadMemory(path)
	return p
}

// start checks etcd when the agent starts. A node that remembers nothing
// adopts the etcd it finds, and so does one told to (adopt: --adopt-pop),
// or one that holds no deployment (holds: its records; nothing it runs
// could be lost). Otherwise a fence stays until etcd is the one the node
// knew. Only an etcd that does not answer is an error.
func (p *plane) start(ctx context.Context, adopt bool, holds int) error {
	p.mu.Lock()
	fresh := p.mem.fresh() && p.memErr == nil
	p.mu.Unlock()
	switch {
	case adopt:
		return p.adopt(ctx, "--adopt-pop")
	case fresh:
		return p.adopt(ctx, "this node remembers no PoP (its first start)")
	}
	o, v, err := p.observe(ctx)
	if err != nil {
		return err
	}
	if v.fenced() && holds == 0 {
		p.log.Warn("control plane: etcd is not the one this node knew, but this node holds no deployment: it adopts the etcd it finds", "was", v.Reason)
		return p.adopt(ctx, "this node holds no deployment")
	}
	_ = p.apply(ctx, o, v) // fenced or not, said so
	return nil
}

// adopt takes the etcd that answers as the PoP's: its PoP record (made
// if it has none), cluster and revision, and lifts any fence.
func (p *plane) adopt(ctx context.Context, why string) error {
	pop, h, err := p.st.EnsurePoP(ctx)
	if err != nil {
		return fmt.Errorf("control plane: adopting etcd's PoP: %w", err)
	}
	p.mu.Lock()
	old, unreadable := p.mem, p.memErr != nil
	p.mem = memory{PoP: pop.ID, PoPCreated: pop.Created, ClusterID: h.ClusterID, Revision: h.Revision}
	p.memErr = nil
	p.applied = p.asked // answers asked before this do not count
	p.publishLocked()
	err = p.saveLocked()
	p.mu.Unlock()
	if err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	lvl := slog.LevelInfo
	if unreadable || !old.fresh() && (old.PoP != pop.ID || old.ClusterID != h.ClusterID || old.Revision > h.Revision || old.Behind != "") {
		lvl = slog.LevelWarn
	}
	p.log.Log(ctx, lvl, "control plane: adopted etcd's PoP", "why", why, "pop", pop.ID, "cluster", fmt.Sprintf("%x", h.ClusterID), "revision", h.Revision,
		"was_pop", old.PoP, "was_cluster", fmt.Sprintf("%x", old.ClusterID), "was_revision", old.Revision)
	p.set(ctx, verdict{})
	return nil
}

// check asks etcd for its PoP record and judges the answer against what
// the node remembers: nil when the node may act on what it read from etcd
// before the call (every list or watch event it acts on), an error
// wrapping state.ErrFenced (with a hint) when it may not, or the error of
// an etcd that does not answer.
func (p *plane) check(ctx context.Context) error {
	o, v, err := p.observe(ctx)
	if err != nil {
		return err
	}
	return p.apply(ctx, o, v)
}

// observe reads etcd's PoP record and judges it, changing nothing.
func (p *plane) observe(ctx context.Context) (observed, verdict, error) {
	// The memory as it is before the request: a revision seen meanwhile
	// (another goroutine's watch) may be newer than what this request
	// is answered at.
	p.mu.Lock()
	floor, memErr := p.mem, p.memErr
	p.asked++
	seq := p.asked
	p.mu.Unlock()
	if memErr != nil {
		return observed{seq: seq}, verdict{Triggers: []string{triggerUnreadable}, Reasons: []string{memErr.Error()},
			Reason: "this node's memory of its PoP's etcd (" + p.path + ") is unreadable: " + memErr.Error()}, nil
	}
	pop, h, err := p.st.PoP(ctx)
	if err != nil && !errors.Is(err, state.ErrUnavailable) && ctx.Err() == nil && !floor.fresh() {
		// etcd answered with a record that is not one.
		return observed{Header: h, seq: seq}, verdict{Triggers: []string{triggerOtherPoP}, Reasons: []string{err.Error()}, Reason: err.Error()}, nil
	}
	if err != nil {
		return observed{}, verdict{}, err
	}
	o := observed{Header: h, PoP: pop, seq: seq}
	return o, judge(floor, o), nil
}

// apply records verdict v of observation o: a fence (and that etcd
// answered behind, for good), or, when the node may act, the PoP, cluster
// and revision seen. It returns the fence as an error.
func (p *plane) apply(ctx context.Context, o observed, v verdict) error {
	p.mu.Lock()
	stale := o.seq <= p.applied // a newer answer was applied meanwhile
	if !stale {
		p.applied = o.seq
	}
	p.mu.Unlock()
	if stale {
		// Not applied; the caller acts only if neither answer fences.
		if v.fenced() {
			return fenceErr(v)
		}
		return p.err()
	}
	if v.Sticky {
		p.remember(v.why(triggerBehind))
	}
	p.set(ctx, v)
	if v.fenced() {
		return p.err()
	}
	p.mu.Lock()
	if p.mem.PoP == "" && o.PoP != nil {
		p.mem.PoP, p.mem.PoPCreated, p.dirty = o.PoP.ID, o.PoP.Created, true
	}
	if p.mem.ClusterID == 0 {
		p.mem.ClusterID, p.dirty = o.ClusterID, true
	}
	p.mu.Unlock()
	p.seen(o.Header)
	return nil
}

// remember makes a sticky fence (an etcd with this PoP's record behind
// what the node saw) stay, also across restarts, until an etcd is adopted.
func (p *plane) remember(behind string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mem.Behind != "" || p.memErr != nil {
		return
	}
	p.mem.Behind = behind
	if err := p.saveLocked(); err != nil {
		p.dirty = true
		p.log.Warn("control plane: saving the fence; retried", "err", err)
	}
}

// seen records the revision of a response of the etcd the node acts on
// (a list, a watch event), unless fenced or of another cluster, and saves
// it at most every memorySaveEvery.
func (p *plane) seen(h state.Header) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.v.fenced() || p.memErr != nil || p.mem.ClusterID != 0 && h.ClusterID != p.mem.ClusterID {
		return
	}
	if h.Revision > p.mem.Revision {
		p.mem.Revision, p.dirty = h.Revision, true
		p.publishLocked()
	}
	if p.dirty && time.Since(p.mem.Saved) >= memorySaveEvery {
		if err := p.saveLocked(); err != nil {
			p.log.Warn("control plane: saving the revision seen; retried", "err", err)
		}
	}
}

// flush saves what is not saved yet (at shutdown).
func (p *plane) flush() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.dirty {
		return nil
	}
	return p.saveLocked()
}

func (p *plane) saveLocked() error {
	m := p.mem
	m.Saved = time.Now().UTC()
	if err := saveMemory(p.path, m); err != nil {
		return err
	}
	p.mem.Saved, p.dirty = m.Saved, false
	return nil
}

// set records verdict v; a change of its triggers (fenced or not, and
// why) is logged, at Error when it fences, and told to changed. Only the
// figures of the same reasons (etcd's revision) change the text silently.
func (p *plane) set(ctx context.Context, v verdict) {
	p.mu.Lock()
	if slices.Equal(v.Triggers, p.v.Triggers) && v.Sticky == p.v.Sticky {
		p.v = v
		p.mu.Unlock()
		return
	}
	was := p.v
	p.v = v
	if v.fenced() && !was.fenced() {
		p.since = time.Now()
	}
	since := p.since
	p.mu.Unlock()
	if v.fenced() {
		p.log.Error("control plane fenced: etcd is not the one this node knew; instances and warm-pool slots keep running, nothing is deployed, undeployed or dropped",
			"reason", v.Reason, "triggers", v.Triggers, "hint", v.hint())
	} else {
		p.log.Warn("control plane: etcd is the one this node knew again; acting again", "was", was.Reason, "fenced_for", time.Since(since).Round(time.Second))
	}
	if p.changed != nil {
		p.changed(ctx)
	}
}

// status is the current verdict, and when its fence began.
func (p *plane) status() (verdict, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.v, p.since
}

// err is the current fence as an error (nil when the node may act).
func (p *plane) err() error {
	v, _ := p.status()
	return fenceErr(v)
}

// fenceErr is fence v as an error wrapping state.ErrFenced, with a hint
// (nil when v does not fence).
func fenceErr(v verdict) error {
	if !v.fenced() {
		return nil
	}
	return hint.With(fmt.Errorf("%w: %s", state.ErrFenced, v.Reason), v.hint())
}

// describe is the control plane as /healthz shows it.
func (p *plane) describe() map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]any{"pop": p.mem.PoP, "cluster_id": fmt.Sprintf("%x", p.mem.ClusterID), "revision": p.mem.Revision}
	if p.v.fenced() {
		out["fenced"], out["since"], out["reason"], out["triggers"], out["hint"] = true, p.since.UTC().Format(time.RFC3339), p.v.Reason, p.v.Triggers, p.v.hint()
	}
	return out
}

// openPlane checks that etcd is the one this node knew: a fenced agent
// keeps what it runs and acts on nothing; one that holds nothing adopts
// what it finds.
func openPlane(ctx context.Context, c config.Config, o Options, st *state.Store, d *deploy.Deployer, reg *prometheus.Registry, seen *atomic.Int64, log *slog.Logger) (*plane, error) {
	pl := newPlane(filepath.Join(c.Node.StateDir, memoryFile), st, log)
	pl.publish(seen)
	holds := 1 // unknown: as if it held one
	if recs, err := d.Records().List(); err == nil {
		holds = len(recs)
	}
	if err := pl.start(ctx, o.AdoptPoP, holds); err != nil {
		return nil, err
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fogdeploy_control_plane_fenced", Help: "1 while the agent acts on nothing because etcd is not the one it knew (emptied, another cluster, or behind the revision it saw; /healthz says why), else 0.",
	}, func() float64 {
		if pl.err() != nil {
			return 1
		}
		return 0
	}))
	return pl, nil
}
