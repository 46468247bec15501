// Package ckptstream carries a checkpoint's directory from one node to another as one stream (a
// tar of its directories, regular files and links, uncompressed: a checkpoint written a moment
// ago is in the page cache, and on a PoP's network compressing it costs more than it saves), and
// writes what it receives with the care owed to bytes from another machine: every name stays
// inside the destination, nothing is written through a link, and the whole is bounded in size.
package ckptstream

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// ErrRefused: a stream holds what a checkpoint never does (a name out of
// its directory, a device, a file through a link) or more than its bound.
var ErrRefused = errors.New("checkpoint stream refused")

// Write writes directory dir's tree to w and returns the bytes of its
// regular files.
func Write(ctx context.Context, w io.Writer, dir string) (int64, error) {
	tw := tar.NewWriter(w)
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		switch {
		case d.IsDir(), d.Type().IsRegular():
		case d.Type()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s is not a regular file, directory or link", p)
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name, hdr.Uname, hdr.Gname = filepath.ToSlash(rel), "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		c, err := io.Copy(tw, f)
		n += c
		return err
	})
	if err != nil {
		return n, err
	}
	return n, tw.Close()
}

// Read writes the tree of stream r into directory dst (which exists, and
// which it fills) and returns the bytes of its regular files. A stream
// with more than limit bytes of files (limit > 0), a name out of dst, a
// path through a link, or another kind of file is refused (ErrRefused);
// what was written before stays for the caller to remove.
func Read(ctx context.Context, r io.Reader, dst string, limit int64) (int64, error) {
	tr := tar.NewReader(r)
	links := map[string]bool{}
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		name, err := safeName(hdr.Name, links)
		if err != nil {
			return n, err
		}
		to := filepath.Join(dst, name)
		mode := fs.FileMode(hdr.Mode) & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.Mkdir(to, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return n, err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(hdr.Linkname, to); err != nil {
				return n, err
			}
			links[name] = true
			if err := os.Lchown(to, hdr.Uid, hdr.Gid); err != nil {
				return n, err
			}
			continue
		case tar.TypeReg:
			if limit > 0 && n+hdr.Size > limit {
				return n, fmt.Errorf("%w: more than %d bytes (the checkpoint's size and a margin)", ErrRefused, limit)
			}
			c, err := writeFile(to, tr, hdr.Size)
			n += c
			if err != nil {
				return n, err
			}
		default:
			return n, fmt.Errorf("%w: %q is of tar type %q, neither a file, a directory nor a link", ErrRefused, hdr.Name, hdr.Typeflag)
		}
		if err := os.Lchown(to, hdr.Uid, hdr.Gid); err != nil {
			return n, err
		}
		if err := os.Chmod(to, mode); err != nil {
			return n, err
		}
	}
}

// safeName is name cleaned, refused if it leaves its directory or goes
// through a link the stream made.
func safeName(name string, links map[string]bool) (string, error) {
	clean := filepath.Clean(filepath.FromSlash(name))
	if clean == "." || filepath.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, ".."+string(filepath.Separator)) {
		return "", fmt.Errorf("%w: the name %q is outside the checkpoint's directory", ErrRefused, name)
	}
	if links[clean] {
		return "", fmt.Errorf("%w: %q is a link the stream made already", ErrRefused, name)
	}
	for p := filepath.Dir(clean); p != "."; p = filepath.Dir(p) {
		if links[p] {
			return "", fmt.Errorf("%w: %q is written through the link %q", ErrRefused, name, p)
		}
	}
	return clean, nil
}

// writeFile writes size bytes of r into a new file at to, never through a
// link.
func writeFile(to string, r io.Reader, size int64) (int64, error) {
	f, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return 0, err
	}
	n, err := io.CopyN(f, r, size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return n, err
}
