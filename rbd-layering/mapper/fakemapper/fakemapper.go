// Package fakemapper is a fake of the node's mapper (package mapper) for
// unit tests, over the file-backed fake store (package fakestore), that
// needs neither root nor a kernel device.
//
// An image's file holds an ext4 filesystem, as on the real path (an
// environment's import writes one). A mount copies its files into the
// target directory with debugfs(8) (`rdump`); a release of a writable
// mount makes the filesystem again from the target with mkfs.ext4 -d and
// empties the target, as an unmount leaves an empty mount point. Neither
// needs root. Because the filesystem lives in the image's file, the fake
// store's snapshots and clones carry it, and the mapper's file backend
// reads the same files.
//
// It passes the same suite as the mapper's file backend over the fake
// store's files (mappertest.RunNodeSuite). What it does not model:
// ownership without root (files come back owned by the caller), a
// read-only mount refusing writes (its writes are dropped on release),
// and other processes' mappings.
package fakemapper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/mountinfo"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/fakestore"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// Backend is the name the fake's mappings give as their backend.
const Backend = "fake"

// Mapper is the fake. The zero value is not usable; call New.
type Mapper struct {
	store *fakestore.Store

	mu   sync.Mutex
	maps map[string]*mapper.Mapping
	// unwatch ends the store's watch of each mapping's image, by ID.
	unwatch map[string]func()
	next    int
}

var _ mapper.Node = (*Mapper)(nil)

// New returns a mapper of the images of store.
func New(store *fakestore.Store) *Mapper {
	return &Mapper{store: store, maps: map[string]*mapper.Mapping{}, unwatch: map[string]func(){}}
}

// Map records a mapping of img. A snapshot's mapping is read-only. Until
// its release the image is watched: the store refuses to remove it, as
// RBD refuses to remove a mapped image.
func (m *Mapper) Map(ctx context.Context, img mapper.Image, opts ...mapper.MapOption) (*mapper.Mapping, error) {
	if err := img.Validate(); err != nil {
		return nil, err
	}
	o := mapper.SettingsOf(opts...)
	if o.ID != "" {
		if err := mapper.ValidateID(o.ID); err != nil {
			return nil, err
		}
	}
	if _, err := m.file(ctx, img); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	id := o.ID
	if id == "" {
		m.next++
		id = "fake-" + strconv.Itoa(m.next)
	}
	if _, ok := m.maps[id]; ok {
		return nil, fmt.Errorf("map %s: mapping ID %s is taken: %w", img, id, mapper.ErrBusy)
	}
	unwatch, err := m.store.Watch(img.Name)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", img, mapper.ErrImageNotFound)
	}
	m.unwatch[id] = unwatch
	mp := &mapper.Mapping{ID: id, Image: img, Backend: Backend, Device: "fake:" + img.String(),
		ReadOnly: o.ReadOnly || img.Snap != "", Created: time.Now(), Ephemeral: o.Ephemeral, Live: true}
	m.maps[id] = mp
	out := *mp
	return &out, nil
}

// file returns the file that holds img's blocks.
func (m *Mapper) file(_ context.Context, img mapper.Image) (string, error) {
	p := m.store.Path(img.Name)
	if img.Snap != "" {
		p = m.store.SnapPath(layering.SnapRef{Image: img.Name, Snap: img.Snap})
	}
	if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("map %s: %w", img, mapper.ErrImageNotFound)
	} else if err != nil {
		return "", err
	}
	return p, nil
}

// Mount unpacks the mapping's filesystem into target. With opts.Format an
// image that holds none starts empty; without, it is refused.
func (m *Mapper) Mount(ctx context.Context, mp *mapper.Mapping, target string, opts mapper.MountOptions) error {
	if mp == nil {
		return fmt.Errorf("mount: nil mapping: %w", mapper.ErrInvalid)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.maps[mp.ID]
	if !ok {
		return fmt.Errorf("mount: mapping %s: %w", mp.ID, mapper.ErrNotMapped)
	}
	if rec.Target != "" {
		return fmt.Errorf("mapping %s (%s) is already mounted at %s: %w", rec.ID, rec.Image, rec.Target, mapper.ErrBusy)
	}
	ro := opts.ReadOnly || rec.ReadOnly
	if opts.Format && ro {
		return fmt.Errorf("mapping %s (%s): cannot format a read-only mount: %w", rec.ID, rec.Image, mapper.ErrInvalid)
	}
	if target == "" {
		return fmt.Errorf("mount %s: target is empty: %w", rec.Image, mapper.ErrInvalid)
	}
	target, err := filepath.Abs(target)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(target, 0o755); err != nil {
		return fmt.Errorf("mount %s: prepare target: %w", rec.Image, err)
	}
	if ents, err := os.ReadDir(target); err != nil || len(ents) > 0 {
		return fmt.Errorf("mount %s at %s: the target is not an empty directory: %w", rec.Image, target, mapper.ErrBusy)
	}
	file, err := m.file(ctx, rec.Image)
	if err != nil {
		return err
	}
	hasFS, err := hasFilesystem(file)
	if err != nil {
		return fmt.Errorf("mount %s: %w", rec.Image, err)
	}
	switch {
	case !hasFS && !opts.Format:
		return fmt.Errorf("mount %s: the image holds no filesystem: %w", rec.Image, mapper.ErrInvalid)
	case hasFS:
		if err := unpack(ctx, file, target); err != nil {
			_ = mountinfo.Empty(target)
			return fmt.Errorf("mount %s: %w", rec.Image, err)
		}
	}
	rec.Target = target
	rec.ReadOnly = ro
	mp.Target = target
	return nil
}

// MapAndMount is Map then Mount; a failed mount leaves no mapping.
func (m *Mapper) MapAndMount(ctx context.Context, img mapper.Image, target string, mopts mapper.MountOptions, opts ...mapper.MapOption) (*mapper.Mapping, error) {
	mp, err := m.Map(ctx, img, opts...)
	if err != nil {
		return nil, err
	}
	if err := m.Mount(ctx, mp, target, mopts); err != nil {
		_ = m.Release(context.WithoutCancel(ctx), mp.ID)
		return nil, err
	}
	return mp, nil
}

// Release packs a writable mount back into its image, empties its target
// and forgets the mapping.
func (m *Mapper) Release(ctx context.Context, id string) error {
	if err := mapper.ValidateID(id); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.maps[id]
	if !ok {
		return fmt.Errorf("release %s: %w", id, mapper.ErrNotMapped)
	}
	if rec.Target != "" {
		if !rec.ReadOnly {
			if err := m.writeBack(ctx, rec); err != nil {
				return err
			}
		}
		if err := mountinfo.Empty(rec.Target); err != nil {
			return fmt.Errorf("release %s: unmount %s: %w", id, rec.Target, err)
		}
	}
	delete(m.maps, id)
	if unwatch, ok := m.unwatch[id]; ok {
		unwatch()
		delete(m.unwatch, id)
	}
	return nil
}

// Abort is Release: the fake has no owner to lose.
func (m *Mapper) Abort(ctx context.Context, id string) error { return m.Release(ctx, id) }

// List returns every mapping, by ID.
func (m *Mapper) List() ([]mapper.Mapping, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]mapper.Mapping, 0, len(m.maps))
	for _, mp := range m.maps {
		out = append(out, *mp)
	}
	slices.SortFunc(out, func(a, b mapper.Mapping) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// ReleaseAbandoned releases nothing: the fake's mappings have no owner
// process to lose.
func (m *Mapper) ReleaseAbandoned(context.Context) ([]mapper.Mapping, error) { return nil, nil }

// Mounted reports whether mapping id is mounted.
func (m *Mapper) Mounted(id string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mp, ok := m.maps[id]
	return ok && mp.Target != "", nil
}

// Users returns the mappings of img or of any snapshot of it.
func (m *Mapper) Users(img mapper.Image) ([]string, error) {
	if err := img.Validate(); err != nil {
		return nil, err
	}
	all, _ := m.List()
	var users []string
	for _, mp := range all {
		if mp.Image.Pool == img.Pool && mp.Image.Name == img.Name {
			users = append(users, fmt.Sprintf("mapping %s (%s)", mp.ID, Backend))
		}
	}
	return users, nil
}

// writeBack makes rec's image's filesystem again from its target.
func (m *Mapper) writeBack(ctx context.Context, rec *mapper.Mapping) error {
	file, err := m.file(ctx, rec.Image)
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-E", "nodiscard", "-d", rec.Target, file).CombinedOutput()
	if err != nil {
		return fmt.Errorf("release %s: write its files back into %s: mkfs.ext4 -d: %w: %s", rec.ID, rec.Image, err, bytes.TrimSpace(out))
	}
	return nil
}

// hasFilesystem reports whether file holds an ext2/3/4 filesystem: its
// superblock's magic (0xEF53 at byte 1080).
func hasFilesystem(file string) (bool, error) {
	f, err := os.Open(file)
	if err != nil {
		return false, err
	}
	defer f.Close()
	b := make([]byte, 2)
	if _, err := f.ReadAt(b, 1080); err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	return b[0] == 0x53 && b[1] == 0xEF, nil
}

// unpack copies the files of file's filesystem under target.
func unpack(ctx context.Context, file, target string) error {
	out, err := exec.CommandContext(ctx, "debugfs", "-R", "rdump / "+target, file).CombinedOutput()
	if err != nil || bytes.Contains(out, []byte("rdump: ")) {
		return fmt.Errorf("read its files: debugfs rdump: %v: %s", err, bytes.TrimSpace(out))
	}
	return nil
}
