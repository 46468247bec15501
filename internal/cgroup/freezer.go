package cgroup

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/hint"
)

// Freezer stops every process of a cgroup at once and lets them run again:
// a warm pool's slot restored ahead of any request waits frozen, using no
// CPU, until a deployment binds it.
type Freezer interface {
	// Version is the hierarchy it writes to.
	Version() Version
	// Freeze stops the processes of pid's cgroup, and returns once the
	// kernel reports them all stopped. It refuses a process of the root
	// cgroup (ErrUnsupported): that would stop the whole machine.
	Freeze(ctx context.Context, pid int) error
	// Thaw lets the processes of pid's cgroup run again.
	Thaw(pid int) error
	// Frozen says whether pid's cgroup is frozen.
	Frozen(pid int) (bool, error)
}

// DetectFreezer returns the Freezer of this node: cgroup v1's freezer
// controller where it is mounted, else cgroup v2's cgroup.freeze.
func DetectFreezer(p Paths) (Freezer, error) {
	p = p.withDefaults()
	ms, err := readMounts(p.Mountinfo)
	if err != nil {
		return nil, err
	}
	if m, ok := ms.v1("freezer"); ok {
		return &freezerV1{proc: p.Proc, m: m}, nil
	}
	if m, ok := ms.v2(); ok {
		return &freezerV2{proc: p.Proc, m: m}, nil
	}
	return nil, hint.With(fmt.Errorf("no freezer in %s: %w", p.Mountinfo, ErrUnsupported),
		"mount the cgroup v1 freezer controller, or cgroup v2 (Linux 5.2 or later)")
}

// freezePoll is how often Freeze reads whether the kernel has stopped
// every process yet.
const freezePoll = time.Millisecond

// freezerDir is the directory of pid's cgroup in the hierarchy mounted at
// m whose /proc/<pid>/cgroup line is controller ("" for cgroup v2).
func freezerDir(proc string, m mount, pid int, controller string) (string, error) {
	cgs, err := procCgroups(proc, pid)
	if err != nil {
		return "", err
	}
	path, ok := cgs[controller]
	if !ok {
		return "", fmt.Errorf("pid %d has no %s cgroup: %w", pid, versionOf(controller), ErrUnsupported)
	}
	if filepath.Clean("/"+path) == "/" {
		return "", hint.With(fmt.Errorf("pid %d is in the root %s cgroup: %w", pid, versionOf(controller), ErrUnsupported),
			"freezing it would stop the whole machine; run the process in a container or a child cgroup")
	}
	return m.dir(path)
}

func versionOf(controller string) string {
	if controller == "" {
		return "cgroup v2"
	}
	return "cgroup v1 " + controller
}

// waitState polls file until its content (or, with key, the value of key
// in it) is want.
func waitState(ctx context.Context, file, key, want string) error {
	for {
		b, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("read %s: %w", file, err)
		}
		got := strings.TrimSpace(string(b))
		if key != "" {
			got = ""
			for line := range strings.SplitSeq(string(b), "\n") {
				if v, ok := strings.CutPrefix(line, key+" "); ok {
					got = strings.TrimSpace(v)
				}
			}
		}
		if got == want {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s is %q, not %q: %w", file, got, want, ctx.Err())
		case <-time.After(freezePoll):
		}
	}
}

// freezerV1 writes cgroup v1's freezer.state.
type freezerV1 struct {
	proc string
	m    mount
}

func (f *freezerV1) Version() Version { return V1 }

func (f *freezerV1) Freeze(ctx context.Context, pid int) error {
	dir, err := freezerDir(f.proc, f.m, pid, "freezer")
	if err != nil {
		return err
	}
	file := filepath.Join(dir, "freezer.state")
	if err := writeFile(file, "FROZEN"); err != nil {
		return err
	}
	return waitState(ctx, file, "", "FROZEN")
}

func (f *freezerV1) Thaw(pid int) error {
	dir, err := freezerDir(f.proc, f.m, pid, "freezer")
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, "freezer.state"), "THAWED")
}

func (f *freezerV1) Frozen(pid int) (bool, error) {
	dir, err := freezerDir(f.proc, f.m, pid, "freezer")
	if err != nil {
		return false, err
	}
	b, err := os.ReadFile(filepath.Join(dir, "freezer.state"))
	if err != nil {
		return false, fmt.Errorf("read the freezer state of pid %d: %w", pid, err)
	}
	return strings.TrimSpace(string(b)) != "THAWED", nil
}

// freezerV2 writes cgroup v2's cgroup.freeze and reads cgroup.events.
type freezerV2 struct {
	proc string
	m    mount
}

func (f *freezerV2) Version() Version { return V2 }

func (f *freezerV2) dir(pid int) (string, error) {
	dir, err := freezerDir(f.proc, f.m, pid, "")
	if err != nil {
		return "", err
	}
	if !exists(filepath.Join(dir, "cgroup.freeze")) {
		return "", hint.With(fmt.Errorf("cgroup %s has no cgroup.freeze: %w", dir, ErrUnsupported), "the cgroup v2 freezer needs Linux 5.2 or later")
	}
	return dir, nil
}

func (f *freezerV2) Freeze(ctx context.Context, pid int) error {
	dir, err := f.dir(pid)
	if err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, "cgroup.freeze"), "1"); err != nil {
		return err
	}
	return waitState(ctx, filepath.Join(dir, "cgroup.events"), "frozen", "1")
}

func (f *freezerV2) Thaw(pid int) error {
	dir, err := f.dir(pid)
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, "cgroup.freeze"), "0")
}

func (f *freezerV2) Frozen(pid int) (bool, error) {
	dir, err := f.dir(pid)
	if err != nil {
		return false, err
	}
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.freeze"))
	if err != nil {
		return false, fmt.Errorf("read the freezer state of pid %d: %w", pid, err)
	}
	return strings.TrimSpace(string(b)) == "1", nil
}
