//go:build !no_ceph

package cephstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// openStalling opens a store on the dev cluster with a short stall bound.
func openStalling(t *testing.T) *Store {
	t.Helper()
	c := testenv.CephCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := Open(ctx, Config{Conf: c.Conf, Keyring: c.Keyring, ID: c.ID, Pool: c.Pool, Stall: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// cur returns the connection calls use now.
func (s *Store) cur() *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sess
}

// shutDown says whether se was shut down, and how many retired connections
// the store still holds.
func (s *Store) shutDown(se *session) (bool, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return se.closed, len(s.retired)
}

// waitClosed waits until se is shut down and the store holds no retired
// connection.
func waitClosed(t *testing.T, s *Store, se *session) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		closed, retired := s.shutDown(se)
		if closed && retired == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("connection shut down: %v, retired connections held: %d; want it shut down and none held", closed, retired)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stuckCall is a call that does not return until unblock is closed on
// the connection stuckOn, or on every connection when everywhere is set;
// it returns 1 then, and 2 at once elsewhere.
type stuckCall struct {
	stuckOn    *session
	everywhere bool
	unblock    chan struct{}
	released   atomic.Int32 // stalled results handed to release
}

func (c *stuckCall) call(se *session) (int, error) {
	if c.everywhere || se == c.stuckOn {
		<-c.unblock
		return 1, nil
	}
	return 2, nil
}

func (c *stuckCall) release(v int) {
	if v == 1 {
		c.released.Add(1)
	}
}

// finish lets the calls stuck in c return, waits until each connection
// they held is shut down, checks that what each returned was released
// once (released in all), and closes the store.
func (c *stuckCall) finish(t *testing.T, s *Store, held []*session, released int32) {
	t.Helper()
	close(c.unblock)
	for _, se := range held {
		waitClosed(t, s, se)
	}
	if got := c.released.Load(); got != released {
		t.Errorf("what the stalled calls returned was released %d times; want %d", got, released)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close once every call returned = %v", err)
	}
}

// TestStalledCallReconnects: a call that librbd does not return from
// within Config.Stall is given up on; the store connects again, runs the
// call once more on the new connection, and serves later calls there; what
// the stalled call returns at last is released, and its connection is
// shut down then.
func TestStalledCallReconnects(t *testing.T) {
	s := openStalling(t)
	first := s.cur()
	c := &stuckCall{stuckOn: first, unblock: make(chan struct{})}
	v, err := bounded(t.Context(), s, "test call", true, c.call, c.release)
	if err != nil || v != 2 {
		t.Fatalf("bounded(a call stuck on the first connection) = %d, %v; want the second connection's answer", v, err)
	}
	if s.cur() == first {
		t.Fatal("the store still uses the connection a call stalled on")
	}
	if n := s.Stalls(); n != 1 {
		t.Errorf("Stalls() = %d after one stall; want 1", n)
	}
	// The new connection serves real calls.
	name := fmt.Sprintf("t-stall-%d", time.Now().UnixNano()%1e9)
	if err := s.Create(t.Context(), name, 4<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stat(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	// The stalled call still holds its connection.
	if closed, retired := s.shutDown(first); closed || retired != 1 {
		t.Fatalf("while the stalled call runs: its connection shut down %v, retired held %d; want open and held", closed, retired)
	}
	c.finish(t, s, []*session{first}, 1)
}

// TestStalledTwice: a call that stalls on the new connection too gives an
// error wrapping ErrStalled and layering.ErrUnavailable, with a hint; a
// call that is not repeatable stalls once.
func TestStalledTwice(t *testing.T) {
	s := openStalling(t)
	c := &stuckCall{everywhere: true, unblock: make(chan struct{})}
	held := []*session{s.cur()}
	start := time.Now()
	_, err := bounded(t.Context(), s, "clone a to b", false, c.call, c.release)
	if !errors.Is(err, ErrStalled) || !errors.Is(err, layering.ErrUnavailable) || !strings.Contains(err.Error(), "clone a to b") {
		t.Fatalf("bounded(a stalling call, no retry) = %v; want ErrStalled and ErrUnavailable naming the call", err)
	}
	if hint.Of(err) == "" {
		t.Errorf("the stall error %q has no hint", err)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("a call that is not repeatable gave up after %s; want one stall bound (300ms)", el)
	}
	if s.cur() == held[0] {
		t.Fatal("no new connection after a stall")
	}
	held = append(held, s.cur())
	_, err = bounded(t.Context(), s, "open x", true, c.call, c.release)
	if !errors.Is(err, ErrStalled) || !strings.Contains(err.Error(), "attempt 2") {
		t.Fatalf("bounded(a call stalling on both connections) = %v; want ErrStalled after the second attempt", err)
	}
	if _, retired := s.shutDown(held[0]); retired != 3 {
		t.Errorf("retired connections held = %d; want 3 (one per stall)", retired)
	}
	c.finish(t, s, held, 3)
}

// TestCallGivenUpOnCtx: a caller's context ends the wait without retiring
// the connection; Close while the call runs leaves that connection open,
// says so, and it is shut down when the call returns.
func TestCallGivenUpOnCtx(t *testing.T) {
	s := openStalling(t)
	s.cfg.Stall = time.Minute
	first := s.cur()
	c := &stuckCall{stuckOn: first, unblock: make(chan struct{})}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err := bounded(ctx, s, "open y", true, c.call, c.release)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrStalled) {
		t.Fatalf("bounded under a 100ms context = %v; want the context's error", err)
	}
	if s.cur() != first {
		t.Error("the store connected again after a caller gave up; want the same connection")
	}
	if n := s.Stalls(); n != 0 {
		t.Errorf("Stalls() = %d after a caller gave up; want 0", n)
	}
	if err := s.Close(); err == nil || !strings.Contains(err.Error(), "left open") {
		t.Fatalf("Close with a call still in librbd = %v; want an error saying a connection is left open", err)
	}
	c.finish(t, s, []*session{first}, 1)
}

// TestChangeWaitedFor: a call that changes the pool (a clone, a removal)
// is not given up on when its caller's context ends, so that the caller
// never undoes it before it is done; it is bounded by the stall bound.
func TestChangeWaitedFor(t *testing.T) {
	s := openStalling(t)
	s.cfg.Stall = time.Minute
	c := &stuckCall{stuckOn: s.cur(), unblock: make(chan struct{})}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	time.AfterFunc(500*time.Millisecond, func() { close(c.unblock) })
	start := time.Now()
	v, err := bounded(ctx, s, "clone z", false, c.call, c.release)
	if err != nil || v != 1 || time.Since(start) < 400*time.Millisecond {
		t.Fatalf("bounded(a change, its caller's context ending first) = %d, %v after %s; want its own answer once it returned", v, err, time.Since(start))
	}
	if err := s.Close(); err != nil {
		t.Error(err)
	}
}

// TestCallsAfterClose: a call on a closed store fails with ErrClosed and
// layering.ErrUnavailable, naming what it was; none reaches librados,
// whose memory for the connection is freed (a call there could crash the
// process). A second Close is no error, and a stall after Close does not
// connect again.
func TestCallsAfterClose(t *testing.T) {
	s := openStalling(t)
	ctx := t.Context()
	name := fmt.Sprintf("t-closed-%d", time.Now().UnixNano()%1e9)
	if err := s.Create(ctx, name, 4<<20); err != nil {
		t.Fatal(err)
	}
	defer func() {
		s2 := openStalling(t)
		defer s2.Close()
		if err := s2.Remove(context.Background(), name); err != nil {
			t.Error(err)
		}
	}()
	first := s.cur()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if shut, _ := s.shutDown(first); !shut {
		t.Fatal("Close with no call running left the connection open")
	}
	calls := map[string]func() error{
		"Create": func() error { return s.Create(ctx, name+"-b", 4<<20) },
		"Stat":   func() error { _, err := s.Stat(ctx, name); return err },
		"List":   func() error { _, err := s.List(ctx); return err },
		"Remove": func() error { return s.Remove(ctx, name) },
		"Meta":   func() error { _, err := s.Meta(ctx, name); return err },
		"Tags":   func() error { _, err := s.Tags(ctx); return err },
		"Clone": func() error {
			return s.Clone(ctx, layering.SnapRef{Image: name, Snap: "s"}, name+"-c")
		},
		"Diagnose": func() error {
			return s.monJSON(ctx, map[string]any{"prefix": "osd dump", "format": "json"}, &osdDump{})
		},
	}
	for op, call := range calls {
		if err := call(); !errors.Is(err, ErrClosed) || !errors.Is(err, layering.ErrUnavailable) {
			t.Errorf("%s after Close = %v; want ErrClosed and ErrUnavailable", op, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Errorf("a second Close = %v", err)
	}
	if err := s.reconnect(ctx, first); !errors.Is(err, ErrClosed) || s.cur() != first {
		t.Errorf("reconnect after Close = %v (connection replaced: %v); want ErrClosed and no new connection", err, s.cur() != first)
	}
}
