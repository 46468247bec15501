// The node's read path for environments: every restore of a generation on a node reads the
// generation's environment from one node-level read-only copy of it (a clone of its sealed
// snapshot, mapped and mounted read-only once), through an overlay whose upper directory lives in
// the instance's own writable image, a clone of the pool's blank filesystem (upperSource). The page
// cache of those files is then shared by every instance of the generation on the node, and a
// repeated restore reads next to nothing from the OSDs. The copy is a clone, so that gc sees the
// generation in use while a node holds it; it is journaled in StateDir/lowers/records/<id>.json
// before it is made, kept while an instance uses it or its generation is current, and dropped by
// TrimLowers.

package deploy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/journal"
	"github.com/fogdeploy/fogdeploy/internal/keyedmutex"
	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/mountinfo"
	"github.com/fogdeploy/fogdeploy/internal/overlay"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// EnvCopies are the node's read-only copies of generations' environments
// (each journaled, one maker at a time) and the pool's blank filesystems
// that take an instance's writes over them.
type EnvCopies struct {
	*node
	// lowers are the copies' records, lowerLock one maker of each.
	lowers    journal.Journal[Lower]
	lowerLock keyedmutex.Map[string]
	// blanks are the pool's blank filesystems by size, as found or made:
	// one per environment size.
	blankMu sync.Mutex
	blanks  map[int64]layering.SnapRef
	// used says whether a slot or a deployment of this node reads from a
	// copy (by its ID).
	used func(id string) (bool, error)
}

// EnvCopies returns the node's copies of environments.
func (d *Deployer) EnvCopies() *EnvCopies { return d.envs }

// EnvRead is where a restore reads its environment from (Config.EnvRead).
type EnvRead string

// Environment read paths.
const (
	// EnvShared: the node's read-only copy of the generation's
	// environment, under an overlay whose writes go to the instance's own
	// clone (the default).
	EnvShared EnvRead = "shared"
	// EnvClone: the instance's own clone only, read through its own
	// mapping (every restore reads the environment from the OSDs).
	EnvClone EnvRead = "clone"
)

// StepLower is the wait for the node's read-only copy of the
// generation's environment (made on first use; about 0 after).
const StepLower Step = "lower"

// Lower is the record of the node's read-only copy of a generation's
// environment.
type Lower struct {
	// ID is the record's and the mapping's ID.
	ID  string `json:"id"`
	App string `json:"app"`
	Gen int    `json:"gen"`
	// Sealed is when the generation was sealed (with App and Gen, its
	// identity: a generation number taken again after a removal is
	// another generation).
	Sealed time.Time `json:"sealed"`
	// Image is the clone of the generation's environment snapshot.
	Image string `json:"image"`
	// Root is where it is mounted read-only.
	Root string `json:"root"`
	// Size is the environment's size in bytes: the size of the blank
	// filesystem that takes an instance's writes over it.
	Size int64 `json:"size,omitempty"`
	// Ready: mapped and mounted.
	Ready   bool      `json:"ready"`
	Created time.Time `json:"created"`
}

// LowerIDPrefix starts the record and mapping IDs of the node's copies
// (and so the names of their mount directories).
const LowerIDPrefix = "lower-"

// lowerID is the lower record and mapping ID of generation gen of app.
func lowerID(app string, gen int) string {
	id := LowerIDPrefix + app + "-" + strconv.Itoa(gen)
	if len(id) > spec.MaxIDLen {
		sum := sha256.Sum256([]byte(id))
		id = id[:spec.MaxIDLen-9] + "-" + hex.EncodeToString(sum[:4])
	}
	return id
}

// lowerFor returns the root of the node's read-only copy of generation
// g's environment, making it first if the node has none.
func (e *EnvCopies) lowerFor(ctx context.Context, g spec.Generation) (Lower, error) {
	id := lowerID(g.App, g.Gen)
	unlock := e.lowerLock.Lock(id)
	defer unlock()
	rec, err := e.lowers.Load(id)
	if err == nil && e.lowerReady(rec, g) {
		if rec.Size == 0 {
			// Recorded before its size was.
			err = e.sizeLower(ctx, &rec)
		}
		return rec, err
	}
	if err == nil {
		// Half made, of another generation of that number, or its
		// mount is gone: made again.
		if err := e.dropLower(ctx, rec); err != nil {
			return Lower{}, err
		}
	} else if !errors.Is(err, ErrNoLower) {
		return Lower{}, err
	}
	rec = Lower{ID: id, App: g.App, Gen: g.Gen, Sealed: g.Created, Image: catalog.LowerImage(g.App, g.Gen, e.cfg.Node),
		Root: filepath.Join(e.cfg.StateDir, "lowers", id), Created: time.Now().UTC()}
	if err := e.lowers.Create(id, &rec, true); err != nil {
		return Lower{}, err
	}
	if err := e.makeLower(ctx, g, &rec); err != nil {
		return Lower{}, errors.Join(err, e.dropLower(context.WithoutCancel(ctx), rec))
	}
	e.log.Info("node copy of a generation's environment made", "app", g.App, "gen", g.Gen, "image", rec.Image, "root", rec.Root)
	return rec, nil
}

// lowerReady reports whether rec is the node's whole, mounted copy of
// generation g's environment.
func (e *EnvCopies) lowerReady(rec Lower, g spec.Generation) bool {
	if !rec.Ready || !rec.Sealed.Equal(g.Created) {
		return false
	}
	ok, err := e.deps.Mapper.Mounted(rec.ID)
	return err == nil && ok
}

// lowerSoon returns the node's copy of generation g's environment if it
// holds one; otherwise it starts making it and returns what a slot needs
// of it meanwhile (its app, generation and size, no Root), and made waits
// for the copy.
func (e *EnvCopies) lowerSoon(ctx context.Context, g spec.Generation) (lower Lower, made func() (Lower, error), err error) {
	id := lowerID(g.App, g.Gen)
	if rec, err := e.lowers.Load(id); err == nil && rec.Size > 0 && e.lowerReady(rec, g) {
		return rec, func() (Lower, error) { return rec, nil }, nil
	}
	var got Lower
	wait := async(func() (err error) {
		got, err = e.lowerFor(ctx, g)
		return err
	})
	made = func() (Lower, error) { return got, wait() }
	info, err := e.deps.Store.Stat(ctx, g.EnvSnap.Image)
	if err != nil {
		_, _ = made()
		return Lower{}, made, fmt.Errorf("size of generation %d of %s's environment: %w", g.Gen, g.App, err)
	}
	return Lower{ID: id, App: g.App, Gen: g.Gen, Sealed: g.Created, Size: info.Size}, made, nil
}

func (e *EnvCopies) makeLower(ctx context.Context, g spec.Generation, rec *Lower) error {
	st := e.deps.Store
	if _, err := e.deps.Envs.CheckDepth(ctx, g.EnvSnap, g.Spec.Env); err != nil {
		return err
	}
	if err := st.Clone(ctx, g.EnvSnap, rec.Image); err != nil && !errors.Is(err, layering.ErrExists) {
		return err
	}
	meta := map[string]string{catalog.MetaLower: g.App + "/" + strconv.Itoa(g.Gen)}
	if e.cfg.Node != "" {
		meta[catalog.MetaNode] = e.cfg.Node
	}
	if err := st.SetMeta(ctx, rec.Image, meta); err != nil {
		return err
	}
	if _, err := e.deps.Mapper.MapAndMount(ctx, mapper.Image{Pool: e.cfg.Pool, Name: rec.Image}, rec.Root,
		mapper.MountOptions{ReadOnly: true}, mapper.WithID(rec.ID), mapper.WithReadOnly()); err != nil {
		return err
	}
	rec.Ready = true
	return e.sizeLower(ctx, rec)
}

// sizeLower records the size of rec's image in rec.
func (e *EnvCopies) sizeLower(ctx context.Context, rec *Lower) error {
	info, err := e.deps.Store.Stat(ctx, rec.Image)
	if err != nil {
		return fmt.Errorf("size of the node copy %s: %w", rec.Image, err)
	}
	rec.Size = info.Size
	return e.lowers.Save(rec.ID, rec)
}

// upperSource is the snapshot that an instance's writable image over
// lower is cloned from: the pool's blank filesystem of the environment's
// size (layering.Blank), made on first use. A clone of the generation's
// environment would do too, but every object of it that the instance
// first writes (the filesystem's metadata, its journal) is read whole
// from the cluster first; a clone of the blank reads next to nothing.
func (e *EnvCopies) upperSource(ctx context.Context, lower Lower) (layering.SnapRef, error) {
	e.blankMu.Lock()
	ref, ok := e.blanks[lower.Size]
	e.blankMu.Unlock()
	if ok {
		return ref, nil
	}
	work := filepath.Join(e.cfg.StateDir, "tmp")
	if err := os.MkdirAll(work, 0o700); err != nil {
		return layering.SnapRef{}, err
	}
	ref, err := layering.Blank(ctx, e.deps.Store, lower.Size, work)
	if err != nil {
		return layering.SnapRef{}, fmt.Errorf("blank filesystem for the writes of %s generation %d: %w", lower.App, lower.Gen, err)
	}
	e.blankMu.Lock()
	e.blanks[lower.Size] = ref
	e.blankMu.Unlock()
	return ref, nil
}

// cloneBlank clones blank, the pool's blank filesystem of lower's size
// (upperSource), into image name; a blank gone from the pool since it
// was found is forgotten, and a new one made and cloned.
func (e *EnvCopies) cloneBlank(ctx context.Context, blank layering.SnapRef, lower Lower, name string) error {
	err := e.deps.Store.Clone(ctx, blank, name)
	if errors.Is(err, layering.ErrNotFound) {
		e.forgetBlank(blank)
		if blank, err = e.upperSource(ctx, lower); err == nil {
			err = e.deps.Store.Clone(ctx, blank, name)
		}
	}
	return err
}

// forgetBlank drops a remembered blank snapshot (gone from the pool).
func (e *EnvCopies) forgetBlank(ref layering.SnapRef) {
	e.blankMu.Lock()
	defer e.blankMu.Unlock()
	for size, r := range e.blanks {
		if r == ref {
			delete(e.blanks, size)
		}
	}
}

// dropLower releases a lower's mapping, removes its image and its record.
func (e *EnvCopies) dropLower(ctx context.Context, rec Lower) error {
	if err := e.deps.Mapper.Release(ctx, rec.ID); err != nil && !errors.Is(err, mapper.ErrNotMapped) {
		return fmt.Errorf("release the node copy of %s generation %d: %w", rec.App, rec.Gen, err)
	}
	if err := e.removeImage(ctx, rec.ID, rec.Image); err != nil && !errors.Is(err, layering.ErrNotFound) {
		return fmt.Errorf("remove the node copy of %s generation %d: %w", rec.App, rec.Gen, err)
	}
	_ = os.Remove(rec.Root)
	return e.lowers.Remove(rec.ID)
}

// ErrNoLower: the node holds no copy of that generation's environment.
var ErrNoLower = errors.New("no node copy of the environment")

// Lowers lists the node's read-only copies of generations' environments.
func (e *EnvCopies) Lowers() ([]Lower, error) { return e.lowers.List() }

// TrimLowers drops the node's copies of generations' environments that no
// instance on the node uses and that keep rejects (nil: every unused one),
// and returns them.
func (e *EnvCopies) TrimLowers(ctx context.Context, keep func(Lower) bool) ([]Lower, error) {
	recs, err := e.lowers.List()
	if err != nil {
		return nil, err
	}
	var dropped []Lower
	var errs []error
	for _, rec := range recs {
		if keep != nil && keep(rec) {
			continue
		}
		unlock := e.lowerLock.Lock(rec.ID)
		used, err := e.used(rec.ID)
		if err == nil && !used {
			err = e.dropLower(ctx, rec)
			if err == nil {
				dropped = append(dropped, rec)
			}
		}
		unlock()
		if err != nil {
			errs = append(errs, err)
		}
	}
	return dropped, errors.Join(errs...)
}

// lowerUsedBy reports whether a slot or a deployment of this node reads
// from lower id (what EnvCopies.used asks).
func lowerUsedBy(slotRecs journal.Journal[Slot], depRecs journal.Journal[Deployment], id string) (bool, error) {
	slots, err := slotRecs.List()
	if err != nil {
		return false, err
	}
	for _, s := range slots {
		if s.Lower == id {
			return true, nil
		}
	}
	recs, err := depRecs.List()
	if err != nil {
		return false, err
	}
	for _, r := range recs {
		if r.Lower == id {
			return true, nil
		}
	}
	return false, nil
}

// overlayRoot mounts slot s's root (dir/mnt/root) as the overlay of lower
// over its own clone (mounted at dir/disk). dir/mnt is a shared mount, so
// that an instance that binds it with slave propagation sees resetRoot's
// unmount and mount of the root.
func (e *EnvCopies) overlayRoot(ctx context.Context, lower Lower, dir string) (string, error) {
	if err := e.deps.Roots.MountShared(filepath.Join(dir, "mnt")); err != nil {
		return "", err
	}
	root := filepath.Join(dir, "mnt", "root")
	if err := e.deps.Roots.Mount(ctx, rootLayers(lower, dir), root); err != nil {
		return "", err
	}
	return root, nil
}

func rootLayers(lower Lower, dir string) overlay.Layers {
	return overlay.Layers{Lower: lower.Root, Disk: filepath.Join(dir, "disk")}
}

// resetRoot drops what an instance wrote into its overlay root under dir:
// the root is the generation's again.
func (e *EnvCopies) resetRoot(ctx context.Context, lower Lower, dir string) error {
	return e.deps.Roots.Reset(ctx, rootLayers(lower, dir), filepath.Join(dir, "mnt", "root"))
}

// removeDir removes an instance's directory and what it holds, unless
// something is still mounted under it.
func removeDir(dir string) error {
	if dir == "" {
		return nil
	}
	return mountinfo.RemoveAll(dir)
}

// unmountRoot unmounts an instance's overlay root under dir (dir/mnt/root,
// or dir/root where an earlier version mounted it), and its copies in the
// mount namespaces of the apps run there, if it has one, then dir/mnt.
func (e *EnvCopies) unmountRoot(ctx context.Context, dir string) error {
	if dir == "" {
		return nil
	}
	for _, root := range []string{filepath.Join(dir, "mnt", "root"), filepath.Join(dir, "root")} {
		ok, err := e.deps.Roots.Mounted(root)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		_, _ = mapper.DetachCopies(root)
		if err := e.deps.Roots.Unmount(ctx, root); err != nil {
			return err
		}
	}
	if err := e.unbindCkpt(dir); err != nil {
		return err
	}
	return e.deps.Roots.UnmountShared(filepath.Join(dir, "mnt"))
}

// slotEnv is the environment snapshot a slot clones. With the shared read
// path (s.Lower) its environment is read from the node's copy of the
// generation's (lower.go), and its writable image is a clone of a blank
// filesystem; otherwise the generation's environment is cloned for this
// slot (the node's copy checks it once, makeLower). A node's copy not made
// yet is made while the slot's own images are cloned and mapped: lower is
// then without its Root, and made waits for it.
func (e *EnvCopies) slotEnv(ctx context.Context, o *op, s *Slot, src slotSource) (env layering.SnapRef, lower Lower, made func() (Lower, error), err error) {
	env = src.env
	made = func() (Lower, error) { return lower, nil }
	switch {
	case s.Lower != "" && src.gen != nil:
		of := src.gen
		if src.lowerOf != nil {
			of = src.lowerOf
		}
		if lower, made, err = e.lowerSoon(ctx, *of); err != nil {
			return layering.SnapRef{}, Lower{}, made, err
		}
		if !src.resume { // a resume's upper layer is its suspension's
			if env, err = e.upperSource(ctx, lower); err != nil {
				return layering.SnapRef{}, Lower{}, made, err
			}
		}
		if lower.Root != "" {
			o.phase(StepLower)
		}
	case src.resume:
		// Its suspension's root, cloned: one level below its generation.
	case src.gen != nil:
		if _, err := e.deps.Envs.CheckDepth(ctx, src.env, src.app.Env); err != nil {
			return layering.SnapRef{}, Lower{}, made, err
		}
	}
	return env, lower, made, nil
}
