// Checkpoint generations: removed when no clone uses them, kept to the newest N (Retain).

package gc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/state"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// RemoveGeneration removes generation gen of app: its images (refused,
// wrapping layering.ErrHasChildren, while clones use them), then its
// record; a generation whose images are gone loses its record.
func RemoveGeneration(ctx context.Context, store layering.Store, st *state.Store, app string, gen int) error {
	if err := catalog.RemoveGeneration(ctx, store, app, gen); err != nil && !errors.Is(err, layering.ErrNotFound) {
		return err
	}
	return st.DeleteCheckpoint(ctx, app, gen)
}

// RemoveGenerationWaiting is RemoveGeneration retried, for up to wait,
// while nodes drop their copies of the generation's environment
// (catalog.ErrHeldByNodes; the first try retired it). progress, if not
// nil, is told once that it waits.
func RemoveGenerationWaiting(ctx context.Context, store layering.Store, st *state.Store, app string, gen int, wait time.Duration, progress func(string)) error {
	deadline := time.Now().Add(wait)
	for told := false; ; told = true {
		err := RemoveGeneration(ctx, store, st, app, gen)
		if !errors.Is(err, catalog.ErrHeldByNodes) || time.Now().After(deadline) {
			return err
		}
		if !told && progress != nil {
			progress(fmt.Sprintf("generation %d of %s is retired; waiting up to %s for the nodes to drop their copies of it", gen, app, wait.Round(time.Second)))
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// removedAppGeneration is the item of generation g of an app that was
// removed: skipped while clones of it remain (the pool slots its agents
// are releasing).
func removedAppGeneration(ctx context.Context, store layering.Store, g spec.Generation) (Item, error) {
	it := Item{Kind: KindGeneration, Name: fmt.Sprintf("%s/%d", g.App, g.Gen), App: g.App, Gen: g.Gen,
		Images: []string{g.EnvSnap.Image, g.CkptSnap.Image}, Reason: "its app was removed"}
	users, err := generationUsers(ctx, store, g)
	if err != nil {
		return it, err
	}
	if users > 0 {
		it.Skip, it.Reason = true, fmt.Sprintf("its app was removed, but %d clone(s) of it remain", users)
	}
	return it, nil
}

// generationUsers is how many clones use g's sealed images (the most of
// either).
func generationUsers(ctx context.Context, store layering.Store, g spec.Generation) (int, error) {
	users := 0
	for _, ref := range []layering.SnapRef{g.EnvSnap, g.CkptSnap} {
		kids, err := store.Children(ctx, ref)
		if err != nil && !errors.Is(err, layering.ErrNotFound) {
			return 0, err
		}
		users = max(users, len(kids))
	}
	return users, nil
}

// Retain lists (dryRun) or removes the complete generations of app older
// than the newest keep. A generation that deployments still use is listed
// with Skip and kept.
func Retain(ctx context.Context, store layering.Store, app string, keep int, dryRun bool) ([]Item, error) {
	gens, err := catalog.Generations(ctx, store, app)
	if err != nil {
		return nil, err
	}
	// The newest keep of each engine (an app of engine auto has a
	// generation per engine at each checkpoint).
	// Retired ones (their removal was asked) do not count.
	newer := map[engine.Name]int{}
	var old []spec.Generation
	for i := len(gens) - 1; i >= 0; i-- {
		if gens[i].Retired {
			old = append([]spec.Generation{gens[i]}, old...)
		} else if newer[gens[i].Engine]++; newer[gens[i].Engine] > keep {
			old = append([]spec.Generation{gens[i]}, old...)
		}
	}
	var out []Item
	for _, g := range old {
		why := fmt.Sprintf("older than the newest %d of %s", keep, g.Engine)
		if g.Retired {
			why = "retired (its removal was asked)"
		}
		it := Item{Kind: KindGeneration, Name: fmt.Sprintf("%s/%d", app, g.Gen), App: app, Gen: g.Gen,
			Images: []string{g.EnvSnap.Image, g.CkptSnap.Image}, Reason: why}
		users, err := generationUsers(ctx, store, g)
		if err != nil {
			return nil, err
		}
		if users > 0 {
			it.Skip, it.Reason = true, fmt.Sprintf("%s, but used by %d instance(s) or node copies", why, users)
		} else if !dryRun {
			if err := catalog.RemoveGeneration(ctx, store, app, g.Gen); err != nil {
				return out, err
			}
		}
		out = append(out, it)
	}
	return out, nil
}
