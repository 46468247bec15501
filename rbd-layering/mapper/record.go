package mapper

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/atomicfile"
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

// store reads and writes records under StateDir/mappings.
type store struct{ dir string }

func (s store) path(id string) string { return filepath.Join(s.dir, id+".json") }

func (s store) init() error {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return fmt.Errorf("create state directory: %w", err)
	}
	return nil
}

// marshalTemp writes rec to a fsynced temporary file in s.dir.
func (s store) marshalTemp(rec *Record) (string, error) {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp(s.dir, "."+rec.ID+".*.tmp")
	if err != nil {
		return "", fmt.Errorf("write record %s: %w", rec.ID, err)
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("write record %s: %w", rec.ID, err)
	}
	return f.Name(), nil
}

// create writes a new record, failing with ErrBusy if the ID is taken.
// link(2) makes the exclusive create atomic.
func (s store) create(rec *Record) error {
	tmp, err := s.marshalTemp(rec)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, s.path(rec.ID)); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("mapping ID %q is already in use (record %s): %w (hint: pick another ID or release that mapping)", rec.ID, s.path(rec.ID), ErrBusy)
		}
		return fmt.Errorf("write record %s: %w", rec.ID, err)
	}
	return syncDir(s.dir)
}

// save replaces the record atomically and durably.
func (s store) save(rec *Record) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(s.path(rec.ID), append(b, '\n'), 0o600, true); err != nil {
		return fmt.Errorf("record %s: %w", rec.ID, err)
	}
	return nil
}

func (s store) load(id string) (*Record, error) {
	b, err := os.ReadFile(s.path(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("mapping %q: %w (hint: it was never mapped on this node, or was already released)", id, ErrNotMapped)
	}
	if err != nil {
		return nil, fmt.Errorf("read record %s: %w", id, err)
	}
	var rec Record
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("record %s is corrupt: %w", s.path(id), err)
	}
	if rec.Version != recordVersion || rec.ID != id {
		return nil, fmt.Errorf("record %s has version %d and ID %q, want version %d and ID %q", s.path(id), rec.Version, rec.ID, recordVersion, id)
	}
	return &rec, nil
}

func (s store) remove(id string) error {
	if err := os.Remove(s.path(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove record %s: %w", id, err)
	}
	return syncDir(s.dir)
}

// ids lists the record IDs, sorted. Leftover temporary files of a crashed
// writer are removed.
func (s store) ids() ([]string, error) {
	ents, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list records: %w", err)
	}
	var ids []string
	for _, e := range ents {
		n := e.Name()
		switch {
		case strings.HasPrefix(n, ".") && strings.HasSuffix(n, ".tmp"):
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > time.Minute {
				os.Remove(filepath.Join(s.dir, n))
			}
		case strings.HasSuffix(n, ".json"):
			ids = append(ids, strings.TrimSuffix(n, ".json"))
		}
	}
	sort.Strings(ids)
	return ids, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// newID returns 12 random hex digits.
func newID() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
