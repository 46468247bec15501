// A suspend's store step: the checkpoint copied into an image of its own while the instance's
// root is released, and both images sealed (suspend.go runs the steps).

package deploy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/gencache"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// suspendImages is what a suspend's store step works on: the writable
// image (env) and the checkpoint's (ckpt, tagged when it was made;
// mounted: its unmount), and whether the instance's processes are gone
// already (exited).
type suspendImages struct {
	env, ckpt string
	mounted   func() error
	exited    bool
	// kept: the checkpoint is a hand-over's, whose durable copy is
	// written behind the suspend (Handoffs.store), not here.
	kept *Handoff
}

// withSeed is meta with the identity seed of the instance a suspension
// checkpointed (a resume keeps it).
func withSeed(meta map[string]string, seed string) map[string]string {
	m := maps.Clone(meta)
	m[metaSeed] = seed
	return m
}

// storeAndRelease runs at once the copy of rec's checkpoint into image
// ckptImg and the release of its instance, root and mappings, each image
// sealed once it is written; rec then owns the images and its directory
// only (the directory goes at the suspend's end).
func (sx *Suspensions) storeAndRelease(ctx context.Context, rec *Deployment, susp *spec.Suspension, si suspendImages) error {
	envImg, ckptImg := si.env, si.ckpt
	h := *rec.Handle
	dr := sx.drv.driverByName(h.Driver)
	if dr == nil {
		return fmt.Errorf("%w: driver %q of deployment %s", drivers.ErrDriver, h.Driver, rec.ID)
	}
	mid := suspendMapping(rec.ID)
	// Every image but the two and the hold is a parent of the writable
	// image (a resumed instance's suspension before): it stays with it.
	hold := suspendHoldImage(rec.ID)
	susp.Parents = slices.DeleteFunc(slices.Clone(rec.Images), func(img string) bool { return img == envImg || img == ckptImg || img == hold })
	susp.Env = layering.SnapRef{Image: envImg, Snap: layering.SealedSnap}
	susp.Ckpt = layering.SnapRef{Image: ckptImg, Snap: layering.SealedSnap}
	meta := sx.suspensionMeta(rec.ID)
	stored := func() error { return nil }
	if si.kept == nil {
		stored = async(func() error {
			if err := sx.storeCheckpoint(ctx, rec.Dir, mid, si.mounted, drivers.GenDir(h.CkptPath, susp.CkptGen), susp.CkptGen); err != nil {
				return err
			}
			return sx.sealImage(ctx, susp.Ckpt, nil)
		})
	}
	// An instance whose processes are gone holds no mount of its root:
	// the root is unmounted and its image unmapped and sealed while the
	// instance is removed.
	removed := func() error { return nil }
	var released error
	if si.exited {
		removed = async(func() error { return sx.stages.removeInstance(ctx, dr, h) })
		released = sx.releaseRoot(ctx, *rec, mid)
	} else {
		released = sx.releaseInstance(ctx, dr, *rec, mid)
	}
	if released == nil {
		released = sx.detachParents(ctx, rec, susp)
	}
	if released == nil {
		released = sx.sealImage(ctx, susp.Env, meta)
	}
	if err := errors.Join(released, stored(), removed()); err != nil {
		return err
	}
	owned := append([]string{envImg, ckptImg}, susp.Parents...)
	if slices.Contains(rec.Images, hold) { // made during the checkpoint
		owned = append(owned, hold)
	}
	rec.Owned = Owned{Images: owned, Dir: rec.Dir}
	return nil
}

// releaseInstance removes rec's instance, unmounts its root and releases
// its mappings but mid; it leaves its images and its directory.
func (sx *Suspensions) releaseInstance(ctx context.Context, dr drivers.Driver, rec Deployment, mid string) error {
	if err := sx.stages.removeInstance(ctx, dr, *rec.Handle); err != nil {
		return err
	}
	return sx.releaseRoot(ctx, rec, mid)
}

// releaseRoot unmounts rec's root and releases its mappings but mid.
func (sx *Suspensions) releaseRoot(ctx context.Context, rec Deployment, mid string) error {
	if err := sx.envs.unmountRoot(ctx, rec.Dir); err != nil {
		return fmt.Errorf("unmount root: %w", err)
	}
	return sx.releaseMappings(ctx, slices.DeleteFunc(slices.Clone(rec.Mappings), func(m string) bool { return m == mid }))
}

// suspendMapping is the mapping of deployment id's suspension image.
func suspendMapping(id string) string { return id + "-susp" }

// suspendMount is where a suspend mounts its checkpoint's image.
func suspendMount(instDir string) string { return filepath.Join(instDir, "suspend") }

// mountSuspension journals the mapping of rec's suspension image img and
// starts to map, format and mount it (suspendMount); the function it
// returns waits for that.
func (sx *Suspensions) mountSuspension(ctx context.Context, rec *Deployment, img string) (func() error, error) {
	mid, err := sx.journalMapping(rec, suspendMapping(rec.ID))
	if err != nil {
		return nil, err
	}
	target := suspendMount(rec.Dir)
	return async(func() error {
		_ = sx.deps.Mapper.Release(ctx, mid) // one a crash left
		_, err := sx.deps.Mapper.MapAndMount(ctx, mapper.Image{Pool: sx.cfg.Pool, Name: img}, target,
			mapper.MountOptions{Format: true}, mapper.WithID(mid))
		return err
	}), nil
}

// storeCheckpoint copies the checkpoint files in dir into directory gen of
// the suspension's image, once mounted (mountSuspension), then releases
// its mapping mid, which flushes them.
func (sx *Suspensions) storeCheckpoint(ctx context.Context, instDir, mid string, mounted func() error, dir string, gen int) (err error) {
	target := suspendMount(instDir)
	defer func() {
		// The release flushes what was written.
		if rerr := sx.deps.Mapper.Release(context.WithoutCancel(ctx), mid); rerr != nil && !errors.Is(rerr, mapper.ErrNotMapped) {
			err = errors.Join(err, rerr)
		}
		_ = os.Remove(target)
	}()
	if err := mounted(); err != nil {
		return err
	}
	// Anew: a copy that a crash cut short is replaced.
	dst := drivers.GenDir(target, gen)
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	return gencache.CopyTree(ctx, dir, dst)
}

// suspensionMeta names deployment id on a suspension's images (gc keeps
// them while it exists) and no slot.
func (sx *Suspensions) suspensionMeta(id string) map[string]string {
	return map[string]string{catalog.MetaDeployment: id, catalog.MetaSlot: "", catalog.MetaNode: sx.cfg.Node}
}

// sealImage tags ref's image with meta (if any), once nothing maps it,
// and snapshots it (once).
func (sx *Suspensions) sealImage(ctx context.Context, ref layering.SnapRef, meta map[string]string) error {
	if err := sx.deps.Store.Seal(ctx, ref, meta); err != nil && !errors.Is(err, layering.ErrExists) {
		return err
	}
	return nil
}

// adoptSuspension hands what is left of the suspension to the resumed
// deployment dep: its writable image (its clone's parent goes after the
// clone), which it keeps, and the checkpoint's image and the hold, which
// DropSuspension removes once the caller recorded dep Running (the
// instance answers meanwhile; until then an undeploy removes them too).
func (sx *Suspensions) adoptSuspension(dep Deployment, susp spec.Suspension) Deployment {
	dep.Images = append(append(dep.Images, susp.Env.Image), susp.Parents...)
	for _, img := range []string{susp.Ckpt.Image, susp.Hold} {
		if img != "" {
			dep.Images = append(dep.Images, img)
		}
	}
	if err := sx.recs.save(&dep); err != nil {
		sx.log.Warn("the resumed deployment does not own its suspension's images; gc removes them once the deployment is gone",
			"deployment", dep.ID, "image", susp.Env.Image, "err", err)
	}
	sx.log.Info("resumed", "id", dep.ID, "app", dep.App, "gen", susp.From.Gen, "ports", dep.Ports, "timings", dep.Timings.String())
	return dep
}

// DropSuspension removes the checkpoint's image and the hold of
// suspension susp, which deployment id resumed from (Resume), and stops
// owning them. A removal that fails leaves the image to the deployment's
// undeploy. Like every change of a deployment, it is not called while
// another runs on id.
//
// A checkpoint image whose pages a lazy restore still reads (servedFetch)
// is removed once it has every page.
func (sx *Suspensions) DropSuspension(ctx context.Context, id string, susp spec.Suspension) {
	if served := sx.ckpts.Serving(susp.Ckpt.Image); served != nil {
		select {
		case <-served:
		case <-ctx.Done():
			return
		}
	}
	var gone []string
	for _, img := range []string{susp.Ckpt.Image, susp.Hold} {
		if img == "" {
			continue
		}
		if img == susp.Ckpt.Image && susp.Pending != "" {
			// A hand-over's source writes it still, and removes it
			// once sealed (gc, if that node is lost meanwhile).
			gone = append(gone, img)
			continue
		}
		if err := sx.deps.Store.Remove(ctx, img); err != nil && !errors.Is(err, layering.ErrNotFound) {
			sx.log.Warn("removing a resumed suspension's image; the deployment's undeploy removes it", "deployment", id, "image", img, "err", err)
			continue
		}
		gone = append(gone, img)
	}
	if dep, err := sx.recs.Load(id); err == nil && len(gone) > 0 {
		dep.Images = slices.DeleteFunc(dep.Images, func(i string) bool { return slices.Contains(gone, i) })
		_ = sx.recs.save(&dep)
	}
}
