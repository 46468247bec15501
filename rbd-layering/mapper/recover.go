// Mappings left by a killed process: listed, recovered, released.

package mapper

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"syscall"

	"github.com/fogdeploy/fogdeploy/internal/procstat"
)

// List returns every mapping recorded in StateDir, also those made by
// other Mapper instances or earlier processes.
func (m *Mapper) List() ([]Mapping, error) {
	ids, err := m.store.ids()
	if err != nil {
		return nil, err
	}
	var out []Mapping
	var errs []error
	for _, id := range ids {
		rec, err := m.store.load(id)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		mp := rec.mapping()
		mp.Live = rec.Owner.PID == m.owner.PID || m.live(rec)
		out = append(out, mp)
	}
	return out, errors.Join(errs...)
}

// Recover undoes every mapping recorded in StateDir, as after a crash or
// kill: it unmounts, detaches, stops rbd-fuse processes and removes the
// records, verifying identity at each step, and returns what it undid.
// Resources that are already gone are skipped without error. Records of
// another process that is still running are left alone (and logged);
// records of this process, from any Mapper instance, are undone, so call
// Recover at start-up, before mapping anything.
func (m *Mapper) Recover(ctx context.Context) ([]Mapping, error) {
	undone, err := m.releaseWhere(ctx, func(*Record) bool { return true })
	if len(undone) > 0 {
		m.log.Info("recovered mappings", "count", len(undone))
	}
	return undone, err
}

// ReleaseAbandoned releases the Ephemeral mappings whose process is gone
// (an environment build killed halfway leaves its step's image mapped and
// mounted): no record names them, so no one else would. It returns what it
// released; mappings of running processes, this one's included, stay.
func (m *Mapper) ReleaseAbandoned(ctx context.Context) ([]Mapping, error) {
	undone, err := m.releaseWhere(ctx, func(r *Record) bool { return r.Ephemeral && r.Owner.PID != m.owner.PID && !m.live(r) })
	if len(undone) > 0 {
		m.log.Info("released the mappings of processes that are gone", "count", len(undone))
	}
	return undone, err
}

// releaseWhere releases the recorded mappings that match and whose owner
// is this process or gone, each under its lock. A record that does not
// match as read first is passed over without its lock, which an operation
// of this process may hold.
func (m *Mapper) releaseWhere(ctx context.Context, match func(*Record) bool) ([]Mapping, error) {
	ids, err := m.store.ids()
	if err != nil {
		return nil, err
	}
	var undone []Mapping
	var errs []error
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		if rec, err := m.store.load(id); err == nil && !match(rec) {
			continue
		}
		unlock, err := m.lock(id)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rec, err := m.store.load(id)
		switch {
		case errors.Is(err, ErrNotMapped):
			// released meanwhile
		case err != nil:
			errs = append(errs, err)
		case !match(rec):
		case m.live(rec):
			m.log.Warn("not releasing a mapping of a running process", "id", id, "image", rec.Image.String(), "pid", rec.Owner.PID)
		default:
			if err := m.release(ctx, rec); err != nil {
				errs = append(errs, fmt.Errorf("release %s: %w", id, err))
			} else {
				undone = append(undone, rec.mapping())
			}
		}
		unlock()
	}
	return undone, errors.Join(errs...)
}

// live says whether rec's owner is another process that still runs.
func (m *Mapper) live(rec *Record) bool {
	return rec.Owner.PID != m.owner.PID && procstat.Alive(rec.Owner.PID, rec.Owner.Start)
}

// Mounted reports whether mapping id is mounted now at the target its
// record names: not when it has no record or no target, nor when the mount
// is gone (the node restarted since).
func (m *Mapper) Mounted(id string) (bool, error) {
	if err := ValidateID(id); err != nil {
		return false, err
	}
	rec, err := m.store.load(id)
	if errors.Is(err, ErrNotMapped) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	if rec.Target == "" {
		return false, nil
	}
	// A mount point is on another device than its parent: two stats,
	// not a read of the mount table, on a restore's path.
	var st, parent syscall.Stat_t
	if err := syscall.Stat(rec.Target, &st); err != nil {
		return false, nil
	}
	if err := syscall.Stat(filepath.Dir(rec.Target), &parent); err != nil {
		return false, err
	}
	return st.Dev != parent.Dev, nil
}
