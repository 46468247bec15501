// The generation a restore without a pool slot takes: the one this node's
// last full lookup of the app gave (Deployer.known), checked while the
// restore runs (its record as it was, not retired, none newer), where a lookup
// would list the app's generations and read their records first.

package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// knownGens remembers, per app and engine asked ("": any), the
// generation of the app's last lookup on this node that the node can
// restore. It is only ever a first guess: every use is checked (knownGen).
type knownGens struct {
	mu sync.Mutex
	m  map[knownKey]spec.Generation
}

type knownKey struct {
	app string
	eng engine.Name
}

func (k *knownGens) get(app string, eng engine.Name) (spec.Generation, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	g, ok := k.m[knownKey{app, eng}]
	return g, ok
}

func (k *knownGens) set(app string, eng engine.Name, g spec.Generation) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[knownKey]spec.Generation{}
	}
	k.m[knownKey{app, eng}] = g
}

func (k *knownGens) forget(app string, eng engine.Name) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.m, knownKey{app, eng})
}

// knownGen returns the generation of app (engine eng) that this node's
// last lookup gave, if it still runs app's process, and fresh, which
// says (wrapping errNewerGen) whether it is still the app's newest
// restorable one: its record is there as it was, not retired, and no
// newer generation is (newerGen). fresh runs meanwhile; a restore into a
// spare slot waits for it before it binds, one that provisions a slot of
// its own before it provisions.
func (c *Checkpoints) knownGen(ctx context.Context, app spec.App, eng engine.Name) (g spec.Generation, fresh func() error, ok bool) {
	g, ok = c.known.get(app.Name, eng)
	if !ok || (len(g.Spec.Command) > 0 && !g.Spec.SameProcess(app)) {
		return spec.Generation{}, nil, false
	}
	return g, async(func() error {
		now, ok, err := catalog.ReadGen(context.WithoutCancel(ctx), c.deps.Store, app.Name, g.Gen)
		if err != nil {
			return fmt.Errorf("app %s: whether generation %d is still there: %w (%w)", app.Name, g.Gen, err, errNewerGen)
		}
		var stale string
		switch {
		case !ok:
			stale = "is gone"
		case now.Retired:
			stale = "is retired"
		case !sameRecord(now, g):
			// Written again since (its platform, its engine's version):
			// the lookup checks it anew.
			stale = "has another record"
		}
		if stale != "" {
			c.known.forget(app.Name, eng)
			return fmt.Errorf("app %s: generation %d %s: %w", app.Name, g.Gen, stale, errNewerGen)
		}
		return c.stillNewest(ctx, app.Name, g.Gen)
	}), true
}

// sameRecord reports whether a and b are the same generation record as
// it is stored.
func sameRecord(a, b spec.Generation) bool {
	ra, erra := json.Marshal(a)
	rb, errb := json.Marshal(b)
	return erra == nil && errb == nil && bytes.Equal(ra, rb)
}

// stillNewest says, wrapping errNewerGen, whether app may have a
// generation newer than gen (newerGen): the deploy then looks the newest
// up.
func (c *Checkpoints) stillNewest(ctx context.Context, app string, gen int) error {
	switch newer, err := c.newerGen(ctx, app, gen); {
	case err != nil:
		// The full lookup says what is wrong.
		return fmt.Errorf("app %s: whether a generation is newer than %d: %w (%w)", app, gen, err, errNewerGen)
	case newer:
		return fmt.Errorf("app %s: a generation newer than %d: %w", app, gen, errNewerGen)
	}
	return nil
}

// newestGen is the number of app's newest generation in the pool (0 for
// none), from a listing that started after the call.
func (c *Checkpoints) newestGen(ctx context.Context, app string) (int, error) {
	lctx := context.WithoutCancel(ctx) // a listing may answer callers other than this one
	return c.newest.Do(ctx, app, func() (int, error) {
		nums, err := catalog.GenNumbers(lctx, c.deps.Store, app)
		if err != nil || len(nums) == 0 {
			return 0, err
		}
		return nums[len(nums)-1], nil
	})
}

// newerGen says whether app has a generation newer than gen in the pool,
// sealed or being made. Generation numbers are given in order (nextGen:
// one past the highest in use), so a newer one exists only if gen+1 does:
// one read of an object that is not there, where a listing of the pool
// reads every image's name. Where gen+1 exists, the pool's listing says
// whether it is newer than every other (newestGen).
//
// Simultaneous hits share one read that started after each asked
// (coalesce): eight deploys arriving at once make one or two round trips
// to the cluster, not eight.
func (c *Checkpoints) newerGen(ctx context.Context, app string, gen int) (bool, error) {
	lctx := context.WithoutCancel(ctx) // a read may answer callers other than this one
	return c.newer.Do(ctx, appGen{app, gen}, func() (bool, error) {
		_, err := c.deps.Store.Meta(lctx, catalog.GenImage(app, gen+1, "ckpt"))
		if errors.Is(err, layering.ErrNotFound) {
			return false, nil
		} else if err != nil {
			return false, err
		}
		newest, err := c.newestGen(lctx, app)
		return newest != gen, err
	})
}
