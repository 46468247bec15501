package gencache

// An indexed copy: a generation's files copied from the cluster by their
// block index (blocks.go), reading only the blocks the copy does not
// already hold.

import (
	"context"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
)

// CopyStats says what an indexed copy read and what it made from the
// node's own copy.
type CopyStats struct {
	// Bytes is the size of the files copied.
	Bytes int64 `json:"bytes"`
	// Read is what was read from the source.
	Read int64 `json:"read"`
	// Reused is what was copied from blocks the copy already held.
	Reused int64 `json:"reused"`
	// Zero is what was left as holes, zero in the index.
	Zero int64 `json:"zero"`
}

// CopyTreeFrom copies src into dst as CopyTree does, reading from src
// only the blocks of x that are neither zero nor repeated: the others are
// copied from the files already written in dst. A regular file of src
// that x does not list (or lists with another size) is copied whole.
// Every block read from src is checked against its digest: a mismatch is
// ErrIndexMismatch, and dst then holds part of the copy (the caller
// empties it and copies the whole tree).
//
// The copy is planned first: the reads from src then run fetchReaders at
// a time (over a network a read waits mostly for its answer; with the
// cluster on the node itself they are bound by the CPU they cost, and
// four take as long as one), and the copies of repeated blocks run
// beside them, each once the read of its source is done.
func CopyTreeFrom(ctx context.Context, src, dst string, x *Index) (CopyStats, error) {
	files := make(map[string]*IndexedFile, len(x.Files))
	for i := range x.Files {
		files[x.Files[i].Path] = &x.Files[i]
	}
	p := &copyPlan{seen: map[Digest]blockRef{}, run: map[Digest]bool{}}
	defer p.close()
	buf := make([]byte, copyBuffer)
	err := walkTree(ctx, src, dst, func(rel, from, to string, perm fs.FileMode) error {
		f := files[rel]
		if f != nil {
			if st, err := os.Stat(from); err != nil || st.Size() != f.Size {
				f = nil
			}
		}
		if f == nil {
			var n int64
			err := copyFileWith(from, to, perm, buf, func(b []byte) func() { n += int64(len(b)); return nil })
			p.stats.Bytes += n
			p.stats.Read += n
			return err
		}
		return p.file(f, from, to, perm)
	})
	if err != nil {
		return p.stats, err
	}
	return p.stats, p.execute(ctx)
}

// fetchReaders is how many reads of an indexed copy are under way at once.
const fetchReaders = 4

// blockRef is where a copy holds a block once read: the output file, the
// block's offset in it, and the read that writes it.
type blockRef struct {
	f    *os.File
	off  int64
	read int
}

// readOp reads n bytes at off from in, checks them against digests
// (from block first of path) and writes them at off in out.
type readOp struct {
	in, out *os.File
	path    string
	off, n  int64
	first   int
	digests []Digest
	size    int64 // of the file
	done    chan struct{}
}

// reuseOp copies n bytes at src.off in src.f to off in out, once the read
// src.read is done.
type reuseOp struct {
	src blockRef
	out *os.File
	off int64
	n   int64
}

type copyPlan struct {
	seen   map[Digest]blockRef
	run    map[Digest]bool // the digests of the read being planned
	reads  []*readOp
	reuses []reuseOp
	files  []*os.File
	stats  CopyStats
}

func (p *copyPlan) close() {
	for _, f := range p.files {
		_ = f.Close()
	}
}

// file plans the copy of the indexed file f from from to to.
func (p *copyPlan) file(f *IndexedFile, from, to string, perm fs.FileMode) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	p.files = append(p.files, in)
	out, err := os.OpenFile(to, os.O_RDWR|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	p.files = append(p.files, out)
	if err := out.Truncate(f.Size); err != nil {
		return err
	}
	p.stats.Bytes += f.Size
	nb := len(f.Blocks)
	for i := 0; i < nb; {
		d := f.Blocks[i]
		off := int64(i) * BlockSize
		if d == zeroDigest {
			p.stats.Zero += blockLen(f.Size, i)
			i++
			continue
		}
		if ref, ok := p.seen[d]; ok {
			// A run of blocks held one after the other by one read.
			j := i + 1
			for j < nb {
				r, ok := p.seen[f.Blocks[j]]
				if !ok || r.f != ref.f || r.read != ref.read || r.off != ref.off+int64(j-i)*BlockSize || f.Blocks[j] == zeroDigest {
					break
				}
				j++
			}
			n := int64(j-i-1)*BlockSize + blockLen(f.Size, j-1)
			p.reuses = append(p.reuses, reuseOp{src: ref, out: out, off: off, n: n})
			p.stats.Reused += n
			i = j
			continue
		}
		// A run of blocks to read: neither zero nor held nor repeated in
		// the run, up to a copy's buffer.
		clear(p.run)
		p.run[d] = true
		j := i + 1
		for j < nb && (j-i)*BlockSize < copyBuffer {
			e := f.Blocks[j]
			if _, held := p.seen[e]; held || e == zeroDigest || p.run[e] {
				break
			}
			p.run[e] = true
			j++
		}
		n := int64(j-i-1)*BlockSize + blockLen(f.Size, j-1)
		r := len(p.reads)
		p.reads = append(p.reads, &readOp{in: in, out: out, path: f.Path, off: off, n: n, first: i,
			digests: f.Blocks[i:j], size: f.Size, done: make(chan struct{})})
		for k := i; k < j; k++ {
			p.seen[f.Blocks[k]] = blockRef{f: out, off: int64(k) * BlockSize, read: r}
		}
		p.stats.Read += n
		i = j
	}
	return nil
}

// execute carries out the plan: its reads fetchReaders at a time, and beside
// them its reuses in turn, each once its source is read.
func (p *copyPlan) execute(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	next := make(chan *readOp)
	g.Go(func() error {
		defer close(next)
		for _, r := range p.reads {
			select {
			case next <- r:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	for range min(fetchReaders, len(p.reads)) {
		g.Go(func() error {
			buf := make([]byte, copyBuffer)
			for r := range next {
				if err := r.do(buf); err != nil {
					return err
				}
			}
			return nil
		})
	}
	g.Go(func() error {
		buf := make([]byte, copyBuffer)
		for _, u := range p.reuses {
			select {
			case <-p.reads[u.src.read].done:
			case <-ctx.Done():
				return ctx.Err()
			}
			if err := reuse(u, buf); err != nil {
				return err
			}
		}
		return nil
	})
	return g.Wait()
}

func (r *readOp) do(buf []byte) error {
	b := buf[:r.n]
	if _, err := r.in.ReadAt(b, r.off); err != nil {
		return fmt.Errorf("read %s at %d: %w", r.path, r.off, err)
	}
	for k, d := range r.digests {
		s := int64(k) * BlockSize
		if digestOf(b[s:s+blockLen(r.size, r.first+k)]) != d {
			return fmt.Errorf("%s: block %d: %w", r.path, r.first+k, ErrIndexMismatch)
		}
	}
	if _, err := r.out.WriteAt(b, r.off); err != nil {
		return err
	}
	close(r.done)
	return nil
}

// reuse copies u's bytes, in the kernel where it can.
func reuse(u reuseOp, buf []byte) error {
	roff, woff, n := u.src.off, u.off, u.n
	for n > 0 {
		k, err := unix.CopyFileRange(int(u.src.f.Fd()), &roff, int(u.out.Fd()), &woff, int(n), 0)
		if err != nil || k == 0 {
			break
		}
		n -= int64(k)
	}
	for n > 0 {
		b := buf[:min(n, int64(len(buf)))]
		if _, err := u.src.f.ReadAt(b, roff); err != nil {
			return err
		}
		if _, err := u.out.WriteAt(b, woff); err != nil {
			return err
		}
		roff, woff, n = roff+int64(len(b)), woff+int64(len(b)), n-int64(len(b))
	}
	return nil
}
