// Package catalog is the PoP's catalog of checkpoint generations, kept in
// the pool itself: the sealed snapshot pairs (environment + checkpoint
// image) an app's restores come from, the names of the images that
// generations, instances and nodes' copies take, the metadata that marks
// them, and the listing and removal of generations. fogctl and gc read it
// without a deployer; the deployer (package deploy) through it.
package catalog

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// Image names and metadata.
const (
	// GenPrefix starts the images of a checkpoint generation:
	// fdc-<app>-<gen>-env and fdc-<app>-<gen>-ckpt.
	GenPrefix = "fdc-"
	// InstancePrefix starts the clones of a deployment: fdi-<id>-env and
	// fdi-<id>-ckpt.
	InstancePrefix = "fdi-"
	// MetaGeneration holds the Generation record (JSON) on the checkpoint
	// image of a generation.
	MetaGeneration = "fogdeploy.generation"
	// MetaDeployment names the deployment that owns an instance clone.
	MetaDeployment = "fogdeploy.deployment"
	// MetaRetired marks a generation whose removal was asked while nodes
	// held copies of it (RemoveGeneration): no deploy restores it, and
	// the nodes drop their copies.
	MetaRetired = "fogdeploy.retired"
	// MetaRestores names the generation ("<app>/<gen>") whose node copy an
	// instance's writable image lies under (the shared read path: the
	// image is a clone of a blank filesystem, not of the generation).
	MetaRestores = "fogdeploy.restores"
	// MetaNode names the node that made an instance clone or a generation.
	MetaNode = "fogdeploy.node"
	// MetaSlot names the slot an instance clone was made for.
	MetaSlot = "fogdeploy.slot"
	// MetaEtcd is the etcd revision the node that made an image had seen
	// when it named the image's owner (a deployment, a generation): the
	// image's own record that its owner existed then. gc never takes for
	// an orphan an image whose owner the PoP's etcd did not hold at that
	// revision (an etcd restored from an older backup).
	MetaEtcd = "fogdeploy.etcd"
)

// GenImage names image kind ("env" or "ckpt") of generation gen of app.
func GenImage(app string, gen int, kind string) string {
	return fmt.Sprintf("%s%s-%d-%s", GenPrefix, app, gen, kind)
}

// ParseGenImage splits fdc-<app>-<gen>-<env|ckpt>; ok is false for any
// other name.
func ParseGenImage(name string) (app string, gen int, kind string, ok bool) {
	rest, ok := strings.CutPrefix(name, GenPrefix)
	if !ok {
		return "", 0, "", false
	}
	i := strings.LastIndex(rest, "-")
	if i < 0 {
		return "", 0, "", false
	}
	rest, kind = rest[:i], rest[i+1:]
	j := strings.LastIndex(rest, "-")
	if j <= 0 || (kind != "env" && kind != "ckpt") {
		return "", 0, "", false
	}
	gen, err := strconv.Atoi(rest[j+1:])
	if err != nil || gen < 1 || GenImage(rest[:j], gen, kind) != name {
		return "", 0, "", false
	}
	return rest[:j], gen, kind, true
}

// Generations returns the complete checkpoint generations of app in the
// store's pool, oldest first.
func Generations(ctx context.Context, store layering.Store, app string) ([]spec.Generation, error) {
	nums, err := GenNumbers(ctx, store, app)
	if err != nil {
		return nil, err
	}
	var out []spec.Generation
	for _, n := range nums {
		g, ok, err := ReadGen(ctx, store, app, n)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, g)
		}
	}
	return out, nil
}

// GenNumbers returns the numbers of app's generations whose checkpoint
// image is in the store's pool (sealed or not), ascending.
func GenNumbers(ctx context.Context, store layering.Store, app string) ([]int, error) {
	names, err := store.List(ctx)
	if err != nil {
		return nil, err
	}
	var nums []int
	pre := GenPrefix + app + "-"
	for _, n := range names {
		rest, ok := strings.CutPrefix(n, pre)
		if !ok || !strings.HasSuffix(rest, "-ckpt") {
			continue
		}
		g, err := strconv.Atoi(strings.TrimSuffix(rest, "-ckpt"))
		if err != nil || GenImage(app, g, "ckpt") != n {
			continue
		}
		nums = append(nums, g)
	}
	sort.Ints(nums)
	return nums, nil
}

// ReadGen reads the record of generation gen of app from its checkpoint
// image's metadata; ok is false while it is not sealed (or gone).
func ReadGen(ctx context.Context, store layering.Store, app string, gen int) (spec.Generation, bool, error) {
	img := GenImage(app, gen, "ckpt")
	md, err := store.Meta(ctx, img)
	if errors.Is(err, layering.ErrNotFound) {
		return spec.Generation{}, false, nil
	} else if err != nil {
		return spec.Generation{}, false, err
	}
	raw := md[MetaGeneration]
	if raw == "" {
		return spec.Generation{}, false, nil // not sealed yet (or a crash before sealing)
	}
	var g spec.Generation
	if err := json.Unmarshal([]byte(raw), &g); err != nil {
		return spec.Generation{}, false, fmt.Errorf("generation record of %s: %w", img, err)
	}
	g.Retired = md[MetaRetired] != ""
	return g, true, nil
}

// ErrHeldByNodes: a generation's removal waits for nodes to drop their
// read-only copies of its environment (it wraps layering.ErrHasChildren).
var ErrHeldByNodes = fmt.Errorf("held by nodes' copies: %w", layering.ErrHasChildren)

// RemoveGeneration removes generation gen of app from the pool; it refuses,
// wrapping layering.ErrHasChildren, while deployments still use it. When
// only nodes' copies of its environment hold it, it retires the generation
// (MetaRetired: no deploy restores it, and the agents drop their copies)
// and returns ErrHeldByNodes: removing it again then succeeds.
//
// The checkpoint image names the generation (Generations lists it), so it
// goes last, after the generation is retired and its environment is gone:
// a removal cut short leaves a retired generation that removing again
// finishes, never an environment image that nothing lists. It wraps
// layering.ErrNotFound only when both images are gone.
func RemoveGeneration(ctx context.Context, store layering.Store, app string, gen int) error {
	kinds := []string{"env", "ckpt"} // the order of removal
	var present, copies, users []string
	for _, kind := range kinds {
		img := GenImage(app, gen, kind)
		info, err := store.Stat(ctx, img)
		if errors.Is(err, layering.ErrNotFound) {
			continue
		} else if err != nil {
			return fmt.Errorf("generation %d of %s: %w", gen, app, err)
		}
		present = append(present, kind)
		if _, sealed := info.Snapshot(layering.SealedSnap); !sealed {
			continue // never sealed, or a removal cut short took its snapshot
		}
		kids, err := store.Children(ctx, layering.SnapRef{Image: img, Snap: layering.SealedSnap})
		if err != nil {
			return fmt.Errorf("generation %d of %s: %w", gen, app, err)
		}
		for _, k := range kids {
			if IsLowerName(k) {
				copies = append(copies, k)
			} else {
				users = append(users, k)
			}
		}
	}
	if len(users) == 0 && len(copies) > 0 {
		// Instances whose writable image is not a clone of the
		// generation's (the shared read path) still read it.
		var err error
		if users, err = restoring(ctx, store, app, gen); err != nil {
			return err
		}
	}
	if len(users) > 0 {
		return fmt.Errorf("generation %d of %s is used by %d instance(s) (%s): %w", gen, app, len(users), strings.Join(users, ", "), layering.ErrHasChildren)
	}
	if len(copies) > 0 {
		// Retired: no deploy takes it any more, so the nodes drop their
		// copies at their next pool refill.
		if err := retire(ctx, store, app, gen); err != nil {
			return err
		}
		return hint.With(fmt.Errorf("generation %d of %s is held by %d node(s) as their read-only copy of its environment (%s): %w",
			gen, app, len(copies), strings.Join(copies, ", "), ErrHeldByNodes),
			"it is retired: no deploy restores it now, and each agent drops its copy at its next pool refill (agent.reconcile_interval); remove it again then, or let fogctl gc do it")
	}
	if len(present) == 0 {
		return fmt.Errorf("generation %d of %s: %w", gen, app, layering.ErrNotFound)
	}
	if slices.Contains(present, "ckpt") {
		if err := retire(ctx, store, app, gen); err != nil {
			return err
		}
	}
	for _, kind := range present {
		img := GenImage(app, gen, kind)
		if err := store.Remove(ctx, img); err != nil && !errors.Is(err, layering.ErrNotFound) {
			return fmt.Errorf("generation %d of %s: %w", gen, app, err)
		}
		// "Not found" from a removal may come from inside it (a snapshot,
		// a clone's parent): the checkpoint image, which lists the
		// generation, goes only once the environment is really gone.
		if _, err := store.Stat(ctx, img); err == nil {
			return fmt.Errorf("generation %d of %s: %s is still there after its removal: %w", gen, app, img, layering.ErrBusy)
		} else if !errors.Is(err, layering.ErrNotFound) {
			return fmt.Errorf("generation %d of %s: %w", gen, app, err)
		}
	}
	return nil
}

// retire marks generation gen of app retired (MetaRetired), once. A
// generation whose checkpoint image is gone is not listed anyway.
func retire(ctx context.Context, store layering.Store, app string, gen int) error {
	img := GenImage(app, gen, "ckpt")
	info, err := store.Stat(ctx, img)
	if errors.Is(err, layering.ErrNotFound) {
		return nil
	} else if err != nil {
		return err
	}
	if info.Meta[MetaRetired] != "" {
		return nil
	}
	return store.SetMeta(ctx, img, map[string]string{MetaRetired: time.Now().UTC().Format(time.RFC3339)})
}

// restoring returns the instance images of app that say they restore
// generation gen (MetaRestores).
func restoring(ctx context.Context, store layering.Store, app string, gen int) ([]string, error) {
	names, err := store.List(ctx)
	if err != nil {
		return nil, err
	}
	want := app + "/" + strconv.Itoa(gen)
	var users []string
	for _, n := range names {
		if !strings.HasPrefix(n, InstancePrefix+app+"-") || IsLowerName(n) {
			continue
		}
		info, err := store.Stat(ctx, n)
		if errors.Is(err, layering.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if info.Meta[MetaRestores] == want {
			users = append(users, n)
		}
	}
	return users, nil
}

// LowerImage is the name of node's read-only copy of generation gen of
// app: fdi-<app>-l<gen>-<8 hex digits of the node's name>.
func LowerImage(app string, gen int, node string) string {
	sum := sha256.Sum256([]byte(node))
	return InstancePrefix + app + "-l" + strconv.Itoa(gen) + "-" + hex.EncodeToString(sum[:4])
}

// IsLowerImage reports whether an image is a node's read-only copy of a
// generation's environment, by its metadata (as Stat returns it).
func IsLowerImage(meta map[string]string) bool { return meta[MetaLower] != "" }

// lowerName matches the names LowerImage gives.
var lowerName = regexp.MustCompile(`^` + InstancePrefix + `.+-l[0-9]+-[0-9a-f]{8}$`)

// IsLowerName reports whether an image name is one that LowerImage gives.
func IsLowerName(name string) bool { return lowerName.MatchString(name) }

// MetaLower marks a node's read-only copy of a generation's environment
// ("<app>/<gen>").
const MetaLower = "fogdeploy.lower"

// RemoveSuspension removes the images of suspension susp, in order (a
// parent after its clone); those already gone are skipped.
func RemoveSuspension(ctx context.Context, store layering.Store, susp spec.Suspension) error {
	for _, img := range susp.Images() {
		if err := store.Remove(ctx, img); err != nil && !errors.Is(err, layering.ErrNotFound) {
			return fmt.Errorf("remove image %s: %w", img, err)
		}
	}
	return nil
}
