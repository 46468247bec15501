package mapper

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/journal"
)

// recordVersion is bumped when Record changes incompatibly.
const recordVersion = 1

// Record is the on-disk state of one mapping, StateDir/mappings/<id>.json.
//
// Every field that names a resource is written (intent) BEFORE the resource
// is created, and the field that identifies the created resource right
// after, so a restarted process can undo exactly what was created and
// nothing else. Undo always verifies identity first: a loop device's
// backing file, a mount's device number in /proc/self/mountinfo, a
// process's start time and command line.
type Record struct {
	Version  int    `json:"version"`
	ID       string `json:"id"`
	Backend  string `json:"backend"`
	Image    Image  `json:"image"`
	ReadOnly bool   `json:"read_only,omitempty"`
	// Ephemeral: the mapping lives no longer than its owner's call
	// (Ephemeral); once the owner is gone, any process releases it.
	Ephemeral bool      `json:"ephemeral,omitempty"`
	Created   time.Time `json:"created"`
	Owner     Owner     `json:"owner"`

	// Device is the block device, set once the backend attached it.
	Device string `json:"device,omitempty"`

	// krbd, nbd: the spec passed to map (intent).
	Spec string `json:"spec,omitempty"`

	// fuse: the mount directory (intent), and the rbd-fuse process.
	FuseDir   string `json:"fuse_dir,omitempty"`
	FusePID   int    `json:"fuse_pid,omitempty"`
	FuseStart uint64 `json:"fuse_start,omitempty"` // /proc/PID/stat starttime

	// fuse, file: the loop device's backing file (intent) and the loop
	// device once attached.
	LoopBacking string `json:"loop_backing,omitempty"`
	LoopDev     string `json:"loop_dev,omitempty"`

	// Mount: target and the device number expected there (intent), then
	// Mounted once mount(8) succeeded.
	Target   string `json:"target,omitempty"`
	MountDev string `json:"mount_dev,omitempty"` // "major:minor"
	FSType   string `json:"fs_type,omitempty"`
	MountRO  bool   `json:"mount_ro,omitempty"`
	Mounted  bool   `json:"mounted,omitempty"`
}

// Owner identifies the process that created a record. Recover leaves alone
// the records of another process that is still running.
type Owner struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"` // /proc/PID/stat starttime, guards against PID reuse
}

func (r *Record) mapping() Mapping {
	return Mapping{
		ID:        r.ID,
		Image:     r.Image,
		Backend:   r.Backend,
		Device:    r.Device,
		Target:    r.Target,
		ReadOnly:  r.ReadOnly,
		Created:   r.Created,
		Ephemeral: r.Ephemeral,
	}
}

// store reads and writes records under StateDir/mappings, durably, the
// directory synced with each record made or removed.
type store struct{ j journal.Journal[Record] }

func newStore(dir string, log *slog.Logger) store {
	return store{journal.Journal[Record]{Dir: dir, What: "mapping", NotFound: ErrNotMapped, Exists: ErrBusy, SyncDir: true, Log: log}}
}

func (s store) path(id string) string { return s.j.Path(id) }

func (s store) init() error { return s.j.Init() }

// create writes a new record, failing with ErrBusy if the ID is taken.
func (s store) create(rec *Record) error {
	err := s.j.Create(rec.ID, rec, true)
	if errors.Is(err, ErrBusy) {
		return fmt.Errorf("%w (hint: pick another ID or release that mapping)", err)
	}
	return err
}

// save replaces the record atomically and durably.
func (s store) save(rec *Record) error { return s.j.Save(rec.ID, rec) }

func (s store) load(id string) (*Record, error) {
	rec, err := s.j.Load(id)
	if errors.Is(err, ErrNotMapped) {
		return nil, fmt.Errorf("%w (hint: it was never mapped on this node, or was already released)", err)
	} else if err != nil {
		return nil, err
	}
	if rec.Version != recordVersion || rec.ID != id {
		return nil, fmt.Errorf("record %s has version %d and ID %q, want version %d and ID %q", s.path(id), rec.Version, rec.ID, recordVersion, id)
	}
	return &rec, nil
}

func (s store) remove(id string) error { return s.j.Remove(id) }

// ids lists the record IDs, sorted.
func (s store) ids() ([]string, error) { return s.j.IDs() }

// newID returns 12 random hex digits.
func newID() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
