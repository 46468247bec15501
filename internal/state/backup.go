// Backups of the PoP's etcd, and the record of the last one that gc reads: an etcd restored from
// a backup does not know what was made after it, so gc removes nothing younger than it.

package state

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// BackupKey holds the record of the PoP's last backup (Backup, JSON),
// written just before the snapshot is taken, so that the snapshot holds
// it too: an etcd restored from it knows when it was taken.
const BackupKey = Prefix + "backup"

// Backup records one snapshot of the PoP's etcd.
type Backup struct {
	// Taken is when the snapshot was begun (its record written).
	Taken time.Time `json:"taken"`
	// Revision is the etcd revision of the record (in the answer of
	// Snapshot): the snapshot holds every write up to it.
	Revision int64 `json:"revision,omitempty"`
	// Bytes is the snapshot's size (in the answer of Snapshot only).
	Bytes int64 `json:"bytes,omitempty"`
}

// Snapshot records a backup (BackupKey), then writes a snapshot of etcd's
// whole keyspace (etcd's own format: `etcdutl snapshot restore` restores
// it) to w, and returns the record with the snapshot's size.
func (s *Store) Snapshot(ctx context.Context, w io.Writer) (Backup, error) {
	b := Backup{Taken: time.Now().UTC()}
	v, err := json.Marshal(b)
	if err != nil {
		return b, err
	}
	r, err := s.cli.Put(ctx, BackupKey, string(v))
	if err != nil {
		return b, wrapUnavailable(err)
	}
	b.Revision = r.Header.Revision
	rc, err := s.cli.Snapshot(ctx)
	if err != nil {
		return b, wrapUnavailable(err)
	}
	defer rc.Close()
	n, err := io.Copy(w, rc)
	b.Bytes = n
	if err != nil {
		return b, fmt.Errorf("etcd snapshot: %w", err)
	}
	return b, nil
}

// LastBackup reads the record of the PoP's last backup: nil when none was
// taken with Snapshot.
func (s *Store) LastBackup(ctx context.Context) (*Backup, error) {
	r, err := s.cli.Get(ctx, BackupKey)
	if err != nil {
		return nil, wrapUnavailable(err)
	}
	if len(r.Kvs) == 0 {
		return nil, nil
	}
	var b Backup
	if err := json.Unmarshal(r.Kvs[0].Value, &b); err != nil || b.Taken.IsZero() {
		return nil, fmt.Errorf("backup record %s is unreadable (%q): write a new one with `fogctl pop backup`", BackupKey, r.Kvs[0].Value)
	}
	return &b, nil
}
