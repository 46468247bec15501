// Package ksm shares the identical pages of the processes that asked for it: the kernel's
// same-page merging (KSM). The slots of an app restored ahead on a node hold the same pages,
// restored from one checkpoint; a process that opted in (SetSelf, before it starts the restore)
// passes the choice on to every process it forks or executes, and the kernel's scanner (ksmd,
// turned on by Node.Enable) merges their identical anonymous pages into one copy, copied again on
// the first write. Nothing else on the node is scanned: only the address spaces that opted in.
//
// Implements: prctl(PR_SET_MEMORY_MERGE) (Linux >= 6.4; kept across execve since 6.7),
// /sys/kernel/mm/ksm (run, pages_to_scan, pages_sharing, full_scans), /proc/PID/ksm_stat.
package ksm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ErrUnavailable: this kernel cannot merge pages (no CONFIG_KSM, or a
// read-only /sys).
var ErrUnavailable = errors.New("same-page merging unavailable")

// DefaultDir is where the kernel shows its scanner.
const DefaultDir = "/sys/kernel/mm/ksm"

// MaxPagesToScan bounds Settings.PagesToScan: ksmd's batch between two
// sleeps (20 ms by default), so 100000 pages is about 20 GiB a second.
const MaxPagesToScan = 100000

// Node is a node's scanner, the files under Dir (DefaultDir if "").
type Node struct {
	Dir string
}

// Settings are what Enable sets.
type Settings struct {
	// PagesToScan is how many pages ksmd scans per wake-up; 0 leaves the
	// kernel's (100: about 20 MiB a second, one slot of a large app in
	// tens of seconds).
	PagesToScan int
}

// Stats are the scanner's counters.
type Stats struct {
	// PagesShared are the merged pages kept; PagesSharing the pages that
	// map one of them (the pages saved).
	PagesShared, PagesSharing uint64
	// FullScans counts the scanner's passes over every address space
	// that opted in.
	FullScans uint64
}

// SavedBytes is the memory merging saves.
func (s Stats) SavedBytes() uint64 { return s.PagesSharing * uint64(os.Getpagesize()) }

func (n Node) dir() string {
	if n.Dir == "" {
		return DefaultDir
	}
	return n.Dir
}

// Enable starts the scanner (run = 1) with settings s.
func (n Node) Enable(s Settings) error {
	if s.PagesToScan < 0 || s.PagesToScan > MaxPagesToScan {
		return fmt.Errorf("pages_to_scan %d: give 0 (the kernel's) to %d", s.PagesToScan, MaxPagesToScan)
	}
	if _, err := os.Stat(filepath.Join(n.dir(), "run")); err != nil {
		return fmt.Errorf("%w: %w (a kernel built with CONFIG_KSM shows %s)", ErrUnavailable, err, n.dir())
	}
	if s.PagesToScan > 0 {
		if err := n.write("pages_to_scan", strconv.Itoa(s.PagesToScan)); err != nil {
			return err
		}
	}
	// Smart scanning skips, for up to 8 passes, a page that found no
	// twin: the pages of a slot restored alone would not meet the next
	// slot's for that long. Only address spaces that opted in are scanned.
	if _, err := os.Stat(filepath.Join(n.dir(), "smart_scan")); err == nil {
		if err := n.write("smart_scan", "0"); err != nil {
			return err
		}
	}
	return n.write("run", "1")
}

func (n Node) write(name, v string) error {
	p := filepath.Join(n.dir(), name)
	if cur, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(cur)) == v {
		return nil
	}
	if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
		return fmt.Errorf("%w: set %s to %s: %w", ErrUnavailable, p, v, err)
	}
	return nil
}

// Stats reads the scanner's counters.
func (n Node) Stats() (Stats, error) {
	var s Stats
	for name, v := range map[string]*uint64{"pages_shared": &s.PagesShared, "pages_sharing": &s.PagesSharing, "full_scans": &s.FullScans} {
		b, err := os.ReadFile(filepath.Join(n.dir(), name))
		if err != nil {
			return Stats{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		if *v, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err != nil {
			return Stats{}, fmt.Errorf("%s: %w", name, err)
		}
	}
	return s, nil
}

// AwaitScans waits until the scanner has made k more full passes than
// when it was called (a page merges on its second pass at the earliest).
func (n Node) AwaitScans(ctx context.Context, k uint64) error {
	s, err := n.Stats()
	if err != nil {
		return err
	}
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %d passes of the scanner: %w", k, ctx.Err())
		case <-t.C:
		}
		now, err := n.Stats()
		if err != nil {
			return err
		}
		if now.FullScans >= s.FullScans+k {
			return nil
		}
	}
}

// Settle waits until merging has settled: the scanner made at least five
// more passes, and the pages it shares changed by less than 1 % over each
// of its last two. It returns the counters then.
func (n Node) Settle(ctx context.Context) (Stats, error) {
	prev, err := n.Stats()
	if err != nil {
		return Stats{}, err
	}
	steady := 0
	for i := 0; ; i++ {
		if err := n.AwaitScans(ctx, 1); err != nil {
			return prev, err
		}
		now, err := n.Stats()
		if err != nil {
			return Stats{}, err
		}
		diff := max(now.PagesSharing, prev.PagesSharing) - min(now.PagesSharing, prev.PagesSharing)
		if diff*100 <= now.PagesSharing {
			steady++
		} else {
			steady = 0
		}
		if i >= 4 && steady >= 2 {
			return now, nil
		}
		prev = now
	}
}

// SetSelf opts the calling process's whole address space in (on) or out.
// Every process it forks or executes afterwards inherits the choice; out
// copies its merged pages back first.
func SetSelf(on bool) error {
	v := uintptr(0)
	if on {
		v = 1
	}
	if err := unix.Prctl(unix.PR_SET_MEMORY_MERGE, v, 0, 0, 0); err != nil {
		return fmt.Errorf("%w: prctl(PR_SET_MEMORY_MERGE, %d): %w", ErrUnavailable, v, err)
	}
	return nil
}

// Self reports whether the calling process has opted in.
func Self() (bool, error) {
	v, err := unix.PrctlRetInt(unix.PR_GET_MEMORY_MERGE, 0, 0, 0, 0)
	if err != nil {
		return false, fmt.Errorf("%w: prctl(PR_GET_MEMORY_MERGE): %w", ErrUnavailable, err)
	}
	return v == 1, nil
}

// Process is what /proc/PID/ksm_stat says of one process.
type Process struct {
	// MergeAny: its whole address space opted in.
	MergeAny bool
	// MergingPages are its pages that map a merged one.
	MergingPages uint64
}

// ReadProcess reads /proc/pid/ksm_stat (under proc, "/proc" if "").
func ReadProcess(proc string, pid int) (Process, error) {
	if proc == "" {
		proc = "/proc"
	}
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "ksm_stat"))
	if err != nil {
		return Process{}, err
	}
	return parseProcess(string(b))
}

func parseProcess(s string) (Process, error) {
	var p Process
	for line := range strings.SplitSeq(s, "\n") {
		k, v, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		k, v = strings.TrimSuffix(k, ":"), strings.TrimSpace(v)
		switch k {
		case "ksm_merge_any":
			p.MergeAny = v == "yes"
		case "ksm_merging_pages":
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return Process{}, fmt.Errorf("ksm_stat: ksm_merging_pages %q: %w", v, err)
			}
			p.MergingPages = n
		}
	}
	return p, nil
}
