// Hand-overs: the checkpoint of an instance suspended for a migration stays on this node's disk,
// where its target reads it node to node, while its durable copy is written into the suspension's
// image in the cluster behind the migration, off the time the app answers nothing:
//
//	Suspend (SuspendOptions.Handoff): checkpoint → keep (its files moved to
//	    StateDir/handoffs/<id>/<gen>, journaled with the mapping of its image) → store (the
//	    instance released, the writable image sealed) → seal (Pending: this node)
//	then, as its caller decides:
//	    Store: the files copied into the checkpoint's image, the image sealed → Durable →
//	        the files go once no stream reads them
//	    Finish (the instance runs again, from what its target read, or is gone): the image,
//	        its mapping and the files go
//
// Each hand-over is journaled (StateDir/handoffs/records): an agent that stopped finds them (List)
// and carries each on.

package deploy

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/gencache"
	"github.com/fogdeploy/fogdeploy/internal/journal"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// ErrNoHandoff: this node hands over no checkpoint of that deployment (or
// not to the token shown).
var ErrNoHandoff = errors.New("no hand-over")

// ErrDurable: a hand-over's checkpoint is sealed in the cluster, where its
// reader reads it now.
var ErrDurable = errors.New("hand-over durable")

// Handoff is a checkpoint this node hands over: its files, the image its
// durable copy goes into, and the secret its reader shows.
type Handoff struct {
	ID  string `json:"id"`
	Gen int    `json:"gen"`
	// Ckpt is the suspension's checkpoint image; Mapping its mapping
	// while the copy is written.
	Ckpt    string `json:"ckpt"`
	Mapping string `json:"mapping"`
	// Token is the secret the target shows (state.Handoff holds it for
	// the target).
	Token string    `json:"token"`
	Bytes int64     `json:"bytes"`
	Kept  time.Time `json:"kept"`
	// Durable: the copy is sealed in the cluster (its files are gone).
	Durable bool `json:"durable,omitempty"`
}

// Durable is told that a hand-over's checkpoint is sealed in the cluster
// (after how long since its suspend kept it).
type Durable func(ctx context.Context, h Handoff, after time.Duration)

// Handoffs are the checkpoints this node hands over, and their durable
// copies under way.
type Handoffs struct {
	*node
	records journal.Journal[Handoff]
	mu      sync.Mutex
	// readers counts the streams reading each hand-over's files; stored,
	// those whose copy is durable (their files go once nobody reads
	// them); copying, those whose copy is under way.
	readers map[string]int
	stored  map[string]bool
	// runs are what the hand-overs do behind their suspends.
	runs map[string]*handoffRun
	// copies are the durable copies under way (Wait).
	copies sync.WaitGroup
	// ckpts say which checkpoint images a lazy restore still reads
	// (a durable copy's, resumed from the cluster).
	ckpts *Checkpoints
}

// Handoffs returns the node's hand-overs.
func (d *Deployer) Handoffs() *Handoffs { return d.suspensions.handoffs }

func newHandoffs(n *node, ckpts *Checkpoints) *Handoffs {
	return &Handoffs{node: n, ckpts: ckpts, readers: map[string]int{}, stored: map[string]bool{}, runs: map[string]*handoffRun{},
		records: journal.Journal[Handoff]{Dir: filepath.Join(n.cfg.StateDir, "handoffs", "records"), What: "hand-over", NotFound: ErrNoHandoff, Exists: spec.ErrExists, Log: n.log}}
}

// dir holds hand-over id's files (a directory per generation) and the
// mount of its image.
func (hs *Handoffs) dir(id string) string { return filepath.Join(hs.cfg.StateDir, "handoffs", id) }

// files is the directory of h's checkpoint files.
func (hs *Handoffs) files(h Handoff) string { return drivers.GenDir(hs.dir(h.ID), h.Gen) }

// mountOf is where the checkpoint image of hand-over id is mounted while
// its durable copy is written.
func (hs *Handoffs) mountOf(id string) string { return filepath.Join(hs.dir(id), "image") }

// keep moves the checkpoint files src of generation gen of deployment id
// into a new hand-over and journals it; a suspend cut short that kept them
// before finds that one with Get. Files a crash left moved are taken as
// they are.
func (hs *Handoffs) keep(id string, gen int, src, ckpt, mapping string, bytes int64) (Handoff, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return Handoff{}, err
	}
	h := Handoff{ID: id, Gen: gen, Ckpt: ckpt, Mapping: mapping, Token: hex.EncodeToString(b), Bytes: bytes, Kept: time.Now().UTC()}
	if err := hs.take(src, hs.files(h)); err != nil {
		return Handoff{}, fmt.Errorf("keeping the checkpoint of %s for its hand-over: %w", id, err)
	}
	if err := hs.records.Init(); err != nil {
		return Handoff{}, err
	}
	return h, hs.records.Save(id, &h)
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// prepare makes the directory that deployment id's checkpoint of
// generation gen is written into, in memory (memory bytes at most) or,
// with memory 0, on the node's disk, and binds it at genDir, where the
// instance writes that generation: the hand-over then keeps the files
// where they were written (take). A directory an earlier suspend of id
// left without a hand-over goes first. On error nothing is left.
func (hs *Handoffs) prepare(id string, gen int, genDir string, memory int64) (err error) {
	if _, err := hs.records.Load(id); err == nil {
		return fmt.Errorf("deployment %s: a hand-over of it is kept already: %w", id, spec.ErrExists)
	}
	hs.removeFiles(id)
	dst := drivers.GenDir(hs.dir(id), gen)
	defer func() {
		if err != nil {
			_ = hs.deps.Roots.Unbind(genDir)
			hs.removeFiles(id)
		}
	}()
	if err := os.MkdirAll(hs.dir(id), 0o700); err != nil {
		return err
	}
	// Its mode and owner are those of the instance's directory (an app
	// run as a user writes its own images).
	mode, uid, gid := fs.FileMode(0o755), 0, 0
	if st, err := os.Stat(genDir); err == nil {
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			mode, uid, gid = st.Mode().Perm(), int(sys.Uid), int(sys.Gid)
		}
	}
	if err := os.Mkdir(dst, mode); err != nil {
		return err
	}
	if err := os.Chmod(dst, mode); err != nil {
		return err
	}
	if err := os.Chown(dst, uid, gid); err != nil {
		return err
	}
	if memory > 0 {
		if err := hs.deps.Roots.MountMemory(dst, memory); err != nil {
			return err
		}
	}
	return hs.deps.Roots.Bind(dst, genDir)
}

// take takes the checkpoint files written at src into dst, a hand-over's:
// written where prepare bound dst, the bind goes (the instance sees them
// no more); otherwise they are renamed, or copied where a rename cannot
// cross from the instance's mount.
func (hs *Handoffs) take(src, dst string) error {
	if err := hs.deps.Roots.Unbind(src); err != nil {
		return err
	}
	if exists(dst) {
		return nil // written there, or taken before a crash
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	err := os.Rename(src, dst)
	if !errors.Is(err, syscall.EXDEV) {
		return err
	}
	tmp := dst + ".part"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := gencache.CopyTree(context.Background(), src, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	return os.RemoveAll(src)
}

// Open gives a reader of hand-over id that shows token its files, until
// the function it returns is called; ErrNoHandoff if this node hands none
// over or token is not its secret.
func (hs *Handoffs) Open(id, token string) (h Handoff, dir string, done func(), err error) {
	h, err = hs.records.Load(id)
	if err != nil || subtle.ConstantTimeCompare([]byte(h.Token), []byte(token)) != 1 {
		return Handoff{}, "", nil, fmt.Errorf("deployment %s: %w", id, ErrNoHandoff)
	}
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.stored[id] || h.Durable {
		return Handoff{}, "", nil, fmt.Errorf("deployment %s: its checkpoint is in the cluster now: %w", id, ErrDurable)
	}
	hs.readers[id]++
	var once sync.Once
	return h, hs.files(h), func() { once.Do(func() { hs.unread(id) }) }, nil
}

// unread ends a read of hand-over id; the last read of a durable one
// removes its files.
func (hs *Handoffs) unread(id string) {
	hs.mu.Lock()
	hs.readers[id]--
	last := hs.readers[id] <= 0 && hs.stored[id]
	if hs.readers[id] <= 0 {
		delete(hs.readers, id)
	}
	hs.mu.Unlock()
	if last {
		hs.removeFiles(id)
	}
}

// CopyTo copies hand-over id's checkpoint files into dst: a resume on the
// node that suspended it (a migration that came back).
func (hs *Handoffs) CopyTo(ctx context.Context, id, dst string) error {
	h, err := hs.records.Load(id)
	if err != nil {
		return err
	}
	_, dir, done, err := hs.Open(id, h.Token)
	if err != nil {
		return err
	}
	defer done()
	return gencache.CopyTree(ctx, dir, dst)
}

// Get is hand-over id (ErrNoHandoff: none).
func (hs *Handoffs) Get(id string) (Handoff, error) { return hs.records.Load(id) }

// handoffRun is what a hand-over does behind its suspend: the mount of its
// image, and whether its durable copy is under way (copying) or over
// (durable), and whether its deployment needs it no more (finished).
type handoffRun struct {
	mounted                    func() error
	copying, durable, finished bool
}

// run is hand-over h's run, made on its first Store or Finish (its image
// to be mapped once its durable copy is written); the caller holds mu.
func (hs *Handoffs) run(ctx context.Context, h Handoff) *handoffRun {
	r := hs.runs[h.ID]
	if r == nil {
		r = &handoffRun{durable: h.Durable}
		hs.runs[h.ID] = r
	}
	if r.mounted == nil && !r.durable {
		r.mounted = hs.mount(ctx, h.Ckpt, h.Mapping, h.ID)
	}
	return r
}

// Store writes hand-over id's durable copy in the background: its files
// copied into its image, the mapping released (which flushes them), the
// image sealed; then durable is told and the files go once no stream reads
// them. A copy under way or made is not made again; one that failed is
// made anew at the next Store.
func (hs *Handoffs) Store(ctx context.Context, id string, durable Durable) {
	h, err := hs.records.Load(id)
	if err != nil {
		return
	}
	hs.mu.Lock()
	r := hs.run(ctx, h)
	if r.copying || r.durable || r.finished {
		hs.mu.Unlock()
		return
	}
	r.copying = true
	mounted := r.mounted
	hs.mu.Unlock()
	hs.copies.Go(func() {
		start := time.Now()
		err := hs.copyIn(ctx, h, mounted)
		if err == nil {
			err = hs.deps.Store.Snapshot(ctx, layering.SnapRef{Image: h.Ckpt, Snap: layering.SealedSnap})
			if errors.Is(err, layering.ErrExists) {
				err = nil
			}
		}
		if err == nil {
			h.Durable = true
			err = hs.records.Save(h.ID, &h)
		}
		hs.mu.Lock()
		r.copying, r.mounted = false, nil
		r.durable = err == nil
		finished := r.finished
		hs.mu.Unlock()
		switch {
		case finished:
			hs.Finish(context.WithoutCancel(ctx), h.ID)
			return
		case err != nil:
			hs.log.Error("hand-over: writing the checkpoint's durable copy; its caller asks again", "deployment", h.ID, "image", h.Ckpt, "err", err)
			return
		}
		hs.log.Info("hand-over durable: its checkpoint is sealed in the cluster", "deployment", h.ID, "image", h.Ckpt,
			"bytes", h.Bytes, "copy_ms", time.Since(start).Milliseconds(), "since_suspend_ms", time.Since(h.Kept).Milliseconds())
		if durable != nil {
			durable(ctx, h, time.Since(h.Kept))
		}
		hs.dropFiles(h.ID)
	})
}

// Finish ends hand-over id, whose deployment needs it no more (it runs
// again, from a copy its target read, or is gone): its checkpoint image,
// its mapping and its files go (the files once no stream reads them; a
// durable copy under way first ends).
func (hs *Handoffs) Finish(ctx context.Context, id string) {
	h, err := hs.records.Load(id)
	if err != nil {
		return
	}
	hs.mu.Lock()
	r := hs.runs[id]
	if r != nil {
		r.finished = true
		if r.copying {
			hs.mu.Unlock()
			return // the copy finishes it
		}
	}
	hs.mu.Unlock()
	// A restore that reads its pages from the durable copy has them first.
	if served := hs.ckpts.Serving(h.Ckpt); served != nil {
		select {
		case <-served:
		case <-ctx.Done():
		}
	}
	failed := func(what string, err error) {
		hs.log.Warn("hand-over: "+what+"; tried again when the agent starts", "deployment", id, "image", h.Ckpt, "err", err)
		// Its record stays for that; a later hand-over of the deployment
		// starts afresh.
		hs.mu.Lock()
		delete(hs.runs, id)
		hs.mu.Unlock()
	}
	if err := hs.deps.Mapper.Release(ctx, h.Mapping); err != nil && !errors.Is(err, mapper.ErrNotMapped) {
		failed("releasing its image's mapping", err)
		return
	}
	if err := hs.deps.Store.Remove(ctx, h.Ckpt); err != nil && !errors.Is(err, layering.ErrNotFound) {
		failed("removing its checkpoint image", err)
		return
	}
	hs.log.Info("hand-over over: its deployment needs its checkpoint no more", "deployment", id, "image", h.Ckpt)
	hs.mu.Lock()
	delete(hs.runs, id)
	hs.mu.Unlock()
	hs.removeFiles(id)
	hs.mu.Lock()
	delete(hs.stored, id)
	hs.mu.Unlock()
	if err := hs.records.Remove(id); err != nil && !errors.Is(err, ErrNoHandoff) {
		hs.log.Warn("hand-over: removing its record", "deployment", id, "err", err)
	}
}

// dropFiles removes hand-over id's files once no stream reads them.
func (hs *Handoffs) dropFiles(id string) {
	hs.mu.Lock()
	hs.stored[id] = true
	last := hs.readers[id] == 0
	hs.mu.Unlock()
	if last {
		hs.removeFiles(id)
	}
}

// copyIn copies h's files into directory Gen of its mounted image, anew,
// and releases the image's mapping.
func (hs *Handoffs) copyIn(ctx context.Context, h Handoff, mounted func() error) (err error) {
	target := hs.mountOf(h.ID)
	defer func() {
		if rerr := hs.deps.Mapper.Release(context.WithoutCancel(ctx), h.Mapping); rerr != nil && !errors.Is(rerr, mapper.ErrNotMapped) {
			err = errors.Join(err, rerr)
		}
		_ = os.Remove(target)
	}()
	if err := mounted(); err != nil {
		return err
	}
	dst := drivers.GenDir(target, h.Gen)
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	return gencache.CopyTree(ctx, hs.files(h), dst)
}

// mount starts to map and mount hand-over h's image (a mapping left by a
// crash goes first); the function it returns waits for that.
func (hs *Handoffs) mount(ctx context.Context, image, mapping, id string) func() error {
	return async(func() error {
		_ = hs.deps.Mapper.Release(ctx, mapping)
		_, err := hs.deps.Mapper.MapAndMount(ctx, mapper.Image{Pool: hs.cfg.Pool, Name: image}, hs.mountOf(id),
			mapper.MountOptions{Format: true}, mapper.WithID(mapping))
		return err
	})
}

// List is the node's hand-overs.
func (hs *Handoffs) List() ([]Handoff, error) {
	hos, err := hs.records.List()
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return hos, err
}

// Drop ends hand-over id whose suspend failed: its mapping and files go
// (its image is its failed deployment's).
func (hs *Handoffs) Drop(ctx context.Context, id string) {
	h, err := hs.records.Load(id)
	if err != nil {
		return
	}
	if err := hs.deps.Mapper.Release(ctx, h.Mapping); err != nil && !errors.Is(err, mapper.ErrNotMapped) {
		hs.log.Warn("hand-over: releasing its image's mapping", "deployment", id, "err", err)
		return
	}
	hs.mu.Lock()
	delete(hs.runs, id)
	hs.mu.Unlock()
	hs.removeFiles(id)
	if err := hs.records.Remove(id); err != nil && !errors.Is(err, ErrNoHandoff) {
		hs.log.Warn("hand-over: removing its record", "deployment", id, "err", err)
	}
}

// removeFiles removes hand-over id's files (its record stays).
func (hs *Handoffs) removeFiles(id string) {
	if err := hs.unmountFiles(id); err != nil {
		hs.log.Warn("hand-over: unmounting its files in memory; unmounted when it is over", "deployment", id, "err", err)
		return
	}
	if err := removeDir(hs.dir(id)); err != nil {
		hs.log.Warn("hand-over: removing its files; removed when it is over", "deployment", id, "err", err)
	}
}

// SweepFiles removes the hand-overs' directories that no hand-over owns:
// those prepareHandoff made for a checkpoint whose suspend a crash cut
// short and that did not go on (its deployment is not Suspending here),
// their memory with them. suspending says whether deployment id's suspend
// is still under way on this node. Run at the node's start, before any
// suspend.
func (hs *Handoffs) SweepFiles(suspending func(id string) bool) {
	ents, err := os.ReadDir(filepath.Join(hs.cfg.StateDir, "handoffs"))
	if err != nil {
		return
	}
	for _, e := range ents {
		id := e.Name()
		if !e.IsDir() || id == "records" {
			continue
		}
		if _, err := hs.records.Load(id); err == nil || suspending(id) {
			continue
		}
		hs.log.Info("hand-over: removing the checkpoint directory of a suspend that did not go on", "deployment", id)
		hs.removeFiles(id)
	}
}

// unmountFiles unmounts the files of hand-over id kept in memory (each
// generation's directory that is a mount), which go with it.
func (hs *Handoffs) unmountFiles(id string) error { return hs.unbindGens(hs.dir(id)) }

// Wait waits for the durable copies under way: a caller that stops them
// (their context) waits for them before it closes the node's store.
func (hs *Handoffs) Wait() { hs.copies.Wait() }
