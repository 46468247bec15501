// Package atomicfile replaces a file whole: readers see its old content or
// its new one, never a part, and a crash leaves one of the two. It is the
// project's one temporary-file-and-rename; files in a directory that an app
// can write go through internal/ctlfs instead.
package atomicfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Write replaces path with b: a temporary file beside it, written, renamed
// over it. With durable, the file is synced before the rename and the
// directory after it, so that the new content survives a power loss. A
// failed write leaves no temporary file.
func Write(path string, b []byte, perm os.FileMode, durable bool) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".*.tmp")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
			err = fmt.Errorf("write %s: %w", path, err)
		}
	}()
	_, err = f.Write(b)
	err = errors.Join(err, f.Chmod(perm))
	if durable {
		err = errors.Join(err, f.Sync())
	}
	if err = errors.Join(err, f.Close()); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil || !durable {
		return err
	}
	return SyncDir(dir)
}

// SyncDir syncs directory dir, so that the names made or removed in it
// survive a power loss.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
