// The node's checkpoint cache: every restore of a generation on this node reads its checkpoint
// from one read-only local copy (gencache), filled once: from the image the checkpoint was just
// written to, on the node that produced it, or from the sealed snapshot, mapped and mounted
// read-only, on first use elsewhere. A restore's slot then clones only the environment.

package deploy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/gencache"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// Checkpoints are the node's copies of generations' checkpoints (its
// checkpoint cache, filled once per generation) and what the node knows of
// the generations: the newest of each app, shared by the lookups made at
// once, and the one its last lookup gave.
type Checkpoints struct {
	*node
	drv  *Drivers
	envs *EnvCopies
	// cache is the node's read-only copies of the generations its
	// restores read.
	cache *gencache.Cache
	// fetched sums what this node's checkpoint fetches read from the
	// cluster and what their block indexes spared them (FetchBytes).
	fetched fetchCounters
	// newest shares one listing of an app's generations among the pool
	// hits that ask for it at once (newestGen), and newer one read of the
	// next generation's image (newerGen).
	newest coalesce[string, int]
	newer  coalesce[appGen, bool]
	// known is the generation of each app that the last lookup gave,
	// which a restore without a pool slot takes and checks (knownGen).
	known knownGens
	// listSlots lists the node's slots, whose generations stay cached.
	listSlots func() ([]Slot, error)
	// serving are the checkpoint images whose pages lazy restores read
	// from this node (pages.go), served the bytes of those pages.
	serving servings
	served  atomic.Int64
}

// Checkpoints returns the node's copies of checkpoints.
func (d *Deployer) Checkpoints() *Checkpoints { return d.ckpts }

// StepFetch is the wait for a generation's checkpoint to be on the node
// (Deployment.Timings): about 0 once the node holds it.
const StepFetch Step = "fetch"

// CacheKey is generation g's key in the node's checkpoint cache.
func CacheKey(g spec.Generation) gencache.Key { return gencache.KeyOf(g.App, g.Gen, g.Created) }

// ckptSource returns the node's copy of generation g's checkpoint files,
// fetching it first when the node does not hold it (fetched). known, if
// set, is told the copy's directory as soon as it is known, before the
// fetch ends (gencache.Cache.Begin).
//
// from, if set, brings the files instead of the cluster (a hand-over).
func (c *Checkpoints) ckptSource(ctx context.Context, g spec.Generation, known func(dir string), from FetchCheckpoint) (e gencache.Entry, fetched bool, err error) {
	start := time.Now()
	var st gencache.CopyStats
	fill := func(ctx context.Context, dst string) (err error) {
		st, err = c.fetchFrom(ctx, g, dst, from)
		return err
	}
	dir, wait, err := c.cache.Begin(ctx, CacheKey(g), fill)
	if err == nil {
		if known != nil {
			known(dir)
		}
		e, fetched, err = wait()
	}
	if err != nil {
		return e, fetched, err
	}
	if fetched {
		c.log.Info("checkpoint fetched to the node", "app", g.App, "gen", g.Gen, "bytes", e.Bytes,
			"read", st.Read, "reused", st.Reused, "zero", st.Zero, "ms", time.Since(start).Milliseconds(), "dir", e.Dir)
	}
	return e, fetched, nil
}

// fetchFrom copies generation g's checkpoint files into dst with from,
// or, nil, from the cluster (fetch).
func (c *Checkpoints) fetchFrom(ctx context.Context, g spec.Generation, dst string, from FetchCheckpoint) (st gencache.CopyStats, err error) {
	if from == nil {
		return c.fetch(ctx, g, dst)
	}
	err = from(ctx, dst, func(ctx context.Context) (err error) {
		st, err = c.fetch(ctx, g, dst)
		return err
	})
	return st, err
}

// fetch copies generation g's checkpoint files into dst from its sealed
// snapshot, mapped and mounted read-only for the copy only.
func (c *Checkpoints) fetch(ctx context.Context, g spec.Generation, dst string) (_ gencache.CopyStats, err error) {
	target, release, err := c.mapCheckpoint(ctx, g, "fetch")
	if err != nil {
		return gencache.CopyStats{}, err
	}
	defer func() { err = errors.Join(err, release()) }()
	return c.copyCheckpoint(ctx, g, target, dst)
}

// mapCheckpoint maps and mounts generation g's sealed checkpoint image
// read-only (a mapping named use-<image's hash>-<app>-<gen>, which no
// record owns: an agent's start releases one a crash left), and returns
// where, and its release.
func (c *Checkpoints) mapCheckpoint(ctx context.Context, g spec.Generation, use string) (target string, release func() error, err error) {
	// Named after its image too: a suspension's checkpoint (suspend.go)
	// is another of app's, fetched beside a generation of its number.
	sum := sha256.Sum256([]byte(g.CkptSnap.String()))
	id := use + "-" + hex.EncodeToString(sum[:4]) + "-" + g.App + "-" + strconv.Itoa(g.Gen)
	if len(id) > 64 {
		id = id[:64]
	}
	target = filepath.Join(c.cfg.StateDir, "fetch", id)
	mapRO := func(img mapper.Image) (*mapper.Mapping, error) {
		return c.deps.Mapper.MapAndMount(ctx, img, target, mapper.MountOptions{ReadOnly: true}, mapper.WithID(id), mapper.WithReadOnly())
	}
	img := mapper.Image{Pool: c.cfg.Pool, Name: g.CkptSnap.Image, Snap: g.CkptSnap.Snap}
	mp, err := mapRO(img)
	if errors.Is(err, mapper.ErrUnsupported) {
		// rbd-fuse cannot expose a snapshot. A sealed generation's image
		// is never written after its seal (restores copy it; a refresh
		// writes a generation of its own), so its head is the snapshot.
		img.Snap = ""
		mp, err = mapRO(img)
	}
	if err != nil {
		return "", nil, err
	}
	release = func() error {
		defer os.Remove(target)
		if err := c.deps.Mapper.Release(context.WithoutCancel(ctx), mp.ID); err != nil && !errors.Is(err, mapper.ErrNotMapped) {
			return err
		}
		return nil
	}
	if _, err := os.Stat(drivers.GenDir(target, g.Gen)); err != nil {
		return "", nil, errors.Join(fmt.Errorf("generation %d of %s: its checkpoint image holds no generation directory: %w", g.Gen, g.App, err), release())
	}
	return target, release, nil
}

// blocksPath is where a checkpoint image holds the block index of its
// generation gen (beside the generation's directory, not in it).
func blocksPath(ckpt string, gen int) string { return drivers.GenDir(ckpt, gen) + ".blocks" }

// copyCheckpoint copies generation g's checkpoint files from the image
// mounted at ckpt into dst: with the generation's block index, only the
// blocks that are neither zero nor already copied are read from the
// cluster (the processes of an app share most of their pages); without
// one (a generation sealed before indexes, a suspension), or if the
// files are not those of their index, every byte.
func (c *Checkpoints) copyCheckpoint(ctx context.Context, g spec.Generation, ckpt, dst string) (gencache.CopyStats, error) {
	src := drivers.GenDir(ckpt, g.Gen)
	x, err := gencache.ReadIndex(blocksPath(ckpt, g.Gen))
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			c.log.Warn("reading the checkpoint's block index; copying every byte", "app", g.App, "gen", g.Gen, "err", err)
		}
		x = &gencache.Index{}
	}
	st, err := gencache.CopyTreeFrom(ctx, src, dst, x)
	if errors.Is(err, gencache.ErrIndexMismatch) {
		c.log.Warn("the checkpoint differs from its block index; copying every byte", "app", g.App, "gen", g.Gen, "err", err)
		c.fetched.add(st)
		if err := gencache.EmptyDir(dst); err != nil {
			return st, err
		}
		st, err = gencache.CopyTreeFrom(ctx, src, dst, &gencache.Index{})
	}
	c.fetched.add(st)
	return st, err
}

// fetchCounters sums the CopyStats of a node's fetches.
type fetchCounters struct{ bytes, read, reused, zero atomic.Int64 }

func (c *fetchCounters) add(st gencache.CopyStats) {
	c.bytes.Add(st.Bytes)
	c.read.Add(st.Read)
	c.reused.Add(st.Reused)
	c.zero.Add(st.Zero)
}

// FetchBytes sums what this node's checkpoint fetches copied since the
// deployer started: the bytes of the files, those read from the cluster,
// those copied from blocks the fetch already held, and the zero ones.
func (c *Checkpoints) FetchBytes() gencache.CopyStats {
	f := &c.fetched
	return gencache.CopyStats{Bytes: f.bytes.Load(), Read: f.read.Load(), Reused: f.reused.Load(), Zero: f.zero.Load()}
}

// Prefetch brings generation g's checkpoint to this node ahead of its
// restores (fetched: it was not here).
func (c *Checkpoints) Prefetch(ctx context.Context, g spec.Generation) (fetched bool, err error) {
	_, fetched, err = c.ckptSource(ctx, g, nil, nil)
	return fetched, err
}

// Cached lists the generations whose checkpoint this node holds, least
// recently used first.
func (c *Checkpoints) Cached() ([]gencache.Entry, error) { return c.cache.List() }

// SettleCache flushes to disk the generations fetched or adopted since the
// machine started (a restore reads them before they are: gencache.Settle),
// so that they outlive a restart of the machine.
func (c *Checkpoints) SettleCache(ctx context.Context) (int, error) { return c.cache.Settle(ctx) }

// CacheBudget is the cache's byte budget (0: none).
func (c *Checkpoints) CacheBudget() int64 { return c.cache.Budget() }

// TrimCache drops the cached generations that keep rejects (nil: none is
// rejected) and then the least recently used ones beyond the budget; the
// generations of this node's slots stay.
func (c *Checkpoints) TrimCache(keep func(gencache.Key) bool) ([]gencache.Entry, error) {
	slots, err := c.listSlots()
	if err != nil {
		return nil, err
	}
	used := map[gencache.Key]bool{}
	for _, s := range slots {
		if s.Mode == drivers.RunRestart {
			used[gencache.Key{App: s.App, Gen: s.Gen}] = true
		}
	}
	return c.cache.Trim(keep, func(k gencache.Key) bool { return used[gencache.Key{App: k.App, Gen: k.Gen}] })
}

// stageCheckpoint copies the generation a checkpoint just wrote (under
// ckptPath) next to the slot, so that it can enter the cache once the
// generation is sealed (adoptCheckpoint); on error the node fetches it on
// first use instead.
func (c *Checkpoints) stageCheckpoint(ctx context.Context, s *Slot, ckptPath string) string {
	stage := filepath.Join(s.Dir, "stage")
	if err := os.MkdirAll(stage, 0o755); err == nil {
		var x *gencache.Index
		if x, err = gencache.CopyTreeIndexed(ctx, drivers.GenDir(ckptPath, s.Gen), stage); err == nil {
			c.writeBlocks(s, ckptPath, x)
			return stage
		}
		c.log.Warn("keeping the checkpoint on the node; it is fetched on first use instead", "app", s.App, "gen", s.Gen, "err", err)
	}
	_ = os.RemoveAll(stage)
	return ""
}

// writeBlocks writes the block index x of slot s's checkpoint into its
// image, to be sealed with it: other nodes' fetches then read only its
// distinct blocks. Without it they copy every byte.
func (c *Checkpoints) writeBlocks(s *Slot, ckptPath string, x *gencache.Index) {
	if err := gencache.WriteIndex(blocksPath(ckptPath, s.Gen), x); err != nil {
		c.log.Warn("writing the checkpoint's block index; its fetches copy every byte", "app", s.App, "gen", s.Gen, "err", err)
		return
	}
	c.log.Debug("checkpoint's block index written", "app", s.App, "gen", s.Gen, "bytes", x.Bytes(), "distinct", x.Unique())
}

// adoptCheckpoint makes the staged copy of sealed generation g the node's.
func (c *Checkpoints) adoptCheckpoint(g spec.Generation, stage string) {
	if stage == "" {
		return
	}
	if _, err := c.cache.Adopt(CacheKey(g), stage); err != nil {
		c.log.Warn("keeping the checkpoint on the node; it is fetched on first use instead", "app", g.App, "gen", g.Gen, "err", err)
	}
}

// sourceLater returns the directory of the node's copy of the checkpoint
// that slot s restores, when its instance can be created while the copy
// is being fetched: the fetch goes on (fetching is open), the slot serves
// a deploy (a pool's slot reads ahead once made) and its driver reads
// the copy only once started (drivers.LateSourcer).
func (c *Checkpoints) sourceLater(s *Slot, src slotSource, known <-chan string, fetching <-chan struct{}) (string, bool) {
	select {
	case <-fetching:
		return "", false
	default:
	}
	if s.Pool {
		return "", false
	}
	dr, err := c.drv.driverByRun(src.app, s.Mode, src.engine)
	if ls, ok := dr.(drivers.LateSourcer); err != nil || !ok || !ls.TakesSourceLater() {
		return "", false
	}
	select {
	case dir := <-known:
		return dir, dir != ""
	case <-fetching:
		return "", false
	}
}
