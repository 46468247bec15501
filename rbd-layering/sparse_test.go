package layering

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

type recorder struct {
	buf    []byte
	writes [][2]int64
}

func (r *recorder) WriteAt(p []byte, off int64) (int, error) {
	copy(r.buf[off:], p)
	r.writes = append(r.writes, [2]int64{off, int64(len(p))})
	return len(p), nil
}

func TestCopySparseSkipsZeroBlocks(t *testing.T) {
	size := 2*CopyChunk + 3*SparseBlock + 100
	src := make([]byte, size)
	src[10] = 1                             // block 0
	src[SparseBlock+5] = 2                  // block 1, joined to block 0
	src[5*SparseBlock] = 3                  // a block of its own
	src[CopyChunk-1], src[CopyChunk] = 4, 5 // a run across two chunks: two writes
	src[size-1] = 6                         // the short last block
	r := &recorder{buf: make([]byte, size)}
	n, err := CopySparse(context.Background(), r, bytes.NewReader(src), int64(size))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r.buf, src) {
		t.Fatal("the copy differs from its source")
	}
	want := [][2]int64{{0, 2 * SparseBlock}, {5 * SparseBlock, SparseBlock}, {CopyChunk - SparseBlock, SparseBlock},
		{CopyChunk, SparseBlock}, {2*CopyChunk + 3*SparseBlock, 100}}
	if len(r.writes) != len(want) {
		t.Fatalf("writes = %v, want %v", r.writes, want)
	}
	var total int64
	for i := range want {
		if r.writes[i] != want[i] {
			t.Fatalf("writes = %v, want %v", r.writes, want)
		}
		total += want[i][1]
	}
	if n != total {
		t.Fatalf("written = %d, want %d", n, total)
	}
}

// TestCopySparseFileHoles: a sparse file is read where it holds data only,
// and copies whole.
func TestCopySparseFileHoles(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const size = 1 << 30
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	data := map[int64]byte{5000: 1, 300 << 20: 2, size - 1: 3}
	for off, b := range data {
		if _, err := f.WriteAt([]byte{b}, off); err != nil {
			t.Fatal(err)
		}
	}
	r := &recorder{buf: make([]byte, size)}
	if _, err := CopySparse(context.Background(), r, f, size); err != nil {
		t.Fatal(err)
	}
	for off, b := range data {
		if r.buf[off] != b {
			t.Errorf("byte at %d = %d, want %d", off, r.buf[off], b)
		}
	}
	if len(r.writes) != len(data) {
		t.Errorf("writes = %v; want one 4 KiB block per byte written", r.writes)
	}
	for _, w := range r.writes {
		if w[0]%SparseBlock != 0 || w[1] > SparseBlock {
			t.Errorf("write %v: want one block at a block boundary", w)
		}
	}
}
