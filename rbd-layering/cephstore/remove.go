//go:build !no_ceph

// Removing images and snapshots: refused while a snapshot has clones or a client watches the image.

package cephstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ceph/go-ceph/rbd"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// RemoveSnapshot implements layering.Store.
//
// Implements: rbd_snap_unprotect, rbd_snap_remove.
func (s *Store) RemoveSnapshot(ctx context.Context, ref layering.SnapRef) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	kids, err := s.Children(ctx, ref)
	if err != nil {
		return err
	}
	if len(kids) > 0 {
		return fmt.Errorf("snapshot %s has clones %s: %w", ref, strings.Join(kids, ", "), layering.ErrHasChildren)
	}
	img, err := s.openImage(ctx, "remove snapshot "+ref.String(), ref.Image, rbd.NoSnapshot, false)
	if err != nil {
		return err
	}
	defer img.Close()
	snap := img.GetSnapshot(ref.Snap)
	if prot, err := snap.IsProtected(); err != nil {
		return s.wrap(ctx, "remove snapshot "+ref.String(), err)
	} else if prot {
		if err := snap.Unprotect(); err != nil {
			return s.wrap(ctx, "unprotect "+ref.String(), err)
		}
	}
	return s.wrap(ctx, "remove snapshot "+ref.String(), snap.Remove())
}

// Remove implements layering.Store.
//
// Implements: rbd_snap_list, rbd_snap_unprotect, rbd_snap_remove, rbd_remove.
func (s *Store) Remove(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	info, err := s.Stat(ctx, name)
	if errors.Is(err, layering.ErrNotFound) {
		return s.finishRemoval(ctx, name, err)
	}
	if err != nil {
		return err
	}
	for _, sn := range info.Snapshots {
		ref := layering.SnapRef{Image: name, Snap: sn.Name}
		kids, err := s.Children(ctx, ref)
		if err != nil {
			return err
		}
		if len(kids) > 0 {
			return hint.With(
				fmt.Errorf("remove %s: snapshot %s has clones %s: %w", name, ref, strings.Join(kids, ", "), layering.ErrHasChildren),
				"remove the clones first, or flatten them")
		}
	}
	if err := s.checkWatchers(ctx, name); err != nil {
		return err
	}
	for _, sn := range info.Snapshots {
		if err := s.RemoveSnapshot(ctx, layering.SnapRef{Image: name, Snap: sn.Name}); err != nil {
			return err
		}
	}
	err = s.removeImage(ctx, name)
	if errno(err) == eBUSY { // "remove NAME: in use (ceph: ...)"
		return hint.With(err, "the image still has watchers: it is mapped on a node; undeploy or unmap it first")
	}
	return err
}

// finishRemoval completes the removal of an image that a killed process
// left half done: its header is gone, so it cannot be opened (notFound),
// but the pool's directory still lists it. librbd's remove finishes it.
// An image that is not listed either is simply not found.
//
// Implements: rbd_list2, rbd_remove.
func (s *Store) finishRemoval(ctx context.Context, name string, notFound error) error {
	se, err := s.acquire()
	if err != nil {
		return err
	}
	defer s.release(se)
	names, err := rbd.GetImageNames(se.ioctx)
	if err != nil {
		return s.wrap(ctx, "list images", err)
	}
	if !slices.Contains(names, name) {
		return notFound
	}
	return s.removeImage(ctx, name)
}

// removeImage removes an image, bounded as an open is (librbd opens it
// first), and not repeatable: a removal given up on may still go on. The
// removal of a half-removed image finishes it later (finishRemoval).
//
// Implements: rbd_remove.
func (s *Store) removeImage(ctx context.Context, name string) error {
	_, err := bounded(ctx, s, "remove "+name, false, func(se *session) (struct{}, error) {
		return struct{}{}, rbd.RemoveImage(se.ioctx, name)
	}, nil)
	return err
}

// checkWatchers refuses while another client (a mapping) watches the image.
//
// Implements: rbd_watchers_list.
func (s *Store) checkWatchers(ctx context.Context, name string) error {
	img, err := s.openImage(ctx, "watchers of "+name, name, rbd.NoSnapshot, true)
	if err != nil {
		return err
	}
	defer img.Close()
	ws, err := img.ListWatchers()
	if err != nil {
		return s.wrap(ctx, "watchers of "+name, err)
	}
	if len(ws) > 0 {
		addrs := make([]string, 0, len(ws))
		for _, w := range ws {
			addrs = append(addrs, w.Addr)
		}
		return hint.With(fmt.Errorf("remove %s: mapped by %s: %w", name, strings.Join(addrs, ", "), layering.ErrBusy),
			"it is mapped on a node: undeploy or unmap it first")
	}
	return nil
}
