// Package gencache keeps, on one node, the files of the checkpoint
// generations its restores read: one read-only copy per generation, filled
// once (from the sealed snapshot in Ceph, or from the node that just wrote
// it), shared by every restore of that generation on the node, and kept
// under a byte budget, least recently used first out.
//
// Every restore of a generation then reads the same local files: the page
// cache holds them once per node, and the cluster serves a generation's
// image once per node instead of once per restore.
//
// An entry is a directory Dir/<app>/<gen>/ holding the generation's files
// as the engine wrote them, and a marker file Dir/<app>/<gen>.done written
// last: a directory without its marker is a fill that was cut short, and
// Recover removes it. The marker's modification time is the entry's last
// use.
//
// A fill is not flushed to disk before its restores read it: its marker
// names the boot it was written in, and holds only until the machine
// restarts (a crash of the machine may lose what the page cache held, a
// crash of the process cannot). Settle flushes entries later, in the
// background, and makes their markers hold across restarts.
package gencache

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/keyedmutex"
)

// ErrNotCached: the generation is not on this node.
var ErrNotCached = errors.New("generation not cached on this node")

// Key names one generation of one app. Stamp tells apart generations that
// reuse a number after one was removed (the generation's creation time).
type Key struct {
	App   string `json:"app"`
	Gen   int    `json:"gen"`
	Stamp string `json:"stamp,omitempty"`
}

// KeyOf is the key of generation gen of app, created at created.
func KeyOf(app string, gen int, created time.Time) Key {
	k := Key{App: app, Gen: gen}
	if !created.IsZero() {
		k.Stamp = strconv.FormatInt(created.UnixNano(), 36)
	}
	return k
}

// name is the entry's directory name in its app's directory.
func (k Key) name() string {
	if k.Stamp == "" {
		return strconv.Itoa(k.Gen)
	}
	return strconv.Itoa(k.Gen) + "-" + k.Stamp
}

// parseName is name's inverse.
func parseName(app, s string) (Key, bool) {
	g, stamp, _ := strings.Cut(s, "-")
	n, err := strconv.Atoi(g)
	k := Key{App: app, Gen: n, Stamp: stamp}
	return k, err == nil && validKey(k) == nil
}

func (k Key) String() string { return k.App + "/" + k.name() }

// Entry is one generation held on the node.
type Entry struct {
	Key
	// Dir holds the generation's files, read-only to restores.
	Dir   string `json:"dir"`
	Bytes int64  `json:"bytes"`
	// Used is when a restore last took it (or when it was filled).
	Used time.Time `json:"used"`
	// Unflushed: written since the machine started and not flushed to
	// disk yet (Settle): a restart of the machine would drop it.
	Unflushed bool `json:"unflushed,omitempty"`
}

// Fill writes a generation's files into dst, an empty directory.
type Fill func(ctx context.Context, dst string) error

// Cache is a node's generations. Its methods are safe for concurrent use.
type Cache struct {
	dir    string
	budget int64
	// boot is this boot of the machine's ID (marker).
	boot string
	keys keyedmutex.Map[Key]
	// mu orders the removals of Trim against Get's use of an entry.
	mu sync.RWMutex
}

// New returns the cache rooted at dir (created if missing), holding at
// most budget bytes once trimmed (0: no limit).
func New(dir string, budget int64) (*Cache, error) {
	if budget < 0 {
		return nil, fmt.Errorf("checkpoint cache budget %d bytes: must be 0 (no limit) or more", budget)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("checkpoint cache: %w", err)
	}
	boot, err := bootID()
	if err != nil {
		return nil, fmt.Errorf("checkpoint cache: %w", err)
	}
	return &Cache{dir: dir, budget: budget, boot: boot}, nil
}

// Dir is the cache's root.
func (c *Cache) Dir() string { return c.dir }

// Budget is the byte budget (0: none).
func (c *Cache) Budget() int64 { return c.budget }

func (c *Cache) entryDir(k Key) string { return filepath.Join(c.dir, k.App, k.name()) }
func (c *Cache) marker(k Key) string   { return c.entryDir(k) + ".done" }

// Get returns generation k's entry, filling it with fill first when the
// node does not hold it (fetched reports that it did). Concurrent Gets of
// one generation fill it once. A fill that fails leaves nothing.
func (c *Cache) Get(ctx context.Context, k Key, fill Fill) (e Entry, fetched bool, err error) {
	return c.get(ctx, k, fill, func() {})
}

// Begin is a Get that returns as soon as the directory of k's files is
// known (dir: held, or made empty for the fill to write into), so that a
// caller can bind it where a restore will read it while the fill goes on;
// wait returns what Get would have. Until wait returns without error, the
// directory may be incomplete, and it is gone if the fill fails.
func (c *Cache) Begin(ctx context.Context, k Key, fill Fill) (dir string, wait func() (Entry, bool, error), err error) {
	type result struct {
		e       Entry
		fetched bool
		err     error
	}
	known := make(chan struct{})
	done := make(chan result, 1)
	go func() {
		// get calls it once at most.
		e, fetched, err := c.get(ctx, k, fill, func() { close(known) })
		done <- result{e, fetched, err}
	}()
	var r result
	waited := false
	wait = func() (Entry, bool, error) {
		if !waited {
			r, waited = <-done, true
		}
		return r.e, r.fetched, r.err
	}
	select {
	case <-known:
		return c.entryDir(k), wait, nil
	case r = <-done:
		waited = true
		return r.e.Dir, wait, r.err
	}
}

// get is Get; dirKnown is called once k's directory is where its files
// are or will be.
func (c *Cache) get(ctx context.Context, k Key, fill Fill, dirKnown func()) (e Entry, fetched bool, err error) {
	if err := validKey(k); err != nil {
		return Entry{}, false, err
	}
	unlock := c.keys.Lock(k)
	defer unlock()
	c.mu.RLock()
	defer c.mu.RUnlock()
	if e, err := c.touch(k); err == nil {
		dirKnown()
		return e, false, nil
	} else if !errors.Is(err, ErrNotCached) {
		return Entry{}, false, err
	}
	if fill == nil {
		return Entry{}, false, fmt.Errorf("%s: %w", k, ErrNotCached)
	}
	return c.fill(ctx, k, fill, dirKnown)
}

// Lookup returns generation k's entry, marking it used, or ErrNotCached.
func (c *Cache) Lookup(k Key) (Entry, error) {
	if err := validKey(k); err != nil {
		return Entry{}, err
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.touch(k)
}

// PartialFile, in an entry's directory, marks a copy that lacks some of
// its files' bytes (MarkPartial): it serves the restore it was filled for
// only, and is filled anew for any other.
const PartialFile = ".partial"

// MarkPartial marks dir, an entry's directory being filled (Begin), a
// partial copy: its fill's own restore reads it, no later one.
func MarkPartial(dir string) error {
	return os.WriteFile(filepath.Join(dir, PartialFile), nil, 0o600)
}

// touch marks k used and returns its entry; a partial copy is not one.
func (c *Cache) touch(k Key) (Entry, error) {
	if _, err := os.Lstat(filepath.Join(c.entryDir(k), PartialFile)); err == nil {
		return Entry{}, fmt.Errorf("%s: a partial copy: %w", k, ErrNotCached)
	}
	now := time.Now()
	if err := os.Chtimes(c.marker(k), now, now); errors.Is(err, fs.ErrNotExist) {
		return Entry{}, fmt.Errorf("%s: %w", k, ErrNotCached)
	} else if err != nil {
		return Entry{}, fmt.Errorf("checkpoint cache: %w", err)
	}
	return c.entry(k)
}

// entry reads k's entry from its marker (which holds its size).
func (c *Cache) entry(k Key) (Entry, error) {
	st, err := os.Stat(c.marker(k))
	if errors.Is(err, fs.ErrNotExist) {
		return Entry{}, fmt.Errorf("%s: %w", k, ErrNotCached)
	}
	if err != nil {
		return Entry{}, fmt.Errorf("checkpoint cache: %w", err)
	}
	b, err := os.ReadFile(c.marker(k))
	if err != nil {
		return Entry{}, fmt.Errorf("checkpoint cache: %w", err)
	}
	m := parseMarker(b)
	if !m.holds(c.boot) {
		return Entry{}, fmt.Errorf("%s: written before the machine restarted and not flushed: %w", k, ErrNotCached)
	}
	return Entry{Key: k, Dir: c.entryDir(k), Bytes: m.bytes, Used: st.ModTime(), Unflushed: m.boot != ""}, nil
}

// fill runs f into a fresh directory, then publishes it: the directory
// under its name, then the marker with its size.
func (c *Cache) fill(ctx context.Context, k Key, f Fill, dirKnown func()) (_ Entry, _ bool, err error) {
	dst := c.entryDir(k)
	// A directory without its marker is a fill cut short.
	if err := os.RemoveAll(dst); err != nil {
		return Entry{}, false, fmt.Errorf("checkpoint cache: %w", err)
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return Entry{}, false, fmt.Errorf("checkpoint cache: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dst)
		}
	}()
	dirKnown()
	if err := f(ctx, dst); err != nil {
		return Entry{}, false, fmt.Errorf("fill the checkpoint cache with %s: %w", k, err)
	}
	e, err := c.publish(k)
	return e, true, err
}

// Adopt makes dir, a directory on the cache's file system holding
// generation k's files (a checkpoint just written on this node), the
// entry of k. dir is moved, not copied.
func (c *Cache) Adopt(k Key, dir string) (Entry, error) {
	if err := validKey(k); err != nil {
		return Entry{}, err
	}
	unlock := c.keys.Lock(k)
	defer unlock()
	c.mu.RLock()
	defer c.mu.RUnlock()
	if e, err := c.touch(k); err == nil {
		_ = os.RemoveAll(dir)
		return e, nil
	}
	dst := c.entryDir(k)
	if err := os.RemoveAll(dst); err != nil {
		return Entry{}, fmt.Errorf("checkpoint cache: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return Entry{}, fmt.Errorf("checkpoint cache: %w", err)
	}
	if err := os.Rename(dir, dst); err != nil {
		return Entry{}, fmt.Errorf("checkpoint cache: adopt %s: %w", dir, err)
	}
	return c.publish(k)
}

// publish writes k's marker, naming this boot: Settle flushes the
// entry later.
func (c *Cache) publish(k Key) (Entry, error) {
	n, err := treeBytes(c.entryDir(k))
	if err == nil {
		err = os.WriteFile(c.marker(k), []byte(marker{bytes: n, boot: c.boot}.String()), 0o644)
	}
	if err != nil {
		_ = os.RemoveAll(c.entryDir(k))
		return Entry{}, fmt.Errorf("checkpoint cache: %w", err)
	}
	return c.entry(k)
}

// List returns the generations held, least recently used first.
func (c *Cache) List() ([]Entry, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.list()
}

func (c *Cache) list() ([]Entry, error) {
	apps, err := os.ReadDir(c.dir)
	if err != nil {
		return nil, fmt.Errorf("checkpoint cache: %w", err)
	}
	var out []Entry
	for _, a := range apps {
		if !a.IsDir() {
			continue
		}
		files, err := os.ReadDir(filepath.Join(c.dir, a.Name()))
		if err != nil {
			continue
		}
		for _, f := range files {
			name, ok := strings.CutSuffix(f.Name(), ".done")
			k, valid := parseName(a.Name(), name)
			if !ok || !valid {
				continue
			}
			if e, err := c.entry(k); err == nil {
				out = append(out, e)
			}
		}
	}
	slices.SortFunc(out, func(a, b Entry) int { return a.Used.Compare(b.Used) })
	return out, nil
}

// Bytes is what the cache holds.
func (c *Cache) Bytes() (int64, error) {
	es, err := c.List()
	var n int64
	for _, e := range es {
		n += e.Bytes
	}
	return n, err
}

// Remove drops generation k (nothing if it is not held).
func (c *Cache) Remove(k Key) error {
	if err := validKey(k); err != nil {
		return err
	}
	unlock := c.keys.Lock(k)
	defer unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.remove(k)
}

// remove drops the marker first: a directory without it is garbage.
func (c *Cache) remove(k Key) error {
	if err := os.Remove(c.marker(k)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("checkpoint cache: %w", err)
	}
	if err := os.RemoveAll(c.entryDir(k)); err != nil {
		return fmt.Errorf("checkpoint cache: %w", err)
	}
	_ = os.Remove(filepath.Join(c.dir, k.App)) // when it was the app's last
	return nil
}

// Trim drops the generations that keep says are no longer needed (nil:
// all are), then the least recently used ones until the cache fits its
// budget; inUse protects the generations a slot or a restore is about to
// read. It returns what it dropped.
func (c *Cache) Trim(keep, inUse func(Key) bool) ([]Entry, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	es, err := c.list()
	if err != nil {
		return nil, err
	}
	var total int64
	for _, e := range es {
		total += e.Bytes
	}
	var dropped []Entry
	var errs []error
	drop := func(e Entry) {
		if err := c.remove(e.Key); err != nil {
			errs = append(errs, err)
			return
		}
		total -= e.Bytes
		dropped = append(dropped, e)
	}
	var kept []Entry
	for _, e := range es {
		if keep != nil && !keep(e.Key) && (inUse == nil || !inUse(e.Key)) {
			drop(e)
			continue
		}
		kept = append(kept, e)
	}
	for _, e := range kept { // least recently used first
		if c.budget == 0 || total <= c.budget {
			break
		}
		if inUse != nil && inUse(e.Key) {
			continue
		}
		drop(e)
	}
	return dropped, errors.Join(errs...)
}

// Recover removes what fills cut short left: directories without their
// marker, markers without their directory, entries that were not flushed
// before the machine restarted, and partial copies.
func (c *Cache) Recover() ([]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	apps, err := os.ReadDir(c.dir)
	if err != nil {
		return nil, fmt.Errorf("checkpoint cache: %w", err)
	}
	var removed []string
	var errs []error
	for _, a := range apps {
		ad := filepath.Join(c.dir, a.Name())
		if !a.IsDir() {
			continue
		}
		files, _ := os.ReadDir(ad)
		for _, f := range files {
			p := filepath.Join(ad, f.Name())
			var orphan bool
			if g, ok := strings.CutSuffix(f.Name(), ".done"); ok {
				_, err := os.Stat(filepath.Join(ad, g))
				b, rerr := os.ReadFile(p)
				orphan = err != nil || rerr == nil && !parseMarker(b).holds(c.boot)
				if orphan {
					_ = os.RemoveAll(filepath.Join(ad, g)) // not flushed: maybe not whole
				}
			} else {
				b, err := os.ReadFile(p + ".done")
				_, perr := os.Lstat(filepath.Join(p, PartialFile))
				orphan = err != nil || !parseMarker(b).holds(c.boot) || perr == nil
				if orphan {
					_ = os.Remove(p + ".done")
				}
			}
			if orphan {
				if err := os.RemoveAll(p); err != nil {
					errs = append(errs, err)
					continue
				}
				removed = append(removed, p)
			}
		}
		_ = os.Remove(ad) // empty
	}
	return removed, errors.Join(errs...)
}

func validKey(k Key) error {
	if k.App == "" || k.Gen <= 0 || strings.ContainsAny(k.App, "/\x00") || k.App == "." || k.App == ".." ||
		strings.ContainsFunc(k.Stamp, func(r rune) bool { return !('0' <= r && r <= '9' || 'a' <= r && r <= 'z') }) {
		return fmt.Errorf("checkpoint cache key %q generation %d stamp %q: want an app name, a generation above 0 and a stamp of digits and lower-case letters", k.App, k.Gen, k.Stamp)
	}
	return nil
}
