package gencache

// A checkpoint's block index: the digest of every 4 KiB block of every
// regular file a generation holds, written beside the generation when it is
// sealed. A node that fetches the generation reads from the cluster only
// the blocks it does not already hold: the processes of one app restored
// from one checkpoint (PostgreSQL's postmaster and its children, forked from
// it) share most of their pages, and many pages are zero. Every block read
// is checked against its digest, and a block the copy already holds is
// copied from the node's own copy, so the files that result are the ones
// the index was made from, or the copy fails with ErrIndexMismatch.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
)

// BlockSize is the size of an index's blocks: a page.
const BlockSize = 4096

// ErrBadIndex: a block index could not be read (truncated, corrupt, or
// not an index).
var ErrBadIndex = errors.New("bad block index")

// ErrIndexMismatch: a file or block read during an indexed copy is not
// the one its index describes.
var ErrIndexMismatch = errors.New("the files are not those of their block index")

// Digest identifies one block's contents: the first 16 bytes of its
// SHA-256 (of the block's own bytes, shorter for a file's last block).
type Digest [16]byte

func digestOf(b []byte) Digest {
	s := sha256.Sum256(b)
	return Digest(s[:16])
}

// zeroDigest is the digest of a whole block of zeros: such a block is
// neither read nor written by an indexed copy (a hole reads as zeros).
var zeroDigest = digestOf(make([]byte, BlockSize))

// Index lists the regular files of a tree, in the order a copy walks them,
// with the digest of each of their blocks.
type Index struct {
	Files []IndexedFile
}

// IndexedFile is one regular file of an Index: its path relative to the
// tree's root, its size and its blocks' digests.
type IndexedFile struct {
	Path   string
	Size   int64
	Blocks []Digest
}

// Bytes is the sum of the indexed files' sizes.
func (x *Index) Bytes() int64 {
	var n int64
	for _, f := range x.Files {
		n += f.Size
	}
	return n
}

// Unique returns the bytes of the blocks an indexed copy reads from its
// source: the blocks that are neither zero nor seen before.
func (x *Index) Unique() int64 {
	seen := map[Digest]bool{zeroDigest: true}
	var n int64
	for _, f := range x.Files {
		for i, d := range f.Blocks {
			if !seen[d] {
				seen[d] = true
				n += blockLen(f.Size, i)
			}
		}
	}
	return n
}

func blockCount(size int64) int { return int((size + BlockSize - 1) / BlockSize) }

func blockLen(size int64, i int) int64 { return min(BlockSize, size-int64(i)*BlockSize) }

// The index's encoding: magic, block size, file count, then each file's
// path (length-prefixed), size and digests; last, the SHA-256 of all that.
var indexMagic = []byte("fogblk1\n")

const (
	maxIndexFiles = 1 << 20
	maxIndexPath  = 4096
	// maxIndexBytes bounds an index read (a 64 GiB tree's index is 256 MiB).
	maxIndexBytes = 256 << 20
)

// WriteIndex writes x to the file name, replacing whatever was there
// (never following a link at name: a checkpoint's directory was writable
// by the app it holds), and flushes it.
func WriteIndex(name string, x *Index) error {
	if err := os.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		return err
	}
	h := sha256.New()
	w := bufio.NewWriterSize(io.MultiWriter(f, h), 1<<20)
	var hdr [8]byte
	_, _ = w.Write(indexMagic)
	binary.LittleEndian.PutUint32(hdr[:4], BlockSize)
	binary.LittleEndian.PutUint32(hdr[4:], uint32(len(x.Files)))
	_, _ = w.Write(hdr[:])
	for _, file := range x.Files {
		var n [2]byte
		binary.LittleEndian.PutUint16(n[:], uint16(len(file.Path)))
		_, _ = w.Write(n[:])
		_, _ = w.WriteString(file.Path)
		binary.LittleEndian.PutUint64(hdr[:], uint64(file.Size))
		_, _ = w.Write(hdr[:])
		for _, d := range file.Blocks {
			_, _ = w.Write(d[:])
		}
	}
	err = w.Flush()
	if err == nil {
		_, err = f.Write(h.Sum(nil))
	}
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}

// ReadIndex reads the index in the file name (never through a link). An
// absent file is fs.ErrNotExist; one that is not a whole, valid index is
// ErrBadIndex.
func ReadIndex(name string) (*Index, error) {
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("%s is a link: %w", name, ErrBadIndex)
		}
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxIndexBytes+1))
	if err != nil {
		return nil, err
	}
	x, err := decodeIndex(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %v", name, ErrBadIndex, err)
	}
	return x, nil
}

func decodeIndex(b []byte) (*Index, error) {
	if len(b) > maxIndexBytes {
		return nil, errors.New("larger than an index can be")
	}
	if len(b) < len(indexMagic)+8+sha256.Size || !bytes.Equal(b[:len(indexMagic)], indexMagic) {
		return nil, errors.New("not a block index")
	}
	body, sum := b[:len(b)-sha256.Size], b[len(b)-sha256.Size:]
	if s := sha256.Sum256(body); !bytes.Equal(s[:], sum) {
		return nil, errors.New("its checksum does not match (cut short or corrupt)")
	}
	r := body[len(indexMagic):]
	if bs := binary.LittleEndian.Uint32(r); bs != BlockSize {
		return nil, fmt.Errorf("block size %d, want %d", bs, BlockSize)
	}
	n := binary.LittleEndian.Uint32(r[4:])
	if n > maxIndexFiles {
		return nil, fmt.Errorf("%d files, more than %d", n, maxIndexFiles)
	}
	r = r[8:]
	x := &Index{Files: make([]IndexedFile, 0, n)}
	paths := map[string]bool{}
	for range n {
		if len(r) < 2 {
			return nil, errors.New("cut short in a file's path")
		}
		l := int(binary.LittleEndian.Uint16(r))
		r = r[2:]
		if l == 0 || l > maxIndexPath || len(r) < l+8 {
			return nil, errors.New("cut short in a file's path")
		}
		p := string(r[:l])
		if !filepath.IsLocal(p) || filepath.Clean(p) != p || paths[p] {
			return nil, fmt.Errorf("file path %q is not a clean relative path of its own", p)
		}
		paths[p] = true
		size := int64(binary.LittleEndian.Uint64(r[l:]))
		r = r[l+8:]
		if size < 0 || size/BlockSize > int64(len(r)/len(Digest{})) || blockCount(size) > len(r)/len(Digest{}) {
			return nil, fmt.Errorf("file %s: size %d beyond its digests", p, size)
		}
		nb := blockCount(size)
		f := IndexedFile{Path: p, Size: size, Blocks: make([]Digest, nb)}
		for i := range nb {
			copy(f.Blocks[i][:], r[i*len(Digest{}):])
		}
		r = r[nb*len(Digest{}):]
		x.Files = append(x.Files, f)
	}
	if len(r) != 0 {
		return nil, errors.New("bytes after its last file")
	}
	return x, nil
}

// CopyTreeIndexed is CopyTree that also returns the block index of the
// files it copied.
func CopyTreeIndexed(ctx context.Context, src, dst string) (*Index, error) {
	x := &Index{}
	buf := make([]byte, copyBuffer)
	err := walkTree(ctx, src, dst, func(rel, from, to string, perm fs.FileMode) error {
		f := IndexedFile{Path: rel}
		err := copyFileWith(from, to, perm, buf, func(b []byte) func() {
			n := blockCount(int64(len(b)))
			f.Blocks = slices.Grow(f.Blocks, n)[:len(f.Blocks)+n]
			f.Size += int64(len(b))
			return digestBlocks(f.Blocks[len(f.Blocks)-n:], b)
		})
		x.Files = append(x.Files, f)
		return err
	})
	if err != nil {
		return nil, err
	}
	return x, nil
}

// digestBlocks starts writing the digests of b's blocks into ds, two
// halves at once beside the copy's write of b (hashing costs more than the
// copy), and returns the wait for them.
func digestBlocks(ds []Digest, b []byte) (wait func()) {
	var wg sync.WaitGroup
	half := len(ds) / 2
	for _, r := range [][2]int{{0, half}, {half, len(ds)}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := r[0]; i < r[1]; i++ {
				ds[i] = digestOf(b[i*BlockSize : min((i+1)*BlockSize, len(b))])
			}
		}()
	}
	return wg.Wait
}
