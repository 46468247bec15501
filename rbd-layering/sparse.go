package layering

import (
	"context"
	"fmt"
	"io"
)

// CopyChunk is the block size of CopySparse.
const CopyChunk = 1 << 20

// CopySparse copies size bytes from src to dst, skipping chunks that are all
// zero (the destination is thin-provisioned and reads back zeros there). It
// checks ctx between chunks.
func CopySparse(ctx context.Context, dst io.WriterAt, src io.ReaderAt, size int64) (written int64, err error) {
	buf := make([]byte, CopyChunk)
	for off := int64(0); off < size; off += CopyChunk {
		if err := ctx.Err(); err != nil {
			return written, err
		}
		n := int64(CopyChunk)
		if size-off < n {
			n = size - off
		}
		if _, err := src.ReadAt(buf[:n], off); err != nil && err != io.EOF {
			return written, fmt.Errorf("read at %d: %w", off, err)
		}
		if allZero(buf[:n]) {
			continue
		}
		if _, err := dst.WriteAt(buf[:n], off); err != nil {
			return written, fmt.Errorf("write at %d: %w", off, err)
		}
		written += n
	}
	return written, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
