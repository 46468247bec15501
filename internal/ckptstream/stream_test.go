package ckptstream

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "sub"), 0o755))
	must(os.WriteFile(filepath.Join(src, "pages-1.img"), bytes.Repeat([]byte{7}, 1<<20), 0o600))
	must(os.WriteFile(filepath.Join(src, "sub", "core.img"), []byte("core"), 0o640))
	must(os.Symlink("pages-1.img", filepath.Join(src, "latest")))
	var buf bytes.Buffer
	sent, err := Write(context.Background(), &buf, src)
	must(err)
	got, err := Read(context.Background(), &buf, dst, 0)
	must(err)
	if sent != 1<<20+4 || got != sent {
		t.Fatalf("sent %d, received %d bytes; want %d both", sent, got, 1<<20+4)
	}
	b, err := os.ReadFile(filepath.Join(dst, "latest"))
	must(err)
	if !bytes.Equal(b, bytes.Repeat([]byte{7}, 1<<20)) {
		t.Fatal("the link's file differs")
	}
	st, err := os.Stat(filepath.Join(dst, "sub", "core.img"))
	must(err)
	if st.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v, want 0640", st.Mode().Perm())
	}
}

// A stream from a hostile or broken peer writes nothing outside its
// directory and nothing through a link, and stays within its bound.
func TestReadRefuses(t *testing.T) {
	type entry struct {
		name, link string
		typ        byte
		size       int
	}
	cases := map[string][]entry{
		"parent":            {{name: "../escaped", typ: tar.TypeReg, size: 1}},
		"absolute":          {{name: "/tmp/escaped", typ: tar.TypeReg, size: 1}},
		"through a link":    {{name: "out", link: "/", typ: tar.TypeSymlink}, {name: "out/escaped", typ: tar.TypeReg, size: 1}},
		"dir over a link":   {{name: "out", link: "/", typ: tar.TypeSymlink}, {name: "out", typ: tar.TypeDir}},
		"device":            {{name: "null", typ: tar.TypeChar}},
		"hard link":         {{name: "h", link: "/etc/passwd", typ: tar.TypeLink}},
		"beyond the bound":  {{name: "big", typ: tar.TypeReg, size: 4096}},
		"file over a link":  {{name: "x", link: "/etc/hostname", typ: tar.TypeSymlink}, {name: "x", typ: tar.TypeReg, size: 1}},
		"fifo":              {{name: "fifo", typ: tar.TypeFifo}},
		"parent after join": {{name: "a/../../escaped", typ: tar.TypeReg, size: 1}},
	}
	for name, entries := range cases {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, e := range entries {
				hdr := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Size: int64(e.size), Mode: 0o777}
				if err := tw.WriteHeader(hdr); err != nil {
					t.Fatal(err)
				}
				if e.size > 0 {
					_, _ = tw.Write(make([]byte, e.size))
				}
			}
			_ = tw.Close()
			outer := t.TempDir()
			dst := filepath.Join(outer, "dst")
			if err := os.Mkdir(dst, 0o755); err != nil {
				t.Fatal(err)
			}
			_, err := Read(context.Background(), &buf, dst, 1024)
			if err == nil {
				t.Fatal("read a stream it must refuse")
			}
			if name != "file over a link" && !errors.Is(err, ErrRefused) {
				t.Fatalf("err %v, want ErrRefused", err)
			}
			if _, err := os.Lstat(filepath.Join(outer, "escaped")); err == nil {
				t.Fatal("a file was written outside the destination")
			}
		})
	}
}

// A file written without its holes arrives at its whole size, its holes
// reading zeros and taking no room, its other bytes as they were; a
// stream whose holes do not fit its file is refused.
func TestWriteWithout(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i/4096) + 1
	}
	if err := os.WriteFile(filepath.Join(src, "pages-1.img"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "core.img"), []byte("core"), 0o600); err != nil {
		t.Fatal(err)
	}
	holes := []Extent{{0, 8192}, {65536, 512 << 10}, {1<<20 - 4096, 4096}}
	var buf bytes.Buffer
	sent, err := WriteWithout(context.Background(), &buf, src, map[string][]Extent{"pages-1.img": holes})
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(1<<20-8192-512<<10-4096) + 4; sent != want {
		t.Fatalf("sent %d bytes; want %d (the file without its holes, and core.img)", sent, want)
	}
	got, err := Read(context.Background(), &buf, dst, 1<<20)
	if err != nil || got != sent {
		t.Fatalf("Read = %d, %v; want %d", got, err, sent)
	}
	b, err := os.ReadFile(filepath.Join(dst, "pages-1.img"))
	if err != nil || len(b) != len(data) {
		t.Fatalf("received pages-1.img: %d bytes, %v; want %d", len(b), err, len(data))
	}
	for i := range b {
		inHole := false
		for _, h := range holes {
			if int64(i) >= h.Off && int64(i) < h.Off+h.Len {
				inHole = true
			}
		}
		if want := data[i]; inHole && b[i] != 0 || !inHole && b[i] != want {
			t.Fatalf("byte %d = %d (in a hole: %v); want %d, or 0 in a hole", i, b[i], inHole, want)
		}
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(dst, "pages-1.img"), &st); err != nil || st.Blocks*512 > int64(len(data))-int64(400<<10) {
		t.Errorf("received pages-1.img takes %d bytes on disk, %v; want its holes left unwritten", st.Blocks*512, err)
	}

	// Holes out of order, out of the file, or that leave other bytes than
	// the stream holds.
	for _, c := range []struct{ size, holes string }{
		{"8192", "4096+4096,0+4096"},
		{"8192", "4096+8192"},
		{"8192", ""},
		{"x", "0+4096"},
		{"8192", "0-4096"},
		{"1099511627776", "0+4096"},
	} {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		_ = tw.WriteHeader(&tar.Header{Name: "pages-1.img", Mode: 0o600, Size: 4096, Typeflag: tar.TypeReg, Format: tar.FormatPAX,
			PAXRecords: map[string]string{paxSize: c.size, paxHoles: c.holes}})
		_, _ = tw.Write(make([]byte, 4096))
		_ = tw.Close()
		if _, err := Read(context.Background(), &b, t.TempDir(), 1<<20); !errors.Is(err, ErrRefused) {
			t.Errorf("size %s, holes %s: Read = %v; want ErrRefused", c.size, c.holes, err)
		}
	}
}
