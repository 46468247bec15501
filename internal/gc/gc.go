// Package gc finds and removes what fogdeploy left in a PoP's pool and
// etcd without an owner, and the checkpoint generations beyond retention.
//
//	plan, err := gc.Plan(ctx, gc.Config{Store: s, State: st, Keep: 3})
//	for _, it := range plan { fmt.Println(it.Kind, it.Name, it.Reason) }
//	removed, err := gc.Apply(ctx, cfg, plan)
//
// It never removes a snapshot with live clones (a generation in use is
// listed with Skip set and the reason), an incomplete generation while its
// app's checkpoint lock is held, or anything younger than Config.MinAge;
// and it plans nothing (state.ErrFenced) against an etcd that may not be
// the PoP's: one without a PoP record while the pool holds fogdeploy's
// images, or one that a registered node is fenced from. An image whose own
// record of its owner (catalog.MetaEtcd) this etcd contradicts is kept
// (keepUnseenOwners): an etcd restored from an older backup.
// Node-local leftovers (containers, mappings, mounts) are each agent's to
// sweep; see pop-agent.
package gc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/state"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// Kinds of Item.
const (
	// KindGeneration: a complete generation beyond retention (Name "app/gen").
	KindGeneration = "generation"
	// KindPartial: the images of a generation that was never sealed.
	KindPartial = "partial-generation"
	// KindClone: an instance clone whose deployment is gone, a NotReady
	// node's read-only copy of a generation, or a NotReady node's pool
	// slot that no deployment holds.
	KindClone = "clone"
	// KindRecord: an etcd checkpoint record whose images are gone.
	KindRecord = "checkpoint-record"
	// KindStatus: the status of a withdrawn deployment on a NotReady node.
	KindStatus = "status"
	// KindBlank: a blank filesystem image of the pool that no clone uses
	// (a node makes it again when it needs it).
	KindBlank = "blank"
	// KindExec: a throwaway clone of `fogctl env exec` older than MinAge,
	// which an exec killed halfway left (one still running keeps it).
	KindExec = "exec-clone"
)

// Item is one thing to remove (or, with Skip, kept on purpose).
type Item struct {
	Kind   string `json:"kind"`
	Name   string `json:"name"`
	Reason string `json:"reason"`
	// Images are the RBD images the item removes.
	Images []string `json:"images,omitempty"`
	Skip   bool     `json:"skip,omitempty"`
	// App and Gen name the generation of generation and record items.
	App string `json:"app,omitempty"`
	Gen int    `json:"gen,omitempty"`
}

// Config says where to look and what to keep.
type Config struct {
	Store layering.Store
	State *state.Store
	// Keep is how many complete generations per app to keep (at least 1).
	Keep int
	// MinAge spares orphans younger than this (fogctl's default is 10
	// minutes): a deploy or checkpoint may still be making them.
	MinAge time.Duration
	// Apps limits retention and partial generations to these apps (all
	// when empty).
	Apps []string
	// Blanks also removes the pool's sealed blank filesystem images that
	// no clone uses. They belong to the pool, not to a PoP: every PoP of
	// the pool shares them, and a node makes one again when it needs it.
	Blanks bool
}

// Plan lists what Apply would remove, and the generations beyond
// retention that are kept because deployments use them.
func Plan(ctx context.Context, c Config) ([]Item, error) {
	if c.Keep < 1 {
		return nil, fmt.Errorf("gc: keep %d: keep at least 1 generation per app", c.Keep)
	}
	v, err := c.view(ctx)
	if err != nil {
		return nil, err
	}
	plan, apps, err := c.imageItems(ctx, v)
	if err != nil {
		return nil, err
	}
	for app := range apps {
		items, err := Retain(ctx, c.Store, app, c.Keep, true)
		if err != nil {
			return nil, err
		}
		plan = append(plan, items...)
	}
	records, err := c.recordItems(ctx, v)
	if err != nil {
		return nil, err
	}
	plan = append(plan, records...)
	stale, err := staleStatuses(ctx, c.State, v.nodes)
	if err != nil {
		return nil, err
	}
	plan = append(plan, stale...)
	last, err := c.State.LastBackup(ctx)
	if err != nil {
		return nil, err
	}
	if err := c.keepUnseenOwners(ctx, plan, last); err != nil {
		return nil, err
	}
	sort.SliceStable(plan, func(i, j int) bool {
		if plan[i].Kind != plan[j].Kind {
			return plan[i].Kind < plan[j].Kind
		}
		return plan[i].Name < plan[j].Name
	})
	return plan, nil
}

// popView is what Plan reads of the pool and the PoP's state before it
// decides.
type popView struct {
	names      []string // the pool's images
	nodes      []state.Node
	known      map[string]bool // node names
	down       map[string]bool // nodes whose agent's lease is gone
	desired    map[string]bool // deployment IDs
	slots      slotUse
	registered []spec.App
	recs       []spec.Generation
	recorded   map[string]bool // app/gen of every generation record
	apps       []string        // Config.Apps: only these (none: all)
}

// view reads the pool and the PoP's state, and refuses when etcd is not
// the PoP's (checkControlPlane).
func (c Config) view(ctx context.Context) (*popView, error) {
	v := &popView{known: map[string]bool{}, down: map[string]bool{}, desired: map[string]bool{}, recorded: map[string]bool{}, apps: c.Apps}
	var err error
	if v.names, err = c.Store.List(ctx); err != nil {
		return nil, err
	}
	deps, err := c.State.Deployments(ctx)
	if err != nil {
		return nil, err
	}
	if v.nodes, err = c.State.Nodes(ctx); err != nil {
		return nil, err
	}
	if err := checkControlPlane(ctx, c.State, v.names, v.nodes); err != nil {
		return nil, err
	}
	for _, n := range v.nodes {
		v.known[n.Name], v.down[n.Name] = true, !n.Ready
	}
	for _, d := range deps {
		v.desired[d.ID] = true
	}
	if v.slots, err = slotOwners(ctx, c.State, deps); err != nil {
		return nil, err
	}
	// Only this PoP's apps: a pool may serve more than one PoP.
	if v.registered, err = c.State.Apps(ctx); err != nil {
		return nil, err
	}
	if v.recs, err = c.State.Checkpoints(ctx, ""); err != nil {
		return nil, err
	}
	for _, g := range v.recs {
		v.recorded[g.App+"/"+strconv.Itoa(g.Gen)] = true
	}
	return v, nil
}

func (v *popView) isRegistered(app string) bool {
	return slices.ContainsFunc(v.registered, func(a spec.App) bool { return a.Name == app })
}

func (v *popView) selected(app string) bool { return len(v.apps) == 0 || slices.Contains(v.apps, app) }

func (v *popView) want(app string) bool { return v.isRegistered(app) && v.selected(app) }

// imageItems goes through the pool's images: the unsealed images of
// generations (one item per generation), the blank filesystems (with
// Config.Blanks), the clones of `fogctl env exec` and the instances' clones
// that nothing owns. apps are the registered apps whose generations
// Retain then trims.
func (c Config) imageItems(ctx context.Context, v *popView) (plan []Item, apps map[string]bool, err error) {
	apps = map[string]bool{}
	partial := map[string]*Item{}
	for _, n := range v.names {
		var it *Item
		app, gen, _, ok := catalog.ParseGenImage(n)
		switch {
		case ok && (v.want(app) || !v.isRegistered(app) && v.selected(app) && !v.recorded[app+"/"+strconv.Itoa(gen)]):
			if v.isRegistered(app) {
				apps[app] = true
				it, err = c.partial(ctx, n, app, gen, v.known)
			} else {
				it, err = c.unrecorded(ctx, n, app, gen, v.known)
			}
			if err != nil {
				return nil, nil, err
			}
			if it != nil {
				key := app + "/" + strconv.Itoa(gen)
				if p, ok := partial[key]; ok {
					p.Images = append(p.Images, n)
				} else {
					partial[key] = it
				}
			}
			continue
		case layering.IsBlankName(n):
			if !c.Blanks {
				continue
			}
			it, err = c.blank(ctx, n)
		case strings.HasPrefix(n, layering.ExecPrefix):
			it, err = c.execClone(ctx, n)
		case strings.HasPrefix(n, catalog.InstancePrefix):
			it, err = c.clone(ctx, n, v.known, v.down, v.desired, v.slots)
		}
		if err != nil {
			return nil, nil, err
		}
		if it != nil {
			plan = append(plan, *it)
		}
	}
	for _, it := range partial {
		plan = append(plan, *it)
	}
	return plan, apps, nil
}

// recordItems goes through the generation records: those of apps removed
// from the PoP go with their images; a record whose checkpoint image is
// gone goes alone.
func (c Config) recordItems(ctx context.Context, v *popView) ([]Item, error) {
	var plan []Item
	for _, g := range v.recs {
		if !v.isRegistered(g.App) && v.selected(g.App) {
			// A generation of an app removed from this PoP (its record is
			// in this PoP's etcd): it goes with its images.
			it, err := removedAppGeneration(ctx, c.Store, g)
			if err != nil {
				return nil, err
			}
			plan = append(plan, it)
			continue
		}
		if !v.want(g.App) {
			continue
		}
		if _, err := c.Store.Stat(ctx, g.CkptSnap.Image); errors.Is(err, layering.ErrNotFound) {
			plan = append(plan, Item{Kind: KindRecord, Name: fmt.Sprintf("%s/%d", g.App, g.Gen), App: g.App, Gen: g.Gen,
				Reason: "its checkpoint image " + g.CkptSnap.Image + " is gone"})
		} else if err != nil {
			return nil, err
		}
	}
	return plan, nil
}

// partial returns an item for an image of a generation that was never
// sealed, made by a node of this PoP, if it is old enough and nobody holds
// its app's checkpoint lock.
func (c Config) partial(ctx context.Context, name, app string, gen int, known map[string]bool) (*Item, error) {
	info, err := c.Store.Stat(ctx, catalog.GenImage(app, gen, "ckpt"))
	if err == nil && info.Meta[catalog.MetaGeneration] != "" {
		return nil, nil // sealed
	}
	if err != nil && !errors.Is(err, layering.ErrNotFound) {
		return nil, err
	}
	if ours, err := c.oursAndOld(ctx, name, known); err != nil || !ours {
		return nil, err
	}
	locked, err := c.State.CheckpointLocked(ctx, app)
	if err != nil || locked {
		return nil, err
	}
	return &Item{Kind: KindPartial, Name: fmt.Sprintf("%s/%d", app, gen), Images: []string{name}, App: app, Gen: gen,
		Reason: "never sealed, and no agent is checkpointing " + app}, nil
}

// unrecorded returns an item for an image of a generation of an app that
// is not registered here and that no checkpoint record names (a removal
// cut short left it), if a node of this PoP made it and it is old enough.
func (c Config) unrecorded(ctx context.Context, name, app string, gen int, known map[string]bool) (*Item, error) {
	if ours, err := c.oursAndOld(ctx, name, known); err != nil || !ours {
		return nil, err
	}
	if users, err := generationUsers(ctx, c.Store, spec.Generation{
		EnvSnap:  layering.SnapRef{Image: catalog.GenImage(app, gen, "env"), Snap: layering.SealedSnap},
		CkptSnap: layering.SnapRef{Image: catalog.GenImage(app, gen, "ckpt"), Snap: layering.SealedSnap},
	}); err != nil || users > 0 {
		return nil, err
	}
	return &Item{Kind: KindPartial, Name: fmt.Sprintf("%s/%d", app, gen), Images: []string{name}, App: app, Gen: gen,
		Reason: "its app was removed, and no checkpoint record names it"}, nil
}

// oursAndOld says whether image name exists, a node of this PoP (known)
// made it, and it is older than MinAge.
func (c Config) oursAndOld(ctx context.Context, name string, known map[string]bool) (bool, error) {
	info, err := c.Store.Stat(ctx, name)
	if errors.Is(err, layering.ErrNotFound) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	return known[info.Meta[catalog.MetaNode]] && time.Since(info.Created) >= c.MinAge, nil
}

// clone returns an item for an instance clone made by a node of this PoP
// for a deployment that is neither desired nor has a status, or for a
// node's read-only copy of a generation's environment while its node is
// NotReady (a node that is back makes it again; removing it refuses while
// its node still maps it).
func (c Config) clone(ctx context.Context, name string, known, down, desired map[string]bool, slots slotUse) (*Item, error) {
	info, err := c.Store.Stat(ctx, name)
	if errors.Is(err, layering.ErrNotFound) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	node, id, slot := info.Meta[catalog.MetaNode], info.Meta[catalog.MetaDeployment], info.Meta[catalog.MetaSlot]
	if id == "" && slot != "" {
		// A warm pool's slot, or the slot a pool hit bound (its clones
		// keep the slot's name and metadata): while its node is away,
		// nobody else releases it, and it holds its generation.
		if !known[node] || !down[node] || slots.bound[node+"/"+slot] || time.Since(info.Created) < c.MinAge {
			return nil, nil
		}
		if ids := slots.unsure[node]; len(ids) > 0 {
			// Listed, not removed: the operator learns what holds it.
			return &Item{Kind: KindClone, Name: name, Skip: true,
				Reason: fmt.Sprintf("node %s's pool slot %s, and the node is NotReady, but deployment(s) %s on it may have bound it "+
					"(a status names no slot until its deploy ends): undeploy them, or bring the node back, and gc removes it", node, slot, strings.Join(ids, ", "))}, nil
		}
		return &Item{Kind: KindClone, Name: name, Images: []string{name},
			Reason: fmt.Sprintf("node %s's pool slot %s, bound to no deployment, and the node is NotReady", node, slot)}, nil
	}
	if catalog.IsLowerImage(info.Meta) {
		if !known[node] || !down[node] || time.Since(info.Created) < c.MinAge {
			return nil, nil
		}
		return &Item{Kind: KindClone, Name: name, Images: []string{name},
			Reason: fmt.Sprintf("node %s's copy of %s's environment, and the node is NotReady", node, info.Meta[catalog.MetaLower])}, nil
	}
	// Only clones this PoP's nodes made: a pool may serve more than one.
	if !known[node] || id == "" || desired[id] || time.Since(info.Created) < c.MinAge {
		return nil, nil
	}
	if slots.status[id] {
		return nil, nil // its agent is still undeploying it
	}
	return &Item{Kind: KindClone, Name: name, Images: []string{name},
		Reason: fmt.Sprintf("deployment %s (node %s) is gone", id, node)}, nil
}

// execClone returns an item for Exec's throwaway clone name if it is older
// than MinAge. Which exec made it is not recorded: one still running maps
// it, and Apply's removal then refuses and keeps it.
func (c Config) execClone(ctx context.Context, name string) (*Item, error) {
	info, err := c.Store.Stat(ctx, name)
	if errors.Is(err, layering.ErrNotFound) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	if time.Since(info.Created) < c.MinAge {
		return nil, nil
	}
	return &Item{Kind: KindExec, Name: name, Images: []string{name},
		Reason: "a throwaway clone of `fogctl env exec` that its exec did not remove (it was killed)"}, nil
}

// blank returns an item for the pool's blank filesystem image name if it
// is sealed, no clone uses it and it is older than MinAge. Removing it is
// safe against a clone made meanwhile: the removal refuses while its
// snapshot has clones, and a node whose clone finds it gone makes it
// again.
func (c Config) blank(ctx context.Context, name string) (*Item, error) {
	info, err := c.Store.Stat(ctx, name)
	if errors.Is(err, layering.ErrNotFound) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	snap, ok := info.Snapshot(layering.SealedSnap)
	if !ok || !snap.Protected || time.Since(info.Created) < c.MinAge {
		return nil, nil // being made (a killed maker's remains go at the next make)
	}
	kids, err := c.Store.Children(ctx, layering.SnapRef{Image: name, Snap: layering.SealedSnap})
	if err != nil && !errors.Is(err, layering.ErrNotFound) {
		return nil, err
	}
	if len(kids) > 0 {
		return nil, nil
	}
	return &Item{Kind: KindBlank, Name: name, Images: []string{name},
		Reason: fmt.Sprintf("the pool's blank filesystem of %s, and no clone uses it", strings.TrimPrefix(name, layering.BlankPrefix)+" bytes")}, nil
}

// Apply removes the items of a plan that are not skipped, and returns
// those it removed, and, with Skip set, an exec's clone it found in use;
// it goes on past failures and joins their errors.
func Apply(ctx context.Context, c Config, plan []Item) ([]Item, error) {
	var done []Item
	var errs []error
	for _, it := range plan {
		if it.Skip {
			continue
		}
		var err error
		switch it.Kind {
		case KindGeneration:
			err = RemoveGeneration(ctx, c.Store, c.State, it.App, it.Gen)
		case KindPartial, KindClone:
			for _, img := range it.Images {
				if e := c.Store.Remove(ctx, img); e != nil && !errors.Is(e, layering.ErrNotFound) {
					err = errors.Join(err, e)
				}
			}
		case KindExec:
			e := c.Store.Remove(ctx, it.Name)
			if errors.Is(e, layering.ErrBusy) {
				// An exec still runs in it.
				it.Skip, it.Reason = true, "a throwaway clone of `fogctl env exec`, mapped: its exec still runs (or its client died under a minute ago)"
				done = append(done, it)
				continue
			}
			if !errors.Is(e, layering.ErrNotFound) {
				err = e
			}
		case KindBlank:
			e := c.Store.Remove(ctx, it.Name)
			if errors.Is(e, layering.ErrHasChildren) {
				continue // cloned since the plan: in use again
			}
			if !errors.Is(e, layering.ErrNotFound) {
				err = e
			}
		case KindRecord:
			err = c.State.DeleteCheckpoint(ctx, it.App, it.Gen)
		case KindStatus:
			err = c.State.ForgetStatus(ctx, it.Name)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", it.Kind, it.Name, err))
			continue
		}
		done = append(done, it)
	}
	return done, errors.Join(errs...)
}
