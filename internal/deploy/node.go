package deploy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"

	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// node is what every part of the deploy path shares: the node's
// configuration and components, and the primitives every part uses on
// them: removing an image, releasing mappings, unbinding checkpoints.
type node struct {
	cfg  Config
	deps Deps
	log  *slog.Logger
}

// removeImage removes an image of deployment id. Its mappings are
// released by then; when nothing on this node keeps the image open any
// more (no mapping record, no rbd-fuse), a watcher that the cluster still
// lists is a client that was killed with the image open: an rbd-fuse cut
// off, or a previous agent killed mid-operation. The OSDs keep such a
// watch for osd_client_watch_timeout (30 s), so the image is removed with
// RemoveUnmapped, which evicts dead watchers and retries with bounded
// backoff. Otherwise (or when the mapper cannot tell) plain Remove, which
// refuses while the image is watched.
func (n *node) removeImage(ctx context.Context, id, img string) error {
	users, err := n.deps.Mapper.Users(mapper.Image{Pool: n.cfg.Pool, Name: img})
	if err != nil || len(users) > 0 {
		if err != nil {
			n.log.Warn("cannot tell whether an image is still mapped on this node; not evicting its watchers", "deployment", id, "image", img, "err", err)
		}
		return n.deps.Store.Remove(ctx, img)
	}
	evicted, err := n.deps.Store.RemoveUnmapped(ctx, img)
	for _, e := range evicted {
		n.log.Warn("evicted a dead client that still watched an image (blocklisted for a short while)",
			"deployment", id, "image", img, "client", e.Client, "addr", e.Addr)
	}
	return err
}

// releaseMappings unmounts and unmaps mappings.
func (n *node) releaseMappings(ctx context.Context, mappings []string) error {
	var errs []error
	for _, m := range mappings {
		if err := n.deps.Mapper.Release(ctx, m); err != nil && !errors.Is(err, mapper.ErrNotMapped) {
			errs = append(errs, fmt.Errorf("release mapping %s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}

// unbindCkpt unbinds what is mounted in the generations' directories of
// the checkpoint volume under dir (a spare's attached generation, a
// migration's checkpoint directory), if any.
func (n *node) unbindCkpt(dir string) error {
	return n.unbindGens(filepath.Join(dir, "mnt", "ckpt"))
}

// unbindGens unbinds whatever is mounted at the generations' directories
// in vol (a directory per generation, named by its number); a vol that is
// missing holds none.
func (n *node) unbindGens(vol string) error {
	ents, err := os.ReadDir(vol)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err == nil && e.IsDir() {
			errs = append(errs, n.deps.Roots.Unbind(filepath.Join(vol, e.Name())))
		}
	}
	return errors.Join(errs...)
}

// limitsOf is what an instance of app may use on this node.
func (n *node) limitsOf(app spec.App) *spec.Limits {
	l := app.LimitsOver(n.cfg.Limits)
	return &l
}
