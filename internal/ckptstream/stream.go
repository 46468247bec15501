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
	"strconv"
	"strings"
	"syscall"
)

// ErrRefused: a stream holds what a checkpoint never does (a name out of
// its directory, a device, a file through a link) or more than its bound.
var ErrRefused = errors.New("checkpoint stream refused")

// Extent is a byte range of a file.
type Extent struct{ Off, Len int64 }

// PAX records of a file written without some of its bytes (WriteWithout):
// its whole size, and the ranges left out ("off+len,off+len", in order).
const (
	paxSize  = "FOGDEPLOY.size"
	paxHoles = "FOGDEPLOY.holes"
)

// Write writes directory dir's tree to w and returns the bytes of its
// regular files.
func Write(ctx context.Context, w io.Writer, dir string) (int64, error) {
	return WriteWithout(ctx, w, dir, nil)
}

// WriteWithout is Write without the byte ranges holes names for each file
// (by its name relative to dir; in order, not overlapping): Read makes
// such a file at its whole size with those ranges unwritten (a sparse
// file that reads zeros there), for a reader that gets them another way.
// It returns the bytes it wrote of the files.
func WriteWithout(ctx context.Context, w io.Writer, dir string, holes map[string][]Extent) (int64, error) {
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
		hs := holes[hdr.Name]
		var data []Extent
		if d.Type().IsRegular() && len(hs) > 0 {
			if data, err = dataOf(info.Size(), hs); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			hdr.Format = tar.FormatPAX
			hdr.PAXRecords = map[string]string{paxSize: strconv.FormatInt(info.Size(), 10), paxHoles: formatExtents(hs)}
			hdr.Size = 0
			for _, x := range data {
				hdr.Size += x.Len
			}
		}
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
		if data == nil {
			c, err := io.Copy(tw, f)
			n += c
			return err
		}
		for _, x := range data {
			c, err := io.Copy(tw, io.NewSectionReader(f, x.Off, x.Len))
			n += c
			if err != nil {
				return err
			}
		}
		return nil
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
			size, data, err := layoutOf(hdr, limit)
			if err != nil {
				return n, err
			}
			c, err := writeFile(to, tr, size, data)
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

// writeFile writes a new file at to, never through a link, of size bytes
// whose data extents are read from r in order (nil: the whole file).
func writeFile(to string, r io.Reader, size int64, data []Extent) (int64, error) {
	f, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return 0, err
	}
	if data == nil {
		data = []Extent{{0, size}}
	}
	var n int64
	for _, x := range data {
		if _, err = f.Seek(x.Off, io.SeekStart); err != nil {
			break
		}
		var c int64
		c, err = io.CopyN(f, r, x.Len)
		n += c
		if err != nil {
			break
		}
	}
	if err == nil {
		err = f.Truncate(size)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// layoutOf is the whole size of the file hdr heads and the extents of it
// the stream holds (nil: all of it), checked: holes in order, within the
// file, no larger than limit (limit > 0) and leaving exactly the
// header's bytes.
func layoutOf(hdr *tar.Header, limit int64) (int64, []Extent, error) {
	sz, ok := hdr.PAXRecords[paxSize]
	if !ok {
		return hdr.Size, nil, nil
	}
	refuse := func(why string) (int64, []Extent, error) {
		return 0, nil, fmt.Errorf("%w: %q: %s", ErrRefused, hdr.Name, why)
	}
	size, err := strconv.ParseInt(sz, 10, 64)
	if err != nil || size < hdr.Size || (limit > 0 && size > limit) {
		return refuse("its whole size " + sz + " is not a size within the checkpoint's")
	}
	holes, err := parseExtents(hdr.PAXRecords[paxHoles])
	if err != nil {
		return refuse(err.Error())
	}
	data, err := dataOf(size, holes)
	if err != nil {
		return refuse(err.Error())
	}
	var n int64
	for _, x := range data {
		n += x.Len
	}
	if n != hdr.Size {
		return refuse("its holes do not leave the bytes it holds")
	}
	return size, data, nil
}

// dataOf is the complement of holes in a file of size bytes; holes must
// be in order, not overlapping, and within the file.
func dataOf(size int64, holes []Extent) ([]Extent, error) {
	var data []Extent
	var at int64
	for _, h := range holes {
		if h.Off < at || h.Len <= 0 || h.Off > size-h.Len {
			return nil, fmt.Errorf("hole %d+%d out of order or out of a file of %d bytes", h.Off, h.Len, size)
		}
		if h.Off > at {
			data = append(data, Extent{at, h.Off - at})
		}
		at = h.Off + h.Len
	}
	if at < size {
		data = append(data, Extent{at, size - at})
	}
	if data == nil {
		data = []Extent{}
	}
	return data, nil
}

func formatExtents(xs []Extent) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.FormatInt(x.Off, 10) + "+" + strconv.FormatInt(x.Len, 10)
	}
	return strings.Join(parts, ",")
}

// maxHoles bounds the holes of one file a stream may describe.
const maxHoles = 1 << 20

func parseExtents(s string) ([]Extent, error) {
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > maxHoles {
		return nil, fmt.Errorf("more than %d holes", maxHoles)
	}
	xs := make([]Extent, len(parts))
	for i, p := range parts {
		off, l, ok := strings.Cut(p, "+")
		var err1, err2 error
		xs[i].Off, err1 = strconv.ParseInt(off, 10, 64)
		xs[i].Len, err2 = strconv.ParseInt(l, 10, 64)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("hole %q is not OFFSET+LENGTH", p)
		}
	}
	return xs, nil
}
