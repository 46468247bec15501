//go:build !no_ceph

package cephstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/bits"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// Store is a layering.Backend on one RBD pool.
type Store struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	sess    *session   // the connection calls use
	retired []*session // connections retired still in use, shut down by their last release
	closed  bool       // Close was called: calls fail with ErrClosed
	stalls  atomic.Uint64

	diagMu sync.Mutex
	diag   diagnosis // the last Diagnose, reused for diagnosisTTL
}

var (
	_ layering.Backend      = (*Store)(nil)
	_ layering.Diagnoser    = (*Store)(nil)
	_ layering.StallCounter = (*Store)(nil)
)

// Open connects to the cluster and opens the pool. It returns an error
// wrapping layering.ErrUnavailable within cfg.Timeout when the cluster does
// not answer.
//
// Implements: rados_create2, rados_conf_read_file, rados_connect,
// rados_ioctx_create.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", layering.ErrInvalid, err)
	}
	se, err := dial(ctx, cfg)
	if err != nil {
		return nil, err
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Store{cfg: cfg, log: log, sess: se}, nil
}

// Pool returns the pool name.
func (s *Store) Pool() string { return s.cfg.Pool }

type errnoer interface{ ErrorCode() int }

// errno returns the negative errno carried by a go-ceph error, or 0. A
// read or write operation's error carries it in OpError.
func errno(err error) int {
	if op := (rados.OperationError{}); errors.As(err, &op) && op.OpError != nil {
		err = op.OpError
	}
	var e errnoer
	if errors.As(err, &e) {
		return e.ErrorCode()
	}
	return 0
}

const (
	eNOENT    = -2
	eACCES    = -13
	eBUSY     = -16
	eEXIST    = -17
	eINVAL    = -22
	eNOSPC    = -28
	eRANGE    = -34
	eNOTEMPTY = -39
	eOVERFLOW = -75
	eTIMEDOUT = -110
	eDQUOT    = -122
)

// wrap maps a go-ceph error onto a layering sentinel and keeps both.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	var sentinel error
	switch errno(err) {
	case eNOENT:
		sentinel = layering.ErrNotFound
	case eEXIST:
		sentinel = layering.ErrExists
	case eBUSY:
		sentinel = layering.ErrBusy
	case eNOTEMPTY:
		sentinel = layering.ErrHasChildren
	case eINVAL:
		sentinel = layering.ErrInvalid
	case eTIMEDOUT:
		sentinel = layering.ErrUnavailable
	case eNOSPC, eDQUOT:
		sentinel = layering.ErrFull
	}
	if errors.Is(err, rbd.ErrNotFound) {
		sentinel = layering.ErrNotFound
	}
	if sentinel == nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return fmt.Errorf("%s: %w (ceph: %w)", op, sentinel, err)
}

// Create implements layering.Store.
//
// Implements: rbd_create4.
func (s *Store) Create(ctx context.Context, name string, size int64, options ...layering.CreateOption) error {
	se, err := s.acquire()
	if err != nil {
		return err
	}
	defer s.release(se)
	if err := ctx.Err(); err != nil {
		return err
	}
	if size <= 0 {
		return fmt.Errorf("create %q: size %d: %w", name, size, layering.ErrInvalid)
	}
	co, err := layering.NewCreateOptions(options...)
	if err != nil {
		return fmt.Errorf("create %q: %w", name, err)
	}
	opts := rbd.NewRbdImageOptions()
	defer opts.Destroy()
	if co.ObjectSize != 0 {
		if err := opts.SetUint64(rbd.ImageOptionOrder, uint64(bits.TrailingZeros64(uint64(co.ObjectSize)))); err != nil {
			return err
		}
	}
	return s.wrap(ctx, "create "+name, rbd.CreateImage(se.ioctx, name, uint64(size), opts))
}

// Write implements layering.Store.
//
// Implements: rbd_open, rbd_write2, rbd_flush.
func (s *Store) Write(ctx context.Context, name string, src io.ReaderAt, size int64) error {
	img, err := s.openImage(ctx, "open "+name, name, rbd.NoSnapshot, false)
	if err != nil {
		return err
	}
	defer img.Close()
	if _, err := layering.CopySparse(ctx, img, src, size); err != nil {
		return s.wrap(ctx, "write "+name, err)
	}
	return s.wrap(ctx, "flush "+name, img.Flush())
}

// ReadAt implements layering.Store.
//
// Implements: rbd_open_read_only, rbd_read2.
func (s *Store) ReadAt(ctx context.Context, name string, p []byte, off int64) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	img, snap := name, rbd.NoSnapshot
	if ref, err := layering.ParseSnapRef(name); err == nil {
		img, snap = ref.Image, ref.Snap
	}
	h, err := s.openImage(ctx, "read "+name, img, snap, true)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	n, err := h.ReadAt(p, off)
	if err != nil && err != io.EOF {
		return n, s.wrap(ctx, "read "+name, err)
	}
	return n, err
}

// Stat implements layering.Store.
//
// Implements: rbd_get_size, rbd_get_parent, rbd_snap_list,
// rbd_snap_is_protected, rbd_metadata_list, rbd_diff_iterate2.
func (s *Store) Stat(ctx context.Context, name string) (layering.ImageInfo, error) {
	if err := ctx.Err(); err != nil {
		return layering.ImageInfo{}, err
	}
	img, err := s.openImage(ctx, "stat "+name, name, rbd.NoSnapshot, true)
	if err != nil {
		return layering.ImageInfo{}, err
	}
	defer img.Close()
	info := layering.ImageInfo{Name: name}
	size, err := img.GetSize()
	if err != nil {
		return info, s.wrap(ctx, "stat "+name, err)
	}
	info.Size = int64(size)
	if st, err := img.Stat(); err == nil {
		info.ObjectSize = int64(st.Obj_size)
	} else {
		return info, s.wrap(ctx, "stat "+name, err)
	}
	if p, err := img.GetParent(); err == nil {
		info.Parent = &layering.SnapRef{Image: p.Image.ImageName, Snap: p.Snap.SnapName}
	} else if errno(err) != eNOENT {
		return info, s.wrap(ctx, "parent of "+name, err)
	}
	snaps, err := img.GetSnapshotNames()
	if err != nil {
		return info, s.wrap(ctx, "snapshots of "+name, err)
	}
	for _, sn := range snaps {
		prot, _ := img.GetSnapshot(sn.Name).IsProtected()
		info.Snapshots = append(info.Snapshots, layering.SnapInfo{Name: sn.Name, Protected: prot})
	}
	if md, err := img.ListMetadata(); err == nil {
		info.Meta = md
	}
	if ts, err := img.GetCreateTimestamp(); err == nil {
		info.Created = time.Unix(ts.Sec, ts.Nsec)
	}
	var used uint64
	err = img.DiffIterate(rbd.DiffIterateConfig{
		Offset:        0,
		Length:        size,
		IncludeParent: rbd.ExcludeParent,
		WholeObject:   rbd.EnableWholeObject,
		Callback: func(_, length uint64, exists int, _ interface{}) int {
			if exists != 0 {
				used += length
			}
			return 0
		},
	})
	if err != nil {
		return info, s.wrap(ctx, "used bytes of "+name, err)
	}
	info.Used = int64(used)
	return info, nil
}

// List implements layering.Store.
//
// Implements: rbd_list2.
func (s *Store) List(ctx context.Context) ([]string, error) {
	se, err := s.acquire()
	if err != nil {
		return nil, err
	}
	defer s.release(se)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	names, err := rbd.GetImageNames(se.ioctx)
	if err != nil {
		return nil, s.wrap(ctx, "list pool "+s.cfg.Pool, err)
	}
	sort.Strings(names)
	return names, nil
}

// Snapshot implements layering.Store.
//
// Implements: rbd_snap_create, rbd_snap_protect.
func (s *Store) Snapshot(ctx context.Context, ref layering.SnapRef) (err error) {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ref.Snap == "" {
		return fmt.Errorf("snapshot %s: empty name: %w", ref, layering.ErrInvalid)
	}
	img, err := s.openImage(ctx, "snapshot "+ref.String(), ref.Image, rbd.NoSnapshot, false)
	if err != nil {
		return err
	}
	defer img.Close()
	return s.snapshot(ctx, img, ref)
}

// Seal implements layering.Store.
//
// Implements: rbd_metadata_set, rbd_metadata_remove, rbd_snap_create,
// rbd_snap_protect.
func (s *Store) Seal(ctx context.Context, ref layering.SnapRef, meta map[string]string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ref.Snap == "" {
		return fmt.Errorf("seal %s: empty snapshot name: %w", ref, layering.ErrInvalid)
	}
	// Opening an image opens its whole parent chain: once for both.
	img, err := s.openImage(ctx, "seal "+ref.String(), ref.Image, rbd.NoSnapshot, false)
	if err != nil {
		return err
	}
	defer img.Close()
	if err := s.setMeta(ctx, img, ref.Image, meta); err != nil {
		return err
	}
	return s.snapshot(ctx, img, ref)
}

// snapshot creates and protects snapshot ref of img, open.
func (s *Store) snapshot(ctx context.Context, img *image, ref layering.SnapRef) error {
	snap, err := img.CreateSnapshot(ref.Snap)
	if err != nil {
		return s.wrap(ctx, "snapshot "+ref.String(), err)
	}
	if err := snap.Protect(); err != nil {
		_ = snap.Remove()
		return s.wrap(ctx, "protect "+ref.String(), err)
	}
	return nil
}

// Clone implements layering.Store.
//
// Implements: rbd_clone3.
func (s *Store) Clone(ctx context.Context, parent layering.SnapRef, child string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	// Bounded as an open is (it opens the parent), but not repeatable: a
	// clone given up on may still be made. What the call uses is its own,
	// for it may outlive this function.
	_, err := bounded(ctx, s, fmt.Sprintf("clone %s to %s", parent, child), false, func(se *session) (struct{}, error) {
		opts := rbd.NewRbdImageOptions()
		defer opts.Destroy()
		if err := opts.SetUint64(rbd.ImageOptionFeatures, rbd.FeatureLayering|rbd.FeatureExclusiveLock|rbd.FeatureObjectMap|rbd.FeatureFastDiff|rbd.FeatureDeepFlatten); err != nil {
			return struct{}{}, err
		}
		return struct{}{}, rbd.CloneImage(se.ioctx, parent.Image, parent.Snap, se.ioctx, child, opts)
	}, nil)
	return err
}

// Children implements layering.Store.
//
// Implements: rbd_list_children3.
func (s *Store) Children(ctx context.Context, parent layering.SnapRef) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	img, err := s.openImage(ctx, "children of "+parent.String(), parent.Image, parent.Snap, true)
	if err != nil {
		return nil, err
	}
	defer img.Close()
	// The parent is there: ENOENT from the listing means a clone is half
	// removed (attached still, its name gone), which lasts milliseconds.
	// It must not read as "no such parent", which callers take as "no
	// clones".
	for wait := childListRetry; ; wait *= 2 {
		_, names, err := img.ListChildren()
		if err == nil {
			sort.Strings(names)
			return names, nil
		}
		if errno(err) != eNOENT && !errors.Is(err, rbd.ErrNotFound) {
			return nil, s.wrap(ctx, "children of "+parent.String(), err)
		}
		if wait > time.Second {
			return nil, hint.With(fmt.Errorf("children of %s: a clone of it is being removed: %w (ceph: %w)", parent, layering.ErrBusy, err),
				"try again once the removal ends")
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// childListRetry is the first wait before listing a snapshot's clones again
// while one of them is half removed.
const childListRetry = 50 * time.Millisecond

// Flatten implements layering.Store.
//
// Implements: rbd_flatten.
func (s *Store) Flatten(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	img, err := s.openImage(ctx, "flatten "+name, name, rbd.NoSnapshot, false)
	if err != nil {
		return err
	}
	defer img.Close()
	return s.wrap(ctx, "flatten "+name, img.Flatten())
}

// swapAttempts bounds SwapTag's reads and writes while other writers
// change the catalog.
const swapAttempts = 32
