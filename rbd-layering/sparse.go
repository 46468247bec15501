package layering

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// CopyChunk is the size of CopySparse's reads.
const CopyChunk = 1 << 20

// SparseBlock is the granularity at which CopySparse skips zeros.
const SparseBlock = 4 << 10

// CopySparse copies size bytes from src to dst, skipping blocks of
// SparseBlock bytes that are all zero (the destination is thin-provisioned
// and reads back zeros there): each run of other blocks is one write. It
// checks ctx between chunks, and returns the bytes it wrote.
//
// A source that is a file is read only where it holds data: its holes
// (SEEK_DATA) are skipped without reading them, so that a sparse file of
// many GiB with little in it (a fresh filesystem) copies in the time of
// what it holds.
func CopySparse(ctx context.Context, dst io.WriterAt, src io.ReaderAt, size int64) (written int64, err error) {
	buf := make([]byte, CopyChunk)
	for off := int64(0); off < size; {
		if err := ctx.Err(); err != nil {
			return written, err
		}
		next, more := nextData(src, off)
		if !more {
			break
		}
		if next > off {
			off = next &^ (SparseBlock - 1)
		}
		if off >= size {
			break
		}
		n := int64(CopyChunk)
		if size-off < n {
			n = size - off
		}
		if _, err := src.ReadAt(buf[:n], off); err != nil && err != io.EOF {
			return written, fmt.Errorf("read at %d: %w", off, err)
		}
		for _, r := range dataRuns(buf[:n]) {
			if _, err := dst.WriteAt(buf[r[0]:r[1]], off+int64(r[0])); err != nil {
				return written, fmt.Errorf("write at %d: %w", off+int64(r[0]), err)
			}
			written += int64(r[1] - r[0])
		}
		off += n
	}
	return written, nil
}

// nextData returns the offset of src's first data at or after off, when
// src is a file whose holes the system reports, else off; more is false
// when the file holds no data from off on.
func nextData(src io.ReaderAt, off int64) (next int64, more bool) {
	f, ok := src.(*os.File)
	if !ok {
		return off, true
	}
	next, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
	switch {
	case errors.Is(err, unix.ENXIO):
		return off, false
	case err != nil:
		return off, true // no hole reporting here: read it all
	}
	return next, true
}

// dataRuns returns the [start, end) ranges of b made of SparseBlock blocks
// that are not all zero, adjacent blocks joined.
func dataRuns(b []byte) [][2]int {
	var runs [][2]int
	for i := 0; i < len(b); i += SparseBlock {
		end := min(i+SparseBlock, len(b))
		if allZero(b[i:end]) {
			continue
		}
		if k := len(runs) - 1; k >= 0 && runs[k][1] == i {
			runs[k][1] = end
			continue
		}
		runs = append(runs, [2]int{i, end})
	}
	return runs
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
