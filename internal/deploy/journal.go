// The record store: one JSON file per record, written before each step of the lifecycle (create
// refuses an existing record; save replaces one atomically), so that Undeploy, Recover and Adopt,
// in any process, undo exactly what was made. Deployments and slots are its two kinds of record.

package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/atomicfile"
)

// journal stores records of one kind (what) in dir, by ID.
type journal[T any] struct {
	dir string
	// what names the kind in errors ("deployment", "slot").
	what string
	// notFound is the sentinel a missing record wraps.
	notFound error
}

func (j journal[T]) path(id string) string { return filepath.Join(j.dir, id+".json") }

// create writes a new record, durably when durable is set (a record that
// names what is about to be made); one that exists is ErrExists. A record
// that recovery does not depend on until a later save (a deployment that
// owns nothing yet) need not wait for the disk.
func (j journal[T]) create(id string, v *T, durable bool) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(j.path(id), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("%s %s: %w", j.what, id, ErrExists)
	} else if err != nil {
		return err
	}
	_, err = f.Write(b)
	if durable {
		err = errors.Join(err, f.Sync())
	}
	if err = errors.Join(err, f.Close()); err != nil {
		// A record cut short (a full disk) is unreadable, and would
		// stay behind with its ID taken.
		_ = os.Remove(j.path(id))
	}
	return err
}

// A spare is a file made for a record before the record exists (reserve),
// so that creating the record later (createFrom) makes no file: on a file
// system busy with short-lived files, making one is most of what a durable
// record costs (ext4 without a journal skips every inode freed in the last
// minutes), and writing over blocks that exist is the rest's cheapest part.
// It holds spareSize spaces, whitespace to JSON, until then; list skips it.
const spareSize = 4096

// sparePath is where the spare of record id is.
func (j journal[T]) sparePath(id string) string { return filepath.Join(j.dir, id+".spare") }

// reserve makes the spare of record id, durably.
func (j journal[T]) reserve(id string) error {
	f, err := os.OpenFile(j.sparePath(id), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(bytes.Repeat([]byte{' '}, spareSize))
	if err = errors.Join(err, f.Sync(), f.Close()); err != nil {
		_ = os.Remove(j.sparePath(id))
	}
	return err
}

// unreserve removes the spare of record id, if there is one.
func (j journal[T]) unreserve(id string) error {
	err := os.Remove(j.sparePath(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// dropSpares removes the spares whose record is gone.
func (j journal[T]) dropSpares() error {
	spares, err := filepath.Glob(filepath.Join(j.dir, "*.spare"))
	if err != nil {
		return err
	}
	var errs []error
	for _, sp := range spares {
		id := strings.TrimSuffix(filepath.Base(sp), ".spare")
		if _, err := os.Stat(j.path(id)); errors.Is(err, os.ErrNotExist) {
			errs = append(errs, j.unreserve(id))
		}
	}
	return errors.Join(errs...)
}

// createFrom is create(id, v, true) into spare, a file that reserve made
// (in any journal on this file system): the record is written over the
// spare's blocks, which reach the disk before the spare is renamed to the
// record's name. A record id that exists is ErrExists, and the spare stays
// (the next createFrom writes all of it again). With no spare it creates
// the record's file.
func (j journal[T]) createFrom(spare, id string, v *T) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(spare, os.O_WRONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return j.create(id, v, true)
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
func (j journal[T]) claimName(file, id string) error {
	err := unix.Renameat2(unix.AT_FDCWD, file, unix.AT_FDCWD, j.path(id), unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		// A file system without RENAME_NOREPLACE: a link is refused
		// over an existing name too.
		if err = os.Link(file, j.path(id)); err == nil {
			_ = os.Remove(file) // or the slot's release does
		}
	}
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("%s %s: %w", j.what, id, ErrExists)
	}
	return err
}

// save replaces a record atomically and durably: it is on disk when save
// returns. A record is saved before what it names is made or handed to it.
func (j journal[T]) save(id string, v *T) error { return j.replace(id, v, true) }

// note replaces a record atomically without waiting for the disk: for a
// change that recovery does not depend on (a claim, a timing), which a
// crash of the machine may lose while a crash of the process cannot.
func (j journal[T]) note(id string, v *T) error { return j.replace(id, v, false) }

func (j journal[T]) replace(id string, v *T, sync bool) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return atomicfile.Write(j.path(id), b, 0o600, sync)
}

// load reads a record; a missing one wraps j.notFound.
func (j journal[T]) load(id string) (T, error) {
	var v T
	b, err := os.ReadFile(j.path(id))
	if errors.Is(err, os.ErrNotExist) {
		return v, fmt.Errorf("%s %s: %w", j.what, id, j.notFound)
	} else if err != nil {
		return v, err
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return v, fmt.Errorf("%s record %s: %w", j.what, id, err)
	}
	return v, nil
}

// list returns every readable record, by ID.
func (j journal[T]) list() ([]T, error) {
	ents, err := os.ReadDir(j.dir)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		if id, ok := strings.CutSuffix(e.Name(), ".json"); ok {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	var out []T
	for _, id := range ids {
		if v, err := j.load(id); err == nil {
			out = append(out, v)
		}
	}
	return out, nil
}

// remove deletes a record; a missing one is not an error.
func (j journal[T]) remove(id string) error {
	err := os.Remove(j.path(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}
