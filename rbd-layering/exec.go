package layering

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Phase is one timed step of an operation.
type Phase struct {
	Name     string        `json:"name"`
	Duration time.Duration `json:"duration_ns"`
}

// Timings records the phases of an operation in order.
type Timings []Phase

// Track appends the time since start under name and returns now.
func (t *Timings) Track(name string, start time.Time) time.Time {
	now := time.Now()
	*t = append(*t, Phase{Name: name, Duration: now.Sub(start)})
	return now
}

// Get returns the duration of the named phase (the sum, if it repeats).
func (t Timings) Get(name string) (time.Duration, bool) {
	var d time.Duration
	found := false
	for _, p := range t {
		if p.Name == name {
			d, found = d+p.Duration, true
		}
	}
	return d, found
}

// String renders "clone 21ms, mount 45ms, ...".
func (t Timings) String() string {
	parts := make([]string, len(t))
	for i, p := range t {
		parts[i] = fmt.Sprintf("%s %s", p.Name, p.Duration.Round(time.Millisecond))
	}
	return strings.Join(parts, ", ")
}

// ExecOptions modify ExecWith.
type ExecOptions struct {
	// Output receives what the command prints (nil discards it).
	Output io.Writer
	// Network is RUN's --network: NetworkDefault (outbound through NAT),
	// NetworkNone (only lo) or NetworkHost (the node's network, where
	// ManagerConfig.HostNetwork allows it).
	Network Network
}

// Exec runs a shell command in a throwaway clone of an environment, on
// the default network: ExecWith with Output out.
func (m *Manager) Exec(ctx context.Context, name, command string, out io.Writer) (Timings, error) {
	return m.ExecWith(ctx, name, command, ExecOptions{Output: out})
}

// ExecWith runs a shell command in a throwaway clone of an environment:
// clone, map and mount, run it with the environment's config in
// namespaces of its own as a RUN step does (the clone as its root, a
// private /dev and /proc, the network of opts.Network), unmount, unmap and
// remove the clone. What the command writes is discarded with the clone.
// It returns the phase timings.
func (m *Manager) ExecWith(ctx context.Context, name, command string, opts ExecOptions) (t Timings, err error) {
	if err := opts.Network.check(m.cfg); err != nil {
		return nil, fmt.Errorf("exec: %w", err)
	}
	if opts.Output == nil {
		opts.Output = io.Discard
	}
	env, err := m.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(command) == "" {
		return nil, fmt.Errorf("exec: empty command: %w", ErrInvalid)
	}
	start := time.Now()
	clone := ExecPrefix + name + "-" + randomID(4)
	if err := m.b.Clone(ctx, env.Ref, clone); err != nil {
		return nil, err
	}
	defer func() {
		if rerr := m.b.Remove(context.WithoutCancel(ctx), clone); rerr != nil {
			err = errors.Join(err, fmt.Errorf("remove clone %s: %w", clone, rerr))
		}
	}()
	start = t.Track("clone", start)
	target, err := m.scratch(scratchExec)
	if err != nil {
		return t, err
	}
	defer os.Remove(target)
	unmount, err := m.m.Mount(ctx, clone, target, MountOptions{})
	if err != nil {
		return t, err
	}
	start = t.Track("map+mount", start)
	runErr := runStep(ctx, stepSpec{root: target, command: command, cfg: env.Config, network: opts.Network, out: opts.Output})
	start = t.Track("run", start)
	if uerr := unmount(context.WithoutCancel(ctx)); uerr != nil {
		return t, errors.Join(runErr, uerr)
	}
	t.Track("unmount+unmap", start)
	return t, runErr
}
