//go:build !no_ceph

package cephstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ceph/go-ceph/rbd"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

const (
	// answerWithin is how long a watcher has to answer a notification on
	// the image header before RemoveUnmapped counts it as dead. librbd
	// answers each one from its own thread at once (in milliseconds); a
	// dead client's watch never answers, so this is also what one
	// eviction costs.
	answerWithin = 3 * time.Second
	// blocklistFor is how long an evicted client stays blocklisted:
	// longer than osd_client_watch_timeout, after which its watch would
	// be gone anyway. The client is dead; its address (IP:port/nonce)
	// names that one instance, and no other client reuses it.
	blocklistFor = 120 * time.Second
	// liveTries is how many rounds RemoveUnmapped retries while a watcher
	// answers (a client closing the image right now) before it gives up.
	liveTries = 4
	// firstWait and maxWait bound the exponential backoff of its retries.
	firstWait = 100 * time.Millisecond
	maxWait   = 4 * time.Second
)

// RemoveUnmapped implements layering.Store: Remove, and while that fails
// with ErrBusy, each watcher of the image other than this client is sent
// a notification on the image header (librbd answers every one); one that
// does not answer within a few seconds is a dead client (a killed rbd-fuse
// or agent, whose watch the OSDs keep until osd_client_watch_timeout), and
// is evicted with an OSD blocklist entry of its address for a short while
// (`osd blocklist add ADDR 120`, as librbd itself does when it breaks the
// lock of a dead owner). Retries back off exponentially, within
// Config.BusyWait and ctx. A watcher that answers is never evicted: after
// a few tries the error wraps layering.ErrBusy and names it.
//
// Only call it for images that no live client should have open: a client
// that cannot answer (stopped, or cut off from the cluster) counts as dead.
//
// Implements: rbd_watchers_list, rados_notify2, mon "osd blocklist add"
// (falling back to "osd blacklist add" before Ceph 16), and Remove's.
func (s *Store) RemoveUnmapped(ctx context.Context, name string) ([]layering.Eviction, error) {
	start := time.Now()
	deadline := start.Add(s.cfg.BusyWait)
	var (
		evicted  []layering.Eviction
		tried    = map[string]bool{} // addresses evicted (or refused) already
		evictErr error               // the last failure to evict
		liveFor  int                 // rounds in a row with watchers that answer
	)
	wait := firstWait
	for {
		err := s.Remove(ctx, name)
		if err == nil || !errors.Is(err, layering.ErrBusy) {
			return evicted, err
		}
		ev, live, eerr := s.evictDead(ctx, name, tried)
		evicted = append(evicted, ev...)
		if eerr != nil {
			evictErr = eerr
		}
		if len(live) == 0 {
			liveFor = 0
		} else if liveFor++; liveFor >= liveTries {
			return evicted, hint.With(
				fmt.Errorf("remove %s: still watched by a live client (%s answers notifications), not evicted: %w", name, strings.Join(live, ", "), layering.ErrBusy),
				"it is mapped or open on a node: undeploy or unmap it first")
		}
		if ctx.Err() == nil && time.Now().Add(wait).After(deadline) {
			if evictErr != nil {
				err = fmt.Errorf("%w; eviction failed: %w", err, evictErr)
			}
			return evicted, fmt.Errorf("%w (still watched after %s)", err, time.Since(start).Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return evicted, fmt.Errorf("%w (%w)", err, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, maxWait)
	}
}

type watchKey struct {
	gid    uint64
	cookie uint64
}

// evictDead notifies the watchers of name (but this client and those in
// tried) on the image header and blocklists those that do not answer. It
// returns the evicted ones and the ones that answered ("client.N at
// ADDR"). A watcher that registered after the notification went out is
// left for the next round.
func (s *Store) evictDead(ctx context.Context, name string, tried map[string]bool) ([]layering.Eviction, []string, error) {
	se, err := s.acquire()
	if err != nil {
		return nil, nil, err
	}
	defer s.release(se)
	header, ws, err := s.watchers(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	self := se.conn.GetInstanceID()
	var others []rbd.ImageWatcher
	for _, w := range ws {
		// An address evicted already stays listed until the OSD has the
		// new map: no second notification for it.
		if uint64(w.Id) != self && !tried[w.Addr] {
			others = append(others, w)
		}
	}
	if len(others) == 0 {
		return nil, nil, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	// An empty payload is librbd's "header updated" notification: a live
	// client re-reads the header and answers.
	acks, timeouts, err := se.ioctx.NotifyWithTimeout(header, nil, answerWithin)
	if err != nil && errno(err) != eTIMEDOUT { // ETIMEDOUT: some did not answer
		return nil, nil, wrap("notify the watchers of "+name, err)
	}
	answered, silent := map[watchKey]bool{}, map[watchKey]bool{}
	for _, a := range acks {
		answered[watchKey{uint64(a.NotifierID), uint64(a.WatcherID)}] = true
	}
	for _, t := range timeouts {
		silent[watchKey{uint64(t.NotifierID), uint64(t.WatcherID)}] = true
	}
	var evicted []layering.Eviction
	var live []string
	var errs []error
	for _, w := range others {
		k := watchKey{uint64(w.Id), w.Cookie}
		who := fmt.Sprintf("client.%d", w.Id)
		switch {
		case answered[k]:
			live = append(live, who+" at "+w.Addr)
		case silent[k]:
			tried[w.Addr] = true
			if err := s.blocklist(ctx, w.Addr); err != nil {
				errs = append(errs, fmt.Errorf("evict %s at %s, a dead watcher of %s: %w", who, w.Addr, name, err))
				continue
			}
			evicted = append(evicted, layering.Eviction{Client: who, Addr: w.Addr})
		}
	}
	return evicted, live, errors.Join(errs...)
}

// watchers returns the header object of an image and its watchers.
//
// Implements: rbd_get_id, rbd_watchers_list.
func (s *Store) watchers(ctx context.Context, name string) (string, []rbd.ImageWatcher, error) {
	img, err := s.openImage(ctx, "watchers of "+name, name, rbd.NoSnapshot, true)
	if err != nil {
		return "", nil, err
	}
	defer img.Close()
	id, err := img.GetId()
	if err != nil {
		return "", nil, s.wrap(ctx, "id of "+name, err)
	}
	ws, err := img.ListWatchers()
	if err != nil {
		return "", nil, s.wrap(ctx, "watchers of "+name, err)
	}
	return "rbd_header." + id, ws, nil
}

// blocklist adds addr to the OSD blocklist for blocklistFor: the OSDs drop
// its watches and refuse its requests.
//
// Implements: mon "osd blocklist add" (Ceph 16), "osd blacklist add"
// (before).
func (s *Store) blocklist(ctx context.Context, addr string) error {
	se, err := s.acquire()
	if err != nil {
		return err
	}
	defer s.release(se)
	if err := oneClient(addr); err != nil {
		return err
	}
	var first error
	for _, c := range []struct{ prefix, op string }{{"osd blocklist", "blocklistop"}, {"osd blacklist", "blacklistop"}} {
		if err := ctx.Err(); err != nil {
			return err
		}
		// The monitors want a float for expire: 120.0, not 120.
		expire := json.Number(strconv.FormatFloat(blocklistFor.Seconds(), 'f', 1, 64))
		raw, _ := json.Marshal(map[string]any{"prefix": c.prefix, c.op: "add", "addr": addr, "expire": expire})
		_, status, err := se.conn.MonCommand(raw)
		if err == nil {
			return nil
		}
		err = wrap(c.prefix+" add "+addr, fmt.Errorf("%w (%s)", err, status))
		if errno(err) == eACCES { // no point in the older name
			return hint.With(err, "the cephx user needs `profile rbd` (mon) to evict dead clients; meanwhile their watches time out (osd_client_watch_timeout)")
		}
		if first == nil {
			first = err
		}
	}
	return first
}

// oneClient checks that addr names one client instance, IP:PORT/NONCE
// with a nonce, so that blocklisting it fences that client alone: without
// a nonce an entry fences every client of the host.
func oneClient(addr string) error {
	host, nonce, ok := strings.Cut(addr, "/")
	n, err := strconv.ParseUint(nonce, 10, 32)
	if !ok || err != nil || n == 0 || !strings.Contains(host, ":") || strings.HasPrefix(host, ":") {
		return fmt.Errorf("watcher address %q does not name one client (IP:PORT/NONCE): not evicting it: %w", addr, layering.ErrInvalid)
	}
	return nil
}
