package enginetest

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/ckptstream"
	"github.com/fogdeploy/fogdeploy/internal/engine"
)

// testRemotePages moves an image to another directory without the pages a
// lazy restore can read later (ckptstream.WriteWithout with
// engine.Pages.Holes), and restores it lazily from there with its page
// server (engine.Pages.Serve) on the original: the app answers with all its
// memory, and the session ends once every page is in. An image whose pages
// are elsewhere is never restored at once, and a page server cut short
// stops the app. Engines without RemotePages refuse OpenPages.
func testRemotePages(t *testing.T, newEngine func(t *testing.T) engine.Engine) {
	e, ctx := setup(t, newEngine)
	port, first, sum := launchFilled(t, ctx, e)
	img := checkpoint(t, ctx, e, first, 1)
	pages, err := engine.OpenPages(img)
	if !engine.Of(e.Name()).RemotePages {
		if !errors.Is(err, engine.ErrInvalid) {
			t.Fatalf("OpenPages of a %s image = %v; want ErrInvalid", e.Name(), err)
		}
		return
	}
	if err != nil {
		t.Fatalf("OpenPages: %v", err)
	}
	defer pages.Close()
	if pages.LazyBytes() < 64<<20 {
		t.Fatalf("the image holds %d bytes of lazy pages; want the 64 MiB redis holds", pages.LazyBytes())
	}

	// The image, moved without its lazy pages.
	moved := func() engine.Image {
		dst := t.TempDir()
		holes := map[string][]ckptstream.Extent{}
		for f, hs := range pages.Holes() {
			for _, h := range hs {
				holes[f] = append(holes[f], ckptstream.Extent{Off: h.Off, Len: h.Len})
			}
		}
		pr, pw := io.Pipe()
		sent := make(chan int64, 1)
		go func() {
			n, err := ckptstream.WriteWithout(ctx, pw, img.Dir, holes)
			pw.CloseWithError(err)
			sent <- n
		}()
		if _, err := ckptstream.Read(ctx, pr, dst, 0); err != nil {
			t.Fatalf("read the image without its lazy pages: %v", err)
		}
		if n := <-sent; n > img.Bytes-pages.LazyBytes()+64<<10 {
			t.Fatalf("sent %d bytes of a %d-byte image with %d bytes of lazy pages", n, img.Bytes, pages.LazyBytes())
		}
		got, err := engine.ReadImage(dst)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	// serve serves the pages on one connection to the image's socket,
	// cutting it after cut requests (0: never).
	serve := func(dst engine.Image, cut int) <-chan engine.PageStats {
		ln, err := engine.ListenPages(dst.Dir)
		if err != nil {
			t.Fatal(err)
		}
		out := make(chan engine.PageStats, 1)
		go func() {
			defer ln.Close()
			conn, err := ln.Accept()
			if err != nil {
				out <- engine.PageStats{}
				return
			}
			defer conn.Close()
			var rw io.ReadWriter = conn
			if cut > 0 {
				rw = &cutAfter{Conn: conn, left: cut * 32}
			}
			st, err := pages.Serve(ctx, rw)
			if err != nil {
				t.Logf("page session: %v", err)
			}
			out <- st
		}()
		return out
	}

	dst := moved()
	served := serve(dst, 0)
	if _, err := e.Restore(ctx, dst, engine.RestoreSpec{NetNS: true, Stdout: io.Discard, Stderr: io.Discard}); !errors.Is(err, engine.ErrInvalid) {
		t.Fatalf("a restore at once of an image whose pages are elsewhere = %v; want ErrInvalid", err)
	}
	in := &instance{port: port, netns: true, log: engine.NewLogTail(200), called: time.Now()}
	p, err := e.Restore(ctx, dst, engine.RestoreSpec{NetNS: true, Lazy: true, Stdout: in.log, Stderr: in.log})
	if err != nil {
		t.Fatalf("lazy restore from a remote page server: %v", err)
	}
	in.p = p
	stopOnCleanup(t, p)
	in.waitReady(t, ctx)
	t.Logf("restore with %d MiB on a remote page server answered PING after %s", pages.LazyBytes()>>20, in.ready.Round(time.Millisecond))
	if got := in.do(t, ctx, "GETRANGE", "blob15", "1000", "1015"); got != sum {
		t.Errorf("blob15 after a restore from a remote page server = %q; want %q", got, sum)
	}
	for i := range 16 {
		if got := in.do(t, ctx, "STRLEN", "blob"+strconv.Itoa(i)); got != strconv.Itoa(blobSize) {
			t.Errorf("STRLEN blob%d = %s; want %d", i, got, blobSize)
		}
	}
	select {
	case st := <-served:
		if !st.Closed || st.Bytes < 60<<20 {
			t.Errorf("page session: %+v; want it closed by the restore after 64 MiB", st)
		}
		t.Logf("page session: %d requests, %d MiB", st.Requests, st.Bytes>>20)
	case <-time.After(time.Minute):
		t.Fatal("the page session did not end within a minute of the restore")
	}
	in.stop(t, ctx)

	// A page server cut short: the app does not run on with pages it
	// lacks.
	dst = moved()
	serve(dst, 3)
	cut := &instance{port: port, netns: true, log: engine.NewLogTail(200), called: time.Now()}
	p, err = e.Restore(ctx, dst, engine.RestoreSpec{NetNS: true, Lazy: true, Stdout: cut.log, Stderr: cut.log})
	if err == nil {
		stopOnCleanup(t, p)
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if _, err := p.Wait(wctx); err != nil {
			t.Fatalf("the app of a page server cut after 3 requests still runs after 30 s: %v", err)
		}
		t.Log("a page server cut after 3 requests: the restored app stopped")
	} else {
		t.Logf("a page server cut after 3 requests: the restore failed: %v", err)
	}
	_ = os.Remove(filepath.Join(dst.Dir, engine.PagesSocket))
	assertNoLeftovers(t)
	leftoverPort(t, port)
}

// cutAfter is a connection that reads at most left bytes, then ends.
type cutAfter struct {
	net.Conn
	left int
}

func (c *cutAfter) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, io.EOF
	}
	p = p[:min(len(p), c.left)]
	n, err := c.Conn.Read(p)
	c.left -= n
	return n, err
}
