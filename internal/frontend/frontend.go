// Package frontend is a node's front end to the PoP's endpoints: it accepts a connection to any
// deployment's endpoint port, asks its Router where the deployment runs now (holding the
// connection while it moves, resumes or is woken), and forwards it there.
//
// The bytes go through the kernel: a copy between two TCP connections is a splice(2) in Go on
// Linux, so that the front end never reads the payload into user space. The accept stays in
// user space, where a connection can wait for an instance that does not run yet: what an
// nftables DNAT rule alone cannot do.
package frontend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrNoRoute: the endpoint leads nowhere (no deployment holds the port,
// or it failed), or not within the hold timeout (ErrHoldTimeout too).
// ErrHeldLimit: the front end holds as many connections as it may.
var (
	ErrNoRoute     = errors.New("no route")
	ErrHoldTimeout = errors.New("hold timeout")
	ErrHeldLimit   = errors.New("too many connections held")
	// ErrWakeLimit: the node woke as many suspended deployments as its
	// rate allows (a Router's answer).
	ErrWakeLimit = errors.New("too many wakes")
)

// Target is where a connection to an endpoint goes now.
type Target struct {
	// Addr is the host:port to dial: the instance on this node, or
	// another node's front end.
	Addr       string
	Deployment string
	// Held: the connection waited for the deployment (a move, a resume,
	// a wake). Woke: this connection's request resumed it. Made: it made
	// the app's instance on demand (an app's shared endpoint).
	Held, Woke, Made bool
}

// Router resolves an endpoint port to its Target, waiting while the
// deployment does not run anywhere, until ctx ends (the hold timeout).
type Router interface {
	Route(ctx context.Context, port int) (Target, error)
}

// Config is a front end's.
type Config struct {
	// Listen is the address whose endpoint ports it accepts on.
	Listen string
	// HoldTimeout bounds a connection's wait for its route.
	HoldTimeout time.Duration
	// DialTimeout bounds a connection to the target (default 3s).
	DialTimeout time.Duration
	// MaxHeld bounds the connections waiting for their route at once
	// (default 1024): beyond it a connection is closed at once, so that a
	// flood of connections to deployments that do not run costs the node
	// a bounded number of goroutines and watches.
	MaxHeld int
	Metrics *Metrics
	Log     *slog.Logger
}

// Frontend accepts and forwards the connections to the PoP's endpoints on
// one address.
type Frontend struct {
	cfg    Config
	router Router
	ctx    context.Context
	cancel context.CancelFunc

	mu        sync.Mutex
	listeners map[int]net.Listener
	conns     map[net.Conn]struct{}
	routing   int // connections asking their route now
	closed    bool
	wg        sync.WaitGroup
}

// New makes a front end; Sync opens its listeners.
func New(cfg Config, r Router) *Frontend {
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 3 * time.Second
	}
	if cfg.MaxHeld <= 0 {
		cfg.MaxHeld = 1024
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Frontend{cfg: cfg, router: r, ctx: ctx, cancel: cancel, listeners: map[int]net.Listener{}, conns: map[net.Conn]struct{}{}}
}

// ListenError is a port Sync could not listen on.
type ListenError struct {
	Port int
	Err  error
}

func (e ListenError) Error() string {
	return fmt.Sprintf("front end: listen on port %d: %v (another process holds it? pop.frontend.ports must be the PoP's alone)", e.Port, e.Err)
}

func (e ListenError) Unwrap() error { return e.Err }

// Sync makes the front end listen on exactly ports: it opens what is
// missing and closes the listeners of ports no longer held (their open
// connections go on). It returns the ports it could not listen on, which
// the next Sync tries again.
func (f *Frontend) Sync(ports []int) []ListenError {
	want := map[int]bool{}
	for _, p := range ports {
		want[p] = true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	for p, l := range f.listeners {
		if !want[p] {
			l.Close()
			delete(f.listeners, p)
		}
	}
	var errs []ListenError
	for _, p := range ports {
		if _, ok := f.listeners[p]; ok {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort(f.cfg.Listen, strconv.Itoa(p)))
		if err != nil {
			errs = append(errs, ListenError{Port: p, Err: err})
			continue
		}
		f.listeners[p] = l
		f.wg.Add(1)
		go f.serve(l, p)
	}
	return errs
}

// Ports are the ports it listens on.
func (f *Frontend) Ports() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	ports := make([]int, 0, len(f.listeners))
	for p := range f.listeners {
		ports = append(ports, p)
	}
	sort.Ints(ports)
	return ports
}

// Close stops accepting, closes every open connection (their clients see
// the connection closed) and waits for their handlers.
func (f *Frontend) Close() error {
	f.mu.Lock()
	f.closed = true
	for p, l := range f.listeners {
		l.Close()
		delete(f.listeners, p)
	}
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.cancel()
	f.wg.Wait()
	return nil
}

func (f *Frontend) serve(l net.Listener, port int) {
	defer f.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // closed
		}
		if !f.track(c) {
			c.Close()
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer f.untrack(c)
			f.handle(c, port)
		}()
	}
}

func (f *Frontend) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *Frontend) untrack(c net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.conns, c)
}

// handle routes client c, holding it while its deployment does not run,
// and forwards it.
func (f *Frontend) handle(c net.Conn, port int) {
	defer c.Close()
	m := f.cfg.Metrics.endpoint(port)
	m.accepted()
	start := time.Now()
	ctx, cancel := context.WithTimeout(f.ctx, f.cfg.HoldTimeout)
	defer cancel()
	if !f.beginRoute() {
		m.failed(ErrHeldLimit)
		return
	}
	m.holding(1)
	up, t, err := f.connect(ctx, port)
	m.holding(-1)
	f.endRoute()
	if t.Held {
		m.held(time.Since(start))
	}
	if t.Woke {
		m.woke()
	}
	if t.Made {
		m.made()
	}
	if err != nil {
		m.failed(err)
		f.cfg.Log.Info("front end: connection not forwarded", "port", port, "deployment", t.Deployment, "after", time.Since(start).Round(time.Millisecond), "err", err)
		return
	}
	defer up.Close()
	if !f.track(up) {
		return
	}
	defer f.untrack(up)
	m.open(1)
	defer m.open(-1)
	in, out := splice(c, up)
	m.bytes(in, out)
}

// beginRoute counts a connection asking its route, unless MaxHeld are.
func (f *Frontend) beginRoute() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.routing >= f.cfg.MaxHeld {
		return false
	}
	f.routing++
	return true
}

func (f *Frontend) endRoute() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.routing--
}

// connect routes and dials; a dial that fails (the instance moved a
// moment ago) routes again, within the hold timeout.
func (f *Frontend) connect(ctx context.Context, port int) (net.Conn, Target, error) {
	var held, woke, made bool
	for {
		t, err := f.router.Route(ctx, port)
		held, woke, made = held || t.Held, woke || t.Woke, made || t.Made
		t.Held, t.Woke, t.Made = held, woke, made
		if err != nil {
			if ctx.Err() != nil && f.ctx.Err() == nil {
				err = fmt.Errorf("%w: %w: held %s (agent.frontend.hold_timeout) without its deployment running: %w", ErrNoRoute, ErrHoldTimeout, f.cfg.HoldTimeout, err)
			}
			return nil, t, err
		}
		d := net.Dialer{Timeout: f.cfg.DialTimeout}
		up, err := d.DialContext(ctx, "tcp", t.Addr)
		if err == nil {
			return up, t, nil
		}
		if ctx.Err() != nil {
			return nil, t, fmt.Errorf("%w: dial %s: %w", ErrNoRoute, t.Addr, err)
		}
		held = true
		select {
		case <-ctx.Done():
			return nil, t, fmt.Errorf("%w: dial %s: %w", ErrNoRoute, t.Addr, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// halfOpen bounds how long a client may go on sending once its instance
// closed its side.
const halfOpen = time.Minute

// splice copies both ways until both are done (each side's end is passed
// on as a half close), and returns the bytes from the client (in) and to
// it (out). Between two TCP connections io.Copy is a splice(2).
func splice(client, up net.Conn) (in, out int64) {
	done := make(chan int64, 1)
	go func() {
		n, _ := io.Copy(up, client)
		closeWrite(up)
		done <- n
	}()
	out, _ = io.Copy(client, up)
	closeWrite(client)
	// The instance closed its side: the client's may still be sending,
	// for a while.
	_ = client.SetReadDeadline(time.Now().Add(halfOpen))
	in = <-done
	return in, out
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
		return
	}
	_ = c.Close()
}

// ephemeralPorts is the kernel's range of ports for outgoing connections.
const ephemeralPorts = "/proc/sys/net/ipv4/ip_local_port_range"

// CheckRange refuses a range of endpoint ports that overlaps the ports
// the node's kernel gives outgoing connections: a front end could not
// listen on a port one of them holds, and would take ports from them.
func CheckRange(lo, hi int) error {
	b, err := os.ReadFile(ephemeralPorts)
	if err != nil {
		return nil // not Linux's procfs: nothing to compare
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return nil
	}
	elo, err1 := strconv.Atoi(f[0])
	ehi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || hi < elo || lo > ehi {
		return nil
	}
	return fmt.Errorf("pop.frontend.ports %d-%d overlaps this node's ephemeral ports %d-%d (%s): give the PoP a range outside it (the default is 20000-29999), or narrow net.ipv4.ip_local_port_range",
		lo, hi, elo, ehi, ephemeralPorts)
}
