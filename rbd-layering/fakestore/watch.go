// The fake's watchers: a live client's watch (Watch: the fake mapper's
// mappings; a loop device on an image's file), and a killed client's
// (LeaveDeadWatcher), which RemoveUnmapped evicts.

package fakestore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// RemoveUnmapped implements layering.Store: a watch that LeaveDeadWatcher
// left is evicted at once; a loop device attached to the image's file is
// a live mapping, which it never detaches: after a few tries with
// backoff the error wraps ErrBusy.
func (s *Store) RemoveUnmapped(ctx context.Context, name string) ([]layering.Eviction, error) {
	var evicted []layering.Eviction
	wait := 10 * time.Millisecond
	for try := 1; ; try++ {
		err := s.Remove(ctx, name)
		if err == nil || !errors.Is(err, layering.ErrBusy) {
			return evicted, err
		}
		s.mu.Lock()
		_, dead := s.dead[name]
		delete(s.dead, name)
		s.mu.Unlock()
		if dead {
			evicted = append(evicted, layering.Eviction{Client: "client.fake", Addr: "fake:0/" + name})
			continue
		}
		if try == 4 {
			return evicted, err
		}
		select {
		case <-ctx.Done():
			return evicted, fmt.Errorf("%w (%w)", err, ctx.Err())
		case <-time.After(wait):
		}
		wait *= 2
	}
}

// LeaveDeadWatcher makes the image look like one a client was killed
// with open: Remove refuses with ErrBusy for d, as RBD does until
// osd_client_watch_timeout, and RemoveUnmapped evicts the watch.
func (s *Store) LeaveDeadWatcher(name string, d time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.get(name); err != nil {
		return err
	}
	s.dead[name] = time.Now().Add(d)
	return nil
}

// Watch makes name watched by a live client, as a mapping of the image
// or of one of its snapshots watches its header: Remove and
// RemoveUnmapped refuse with ErrBusy until unwatch is called (once).
func (s *Store) Watch(name string) (unwatch func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.get(name); err != nil {
		return nil, err
	}
	s.live[name]++
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.live[name]--; s.live[name] <= 0 {
				delete(s.live, name)
			}
		})
	}, nil
}

// loopOf returns the loop device whose backing file is path, like RBD's
// watcher check for a mapped image.
func loopOf(path string) string {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && strings.TrimSpace(string(b)) == path {
			return "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(f)))
		}
	}
	return ""
}
