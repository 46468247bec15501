// Flushing: a copy is read before its files reach the disk; its marker names the boot it was
// written in until Settle flushes it.

package gencache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// bootFile holds the machine's boot ID, new at each start of the kernel.
const bootFile = "/proc/sys/kernel/random/boot_id"

func bootID() (string, error) {
	b, err := os.ReadFile(bootFile)
	if err != nil {
		return "", fmt.Errorf("the machine's boot ID: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if id == "" || strings.ContainsAny(id, " \t\n") {
		return "", fmt.Errorf("the machine's boot ID in %s: %q is not one", bootFile, id)
	}
	return id, nil
}

// marker is what an entry's marker file holds: its size, and, until
// Settle flushed it, the boot it was written in.
type marker struct {
	bytes int64
	boot  string
}

func parseMarker(b []byte) marker {
	f := strings.Fields(string(b))
	var m marker
	if len(f) > 0 {
		m.bytes, _ = strconv.ParseInt(f[0], 10, 64)
	}
	if len(f) > 1 {
		m.boot = f[1]
	}
	return m
}

func (m marker) String() string {
	if m.boot == "" {
		return strconv.FormatInt(m.bytes, 10) + "\n"
	}
	return strconv.FormatInt(m.bytes, 10) + " " + m.boot + "\n"
}

// holds reports whether the entry is whole on a machine in boot: flushed,
// or written since the machine started.
func (m marker) holds(boot string) bool { return m.boot == "" || m.boot == boot }

// Settle flushes to disk the entries written since the machine started,
// so that they hold across a restart, and returns how many it flushed.
// It holds no lock while it flushes: restores read the entries meanwhile.
func (c *Cache) Settle(ctx context.Context) (int, error) {
	es, err := c.List()
	if err != nil {
		return 0, err
	}
	var errs []error
	n := 0
	for _, e := range es {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		if _, err := os.Lstat(filepath.Join(e.Dir, PartialFile)); !e.Unflushed || err == nil {
			continue // a partial copy holds for its one restore only
		}
		before, err := os.Stat(c.marker(e.Key))
		if err != nil {
			continue // dropped meanwhile
		}
		if _, err := syncTree(e.Dir); err != nil {
			if _, lerr := os.Stat(c.marker(e.Key)); lerr == nil {
				errs = append(errs, fmt.Errorf("checkpoint cache: flush %s: %w", e.Key, err))
			}
			continue
		}
		settled, err := c.settled(e.Key, before)
		if err != nil {
			errs = append(errs, err)
		}
		if settled {
			n++
		}
	}
	return n, errors.Join(errs...)
}

// settled rewrites k's marker without its boot, unless the marker is
// not the one Settle found before flushing the entry (before): the entry
// was dropped, or dropped and filled again, meanwhile.
func (c *Cache) settled(k Key, before os.FileInfo) (bool, error) {
	unlock := c.keys.Lock(k)
	defer unlock()
	c.mu.RLock()
	defer c.mu.RUnlock()
	st, err := os.Stat(c.marker(k))
	if err != nil || !os.SameFile(before, st) {
		return false, nil
	}
	b, err := os.ReadFile(c.marker(k))
	if err != nil {
		return false, nil
	}
	m := parseMarker(b)
	m.boot = ""
	if err := writeFileSync(c.marker(k), []byte(m.String())); err != nil {
		return false, fmt.Errorf("checkpoint cache: %w", err)
	}
	// Keeps the marker's time: its last use.
	_ = os.Chtimes(c.marker(k), st.ModTime(), st.ModTime())
	return true, nil
}
