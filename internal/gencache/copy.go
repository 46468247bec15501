package gencache

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// CopyTree copies the directory src into dst (an existing directory) as a
// Fill does: regular files, directories and symbolic links, with their
// modes and owners (an engine may have written them as the app's user, and
// restores as that user must read them). Other kinds of files are refused.
func CopyTree(ctx context.Context, src, dst string) error {
	buf := make([]byte, copyBuffer)
	return walkTree(ctx, src, dst, func(_, from, to string, perm fs.FileMode) error {
		return copyFileWith(from, to, perm, buf, nil)
	})
}

// walkTree makes in dst the directories and links of the tree src, and
// has file copy each regular file (rel: its path under src), then gives
// each copy its mode and owner; other kinds of files are refused.
func walkTree(ctx context.Context, src, dst string, file func(rel, from, to string, perm fs.FileMode) error) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if rel != "." {
				if err := os.Mkdir(to, info.Mode().Perm()); err != nil {
					return err
				}
			}
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, to); err != nil {
				return err
			}
		case d.Type().IsRegular():
			if err := file(rel, p, to, info.Mode().Perm()); err != nil {
				return err
			}
		default:
			return fmt.Errorf("copy %s: %s is not a regular file, directory or link", p, info.Mode().Type())
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			if err := os.Lchown(to, int(st.Uid), int(st.Gid)); err != nil {
				return err
			}
		}
		if d.Type()&fs.ModeSymlink == 0 {
			// After Lchown, which clears set-ID bits.
			return os.Chmod(to, info.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
		}
		return nil
	})
}

// copyBuffer is the size of a copy's reads and writes. From an image
// mapped through rbd-fuse and a loop device, 1 MiB ones cost the copying
// process about 40 % less CPU than io.Copy's 32 KiB (the copy shares the
// node's cores with the container a restore creates meanwhile).
const copyBuffer = 1 << 20

// copyFileWith copies from into a new file to through buf, handing each
// chunk to seen (if set) as it goes: every chunk but the last is a whole
// buffer. What seen returns (if not nil) is called once the chunk is
// written, before buf is read into again.
func copyFileWith(from, to string, perm fs.FileMode, buf []byte, seen func([]byte) func()) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	for {
		n, rerr := io.ReadFull(in, buf)
		if n > 0 {
			var done func()
			if seen != nil {
				done = seen(buf[:n])
			}
			_, err := out.Write(buf[:n])
			if done != nil {
				done()
			}
			if err != nil {
				out.Close()
				return err
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			out.Close()
			return rerr
		}
	}
	return out.Close()
}

// treeBytes returns the bytes the regular files under dir hold.
func treeBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		info, err := d.Info()
		n += info.Size()
		return err
	})
	return n, err
}

// syncTree flushes every file and directory under dir to disk and returns
// the bytes its regular files hold.
func syncTree(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && !d.Type().IsRegular() {
			return nil // a link, a socket: nothing to flush
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			n += info.Size()
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		return f.Sync()
	})
	if err != nil {
		return 0, err
	}
	// The entry's name in its app's directory.
	return n, syncDir(filepath.Dir(dir))
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// writeFileSync writes b to name and flushes it and its directory.
func writeFileSync(name string, b []byte) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return syncDir(filepath.Dir(name))
}

// EmptyDir removes everything in dir, keeping dir: a copy that failed
// midway, before another.
func EmptyDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}
