package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/instancectl"
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
	s.log.Info("order received", "deployment", o.Deployment, "node", o.Node)
	return o, nil
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
