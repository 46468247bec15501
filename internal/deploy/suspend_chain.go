// A resumed instance's chain of clones, cut at its next suspend.

package deploy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// detachParents flattens the writable image of a resumed instance
// (released, so mapped nowhere) before its suspension seals it, and
// removes the images it was a clone of (its suspensions before): an
// instance suspended and resumed again and again keeps a chain one clone
// deep instead of one more per round. Only on the shared read path,
// where that image holds the instance's writes over a blank filesystem
// and no more; a root cloned from the generation's environment would
// copy the whole environment. A parent that cannot be removed stays in
// susp.Parents, owned as before.
func (sx *Suspensions) detachParents(ctx context.Context, rec *Deployment, susp *spec.Suspension) error {
	if rec.Lower == "" || len(susp.Parents) == 0 {
		return nil
	}
	// Its chain of parents among its own images, newest first (a suspend
	// started again after the flatten finds none: they stay owned).
	var chain []string
	for img := susp.Env.Image; ; {
		info, err := sx.deps.Store.Stat(ctx, img)
		if err != nil {
			return err
		}
		if info.Parent == nil || !slices.Contains(susp.Parents, info.Parent.Image) {
			break
		}
		img = info.Parent.Image
		chain = append(chain, img)
	}
	if len(chain) == 0 {
		return nil
	}
	t := time.Now()
	if err := sx.deps.Store.Flatten(ctx, susp.Env.Image); err != nil {
		return fmt.Errorf("flatten %s: %w", susp.Env.Image, err)
	}
	kept := slices.DeleteFunc(slices.Clone(susp.Parents), func(img string) bool { return slices.Contains(chain, img) })
	for _, p := range chain { // each is the parent of the one before
		if err := sx.removeImage(ctx, rec.ID, p); err != nil && !errors.Is(err, layering.ErrNotFound) {
			sx.log.Warn("removing a flattened instance's former parent; it stays with the suspension", "deployment", rec.ID, "image", p, "err", err)
			kept = append(kept, p)
		}
	}
	susp.Parents = kept
	sx.log.Info("a resumed instance's writable image flattened", "deployment", rec.ID, "image", susp.Env.Image,
		"parents_removed", len(chain)-len(kept), "took", time.Since(t).Round(time.Millisecond))
	return nil
}
