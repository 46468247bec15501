package mapper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/mountinfo"
	"github.com/fogdeploy/fogdeploy/internal/procstat"
)

// Mapping is one image mapped on this node, as List and Map report it.
type Mapping struct {
	ID       string    // mapping ID, the record's file name
	Image    Image     // what was mapped
	Backend  string    // backend that mapped it
	Device   string    // block device, e.g. /dev/rbd0, /dev/nbd0, /dev/loop3
	Target   string    // mount point, "" when not mounted
	ReadOnly bool      // the device is read-only (snapshot or WithReadOnly)
	Created  time.Time // when Map began
	// Ephemeral: made with Ephemeral. Live (set by List): the process
	// that made it still runs, or is this one.
	Ephemeral bool
	Live      bool
}

// MountOptions tune Mount.
type MountOptions struct {
	// ReadOnly mounts with `-o ro,noload` (no journal replay), as needed
	// for snapshots. It is implied when the mapping is read-only.
	ReadOnly bool
	// Format runs `mkfs.ext4 -E nodiscard -q DEVICE` first if
	// `blkid -p` finds nothing on the device. A device holding anything
	// blkid recognises is never formatted.
	Format bool
	// FSType is passed to `mount -t`; "" means "ext4".
	FSType string
}

// MapOption tunes one Map or MapAndMount call.
type MapOption func(*mapOptions)

type mapOptions struct {
	id        string
	readOnly  bool
	ephemeral bool
}

// WithID uses id as the mapping ID instead of a random one. Map fails with
// ErrBusy if a record with that ID exists.
func WithID(id string) MapOption { return func(o *mapOptions) { o.id = id } }

// WithReadOnly maps the device read-only even when the image is not a
// snapshot.
func WithReadOnly() MapOption { return func(o *mapOptions) { o.readOnly = true } }

// Ephemeral marks a mapping that lives no longer than the call of the
// process that made it (an environment's build step, an import): once that
// process is gone, it is abandoned, and ReleaseAbandoned in any process
// releases it. A mapping without it outlives its process until something
// that knows its owner (a deployment's record) releases it.
func Ephemeral() MapOption { return func(o *mapOptions) { o.ephemeral = true } }

// Settings is what a call's options ask for: for other implementations of
// the mapper's methods (the fake in package fakemapper).
type Settings struct {
	ID        string
	ReadOnly  bool
	Ephemeral bool
}

// SettingsOf applies opts.
func SettingsOf(opts ...MapOption) Settings {
	var o mapOptions
	for _, opt := range opts {
		opt(&o)
	}
	return Settings{ID: o.id, ReadOnly: o.readOnly, Ephemeral: o.ephemeral}
}

// Node is what the node's users of a mapper call (the deployer): *Mapper
// and the fake of package fakemapper implement it, and both pass
// mappertest.RunNodeSuite.
type Node interface {
	Map(ctx context.Context, img Image, opts ...MapOption) (*Mapping, error)
	Mount(ctx context.Context, mp *Mapping, target string, opts MountOptions) error
	MapAndMount(ctx context.Context, img Image, target string, mopts MountOptions, opts ...MapOption) (*Mapping, error)
	// Release unmounts and unmaps a mapping; Abort does so for one whose
	// owner is gone mid-step.
	Release(ctx context.Context, id string) error
	Abort(ctx context.Context, id string) error
	// List is every mapping recorded on the node; Users, the mappings of
	// one image.
	List() ([]Mapping, error)
	Users(img Image) ([]string, error)
	// Mounted reports whether mapping id is mounted now.
	Mounted(id string) (bool, error)
}

var _ Node = (*Mapper)(nil)

// Mapper maps images on this node with one backend and keeps a record of
// every mapping under Config.StateDir. Its methods are safe for concurrent
// use. Mappings outlive the Mapper and the process: they are undone by
// Release, or by Recover in a later process.
type Mapper struct {
	cfg     Config
	log     *slog.Logger
	run     runner
	store   store
	all     map[string]Backend
	backend Backend
	choice  Choice
	owner   Owner

	mu   sync.Mutex
	busy map[string]bool // mapping IDs with an operation in flight
}

// New validates cfg, creates StateDir, and probes the backends to choose
// one (Config.Backend "auto" takes the first usable of krbd, nbd, fuse).
// The choice and the reason are logged and kept in Choice. A nil log
// discards.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*Mapper, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, "fuse"), 0o700); err != nil {
		return nil, fmt.Errorf("create Config.StateDir: %w", err)
	}
	// Mount points in /proc/self/mountinfo are resolved paths.
	dir, err := filepath.EvalSymlinks(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("resolve Config.StateDir: %w", err)
	}
	cfg.StateDir = dir
	m := &Mapper{
		cfg:   cfg,
		log:   log,
		run:   runner{log: log, timeout: cfg.timeout()},
		store: newStore(filepath.Join(dir, "mappings"), log),
		busy:  map[string]bool{},
	}
	if err := m.store.init(); err != nil {
		return nil, err
	}
	start, _ := procstat.Start(os.Getpid())
	m.owner = Owner{PID: os.Getpid(), Start: start}
	m.all = backends(cfg, m.run, log)
	b, choice, err := choose(ctx, cfg.backend(), m.all)
	for _, p := range choice.Probes {
		if p.Err != nil {
			log.Debug("mapper backend probe failed", "backend", p.Backend, "err", p.Err)
		}
	}
	if err != nil {
		return nil, err
	}
	m.backend, m.choice = b, choice
	log.Info("mapper backend chosen", "backend", choice.Backend, "reason", choice.Reason, "state_dir", dir)
	return m, nil
}

// Choice returns the backend this Mapper uses and why.
func (m *Mapper) Choice() Choice { return m.choice }

// lock marks id busy for one operation, or fails with ErrBusy.
func (m *Mapper) lock(id string) (unlock func(), err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.busy[id] {
		return nil, fmt.Errorf("mapping %q has another operation in flight: %w", id, ErrBusy)
	}
	m.busy[id] = true
	return func() {
		m.mu.Lock()
		delete(m.busy, id)
		m.mu.Unlock()
	}, nil
}

// rollbackCtx keeps undo steps running when ctx was cancelled, bounded by
// a few step timeouts.
func (m *Mapper) rollbackCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 4*m.run.timeout)
}

// Map attaches img as a block device (no filesystem is touched). The
// record StateDir/mappings/<id>.json is written before anything is
// created; if Map fails, whatever it created is undone and the record
// removed. A snapshot is mapped read-only.
func (m *Mapper) Map(ctx context.Context, img Image, opts ...MapOption) (_ *Mapping, err error) {
	if err := img.Validate(); err != nil {
		return nil, err
	}
	var o mapOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.id == "" {
		o.id = newID()
	} else if err := ValidateID(o.id); err != nil {
		return nil, err
	}
	unlock, err := m.lock(o.id)
	if err != nil {
		return nil, err
	}
	defer unlock()

	start := time.Now()
	rec := &Record{
		Version:   recordVersion,
		ID:        o.id,
		Backend:   m.backend.Name(),
		Image:     img,
		ReadOnly:  o.readOnly || img.ReadOnly(),
		Ephemeral: o.ephemeral,
		Created:   start.UTC(),
		Owner:     m.owner,
	}
	if err := m.store.create(rec); err != nil {
		return nil, err
	}
	defer func() {
		if err == nil {
			return
		}
		rctx, cancel := m.rollbackCtx(ctx)
		defer cancel()
		if derr := m.backend.Detach(rctx, *rec); derr != nil {
			m.log.Error("map rollback failed; the record stays for Release or Recover", "id", rec.ID, "image", img.String(), "err", derr)
			err = errors.Join(err, fmt.Errorf("rollback: %w", derr))
			return
		}
		if rerr := m.store.remove(rec.ID); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()
	save := func() error { return m.store.save(rec) }
	dev, err := m.backend.Attach(ctx, img, rec, save)
	if err != nil {
		return nil, err
	}
	rec.Device = dev
	if err := save(); err != nil {
		return nil, err
	}
	m.log.Info("image mapped", "id", rec.ID, "image", img.String(), "backend", rec.Backend, "device", dev,
		"read_only", rec.ReadOnly, "ms", time.Since(start).Milliseconds())
	mp := rec.mapping()
	return &mp, nil
}

// MapAndMount is Map followed by Mount. If any step fails, everything it
// created is undone and no record remains.
func (m *Mapper) MapAndMount(ctx context.Context, img Image, target string, mopts MountOptions, opts ...MapOption) (_ *Mapping, err error) {
	mp, err := m.Map(ctx, img, opts...)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err == nil {
			return
		}
		rctx, cancel := m.rollbackCtx(ctx)
		defer cancel()
		if rerr := m.Release(rctx, mp.ID); rerr != nil {
			err = errors.Join(err, fmt.Errorf("rollback: %w", rerr))
		}
	}()
	if err := m.Mount(ctx, mp, target, mopts); err != nil {
		return nil, err
	}
	return mp, nil
}

// Release unmounts (`umount TARGET`) and detaches a mapping, then removes
// its record. It verifies each resource before undoing it and skips those
// already gone. Releasing an unknown or already released ID returns
// ErrNotMapped and changes nothing, so a second Release is harmless; test
// for it with errors.Is. A filesystem with open files makes it fail with
// ErrBusy and keeps the record, so that Release can be retried.
func (m *Mapper) Release(ctx context.Context, id string) error {
	if err := ValidateID(id); err != nil {
		return err
	}
	unlock, err := m.lock(id)
	if err != nil {
		return err
	}
	defer unlock()
	rec, err := m.store.load(id)
	if err != nil {
		return err
	}
	return m.release(ctx, rec)
}

func (m *Mapper) release(ctx context.Context, rec *Record) error {
	start := time.Now()
	// Private mount namespaces made while the image was mounted (those of
	// apps run by the checkpoint engines) hold copies of its mounts, which
	// keep the device busy: drop them first.
	if n, err := DetachCopies(rec.Target, rec.FuseDir); err != nil {
		m.log.Warn("detach copies of the mapping's mounts in other namespaces", "id", rec.ID, "err", err)
	} else if n > 0 {
		m.log.Debug("detached copies of the mapping's mounts in other namespaces", "id", rec.ID, "count", n)
	}
	// Unmounting writes back what the filesystem holds: on a cluster that
	// stopped serving I/O it would wait forever, so it is guarded too.
	if err := m.guard(ctx, rec, func() error { return m.unmount(ctx, rec) }); err != nil {
		return err
	}
	b, ok := m.all[rec.Backend]
	if !ok {
		return fmt.Errorf("mapping %s names backend %q, which this build does not have: %w", rec.ID, rec.Backend, ErrInvalid)
	}
	if err := guard(ctx, b, *rec, m.run.timeout, m.log, func() error { return b.Detach(ctx, *rec) }); err != nil {
		return err
	}
	if err := m.store.remove(rec.ID); err != nil {
		return err
	}
	m.log.Info("mapping released", "id", rec.ID, "image", rec.Image.String(), "backend", rec.Backend,
		"device", rec.Device, "target", rec.Target, "ms", time.Since(start).Milliseconds())
	return nil
}

// unmount unmounts rec.Target if (and only if) the mount there is on the
// recorded device.
func (m *Mapper) unmount(ctx context.Context, rec *Record) error {
	if rec.Target == "" {
		return nil
	}
	for range 4 { // the same device may be stacked on target
		ms, err := mountsAt(rec.Target)
		if err != nil {
			return err
		}
		ours := false
		for _, e := range ms {
			ours = ours || (rec.MountDev != "" && e.Dev == rec.MountDev)
		}
		if !ours {
			if len(ms) > 0 {
				m.log.Warn("mount target holds a mount that is not ours; leaving it", "id", rec.ID, "target", rec.Target,
					"found", ms[len(ms)-1].Source, "want_dev", rec.MountDev)
			}
			return nil
		}
		// What a process killed while it used the filesystem mounted
		// inside it (a build step's /proc, /dev and resolv.conf) would
		// keep it busy.
		subs, err := mountinfo.Under(rec.Target)
		if err != nil {
			return err
		}
		for _, sub := range slices.Backward(subs) { // children first
			if sub == rec.Target {
				continue
			}
			if err := m.run.umount(ctx, sub); err != nil {
				return fmt.Errorf("release %s (%s): a mount inside its filesystem: %w", rec.ID, rec.Image, err)
			}
		}
		if err := m.run.umount(ctx, rec.Target); err != nil {
			return fmt.Errorf("release %s (%s): %w", rec.ID, rec.Image, err)
		}
	}
	return fmt.Errorf("release %s: %s is still mounted after repeated umount: %w", rec.ID, rec.Target, ErrBusy)
}

// guard runs step, which does I/O on rec's device, under guard.
func (m *Mapper) guard(ctx context.Context, rec *Record, step func() error) error {
	b, ok := m.all[rec.Backend]
	if !ok {
		return step()
	}
	return guard(ctx, b, *rec, m.run.timeout, m.log, step)
}

// guard runs step, which does I/O on rec's device. When step has not
// returned a second after timeout and the backend's I/O can block forever
// (aborter: rbd-fuse on a cluster that stopped serving the image), the
// device is cut off, which makes step return; the error then wraps
// ErrStalled. A process blocked on such I/O ignores every signal, so the
// timeout of the command alone cannot end it.
func guard(ctx context.Context, b Backend, rec Record, timeout time.Duration, log *slog.Logger, step func() error) error {
	ab, ok := b.(aborter)
	if !ok {
		return step()
	}
	var cut bool
	fired := make(chan struct{})
	t := time.AfterFunc(timeout+time.Second, func() {
		defer close(fired)
		var err error
		if cut, err = ab.Abort(context.WithoutCancel(ctx), rec); err != nil {
			log.Warn("cutting off a stalled mapping", "id", rec.ID, "image", rec.Image.String(), "err", err)
		}
	})
	err := step()
	if !t.Stop() {
		<-fired
	}
	if !cut {
		return err
	}
	stalled := fmt.Errorf("%s: no answer within %s: %w (hint: the cluster does not serve the image's I/O; `ceph -s` shows OSDs down or a full pool)",
		rec.Image, timeout, ErrStalled)
	if err == nil {
		return stalled
	}
	return fmt.Errorf("%w: %w", stalled, err)
}

// Abort cuts off the I/O of mapping id when its backend can block forever
// on a cluster that stopped serving it (rbd-fuse is killed): every pending
// and later read or write of its device fails at once, so that processes
// blocked on it (an app, a mount, an unmount) return. The mapping stays
// recorded: Release it next. It does not wait for an operation in flight
// on id, since those are what it unblocks. Backends whose I/O does not
// block forever do nothing.
func (m *Mapper) Abort(ctx context.Context, id string) error {
	if err := ValidateID(id); err != nil {
		return err
	}
	rec, err := m.store.load(id)
	if err != nil {
		return err
	}
	b, ok := m.all[rec.Backend].(aborter)
	if !ok {
		return nil
	}
	_, err = b.Abort(ctx, *rec)
	return err
}
