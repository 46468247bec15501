// A fake container's process: its signals, host paths, published ports and listeners.

package runtime

import (
	"context"
	"fmt"
	"io"
	"net"
	"path"
	"strings"
	"sync"
	"sync/atomic"
)

// FakeProgram is what runs in a fake container: it is called with the
// container's argv, environment and streams and returns the exit code. It
// must return soon after ctx is done (the container is being stopped).
type FakeProgram func(ctx context.Context, p *FakeProcess) int

// FakeProcess is the view a FakeProgram has of its container.
type FakeProcess struct {
	Args   []string
	Env    []string
	Stdin  io.Reader
	Stdout io.Writer
	// CapEff is the effective capability mask the container would have.
	CapEff uint64

	c *fakeContainer
}

// Signals delivers the signals sent to the container other than those
// that end it (TERM, INT, KILL), by name without "SIG" ("USR1"). A
// signal sent while the buffer is full is lost, as one that a process
// does not handle is ignored.
func (p *FakeProcess) Signals() <-chan string {
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	return p.c.signals
}

// HostPath returns the host path bound at containerPath (or at a directory
// above it), and whether one is.
func (p *FakeProcess) HostPath(containerPath string) (string, bool) {
	containerPath = path.Clean(containerPath)
	best, host := -1, ""
	for _, b := range p.c.spec.Binds {
		cp := path.Clean(b.ContainerPath)
		rel, ok := strings.CutPrefix(containerPath, cp)
		if !ok || (cp != "/" && rel != "" && rel[0] != '/') || len(cp) <= best {
			continue
		}
		best, host = len(cp), path.Join(b.HostPath, rel)
	}
	return host, best >= 0
}

// PublishedAddr returns the host address where the container's port is
// published ("127.0.0.1:32768"), or "" when it is not.
func (p *FakeProcess) PublishedAddr(port uint16, proto string) string {
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	if l, ok := p.c.listeners[portKey(port, proto)]; ok {
		return l.Addr().String()
	}
	return ""
}

// Listen returns the listener of a published container port (the host
// side of the port mapping), or a loopback listener nobody outside can
// reach when the port is not published.
func (p *FakeProcess) Listen(port uint16, proto string) (net.Listener, error) {
	key := portKey(port, proto)
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	l, ok := p.c.listeners[key]
	if !ok {
		return net.Listen("tcp", "127.0.0.1:0")
	}
	fl, ok := l.(*fakeListener)
	if !ok {
		return l, nil
	}
	if fl.closed.Load() {
		// An app before this one in the same container (a recycled one)
		// closed it: the published port is listened on again.
		nl, err := net.Listen("tcp", fl.Addr().String())
		if err != nil {
			return nil, err
		}
		fl = newFakeListener(nl)
		p.c.listeners[key] = fl
	}
	fl.listening.Store(true)
	return fl, nil
}

// fakeListener is a published port's listener. As dockerd's proxy does, it
// accepts from the start and closes at once what comes while no app in
// the container listens on the port (Listen); it knows whether an app
// closed it.
type fakeListener struct {
	net.Listener
	closed    atomic.Bool
	listening atomic.Bool
	conns     chan net.Conn
	done      chan struct{}
	once      sync.Once
}

func newFakeListener(l net.Listener) *fakeListener {
	fl := &fakeListener{Listener: l, conns: make(chan net.Conn), done: make(chan struct{})}
	go fl.proxy()
	return fl
}

func (l *fakeListener) proxy() {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return
		}
		if !l.listening.Load() {
			_ = c.Close()
			continue
		}
		select {
		case l.conns <- c:
		case <-l.done:
			_ = c.Close()
			return
		}
	}
}

// Accept implements net.Listener.
func (l *fakeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *fakeListener) Close() error {
	l.closed.Store(true)
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// Run runs another program of the container's image (like exec from a
// shell) with its own argv and streams, and returns its exit code.
func (p *FakeProcess) Run(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) int {
	prog, ok := p.c.image.programs[path.Base(args[0])]
	if !ok {
		fmt.Fprintf(stdout, "%s: not found\n", args[0])
		return 127
	}
	return prog(ctx, &FakeProcess{Args: args, Env: p.Env, Stdin: stdin, Stdout: stdout, CapEff: p.CapEff, c: p.c})
}
