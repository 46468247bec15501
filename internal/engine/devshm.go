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
	err = sb.do(func() error {
		src := filepath.Join(root, "dev", "shm")
		ents, err := os.ReadDir(src)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, shmImageDir)
		for _, e := range ents {
			if !e.Type().IsRegular() {
				continue
			}
			if err := os.MkdirAll(dst, 0o700); err != nil {
				return err
			}
			c, err := copyShmFile(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name()))
			if err == nil {
				err = os.Remove(filepath.Join(src, e.Name()))
			}
			if err != nil {
				return fmt.Errorf("save /dev/shm/%s: %w", e.Name(), err)
			}
			n += c
		}
		return nil
	})
	return n, err
}

// restoreShm puts the /dev/shm files an image saved (saveShm) back into
// root's /dev/shm inside sb, before criu restores the app that maps them.
// A file of that name already there is an error: two instances would
// share it.
func restoreShm(sb *sandbox, root, imgDir string) error {
	src := filepath.Join(imgDir, shmImageDir)
	ents, err := os.ReadDir(src)
	if errors.Is(err, os.ErrNotExist) || len(ents) == 0 {
		return nil
	}
	if err != nil {
		return err
	}
	return sb.do(func() error {
		dst := filepath.Join(root, "dev", "shm")
		for _, e := range ents {
			if !e.Type().IsRegular() {
				continue
			}
			if _, err := copyShmFile(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
				return fmt.Errorf("restore /dev/shm/%s: %w", e.Name(), err)
			}
		}
		return nil
	})
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
