//go:build !no_ceph

package cephstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// session is one connection to the cluster (one librados client
// instance) and its I/O context on the pool. Its fields but conn and ioctx
// are guarded by Store.mu.
type session struct {
	conn  *rados.Conn
	ioctx *rados.IOContext
	// users counts the calls running on it and the images open on it,
	// the calls given up on included: it is shut down once it has none
	// and is retired (after a stall, or by Store.Close), never under them.
	users   int
	retired bool
	closed  bool
}

// dial connects to the cluster and opens the pool, within cfg.Timeout and
// ctx.
//
// Implements: rados_create2, rados_conf_read_file, rados_connect,
// rados_ioctx_create.
func dial(ctx context.Context, cfg Config) (*session, error) {
	conn, err := rados.NewConnWithUser(cfg.ID)
	if err != nil {
		return nil, fmt.Errorf("ceph: new connection: %w", err)
	}
	if err := conn.ReadConfigFile(cfg.Conf); err != nil {
		return nil, fmt.Errorf("ceph: read %s: %w", cfg.Conf, err)
	}
	secs := strconv.Itoa(int(cfg.Timeout.Seconds() + 0.5))
	opts := map[string]string{
		"client_mount_timeout": secs,
		"rados_mon_op_timeout": secs,
		"rados_osd_op_timeout": secs,
		"log_to_stderr":        "false",
		"err_to_stderr":        "false",
	}
	if cfg.Keyring != "" {
		opts["keyring"] = cfg.Keyring
	}
	for k, v := range opts {
		if err := conn.SetConfigOption(k, v); err != nil {
			return nil, fmt.Errorf("ceph: set %s: %w", k, err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- conn.Connect() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		go func() { <-done; conn.Shutdown() }()
		return nil, fmt.Errorf("ceph: connect via %s: %w (%w)", cfg.Conf, layering.ErrUnavailable, ctx.Err())
	}
	if err != nil {
		return nil, hint.With(
			fmt.Errorf("ceph: connect via %s as client.%s: %w (ceph: %w)", cfg.Conf, cfg.ID, layering.ErrUnavailable, err),
			"is the cluster up? `ceph -c "+cfg.Conf+" -s`; for the local one run `make dev-up`")
	}
	ioctx, err := conn.OpenIOContext(cfg.Pool)
	if err != nil {
		conn.Shutdown()
		return nil, hint.With(fmt.Errorf("ceph: open pool %q: %w (ceph: %w)", cfg.Pool, layering.ErrNotFound, err),
			"create it with `ceph osd pool create "+cfg.Pool+" && rbd pool init "+cfg.Pool+"` or pass --ceph-pool")
	}
	return &session{conn: conn, ioctx: ioctx}, nil
}

// Stalls implements layering.StallCounter: the calls given up on after
// Config.Stall (not those whose context ended).
func (s *Store) Stalls() uint64 { return s.stalls.Load() }

// ErrClosed is what a call on a Store after its Close returns, with
// layering.ErrUnavailable: the connection it would use is shut down, and
// librados must not be called on it (its memory is freed).
var ErrClosed = errors.New("the store is closed")

// acquire returns the connection calls use now, counting one more use of
// it; release ends that use. After Close it returns an error wrapping
// ErrClosed.
func (s *Store) acquire() (*session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("ceph: %w (%w)", ErrClosed, layering.ErrUnavailable)
	}
	s.sess.users++
	return s.sess, nil
}

// release ends a use of se, and shuts se down if that was the last use of
// a retired connection.
func (s *Store) release(se *session) {
	s.mu.Lock()
	se.users--
	last := se.users == 0 && se.retired && !se.closed
	if last {
		se.closed = true
		s.retired = slices.DeleteFunc(s.retired, func(r *session) bool { return r == se })
	}
	s.mu.Unlock()
	if last {
		se.shutdown()
	}
}

func (se *session) shutdown() {
	se.ioctx.Destroy()
	se.conn.Shutdown()
}

// Close implements layering.Store. A connection still in use (a call that
// librbd has not returned from, see bounded) is not shut down under that
// use, which could crash the process: Close says so, and the connection
// is shut down when its last use ends. Calls after Close fail with
// ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	s.closed = true
	var now []*session
	left := 0
	for _, se := range append(s.retired, s.sess) {
		switch {
		case se.closed:
		case se.users > 0:
			se.retired = true
			left++
		default:
			se.closed = true
			now = append(now, se)
		}
	}
	s.mu.Unlock()
	for _, se := range now {
		se.shutdown()
	}
	if left > 0 {
		return fmt.Errorf("ceph: %d connection(s) left open until librbd returns from the calls on them", left)
	}
	return nil
}

// ErrStalled is what a librbd call that did not return within
// Config.Stall wraps, with layering.ErrUnavailable.
var ErrStalled = errors.New("librbd did not return")

// image is an open image; it holds a use of the connection it is open on.
type image struct {
	*rbd.Image
	s  *Store
	se *session
}

// Close closes the image and ends its use of the connection.
func (i *image) Close() error {
	err := i.Image.Close()
	i.s.release(i.se)
	return err
}

// openImage opens an image (at snapshot snap, or rbd.NoSnapshot) within
// Config.Stall: see bounded.
//
// Implements: rbd_open, rbd_open_read_only.
func (s *Store) openImage(ctx context.Context, op, name, snap string, readOnly bool) (*image, error) {
	return bounded(ctx, s, op, true, func(se *session) (*image, error) {
		var img *rbd.Image
		var err error
		if readOnly {
			img, err = rbd.OpenImageReadOnly(se.ioctx, name, snap)
		} else {
			img, err = rbd.OpenImage(se.ioctx, name, snap)
		}
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		se.users++
		s.mu.Unlock()
		return &image{Image: img, s: s, se: se}, nil
	}, func(img *image) { _ = img.Close() })
}

// bounded runs call, a librbd call that opens an image, on the store's
// connection, and gives up on it after Config.Stall. rbd_open waits for
// librbd's state machine without a timeout of its own: each OSD request
// in it is bounded (rados_osd_op_timeout), but the open as a whole has
// been seen to wait for ever on a healthy cluster, where a new client
// opens the same image at once. So a call that stalls retires its
// connection (later calls use a new one) and, if repeatable, runs once
// more on the new connection. A repeatable call (one that changes nothing
// in the pool) is also given up on when ctx ends; one that changes the
// pool (a clone, a removal) is waited for until it returns or stalls, so
// that its caller never undoes it before it is done. What a call given up
// on returns later is released with release. The call's own error is
// wrapped as Store.wrap does. A stall of a call that is not repeatable, a
// second stall, or a failed reconnection gives an error wrapping
// ErrStalled and layering.ErrUnavailable.
func bounded[T any](ctx context.Context, s *Store, op string, repeatable bool, call func(*session) (T, error), release func(T)) (T, error) {
	type result struct {
		v   T
		err error
	}
	var zero T
	for attempt := 1; ; attempt++ {
		se, err := s.acquire()
		if err != nil {
			return zero, fmt.Errorf("%s: %w", op, err)
		}
		done := make(chan result, 1)
		go func() {
			v, err := call(se)
			done <- result{v, err}
		}()
		timer := time.NewTimer(s.cfg.Stall)
		var stalled bool
		cancelled := ctx.Done()
		if !repeatable {
			cancelled = nil
		}
		select {
		case r := <-done:
			timer.Stop()
			s.release(se)
			return r.v, s.wrap(ctx, op, r.err)
		case <-cancelled:
			timer.Stop()
		case <-timer.C:
			stalled = true
		}
		go func() {
			if r := <-done; r.err == nil && release != nil {
				release(r.v)
			}
			s.release(se)
		}()
		if !stalled {
			return zero, fmt.Errorf("%s: %w", op, ctx.Err())
		}
		s.stalls.Add(1)
		err = s.reconnect(ctx, se)
		s.log.Warn("a librbd call did not return: this connection is left, later calls use a new one",
			"op", op, "after", s.cfg.Stall, "attempt", attempt, "reconnect_error", err)
		if err != nil || !repeatable || attempt == 2 {
			werr := fmt.Errorf("%s: %w within %s, attempt %d (%w)", op, ErrStalled, s.cfg.Stall, attempt, layering.ErrUnavailable)
			if err != nil {
				werr = fmt.Errorf("%w; connecting again: %w", werr, err)
			}
			return zero, hint.With(werr,
				"librbd in this process stopped answering while other clients may be served: `ceph -s` shows whether the cluster is healthy; if it is, restart the process")
		}
	}
}

// reconnect replaces old, the connection of a stalled call, with a new one;
// old is retired, and shut down when its last use ends. Another call may
// have replaced it already.
func (s *Store) reconnect(ctx context.Context, old *session) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("ceph: %w", ErrClosed) // Close retired old
	}
	if s.sess != old {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	se, err := dial(ctx, s.cfg)
	if err != nil {
		return err
	}
	old.retired = true
	s.sess = se
	if old.users > 0 {
		s.retired = append(s.retired, old)
		return nil
	}
	// Its stalled call returned meanwhile.
	old.closed = true
	go old.shutdown()
	return nil
}
