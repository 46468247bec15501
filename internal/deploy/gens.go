package deploy

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/gencache"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// The deployer's view of the generation catalog (package catalog): the
// generations an app has, the one a deploy restores, the next number, and
// a removal that drops this node's copies too.

// Generations returns the complete checkpoint generations of app, oldest
// first.
func (c *Checkpoints) Generations(ctx context.Context, app string) ([]spec.Generation, error) {
	return catalog.Generations(ctx, c.deps.Store, app)
}

// Latest returns app's newest complete generation that is not retired,
// or ErrNoCheckpoint.
func (c *Checkpoints) Latest(ctx context.Context, app string) (spec.Generation, error) {
	gens, err := c.Generations(ctx, app)
	if err != nil {
		return spec.Generation{}, err
	}
	for i := len(gens) - 1; i >= 0; i-- {
		if !gens[i].Retired {
			return gens[i], nil
		}
	}
	return spec.Generation{}, fmt.Errorf("app %s: %w", app, ErrNoCheckpoint)
}

// CurrentOf returns the newest complete generation of app of engine eng
// (any engine when eng is "", else the newest of any engine when eng has
// none), among those that can stand for app as it is now
// (spec.App.SameProcess): the checkpoints of an app that was removed and
// created again with another command, user or environment are not
// restored, and its next deploy produces a new one. ErrNoCheckpoint when
// there is none.
func (c *Checkpoints) CurrentOf(ctx context.Context, app spec.App, eng engine.Name) (spec.Generation, error) {
	// Newest first, each record read only if no newer one stands: a
	// deploy reads one as a rule.
	nums, err := catalog.GenNumbers(ctx, c.deps.Store, app.Name)
	if err != nil {
		return spec.Generation{}, err
	}
	var newest *spec.Generation
	for i := len(nums) - 1; i >= 0; i-- {
		g, ok, err := catalog.ReadGen(ctx, c.deps.Store, app.Name, nums[i])
		if err != nil {
			return spec.Generation{}, err
		}
		if !ok || g.Retired || (len(g.Spec.Command) > 0 && !g.Spec.SameProcess(app)) {
			continue
		}
		if newest == nil {
			newest = &g
		}
		if eng == "" || g.Engine == eng {
			return g, nil
		}
	}
	if newest == nil {
		return spec.Generation{}, fmt.Errorf("app %s (as it is now): %w", app.Name, ErrNoCheckpoint)
	}
	return *newest, nil
}

// nextGen is one past the highest generation number in use, sealed or not.
func (c *Checkpoints) nextGen(ctx context.Context, app string) (int, error) {
	names, err := c.deps.Store.List(ctx)
	if err != nil {
		return 0, err
	}
	next := 1
	pre := catalog.GenPrefix + app + "-"
	for _, n := range names {
		rest, ok := strings.CutPrefix(n, pre)
		if !ok {
			continue
		}
		i := strings.LastIndexByte(rest, '-')
		if i < 0 {
			continue
		}
		if g, err := strconv.Atoi(rest[:i]); err == nil && catalog.GenImage(app, g, rest[i+1:]) == n && g >= next {
			next = g + 1
		}
	}
	return next, nil
}

// RemoveGeneration removes a checkpoint generation. It refuses, wrapping
// layering.ErrHasChildren, while deployments still use it.
// This node's copies of it go too (its environment's first: it is a clone).
func (c *Checkpoints) RemoveGeneration(ctx context.Context, app string, gen int) error {
	if _, err := c.envs.TrimLowers(ctx, func(l Lower) bool { return l.App != app || l.Gen != gen }); err != nil {
		return err
	}
	if err := catalog.RemoveGeneration(ctx, c.deps.Store, app, gen); err != nil {
		return err
	}
	_, err := c.TrimCache(func(k gencache.Key) bool { return k.App != app || k.Gen != gen })
	return err
}
