// A lazy resume's memory read from the cluster on demand: the suspension's checkpoint image
// stays mapped while the restored app runs, its files but the lazy pages are copied to the node,
// and those pages are served from the image to the restore's `criu lazy-pages` as it asks for
// them (engine.Pages), instead of the whole checkpoint being read before the app runs.

package deploy

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/ckptstream"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/gencache"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// pagesAccept bounds the wait for a restore to ask for the pages of the
// checkpoint copied for it.
const pagesAccept = 2 * time.Minute

// servings are the checkpoint images whose pages this node serves to a
// lazy restore (closed once it has every page, or never asked).
type servings struct {
	mu sync.Mutex
	m  map[string]chan struct{}
}

func (s *servings) begin(image string) (end func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]chan struct{}{}
	}
	ch := make(chan struct{})
	s.m[image] = ch
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.m[image] == ch {
			delete(s.m, image)
		}
		close(ch)
	}
}

// PagesServed is the bytes of memory pages this node served from the
// cluster to lazy restores (servedFetch).
func (c *Checkpoints) PagesServed() int64 { return c.served.Load() }

// Serving is closed once the lazy restore served from checkpoint image
// image has every page; nil when no restore is served from it.
func (c *Checkpoints) Serving(image string) <-chan struct{} {
	c.serving.mu.Lock()
	defer c.serving.mu.Unlock()
	return c.serving.m[image]
}

// servedFetch is the FetchCheckpoint of a lazy resume from the cluster
// under an engine that serves pages (engine.Facts.RemotePages): it copies
// the suspension's checkpoint g from its image without the pages a lazy
// restore reads later, marks the copy partial (it serves this restore
// alone), and serves those pages from the image, mapped until the restore
// has every page. An image it cannot serve so is copied whole.
func (c *Checkpoints) servedFetch(g spec.Generation) FetchCheckpoint {
	return func(ctx context.Context, dst string, fromCluster func(context.Context) error) (err error) {
		target, release, err := c.mapCheckpoint(ctx, g, "pages")
		if err != nil {
			return err
		}
		src := drivers.GenDir(target, g.Gen)
		pages, err := engine.OpenPagesIn(src)
		if err != nil {
			c.log.Warn("the checkpoint cannot be served page by page; copied whole", "app", g.App, "gen", g.Gen, "err", err)
			if rerr := release(); rerr != nil {
				return rerr
			}
			return fromCluster(ctx)
		}
		done := false
		defer func() {
			if !done {
				pages.Close()
				err = errors.Join(err, release())
			}
		}()
		start := time.Now()
		pr, pw := io.Pipe()
		go func() {
			_, werr := ckptstream.WriteWithout(ctx, pw, src, StreamHoles(pages))
			pw.CloseWithError(werr)
		}()
		n, err := ckptstream.Read(ctx, pr, dst, 0)
		pr.Close()
		if err != nil {
			return err
		}
		c.fetched.add(gencache.CopyStats{Bytes: n, Read: n})
		if err := gencache.MarkPartial(dst); err != nil {
			return err
		}
		ln, err := engine.ListenPages(dst)
		if err != nil {
			return err
		}
		done = true
		end := c.serving.begin(g.CkptSnap.Image)
		c.log.Info("checkpoint copied but its lazy pages, served from the cluster", "app", g.App, "gen", g.Gen, "bytes", n,
			"lazy_bytes", pages.LazyBytes(), "ms", time.Since(start).Milliseconds())
		go func() {
			defer end()
			defer func() { _ = release() }()
			defer pages.Close()
			defer ln.Close()
			_ = ln.SetDeadline(time.Now().Add(pagesAccept))
			conn, err := ln.AcceptUnix()
			if err != nil {
				c.log.Warn("no restore asked for the pages of its checkpoint", "app", g.App, "gen", g.Gen, "err", err)
				return
			}
			defer conn.Close()
			start := time.Now()
			st, err := pages.Serve(context.WithoutCancel(ctx), conn)
			c.served.Add(st.Bytes)
			if err != nil || !st.Closed {
				c.log.Error("page session cut before its restore had every page: the restored app is stopped", "app", g.App, "gen", g.Gen,
					"bytes", st.Bytes, "ms", time.Since(start).Milliseconds(), "err", err)
				return
			}
			c.log.Info("pages served from the cluster: the restore has its whole memory", "app", g.App, "gen", g.Gen,
				"requests", st.Requests, "bytes", st.Bytes, "ms", time.Since(start).Milliseconds())
		}()
		return nil
	}
}

// StreamHoles are the holes of a checkpoint's pages (engine.Pages.Holes)
// as a checkpoint stream leaves them out (ckptstream.WriteWithout).
func StreamHoles(p *engine.Pages) map[string][]ckptstream.Extent {
	holes := p.Holes()
	out := make(map[string][]ckptstream.Extent, len(holes))
	for f, hs := range holes {
		for _, h := range hs {
			out[f] = append(out[f], ckptstream.Extent{Off: h.Off, Len: h.Len})
		}
	}
	return out
}
