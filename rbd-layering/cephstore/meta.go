//go:build !no_ceph

// An image's metadata and its tag (a small record kept beside it, swapped atomically).

package cephstore

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// Meta implements layering.Store.
//
// It reads the keys where librbd keeps them (image format 2): the image's
// id in the object rbd_id.<name>, each key as metadata_<key> in the omap of
// rbd_header.<id>; two reads, without opening the image, which costs
// milliseconds of CPU (librbd copies its configuration and opens the
// parent chain). Anything else than that layout is read through librbd.
//
// Implements: rados_read, rados_read_op_omap_get_vals2 (rbd_open_read_only,
// rbd_metadata_list otherwise).
func (s *Store) Meta(ctx context.Context, name string) (map[string]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if md, ok, err := s.headerMeta(name); ok || err != nil {
		return md, err
	}
	img, err := s.openImage(ctx, "metadata of "+name, name, rbd.NoSnapshot, true)
	if err != nil {
		return nil, err
	}
	defer img.Close()
	md, err := img.ListMetadata()
	if err != nil {
		return nil, s.wrap(ctx, "metadata of "+name, err)
	}
	if md == nil {
		md = map[string]string{}
	}
	return md, nil
}

// headerMeta reads image name's metadata from its header object; ok is
// false when the objects are not laid out as expected.
func (s *Store) headerMeta(name string) (_ map[string]string, ok bool, err error) {
	se, err := s.acquire()
	if err != nil {
		return nil, true, err
	}
	defer s.release(se)
	const metaPrefix = "metadata_"
	buf := make([]byte, 128)
	n, err := se.ioctx.Read("rbd_id."+name, buf, 0)
	if errno(err) == eNOENT {
		return nil, true, fmt.Errorf("metadata of %s: %w", name, layering.ErrNotFound)
	}
	// The id is encoded as a string: its length (32 bits, little endian),
	// then its bytes.
	if err != nil || n < 4 || n == len(buf) {
		return nil, false, nil
	}
	size := int(buf[0]) | int(buf[1])<<8 | int(buf[2])<<16 | int(buf[3])<<24
	if size == 0 || 4+size != n {
		return nil, false, nil
	}
	vals, err := se.ioctx.GetAllOmapValues("rbd_header."+string(buf[4:n]), "", metaPrefix, 64)
	if err != nil {
		return nil, false, nil
	}
	md := make(map[string]string, len(vals))
	for k, v := range vals {
		md[strings.TrimPrefix(k, metaPrefix)] = string(v)
	}
	return md, true, nil
}

// SetMeta implements layering.Store.
//
// Implements: rbd_metadata_set, rbd_metadata_remove.
func (s *Store) SetMeta(ctx context.Context, name string, meta map[string]string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	// One opening for all keys: opening an image opens its whole parent
	// chain, and librbd copies its configuration for each image it opens.
	img, err := s.openImage(ctx, "set metadata on "+name, name, rbd.NoSnapshot, false)
	if err != nil {
		return err
	}
	defer img.Close()
	return s.setMeta(ctx, img, name, meta)
}

// setMeta sets meta's keys on img, image name, open.
func (s *Store) setMeta(ctx context.Context, img *image, name string, meta map[string]string) error {
	keys := slices.Sorted(maps.Keys(meta))
	for _, key := range keys {
		if value := meta[key]; value == "" {
			err := img.RemoveMetadata(key)
			if errno(err) == eNOENT {
				err = nil
			}
			if err != nil {
				return s.wrap(ctx, "remove metadata "+key+" of "+name, err)
			}
		} else if err := img.SetMetadata(key, value); err != nil {
			return s.wrap(ctx, "set metadata "+key+" on "+name, err)
		}
	}
	return nil
}

// Tag implements layering.Catalog.
//
// Implements: rados_read_op_omap_get_vals_by_keys2 (via GetOmapValues).
func (s *Store) Tag(ctx context.Context, name string) ([]byte, error) {
	se, err := s.acquire()
	if err != nil {
		return nil, err
	}
	defer s.release(se)
	vals, err := se.ioctx.GetOmapValues(CatalogObject, "", name, 64)
	if err != nil && errno(err) != eNOENT {
		return nil, s.wrap(ctx, "catalog", err)
	}
	v, ok := vals[name]
	if !ok {
		return nil, fmt.Errorf("environment %q: %w", name, layering.ErrNotFound)
	}
	return v, nil
}

// SetTag implements layering.Catalog.
//
// Implements: rados_write_op_omap_set2.
func (s *Store) SetTag(ctx context.Context, name string, record []byte) error {
	se, err := s.acquire()
	if err != nil {
		return err
	}
	defer s.release(se)
	return s.wrap(ctx, "catalog set "+name, se.ioctx.SetOmap(CatalogObject, map[string][]byte{name: record}))
}

// SwapTag implements layering.Catalog: it reads the name's record and the
// catalog object's version, and writes the new record on the condition
// that the object is still at that version (or, where there is no catalog
// yet, that it creates it); a write of another record in between makes it
// read again.
//
// Implements: rados_read_op_omap_get_vals_by_keys2, rados_get_last_version,
// rados_write_op_assert_version, rados_write_op_create,
// rados_write_op_omap_set2.
func (s *Store) SwapTag(ctx context.Context, name string, prev, record []byte) error {
	se, err := s.acquire()
	if err != nil {
		return err
	}
	defer s.release(se)
	// An I/O context of its own: the version of the last object read is
	// the I/O context's, which other calls on the session change.
	ioctx, err := se.conn.OpenIOContext(s.cfg.Pool)
	if err != nil {
		return s.wrap(ctx, "catalog set "+name, err)
	}
	defer ioctx.Destroy()
	for range swapAttempts {
		if err := ctx.Err(); err != nil {
			return err
		}
		cur, ver, exists, err := readTag(ioctx, name)
		if err != nil {
			return s.wrap(ctx, "catalog read "+name, err)
		}
		if err := layering.CheckSwap(name, cur, prev); err != nil {
			return err
		}
		op := rados.CreateWriteOp()
		if exists {
			op.AssertVersion(ver)
		} else {
			op.Create(rados.CreateExclusive)
		}
		op.SetOmap(map[string][]byte{name: record})
		err = op.Operate(ioctx, CatalogObject, rados.OperationNoFlag)
		op.Release()
		if err == nil {
			return nil
		}
		switch errno(err) {
		case eRANGE, eOVERFLOW, eEXIST:
			// The catalog changed since it was read: read it again.
			continue
		}
		return s.wrap(ctx, "catalog set "+name, err)
	}
	return fmt.Errorf("catalog set %s: it kept changing under %d attempts: %w", name, swapAttempts, layering.ErrConflict)
}

// readTag reads the record of name (nil if it has none) and the catalog
// object's version; exists says whether there is a catalog object.
func readTag(ioctx *rados.IOContext, name string) (rec []byte, ver uint64, exists bool, err error) {
	op := rados.CreateReadOp()
	defer op.Release()
	step := op.GetOmapValuesByKeys([]string{name})
	if err := op.Operate(ioctx, CatalogObject, rados.OperationNoFlag); err != nil {
		if errno(err) == eNOENT {
			return nil, 0, false, nil
		}
		return nil, 0, false, err
	}
	if ver, err = ioctx.GetLastVersion(); err != nil {
		return nil, 0, false, err
	}
	for {
		kv, err := step.Next()
		if err != nil {
			return nil, 0, false, err
		}
		if kv == nil {
			return rec, ver, true, nil
		}
		if kv.Key == name {
			rec = kv.Value
		}
	}
}

// Tags implements layering.Catalog.
func (s *Store) Tags(ctx context.Context) (map[string][]byte, error) {
	se, err := s.acquire()
	if err != nil {
		return nil, err
	}
	defer s.release(se)
	vals, err := se.ioctx.GetAllOmapValues(CatalogObject, "", "", 256)
	if err != nil {
		if errno(err) == eNOENT {
			return map[string][]byte{}, nil
		}
		return nil, s.wrap(ctx, "catalog", err)
	}
	return vals, nil
}

// DeleteTag implements layering.Catalog.
//
// Implements: rados_write_op_omap_rm_keys2.
func (s *Store) DeleteTag(ctx context.Context, name string) error {
	se, err := s.acquire()
	if err != nil {
		return err
	}
	defer s.release(se)
	err = se.ioctx.RmOmapKeys(CatalogObject, []string{name})
	if errno(err) == eNOENT {
		return nil
	}
	return s.wrap(ctx, "catalog delete "+name, err)
}
