package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/instancectl"
	"github.com/fogdeploy/fogdeploy/internal/ksm"
)

// errReleased: the slot was released (a termination signal) before any
// order came.
var errReleased = errors.New("released before an order")

// waitOrder blocks until the file -wait names appears, and returns what it
// holds. A pre-started slot (a warm pool's) has its root mounted and its
// coordinator listening while it waits, so that only the app's own start
// remains when a deployment binds it. A termination signal ends the wait
// with errReleased; SIGCHLD is reaped meanwhile.
func (s *supervisor) waitOrder(sigs <-chan os.Signal) (instancectl.OrderBody, error) {
	s.recordAssigned()
	t := time.Now()
	s.log.Info("waiting for an order", "file", s.cfg.wait)
	b, err := s.waitFile(s.cfg.wait, sigs)
	if err != nil {
		return instancectl.OrderBody{}, err
	}
	var o instancectl.OrderBody
	if len(b) > 0 {
		if err := json.Unmarshal(b, &o); err != nil {
			return instancectl.OrderBody{}, fmt.Errorf("order %s: %w", s.cfg.wait, err)
		}
	}
	s.tm.record("order", 0, t, 0, nil)
	s.ordered = o
	s.log.Info("order received", "deployment", o.Deployment, "node", o.Node, "memory_merge", o.MemoryMerge, "lazy", o.Lazy)
	s.mergeMemory(o.MemoryMerge)
	return o, nil
}

// mergeMemory opts the entrypoint in or out of same-page merging before it
// starts the app, which inherits the choice (internal/ksm): the restore a
// pool slot is ordered ahead of any request shares its identical pages
// with the node's other instances that opted in. A recycled container
// that served such an instance opts out again for the next one. A kernel
// without it restores the app unmerged.
func (s *supervisor) mergeMemory(on bool) {
	if cur, err := ksm.Self(); err != nil || cur == on {
		if err != nil && on {
			s.log.Warn("the app's pages will not be merged", "err", err)
		}
		return
	}
	if err := ksm.SetSelf(on); err != nil {
		s.log.Warn("same-page merging", "on", on, "err", err)
	}
}

// waitFile blocks until path appears, and returns what it holds. A
// termination signal ends the wait with errReleased; SIGCHLD is reaped
// meanwhile.
func (s *supervisor) waitFile(path string, sigs <-chan os.Signal) ([]byte, error) {
	w := watchDirs(s.log, []string{filepath.Dir(path)}, watchSafety, watchFallback)
	defer w.stop()
	for {
		// Checked after the watch is in place, so that no file is missed.
		if b, err := os.ReadFile(path); err == nil {
			return b, nil
		}
		select {
		case <-w.C:
		case sig := <-sigs:
			if sig == syscall.SIGCHLD {
				s.reaper.reap()
				continue
			}
			if sig == syscall.SIGUSR1 {
				continue
			}
			return nil, errReleased
		}
	}
}

// lazyRestore says whether a restart restores its app's memory lazily: so
// made (-lazy), or so ordered (a resume's, OrderBody.Lazy), under an
// engine that can.
func (s *supervisor) lazyRestore() bool {
	return s.cfg.mode == modeRestart && engine.Of(s.cfg.engine).LazyRestore && (s.cfg.lazy || s.ordered.Lazy)
}
