package gencache_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/gencache"
)

const bs = gencache.BlockSize

// blocks returns n blocks of random bytes.
func blocks(r *rand.Rand, n int) []byte {
	b := make([]byte, n*bs)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// checkpointTree writes a tree shaped like the checkpoint of a forked
// app: a parent's image, a child's sharing a run of its pages, zero pages
// in both, a page repeated, files ending in part of a block. It returns
// the tree's bytes that are neither zero nor a repeat of earlier ones.
func checkpointTree(t *testing.T, dir string) int64 {
	t.Helper()
	r := rand.New(rand.NewPCG(1, 2))
	shared := blocks(r, 300) // more than a copy's 1 MiB buffer
	own := blocks(r, 20)
	zero := make([]byte, 10*bs)
	tail := blocks(r, 1)[:1000]
	parent := slices(shared, zero, own[:5*bs], own[:bs], tail)
	child := slices(own[5*bs:10*bs], shared[:200*bs], zero[:3*bs], shared[250*bs:], own[10*bs:])
	files := map[string][]byte{"ckpt_parent.dmtcp": parent, "sub/ckpt_child.dmtcp": child, "small": []byte("hello"), "empty": nil}
	for name, b := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("ckpt_parent.dmtcp", filepath.Join(dir, "latest")); err != nil {
		t.Fatal(err)
	}
	// Unique: the shared run, the 20 own blocks, the tail, "hello".
	return int64(len(shared)+len(own)+len(tail)) + 5
}

func slices(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// sameTree fails unless dst holds src's files, links and modes.
func sameTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		a, _ := os.Lstat(p)
		b, err := os.Lstat(to)
		if err != nil {
			t.Errorf("%s not copied: %v", rel, err)
			return nil
		}
		if a.Mode() != b.Mode() {
			t.Errorf("%s: mode %v, want %v", rel, b.Mode(), a.Mode())
		}
		if d.Type().IsRegular() {
			x, _ := os.ReadFile(p)
			y, _ := os.ReadFile(to)
			if !bytes.Equal(x, y) {
				t.Errorf("%s: %d bytes differ from the source's %d", rel, len(y), len(x))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestIndexedCopy: a tree copied with its block index is the same tree,
// read from its source only for the blocks that are neither zero nor
// held already (the child's pages shared with its parent are copied from
// the parent's copy); the index read back is the one written.
func TestIndexedCopy(t *testing.T) {
	ctx := context.Background()
	src, stage, dst := t.TempDir(), t.TempDir(), t.TempDir()
	unique := checkpointTree(t, src)
	x, err := gencache.CopyTreeIndexed(ctx, src, stage)
	if err != nil {
		t.Fatal(err)
	}
	sameTree(t, src, stage)
	name := filepath.Join(t.TempDir(), "1.blocks")
	if err := gencache.WriteIndex(name, x); err != nil {
		t.Fatal(err)
	}
	back, err := gencache.ReadIndex(name)
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Files) != 4 || back.Bytes() != x.Bytes() || back.Unique() != unique {
		t.Fatalf("index read back: %d files, %d bytes, %d unique; want 4 files, %d bytes, %d unique",
			len(back.Files), back.Bytes(), back.Unique(), x.Bytes(), unique)
	}
	st, err := gencache.CopyTreeFrom(ctx, src, dst, back)
	if err != nil {
		t.Fatal(err)
	}
	sameTree(t, src, dst)
	if st.Read != unique || st.Bytes != x.Bytes() || st.Zero != 13*bs || st.Read+st.Reused+st.Zero != st.Bytes {
		t.Errorf("indexed copy: %+v; want %d bytes read of %d, 13 zero blocks, the rest reused", st, unique, x.Bytes())
	}

	// A file the index does not list, or lists with another size, is
	// copied whole.
	if err := os.WriteFile(filepath.Join(src, "small"), []byte("hello, world"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "new"), []byte("new file"), 0o600); err != nil {
		t.Fatal(err)
	}
	dst = t.TempDir()
	if st, err = gencache.CopyTreeFrom(ctx, src, dst, back); err != nil {
		t.Fatal(err)
	}
	sameTree(t, src, dst)
	if st.Read != unique-5+12+8 {
		t.Errorf("indexed copy with a changed and a new file: read %d; want %d", st.Read, unique-5+12+8)
	}
}

// TestIndexedCopyRefusesOtherBlocks: a source block that is not the one
// its index names fails the copy with ErrIndexMismatch.
func TestIndexedCopyRefusesOtherBlocks(t *testing.T) {
	ctx := context.Background()
	src := t.TempDir()
	checkpointTree(t, src)
	x, err := gencache.CopyTreeIndexed(ctx, src, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(src, "ckpt_parent.dmtcp"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("changed"), 7*bs+10); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := gencache.CopyTreeFrom(ctx, src, t.TempDir(), x); !errors.Is(err, gencache.ErrIndexMismatch) {
		t.Errorf("indexed copy of a changed block: %v; want ErrIndexMismatch", err)
	}
}

// TestReadIndexRefusesBadOnes: an index cut short, changed, reached
// through a link, or naming a path outside its tree is ErrBadIndex; none
// is fs.ErrNotExist. WriteIndex replaces a link at its name instead of
// writing through it.
func TestReadIndexRefusesBadOnes(t *testing.T) {
	dir := t.TempDir()
	x := &gencache.Index{Files: []gencache.IndexedFile{{Path: "a", Size: 5, Blocks: make([]gencache.Digest, 1)}}}
	good := filepath.Join(dir, "good")
	if err := gencache.WriteIndex(good, x); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(good)
	flipped := bytes.Clone(b)
	flipped[12] ^= 1
	bad := map[string][]byte{"cut": b[:len(b)-3], "flipped": flipped, "other": []byte("not an index at all, but long enough to be read as one")}
	for name, content := range bad {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("good", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	outside := &gencache.Index{Files: []gencache.IndexedFile{{Path: "../etc/passwd", Size: 1, Blocks: make([]gencache.Digest, 1)}}}
	if err := gencache.WriteIndex(filepath.Join(dir, "outside"), outside); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cut", "flipped", "other", "link", "outside"} {
		if _, err := gencache.ReadIndex(filepath.Join(dir, name)); !errors.Is(err, gencache.ErrBadIndex) {
			t.Errorf("ReadIndex(%s): %v; want ErrBadIndex", name, err)
		}
	}
	if _, err := gencache.ReadIndex(filepath.Join(dir, "absent")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadIndex of no file: %v; want fs.ErrNotExist", err)
	}

	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	planted := filepath.Join(dir, "planted")
	if err := os.Symlink(victim, planted); err != nil {
		t.Fatal(err)
	}
	if err := gencache.WriteIndex(planted, x); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(victim); string(got) != "keep" {
		t.Errorf("WriteIndex over a link wrote through it: the link's target holds %q", got)
	}
	if _, err := gencache.ReadIndex(planted); err != nil {
		t.Errorf("the index written in the link's place: %v", err)
	}
}

// FuzzReadIndex: whatever a checkpoint image holds at an index's name,
// ReadIndex returns an index whose files are clean relative paths with
// one digest per block, or an error; it never panics.
func FuzzReadIndex(f *testing.F) {
	dir := f.TempDir()
	x := &gencache.Index{Files: []gencache.IndexedFile{{Path: "a", Size: 5000, Blocks: make([]gencache.Digest, 2)}, {Path: "b/c", Size: 0}}}
	name := filepath.Join(dir, "seed")
	if err := gencache.WriteIndex(name, x); err != nil {
		f.Fatal(err)
	}
	b, _ := os.ReadFile(name)
	f.Add(b)
	f.Add(b[:len(b)-40])
	f.Add([]byte("fogblk1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		name := filepath.Join(t.TempDir(), "index")
		if err := os.WriteFile(name, b, 0o644); err != nil {
			t.Fatal(err)
		}
		x, err := gencache.ReadIndex(name)
		if err != nil {
			return
		}
		for _, f := range x.Files {
			if !filepath.IsLocal(f.Path) || int64(len(f.Blocks)) != (f.Size+bs-1)/bs {
				t.Fatalf("index read with file %q of %d bytes and %d digests", f.Path, f.Size, len(f.Blocks))
			}
		}
	})
}
