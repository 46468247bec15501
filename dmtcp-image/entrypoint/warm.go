package main

import (
	"io"
	"os"
	"time"
)

// warm reads the images of generation g once while the slot waits for its
// order, so that the restart that follows finds them in the node's page
// cache: the checkpoint's cold read from the cluster happens before the
// deploy instead of during it. It runs at the slot's own (background) CPU
// weight, and an order that comes first does not wait for it: the restart
// then shares what was read so far.
func (s *supervisor) warm(g generation) {
	t := time.Now()
	var n int64
	var err error
	for _, img := range g.images {
		var f *os.File
		if f, err = os.Open(img); err != nil {
			break
		}
		var c int64
		c, err = io.Copy(io.Discard, f)
		_ = f.Close()
		n += c
		if err != nil {
			break
		}
	}
	if err != nil {
		s.log.Warn("reading the checkpoint ahead of the restart", "gen", g.n, "err", err)
	}
	s.tm.record("warm", g.n, t, n, err)
}
