// The app's POSIX shared memory (/dev/shm, e.g. PostgreSQL's dynamic shared memory) across a
// CRIU checkpoint: criu records a mapping of such a file by its path, not its contents, and the
// /dev/shm of a restore is an empty one.

package engine

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// shmImageDir is where an image keeps the files of the app's /dev/shm.
const shmImageDir = "devshm"

// saveShm moves the regular files of /dev/shm in root into dir's
// shmImageDir (inside sb, whose mount namespace holds that /dev/shm),
// with their mode and owner, once the dump has stopped the app: they
// leave with it, as its memory does. It returns their bytes, and moves
// nothing without a root; links, directories and other files are left.
func saveShm(sb *sandbox, root, dir string) (n int64, err error) {
	if root == "" {
		return 0, nil
	}
	err = sb.do(func() (err error) {
		n, err = copyShmFiles(filepath.Join(root, "dev", "shm"), filepath.Join(dir, shmImageDir), true, "save")
		return err
	})
	return n, err
}

// restoreShm puts the /dev/shm files an image saved (saveShm) back into
// root's /dev/shm inside sb, before criu restores the app that maps them.
// A file of that name already there is an error: two instances would
// share it.
func restoreShm(sb *sandbox, root, imgDir string) error {
	src := filepath.Join(imgDir, shmImageDir)
	if _, err := os.Stat(src); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return sb.do(func() error {
		_, err := copyShmFiles(src, filepath.Join(root, "dev", "shm"), false, "restore")
		return err
	})
}

// copyShmFiles copies the regular files of directory src into dst,
// removing each from src once copied when move is set (a save, which
// makes dst: a restore's is the root's /dev/shm), and returns their
// bytes. A missing src holds nothing.
func copyShmFiles(src, dst string, move bool, verb string) (n int64, err error) {
	ents, err := os.ReadDir(src)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		if move {
			if err := os.MkdirAll(dst, 0o700); err != nil {
				return n, err
			}
		}
		c, err := copyShmFile(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name()))
		if err == nil && move {
			err = os.Remove(filepath.Join(src, e.Name()))
		}
		if err != nil {
			return n, fmt.Errorf("%s /dev/shm/%s: %w", verb, e.Name(), err)
		}
		n += c
	}
	return n, nil
}

// copyShmFile copies regular file src to new file dst (never through a
// link), with src's mode and owner.
func copyShmFile(src, dst string) (int64, error) {
	in, err := os.OpenFile(src, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return 0, err
	}
	if !fi.Mode().IsRegular() {
		return 0, fmt.Errorf("%s is not a regular file: %w", src, ErrInvalid)
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, fi.Mode().Perm())
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(out, in)
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && err == nil {
		err = out.Chown(int(st.Uid), int(st.Gid))
	}
	if err == nil {
		err = out.Chmod(fi.Mode().Perm())
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(dst)
	}
	return n, err
}
