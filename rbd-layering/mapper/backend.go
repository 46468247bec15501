package mapper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
)

// Backend turns an image into a block device on this node and back. The
// Mapper records, mounts and rolls back; a Backend only attaches and
// detaches. krbd, nbd, fuse and file implement it; mappertest.RunSuite is
// the behaviour every implementation must show.
type Backend interface {
	// Name is the Config.Backend value that selects this backend.
	Name() string
	// Probe reports why the backend cannot work on this node, or nil.
	Probe(ctx context.Context) error
	// Attach makes img available as a block device and returns its path.
	// Before creating each resource it fills in rec's intent fields and
	// calls save, and it saves again once the resource exists. On error
	// it may leave resources behind: the caller undoes them with Detach.
	Attach(ctx context.Context, img Image, rec *Record, save func() error) (device string, err error)
	// Detach undoes whatever rec says Attach created (verifying identity
	// first) and is a no-op for resources that are already gone.
	Detach(ctx context.Context, rec Record) error
}

// aborter is a Backend whose devices can block forever when the cluster
// stops serving I/O (rbd-fuse retries a timed-out request without end, and
// a process reading its loop device waits in the kernel, where no signal
// reaches it).
type aborter interface {
	// Abort makes every pending and later I/O on rec's device fail at
	// once, so that whatever waits on it returns. It reports whether it
	// had anything to cut off. The mapping stays for Detach.
	Abort(ctx context.Context, rec Record) (bool, error)
}

// Choice tells which backend a Mapper uses and why.
type Choice struct {
	// Backend is the chosen backend's name.
	Backend string
	// Reason is a one-line explanation, for logs and `fogctl` output.
	Reason string
	// Probes holds each probed backend's result in probe order; Err is nil
	// for a usable one.
	Probes []ProbeResult
}

// ProbeResult is the outcome of one Backend.Probe.
type ProbeResult struct {
	Backend string
	Err     error
}

// autoOrder is the order in which Backend "auto" probes: the kernel client
// is fastest, rbd-nbd next, rbd-fuse + loop works nearly everywhere.
var autoOrder = []string{BackendKRBD, BackendNBD, BackendFuse}

// choose probes the candidates and picks one. want is "auto" or a backend
// name; all holds every backend by name.
func choose(ctx context.Context, want string, all map[string]Backend) (Backend, Choice, error) {
	if want != BackendAuto {
		b, ok := all[want]
		if !ok {
			return nil, Choice{}, fmt.Errorf("backend %q is unknown: %w", want, ErrInvalid)
		}
		err := b.Probe(ctx)
		c := Choice{Backend: want, Probes: []ProbeResult{{want, err}}}
		if err != nil {
			return nil, c, fmt.Errorf("backend %q: %w: %w (hint: install what it needs, or set Backend to \"auto\")", want, ErrBackendUnavailable, err)
		}
		c.Reason = fmt.Sprintf("%s was requested and its probe passed", want)
		return b, c, nil
	}
	var c Choice
	var skipped []string
	for _, name := range autoOrder {
		b, ok := all[name]
		if !ok {
			continue
		}
		err := b.Probe(ctx)
		c.Probes = append(c.Probes, ProbeResult{name, err})
		if err == nil {
			c.Backend = name
			c.Reason = "auto: " + name + " is usable"
			if len(skipped) > 0 {
				c.Reason += "; skipped " + strings.Join(skipped, "; ")
			}
			return b, c, nil
		}
		skipped = append(skipped, fmt.Sprintf("%s (%v)", name, err))
	}
	errs := []error{fmt.Errorf("%w on this node (hint: load the rbd or nbd kernel module, or install rbd-fuse and util-linux)", ErrNoBackend)}
	for _, p := range c.Probes {
		errs = append(errs, fmt.Errorf("%s: %w", p.Backend, p.Err))
	}
	return nil, c, errors.Join(errs...)
}

// backends wires every implementation, by name. The Mapper keeps them all:
// a record is always undone by the backend that created it.
func backends(cfg Config, r runner, log *slog.Logger) map[string]Backend {
	return map[string]Backend{
		BackendKRBD: &krbdBackend{cfg: cfg, run: r, log: log},
		BackendNBD:  &nbdBackend{cfg: cfg, run: r, log: log},
		BackendFuse: &fuseBackend{cfg: cfg, run: r, log: log},
		BackendFile: &fileBackend{cfg: cfg, run: r, log: log},
	}
}

// needTools returns an error naming the first tool missing from PATH.
func needTools(tools ...string) error {
	for _, t := range tools {
		if _, err := lookPath(t); err != nil {
			return fmt.Errorf("%s not found in PATH", t)
		}
	}
	return nil
}
