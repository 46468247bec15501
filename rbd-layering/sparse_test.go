package layering

import (
	"bytes"
	"context"
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
