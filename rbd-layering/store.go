package layering

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"time"
)

// SealedSnap is the name of the protected snapshot that seals every layer
// and environment image.
const SealedSnap = "sealed"

// SnapRef names a snapshot of an image.
type SnapRef struct {
	Image string `json:"image"`
	Snap  string `json:"snap"`
}

// String returns "image@snap", the notation of the rbd CLI.
func (r SnapRef) String() string { return r.Image + "@" + r.Snap }

// IsZero reports whether r names nothing.
func (r SnapRef) IsZero() bool { return r.Image == "" && r.Snap == "" }

// ParseSnapRef parses "image@snap".
func ParseSnapRef(s string) (SnapRef, error) {
	img, snap, ok := strings.Cut(s, "@")
	if !ok || img == "" || snap == "" {
		return SnapRef{}, fmt.Errorf("snapshot %q: want IMAGE@SNAP: %w", s, ErrInvalid)
	}
	return SnapRef{Image: img, Snap: snap}, nil
}

// SnapInfo describes one snapshot of an image.
type SnapInfo struct {
	Name      string `json:"name"`
	Protected bool   `json:"protected"`
}

// ImageInfo describes an image.
type ImageInfo struct {
	Name string `json:"name"`
	// Size is the provisioned size in bytes.
	Size int64 `json:"size"`
	// ObjectSize is the size of the image's objects in bytes (a clone
	// takes its parent's).
	ObjectSize int64 `json:"object_size,omitempty"`
	// Used is the number of bytes this image has written itself, not
	// counting what it shares with its parent.
	Used int64 `json:"used"`
	// Parent is the snapshot this image was cloned from, or nil.
	Parent    *SnapRef          `json:"parent,omitempty"`
	Snapshots []SnapInfo        `json:"snapshots,omitempty"`
	Meta      map[string]string `json:"meta,omitempty"`
	Created   time.Time         `json:"created"`
}

// Snapshot returns the image's snapshot of that name, if it has one.
func (i ImageInfo) Snapshot(name string) (SnapInfo, bool) {
	for _, s := range i.Snapshots {
		if s.Name == name {
			return s, true
		}
	}
	return SnapInfo{}, false
}

// Store manages images, snapshots and clones in one pool.
//
// Implementations: the go-ceph store (package cephstore) and a file-backed
// fake for unit tests (package fakestore). Both pass storetest.RunSuite.
// Every method returns errors that wrap the sentinels of this package.
type Store interface {
	// Create makes an empty image of size bytes. ErrExists if it exists.
	Create(ctx context.Context, name string, size int64, opts ...CreateOption) error
	// Write copies size bytes of src into the image from offset 0,
	// skipping blocks that are all zero.
	Write(ctx context.Context, name string, src io.ReaderAt, size int64) error
	// ReadAt reads len(p) bytes of an image (or of a snapshot, when name is
	// "image@snap") at off.
	ReadAt(ctx context.Context, name string, p []byte, off int64) (int, error)
	// Stat describes an image. ErrNotFound if it does not exist.
	Stat(ctx context.Context, name string) (ImageInfo, error)
	// List returns the names of every image in the pool, sorted.
	List(ctx context.Context) ([]string, error)
	// Snapshot creates and protects a snapshot.
	Snapshot(ctx context.Context, ref SnapRef) error
	// Seal sets metadata keys on ref's image (as SetMeta) and creates and
	// protects snapshot ref (as Snapshot), all in one opening of the
	// image: a suspension's writable image is sealed so while its
	// instance answers nothing. ErrExists if the snapshot exists (the
	// keys are set all the same).
	Seal(ctx context.Context, ref SnapRef, meta map[string]string) error
	// Clone makes child a copy-on-write clone of the protected snapshot parent.
	Clone(ctx context.Context, parent SnapRef, child string) error
	// Children lists the images cloned from a snapshot, sorted.
	Children(ctx context.Context, parent SnapRef) ([]string, error)
	// Flatten copies every block the image shares with its parent into the
	// image and detaches it from the parent.
	Flatten(ctx context.Context, name string) error
	// RemoveSnapshot unprotects and removes a snapshot.
	// ErrHasChildren while clones of it exist.
	RemoveSnapshot(ctx context.Context, ref SnapRef) error
	// Remove deletes an image and its snapshots. ErrHasChildren while a
	// snapshot has clones, ErrBusy while the image is mapped or open.
	Remove(ctx context.Context, name string) error
	// RemoveUnmapped is Remove for an image that the caller knows no live
	// client maps or opens (its mappings on this node are released and no
	// other node uses it), such as the clones of a deployment being undone
	// after a crash. A client killed while it had the image open (an
	// rbd-fuse cut off, an agent killed mid-operation) leaves its watch
	// registered for a while (osd_client_watch_timeout, 30 s by default),
	// and Remove refuses with ErrBusy meanwhile: RemoveUnmapped evicts
	// such a watcher once it fails to answer, and retries with bounded
	// backoff. A watcher that still answers is never evicted: the error
	// then wraps ErrBusy. It returns the watchers it evicted, also with
	// an error. The bound is the implementation's, and ctx's if sooner.
	RemoveUnmapped(ctx context.Context, name string) ([]Eviction, error)
	// Meta returns an image's metadata keys, what Stat reports as Meta,
	// without the rest of Stat's work. ErrNotFound if it does not exist.
	Meta(ctx context.Context, name string) (map[string]string, error)
	// SetMeta sets metadata keys on an image, all in one opening of it
	// (an empty value deletes its key).
	SetMeta(ctx context.Context, name string, meta map[string]string) error
	// Close releases the connection.
	Close() error
}

// CreateOptions are the layout of a new image (Store.Create).
type CreateOptions struct {
	// ObjectSize is the size of the image's objects in bytes: a power of
	// two from MinObjectSize to MaxObjectSize, or 0 for the pool's default
	// (4 MiB). A write to a clone first copies the parent's data of each
	// object it touches (copy-up): small objects copy little.
	ObjectSize int64
}

// Object sizes an image may have.
const (
	MinObjectSize = 4 << 10
	MaxObjectSize = 32 << 20
)

// CreateOption sets one of CreateOptions.
type CreateOption func(*CreateOptions)

// WithObjectSize gives a new image objects of n bytes.
func WithObjectSize(n int64) CreateOption { return func(o *CreateOptions) { o.ObjectSize = n } }

// NewCreateOptions applies opts and validates the result.
func NewCreateOptions(opts ...CreateOption) (CreateOptions, error) {
	var o CreateOptions
	for _, f := range opts {
		f(&o)
	}
	if n := o.ObjectSize; n != 0 && (n < MinObjectSize || n > MaxObjectSize || n&(n-1) != 0) {
		return o, fmt.Errorf("object size %d: want a power of two from %s to %s: %w", n, FormatSize(MinObjectSize), FormatSize(MaxObjectSize), ErrInvalid)
	}
	return o, nil
}

// Eviction is a watcher that Store.RemoveUnmapped evicted: a client that
// kept an image open and no longer answered.
type Eviction struct {
	// Client names the client, e.g. "client.4164".
	Client string `json:"client"`
	// Addr is its address, e.g. "127.0.0.1:0/979340955", as evicted
	// (the Ceph store blocklists it for a short while).
	Addr string `json:"addr"`
}

// Catalog maps environment names to records. The go-ceph implementation
// keeps it in the omap of one RADOS object of the pool, so that every node
// of a PoP sees the same names.
type Catalog interface {
	// Tag returns the record of a name. ErrNotFound if absent.
	Tag(ctx context.Context, name string) ([]byte, error)
	// SetTag creates or replaces a record.
	SetTag(ctx context.Context, name string, record []byte) error
	// SwapTag writes record under name only if the name's record is
	// still prev (nil: the name has none), in one step that every node
	// sees: ErrExists if prev is nil and the name has a record,
	// ErrNotFound if it has none, ErrConflict if its record is not prev.
	SwapTag(ctx context.Context, name string, prev, record []byte) error
	// Tags returns every record by name.
	Tags(ctx context.Context) (map[string][]byte, error)
	// DeleteTag removes a name; no error if absent.
	DeleteTag(ctx context.Context, name string) error
}

// CheckSwap says whether a Catalog may replace name's record cur (nil:
// none) by a SwapTag that expects prev: ErrExists or ErrConflict if not.
func CheckSwap(name string, cur, prev []byte) error {
	switch {
	case prev == nil && cur != nil:
		return fmt.Errorf("environment %q: %w", name, ErrExists)
	case prev != nil && cur == nil:
		return fmt.Errorf("environment %q: removed meanwhile: %w", name, ErrNotFound)
	case prev != nil && !bytes.Equal(cur, prev):
		return fmt.Errorf("environment %q: its catalog record %w", name, ErrConflict)
	}
	return nil
}

// Backend is a Store with its Catalog, as the environment manager needs.
type Backend interface {
	Store
	Catalog
}

// Diagnoser is a Store that can ask its cluster why I/O is not served.
type Diagnoser interface {
	// Diagnose returns nil when the cluster reports nothing wrong, or an
	// error, with a hint, wrapping ErrFull (the pool is full) or
	// ErrUnavailable (OSDs are down).
	Diagnose(ctx context.Context) error
}

// StallCounter is a Store that gives up on calls its cluster library does
// not return from, and counts them.
type StallCounter interface {
	// Stalls returns how many calls were given up on since it was opened.
	Stalls() uint64
}
