// Package journal is the project's record store: one JSON file per record
// in a directory, written before each step that makes what it names
// (Create refuses a taken ID; Save replaces a record atomically), so that a
// restarted process undoes exactly what was made. The deployer's
// deployments, slots and node copies and the mapper's mappings are its
// records.
package journal

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"log/slog"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/atomicfile"
)

// Journal stores records of one kind in Dir, one file per ID.
type Journal[T any] struct {
	Dir string
	// What names the kind in errors ("deployment", "slot", "mapping").
	What string
	// NotFound is the sentinel that Load of a missing record wraps.
	NotFound error
	// Exists is the sentinel that Create of a taken ID wraps (default
	// ErrExists).
	Exists error
	// SyncDir makes durable writes and removals sync the directory too,
	// so that a record's name, not only its content, survives a power
	// loss (records that name kernel resources: the mapper's).
	SyncDir bool
	// Log, if set, is told of each record List sets aside.
	Log *slog.Logger
}

// CorruptSuffix ends the name of a record List set aside: <id>.json then
// this.
const CorruptSuffix = ".corrupt"

// ErrExists is the default Journal.Exists.
var ErrExists = errors.New("record exists")

// Path is where record id is.
func (j Journal[T]) Path(id string) string { return filepath.Join(j.Dir, id+".json") }

// Init makes the directory (0700).
func (j Journal[T]) Init() error {
	if err := os.MkdirAll(j.Dir, 0o700); err != nil {
		return fmt.Errorf("%s records: %w", j.What, err)
	}
	return nil
}

func (j Journal[T]) exists(id string) error {
	sentinel := j.Exists
	if sentinel == nil {
		sentinel = ErrExists
	}
	return fmt.Errorf("%s %s: %w", j.What, id, sentinel)
}

func (j Journal[T]) syncDir() error {
	if !j.SyncDir {
		return nil
	}
	return atomicfile.SyncDir(j.Dir)
}

// Create writes a new record, whole or not at all (a temporary file
// linked to the record's name, which a taken ID refuses: it wraps
// Exists). With durable, the record is on disk when Create returns (a
// record that names what is about to be made), its name too under
// SyncDir; a record that recovery does not depend on until a later Save
// (a deployment that owns nothing yet) need not wait for the disk.
func (j Journal[T]) Create(id string, v *T, durable bool) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(j.Dir, "."+id+".*.tmp")
	if err != nil {
		return fmt.Errorf("%s record %s: %w", j.What, id, err)
	}
	defer os.Remove(f.Name())
	_, err = f.Write(b)
	if durable {
		err = errors.Join(err, f.Sync())
	}
	if err = errors.Join(err, f.Close()); err != nil {
		return fmt.Errorf("%s record %s: %w", j.What, id, err)
	}
	if err := os.Link(f.Name(), j.Path(id)); errors.Is(err, os.ErrExist) {
		return j.exists(id)
	} else if err != nil {
		return fmt.Errorf("%s record %s: %w", j.What, id, err)
	}
	if durable {
		return j.syncDir()
	}
	return nil
}

// A spare is a file made for a record before the record exists (Reserve),
// so that creating the record later (CreateFrom) makes no file: on a file
// system busy with short-lived files, making one is most of what a durable
// record costs (ext4 without a journal skips every inode freed in the last
// minutes), and writing over blocks that exist is the rest's cheapest part.
// It holds spareSize spaces, whitespace to JSON, until then; IDs and List skip it.
const spareSize = 4096

// SparePath is where the spare of record id is.
func (j Journal[T]) SparePath(id string) string { return filepath.Join(j.Dir, id+".spare") }

// Reserve makes the spare of record id, durably.
func (j Journal[T]) Reserve(id string) error {
	f, err := os.OpenFile(j.SparePath(id), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(bytes.Repeat([]byte{' '}, spareSize))
	if err = errors.Join(err, f.Sync(), f.Close()); err != nil {
		_ = os.Remove(j.SparePath(id))
	}
	return err
}

// Unreserve removes the spare of record id, if there is one.
func (j Journal[T]) Unreserve(id string) error {
	err := os.Remove(j.SparePath(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// DropSpares removes the spares whose record is gone.
func (j Journal[T]) DropSpares() error {
	spares, err := filepath.Glob(filepath.Join(j.Dir, "*.spare"))
	if err != nil {
		return err
	}
	var errs []error
	for _, sp := range spares {
		id := strings.TrimSuffix(filepath.Base(sp), ".spare")
		if _, err := os.Stat(j.Path(id)); errors.Is(err, os.ErrNotExist) {
			errs = append(errs, j.Unreserve(id))
		}
	}
	return errors.Join(errs...)
}

// CreateFrom is Create(id, v, true) into spare, a file that Reserve made
// (in any journal on this file system): the record is written over the
// spare's blocks, which reach the disk before the spare is renamed to the
// record's name. A record id that exists wraps Exists, and the spare stays
// (the next CreateFrom writes all of it again). With no spare it creates
// the record's file.
func (j Journal[T]) CreateFrom(spare, id string, v *T) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(spare, os.O_WRONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return j.Create(id, v, true)
	} else if err != nil {
		return err
	}
	// What the record does not cover stays whitespace.
	if fi, err := f.Stat(); err == nil && fi.Size() > int64(len(b)) {
		b = append(b, bytes.Repeat([]byte{' '}, int(fi.Size())-len(b))...)
	}
	_, err = f.Write(b)
	if err == nil {
		err = unix.Fdatasync(int(f.Fd()))
	}
	if err = errors.Join(err, f.Close()); err != nil {
		return err
	}
	return j.claimName(spare, id)
}

// claimName renames file to record id's name, which must not exist.
func (j Journal[T]) claimName(file, id string) error {
	err := unix.Renameat2(unix.AT_FDCWD, file, unix.AT_FDCWD, j.Path(id), unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		// A file system without RENAME_NOREPLACE: a link is refused
		// over an existing name too.
		if err = os.Link(file, j.Path(id)); err == nil {
			_ = os.Remove(file) // or the slot's release does
		}
	}
	if errors.Is(err, os.ErrExist) {
		return j.exists(id)
	}
	return err
}

// Save replaces a record atomically and durably: it is on disk when save
// returns. A record is saved before what it names is made or handed to it.
func (j Journal[T]) Save(id string, v *T) error { return j.replace(id, v, true) }

// Note replaces a record atomically without waiting for the disk: for a
// change that recovery does not depend on (a claim, a timing), which a
// crash of the machine may lose while a crash of the process cannot.
func (j Journal[T]) Note(id string, v *T) error { return j.replace(id, v, false) }

func (j Journal[T]) replace(id string, v *T, sync bool) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return atomicfile.Write(j.Path(id), b, 0o600, sync)
}

// Load reads a record; a missing one wraps j.NotFound.
func (j Journal[T]) Load(id string) (T, error) {
	var v T
	b, err := os.ReadFile(j.Path(id))
	if errors.Is(err, os.ErrNotExist) {
		return v, fmt.Errorf("%s %s: %w", j.What, id, j.NotFound)
	} else if err != nil {
		return v, err
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return v, fmt.Errorf("%s record %s: %w", j.What, id, err)
	}
	return v, nil
}

// IDs lists the records' IDs, sorted. It removes the temporary files
// that a writer killed mid-Save left, once they are a minute old.
func (j Journal[T]) IDs() ([]string, error) {
	ents, err := os.ReadDir(j.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("%s records: %w", j.What, err)
	}
	var ids []string
	for _, e := range ents {
		n := e.Name()
		switch {
		case strings.HasPrefix(n, ".") && strings.HasSuffix(n, ".tmp"):
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > time.Minute {
				_ = os.Remove(filepath.Join(j.Dir, n))
			}
		case strings.HasSuffix(n, ".json"):
			ids = append(ids, strings.TrimSuffix(n, ".json"))
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// List returns every readable record, by ID. A record that is not one
// (a write the machine lost before it reached the disk) is set aside as
// <id>.json.corrupt beside the others, where an operator finds it, and
// logged (Log): List drops none without a word, and lists it no more. A
// record that vanished meanwhile is skipped.
func (j Journal[T]) List() ([]T, error) {
	ids, err := j.IDs()
	if err != nil {
		return nil, err
	}
	var out []T
	for _, id := range ids {
		v, err := j.Load(id)
		switch {
		case err == nil:
			out = append(out, v)
		case errors.Is(err, j.NotFound):
		default:
			j.setAside(id, err)
		}
	}
	return out, nil
}

// setAside renames record id, which Load could not read, to its corrupt
// name, and says so.
func (j Journal[T]) setAside(id string, why error) {
	path := j.Path(id)
	err := os.Rename(path, path+CorruptSuffix)
	if err == nil {
		err = j.syncDir()
	}
	if j.Log != nil {
		j.Log.Warn("a record that cannot be read was set aside; what it named is not undone by this node", "kind", j.What, "id", id,
			"path", path+CorruptSuffix, "why", why, "err", err)
	}
}

// Remove deletes a record; a missing one is not an error.
func (j Journal[T]) Remove(id string) error {
	if err := os.Remove(j.Path(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s record %s: %w", j.What, id, err)
	}
	return j.syncDir()
}
