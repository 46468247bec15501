// Package fakestore is a file-backed fake of layering.Backend for unit tests.
//
// Each image is a sparse file under a directory, a snapshot is a copy of
// that file, and a clone starts as a copy of its parent snapshot. Metadata
// lives in memory. Because images are real files, the mapper's "file"
// backend can attach and mount them, so environment imports and builds run
// end to end without a Ceph cluster. It passes storetest.RunSuite like the
// go-ceph store does.
package fakestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"golang.org/x/sys/unix"
)

type image struct {
	size    int64
	objSize int64
	parent  *layering.SnapRef
	snaps   []string
	meta    map[string]string
	created time.Time
}

// defaultObjectSize is Ceph's default object size (rbd_default_order 22).
const defaultObjectSize = 4 << 20

// Store is the fake. The zero value is not usable; call New.
type Store struct {
	dir string

	mu     sync.Mutex
	images map[string]*image
	tags   map[string][]byte
	// dead holds the watches that LeaveDeadWatcher left, by image: until
	// when the cluster would keep each.
	dead map[string]time.Time
	// live counts the watches of live clients by image (Watch): the fake
	// mapper's mappings, as a mapped RBD image is watched by its mapper.
	live map[string]int
}

var _ layering.Backend = (*Store)(nil)

// New returns an empty store whose files live in dir.
func New(dir string) (*Store, error) {
	for _, d := range []string{"images", "snaps"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	return &Store{dir: dir, images: map[string]*image{}, tags: map[string][]byte{}, dead: map[string]time.Time{}, live: map[string]int{}}, nil
}

// Path returns the file that holds an image's blocks.
func (s *Store) Path(name string) string { return filepath.Join(s.dir, "images", name+".img") }

// SnapPath returns the file that holds a snapshot's blocks.
func (s *Store) SnapPath(r layering.SnapRef) string {
	return filepath.Join(s.dir, "snaps", r.Image+"@"+r.Snap+".img")
}

func (s *Store) get(name string) (*image, error) {
	img, ok := s.images[name]
	if !ok {
		return nil, fmt.Errorf("image %q: %w", name, layering.ErrNotFound)
	}
	return img, nil
}

func (img *image) hasSnap(snap string) bool {
	for _, n := range img.snaps {
		if n == snap {
			return true
		}
	}
	return false
}

// Create implements layering.Store.
func (s *Store) Create(ctx context.Context, name string, size int64, options ...layering.CreateOption) error {
	if size <= 0 {
		return fmt.Errorf("create %q: size %d: %w", name, size, layering.ErrInvalid)
	}
	co, err := layering.NewCreateOptions(options...)
	if err != nil {
		return fmt.Errorf("create %q: %w", name, err)
	}
	if co.ObjectSize == 0 {
		co.ObjectSize = defaultObjectSize
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.images[name]; ok {
		return fmt.Errorf("create %q: %w", name, layering.ErrExists)
	}
	f, err := os.Create(s.Path(name))
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return err
	}
	s.images[name] = &image{size: size, objSize: co.ObjectSize, meta: map[string]string{}, created: time.Now()}
	return nil
}

// Write implements layering.Store.
func (s *Store) Write(ctx context.Context, name string, src io.ReaderAt, size int64) error {
	s.mu.Lock()
	img, err := s.get(name)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if size > img.size {
		return fmt.Errorf("write %q: %d bytes do not fit in %d: %w", name, size, img.size, layering.ErrInvalid)
	}
	f, err := os.OpenFile(s.Path(name), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := layering.CopySparse(ctx, f, src, size); err != nil {
		return fmt.Errorf("write %q: %w", name, err)
	}
	return f.Sync()
}

// ReadAt implements layering.Store.
func (s *Store) ReadAt(ctx context.Context, name string, p []byte, off int64) (int, error) {
	path := ""
	s.mu.Lock()
	if ref, err := layering.ParseSnapRef(name); err == nil {
		img, gerr := s.get(ref.Image)
		if gerr == nil && !img.hasSnap(ref.Snap) {
			gerr = fmt.Errorf("snapshot %s: %w", ref, layering.ErrNotFound)
		}
		if gerr != nil {
			s.mu.Unlock()
			return 0, gerr
		}
		path = s.SnapPath(ref)
	} else {
		if _, gerr := s.get(name); gerr != nil {
			s.mu.Unlock()
			return 0, gerr
		}
		path = s.Path(name)
	}
	s.mu.Unlock()
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.ReadAt(p, off)
}

// Stat implements layering.Store.
func (s *Store) Stat(ctx context.Context, name string) (layering.ImageInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	img, err := s.get(name)
	if err != nil {
		return layering.ImageInfo{}, err
	}
	info := layering.ImageInfo{Name: name, Size: img.size, ObjectSize: img.objSize, Parent: img.parent, Created: img.created, Meta: map[string]string{}}
	for k, v := range img.meta {
		info.Meta[k] = v
	}
	for _, sn := range img.snaps {
		info.Snapshots = append(info.Snapshots, layering.SnapInfo{Name: sn, Protected: true})
	}
	base := ""
	if img.parent != nil {
		base = s.SnapPath(*img.parent)
	}
	used, err := usedBytes(s.Path(name), base)
	if err != nil {
		return info, err
	}
	info.Used = used
	return info, nil
}

// usedBytes counts the 64 KiB blocks of path that differ from base (or are
// non-zero when there is no base).
func usedBytes(path, base string) (int64, error) {
	a, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer a.Close()
	var b *os.File
	if base != "" {
		if b, err = os.Open(base); err != nil {
			return 0, err
		}
		defer b.Close()
	}
	st, err := a.Stat()
	if err != nil {
		return 0, err
	}
	const blk = 64 << 10
	chunk, ref := make([]byte, blk), make([]byte, blk)
	var used int64
	// Only where the file holds data (SEEK_DATA): its holes read as zeros,
	// as a fresh image's and a copied parent's do.
	for off := int64(0); off < st.Size(); off += blk {
		next, err := unix.Seek(int(a.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		} else if err == nil && next > off {
			off = next &^ (blk - 1)
		}
		n, err := a.ReadAt(chunk, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		c := chunk[:n]
		if b != nil {
			m, err := b.ReadAt(ref, off)
			if err != nil && !errors.Is(err, io.EOF) {
				return 0, err
			}
			if m == n && bytes.Equal(c, ref[:m]) {
				continue
			}
			if m == 0 && !bytes.ContainsFunc(c, func(r rune) bool { return r != 0 }) {
				continue
			}
		} else if !bytes.ContainsFunc(c, func(r rune) bool { return r != 0 }) {
			continue
		}
		used += int64(n)
	}
	return used, nil
}

// List implements layering.Store.
func (s *Store) List(ctx context.Context) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.images))
	for n := range s.images {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

// Snapshot implements layering.Store.
func (s *Store) Snapshot(ctx context.Context, ref layering.SnapRef) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	img, err := s.get(ref.Image)
	if err != nil {
		return err
	}
	if ref.Snap == "" {
		return fmt.Errorf("snapshot %s: empty name: %w", ref, layering.ErrInvalid)
	}
	if img.hasSnap(ref.Snap) {
		return fmt.Errorf("snapshot %s: %w", ref, layering.ErrExists)
	}
	if err := copyFile(s.Path(ref.Image), s.SnapPath(ref)); err != nil {
		return err
	}
	img.snaps = append(img.snaps, ref.Snap)
	return nil
}

// Seal implements layering.Store.
func (s *Store) Seal(ctx context.Context, ref layering.SnapRef, meta map[string]string) error {
	if ref.Snap == "" {
		return fmt.Errorf("seal %s: empty snapshot name: %w", ref, layering.ErrInvalid)
	}
	if err := s.SetMeta(ctx, ref.Image, meta); err != nil {
		return err
	}
	return s.Snapshot(ctx, ref)
}

// Clone implements layering.Store.
func (s *Store) Clone(ctx context.Context, parent layering.SnapRef, child string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := s.get(parent.Image)
	if err != nil {
		return fmt.Errorf("clone %s: parent: %w", parent, err)
	}
	if !p.hasSnap(parent.Snap) {
		return fmt.Errorf("clone %s: snapshot %q: %w", parent, parent.Snap, layering.ErrNotFound)
	}
	if _, ok := s.images[child]; ok {
		return fmt.Errorf("clone %s to %q: %w", parent, child, layering.ErrExists)
	}
	if err := copyFile(s.SnapPath(parent), s.Path(child)); err != nil {
		return err
	}
	ref := parent
	s.images[child] = &image{size: p.size, objSize: p.objSize, parent: &ref, meta: map[string]string{}, created: time.Now()}
	return nil
}

// Children implements layering.Store.
func (s *Store) Children(ctx context.Context, parent layering.SnapRef) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := s.get(parent.Image)
	if err != nil {
		return nil, err
	}
	if !p.hasSnap(parent.Snap) {
		return nil, fmt.Errorf("snapshot %s: %w", parent, layering.ErrNotFound)
	}
	return s.childrenLocked(parent), nil
}

func (s *Store) childrenLocked(parent layering.SnapRef) []string {
	var out []string
	for n, img := range s.images {
		if img.parent != nil && *img.parent == parent {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// Flatten implements layering.Store.
func (s *Store) Flatten(ctx context.Context, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	img, err := s.get(name)
	if err != nil {
		return err
	}
	img.parent = nil // the file already holds every block
	return nil
}

// RemoveSnapshot implements layering.Store.
func (s *Store) RemoveSnapshot(ctx context.Context, ref layering.SnapRef) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	img, err := s.get(ref.Image)
	if err != nil {
		return err
	}
	if !img.hasSnap(ref.Snap) {
		return fmt.Errorf("snapshot %s: %w", ref, layering.ErrNotFound)
	}
	if kids := s.childrenLocked(ref); len(kids) > 0 {
		return fmt.Errorf("snapshot %s has clones %s: %w", ref, strings.Join(kids, ", "), layering.ErrHasChildren)
	}
	if err := os.Remove(s.SnapPath(ref)); err != nil {
		return err
	}
	for i, n := range img.snaps {
		if n == ref.Snap {
			img.snaps = append(img.snaps[:i], img.snaps[i+1:]...)
			break
		}
	}
	return nil
}

// Remove implements layering.Store.
func (s *Store) Remove(ctx context.Context, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	img, err := s.get(name)
	if err != nil {
		return err
	}
	for _, sn := range img.snaps {
		ref := layering.SnapRef{Image: name, Snap: sn}
		if kids := s.childrenLocked(ref); len(kids) > 0 {
			return fmt.Errorf("remove %q: snapshot %s has clones %s: %w", name, ref, strings.Join(kids, ", "), layering.ErrHasChildren)
		}
	}
	if dev := loopOf(s.Path(name)); dev != "" {
		return fmt.Errorf("remove %q: attached to %s: %w", name, dev, layering.ErrBusy)
	}
	if n := s.live[name]; n > 0 {
		return fmt.Errorf("remove %q: watched by %d live client(s): %w", name, n, layering.ErrBusy)
	}
	if until, ok := s.dead[name]; ok && time.Now().Before(until) {
		return fmt.Errorf("remove %q: watched by a dead client until %s: %w", name, until.Format(time.TimeOnly), layering.ErrBusy)
	}
	delete(s.dead, name)
	for _, sn := range img.snaps {
		_ = os.Remove(s.SnapPath(layering.SnapRef{Image: name, Snap: sn}))
	}
	if err := os.Remove(s.Path(name)); err != nil {
		return err
	}
	delete(s.images, name)
	return nil
}

// Close implements layering.Store.
func (s *Store) Close() error { return nil }

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if err := out.Truncate(st.Size()); err != nil {
		out.Close()
		return err
	}
	if _, err := layering.CopySparse(context.Background(), out, in, st.Size()); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
