package deploy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/hint"
)

// probe returns the readiness probe of an instance, run from the host.
func (sg *Stages) probe(ctx context.Context, dr drivers.Driver, h drivers.Handle, app spec.App, restored bool) (engine.Probe, error) {
	r := app.Ready
	switch r.Kind {
	case spec.ReadyTCP:
		if c, ok := dr.(*drivers.Container); ok && r.Send == "" {
			// A published port accepts at once (docker-proxy); only the
			// entrypoint, inside the container, sees the app's socket.
			return entrypointProbe{c: c, h: h}, nil
		}
		return engine.TCPProbe{Addr: h.Ports[drivers.PortKey(r.Port, "tcp")], Send: r.Send, Expect: r.Expect, Dial: directDial(h)}, nil
	case spec.ReadyHTTP:
		url := "http://" + h.Ports[drivers.PortKey(r.Port, "tcp")] + r.Path
		return engine.HTTPProbe{URL: url, Status: r.Status, Dial: directDial(h)}, nil
	case spec.ReadyExec:
		pid, err := dr.NetPid(ctx, h)
		if err != nil {
			return nil, err
		}
		argv := append([]string{"nsenter", "--net=/proc/" + strconv.Itoa(pid) + "/ns/net", "--", "chroot", h.EnvPath}, r.Command...)
		return engine.ExecProbe{Argv: argv, Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}}, nil
	case spec.ReadyOutput:
		// A restored app was checkpointed after it had printed the phrase:
		// it is ready once its engine has restored it and it runs.
		return outputProbe{d: dr, h: h, phrase: r.Phrase, restored: restored}, nil
	}
	return nil, fmt.Errorf("%w: ready.kind %q", spec.ErrInvalidSpec, r.Kind)
}

// directDial returns what the probes of instance h dial with: instead of
// the host address where h publishes a port, the instance's own address for
// that port (h.IP), so that the runtime's port proxy is not on the way (it
// costs a process's CPU per connection, and accepts before the app does).
// Where the host does not reach h.IP at once (no route, or no answer within
// directDialTimeout: a runtime whose networks live elsewhere), it dials the
// published address, from then on. nil (the host's own dialer) when h has
// no address.
func directDial(h drivers.Handle) engine.DialFunc {
	if h.IP == "" {
		return nil
	}
	direct := map[string]string{}
	for key, addr := range h.Ports {
		if port, proto, ok := strings.Cut(key, "/"); ok && proto == "tcp" {
			direct[addr] = net.JoinHostPort(h.IP, port)
		}
	}
	var d net.Dialer
	var unreachable atomic.Bool
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if to, ok := direct[addr]; ok && !unreachable.Load() {
			dctx, cancel := context.WithTimeout(ctx, directDialTimeout)
			c, err := d.DialContext(dctx, network, to)
			cancel()
			if err == nil || errors.Is(err, syscall.ECONNREFUSED) || ctx.Err() != nil {
				return c, err
			}
			unreachable.Store(true)
		}
		return d.DialContext(ctx, network, addr)
	}
}

// directDialTimeout bounds a connect to an instance's own address: on the
// node's bridge it is answered at once, accepted or refused.
const directDialTimeout = 250 * time.Millisecond

type outputProbe struct {
	d        drivers.Driver
	h        drivers.Handle
	phrase   string
	restored bool
}

func (p outputProbe) Probe(ctx context.Context) error {
	if p.restored {
		if ok, err := p.d.Running(ctx, p.h); err != nil || !ok {
			return fmt.Errorf("not running (%v)", err)
		}
		return nil
	}
	lines, err := p.d.Logs(ctx, p.h, 500)
	if err != nil {
		return err
	}
	if !drivers.OutputContains(lines, p.phrase) {
		return fmt.Errorf("%q not printed yet", p.phrase)
	}
	return nil
}

func (p outputProbe) String() string { return fmt.Sprintf("output %q", p.phrase) }

// runningInterval is how often waitReady asks the driver whether the
// instance still runs.
const runningInterval = 100 * time.Millisecond

// waitReady probes until the app is ready, its instance stops, or the
// app's ready.timeout passes; the error then carries the app's last lines.
func (sg *Stages) waitReady(ctx context.Context, dr drivers.Driver, h drivers.Handle, app spec.App, restored bool) error {
	p, err := sg.probe(ctx, dr, h, app, restored)
	if err != nil {
		return err
	}
	timeout := readyTimeout(app)
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	fail := func(why string, last error) error {
		lines, _ := dr.Logs(context.WithoutCancel(ctx), h, 20)
		return engine.WithOutput(hint.With(fmt.Errorf("app %s: %s %s after %s: %w (last attempt: %v)", app.Name, p, why,
			time.Since(start).Round(time.Millisecond), engine.ErrNotReady, last),
			"check the app's command and its ready settings (fogctl logs shows its output); raise ready.timeout for a slow boot"),
			"the app", lines)
	}
	// Whether the instance still runs costs a runtime call: asked every
	// runningInterval beside the probes, not between them, so that an
	// answer that comes meanwhile is seen at once. The first check waits
	// a runningInterval too: most instances are ready before it.
	exited := make(chan struct{})
	go func() {
		tick := time.NewTicker(runningInterval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if ok, err := dr.Running(ctx, h); err == nil && !ok {
					close(exited)
					return
				}
			}
		}
	}()
	for {
		last := p.Probe(ctx)
		if last == nil {
			return nil
		}
		// The first probes come closer together: a restore answers within
		// a few hundred milliseconds, and the answer waits for half an
		// interval on average.
		wait := sg.cfg.ReadyInterval
		if time.Since(start) < readySoon {
			wait = min(wait, readySoonInterval)
		}
		select {
		case <-ctx.Done():
			return fail("not ready", last)
		case <-exited:
			return fail("failed: the instance exited", last)
		case <-time.After(wait):
		}
	}
}

// For the first readySoon of its wait, an instance is probed every
// readySoonInterval at most.
const (
	readySoon         = 300 * time.Millisecond
	readySoonInterval = 2 * time.Millisecond
)

// entrypointProbe is ready once the DMTCP container's entrypoint reports
// launch_ready, restart_ready or boot_ready.
type entrypointProbe struct {
	c *drivers.Container
	h drivers.Handle
}

func (p entrypointProbe) Probe(ctx context.Context) error {
	tm, err := p.c.Timings(ctx, p.h)
	if err != nil {
		return err
	}
	for _, t := range tm {
		if t.Phase == "launch_ready" || t.Phase == "restart_ready" || t.Phase == "boot_ready" {
			return nil
		}
	}
	return fmt.Errorf("the entrypoint has not seen the app's port answer yet")
}

func (p entrypointProbe) String() string { return "tcp (inside the container)" }
