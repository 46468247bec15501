// A checkpoint of the app under DMTCP: requested, written, awaited; the app stopped after it.

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/dmtcpctl"
	"github.com/fogdeploy/fogdeploy/internal/instancectl"
)

// ckptResult reports the end of one checkpoint.
type ckptResult struct {
	gen generation
	err error
}

// checkpoint starts a checkpoint of the app into <ckpt>/<gen> and returns
// the channel its result arrives on, and whether the app will be stopped by
// it. It does not block: the main loop keeps reaping meanwhile.
//
// It asks for -kc (or -c with -after-checkpoint=continue), then waits
// until the image is complete, since DMTCP 4.2's -bc does not block.
func (s *supervisor) checkpoint(reason string) (chan ckptResult, bool) {
	exitAfter := s.cfg.after == afterExit
	done := make(chan ckptResult, 1)
	gen := generation{n: s.gen, dir: filepath.Join(s.cfg.ckpt, strconv.Itoa(s.gen))}
	s.log.Info("checkpoint requested", "by", reason, "gen", gen.n, "dir", gen.dir, "delay", s.cfg.ckptDelay)
	go func() {
		// -checkpoint-delay: DMTCP aborts the app when it meets a
		// connection that the app is still closing (Tomcat closes a
		// finished one on its poller's next round); the wait is not part
		// of the checkpoint's timing.
		select {
		case <-time.After(s.cfg.ckptDelay):
		case <-s.appGone:
		}
		t := time.Now()
		gen.started = t
		res := ckptResult{gen: gen}
		defer func() { done <- res }()
		if err := os.MkdirAll(gen.dir, 0o755); err != nil {
			res.err = fmt.Errorf("create generation dir: %w", err)
			return
		}
		// With -after-checkpoint=continue a later checkpoint rewrites the
		// same generation: drop the old marker so that completion is
		// detected afresh.
		_ = os.Remove(filepath.Join(gen.dir, dmtcpctl.RestartScript))
		cmd := dmtcpctl.Checkpoint
		if exitAfter {
			cmd = dmtcpctl.CheckpointKill
		}
		rc, out, err := s.command(cmd)
		var rcErr error
		if rc != 0 {
			rcErr = fmt.Errorf("exit %d", rc)
		}
		if err != nil || !dmtcpctl.CheckpointCommandOK(cmd, rcErr, out) {
			res.err = fmt.Errorf("dmtcp_command %s: exit %d (%s): %w", cmd, rc, strings.TrimSpace(out), errors.Join(err, errCheckpoint))
			return
		}
		deadline, gone := t.Add(s.cfg.ckptTimeout), s.appGone
		for time.Now().Before(deadline) {
			if images, err := dmtcpctl.Complete(gen.dir, 1); err == nil {
				res.gen.images = images
				return
			}
			select {
			case <-gone:
				gone = nil
				if d := time.Now().Add(appGoneGrace); d.Before(deadline) {
					deadline = d
				}
			case <-time.After(5 * time.Millisecond):
			}
		}
		if gone == nil {
			res.err = fmt.Errorf("generation %s not complete %s after the app exited (see the app's output above): %w", gen.dir, appGoneGrace, errCheckpoint)
			return
		}
		res.err = fmt.Errorf("generation %s not complete after %s: %w", gen.dir, s.cfg.ckptTimeout, errCheckpoint)
	}()
	return done, exitAfter
}

// stopApp waits a little for an app that a -kc checkpoint is stopping, then
// kills it.
func (s *supervisor) stopApp(appDone <-chan syscall.WaitStatus) {
	if appDone == nil {
		return
	}
	timeout := time.After(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-appDone:
			return
		case <-tick.C:
			s.reaper.reap()
		case <-timeout:
			s.log.Warn("app did not stop after the checkpoint; killing it", "pid", s.appPid)
			_ = syscall.Kill(s.appPid, syscall.SIGKILL)
			timeout = time.After(10 * time.Second)
		}
	}
}

// shutdownCoordinator kills the coordinator (it ignores SIGTERM) and reaps
// what is left.
func (s *supervisor) shutdownCoordinator() {
	if s.coordPid > 0 {
		_ = syscall.Kill(-s.coordPid, syscall.SIGKILL)
		_ = syscall.Kill(s.coordPid, syscall.SIGKILL)
		time.Sleep(5 * time.Millisecond)
		s.reaper.reap()
	}
}

// reportCheckpoint writes, in the control directory (-wait's), the
// checkpoint that stopped the app, once the app is gone: the host reads
// it as soon as this process exits (instancectl.Checkpointed).
func (s *supervisor) reportCheckpoint(res ckptResult) {
	if s.cfg.wait == "" {
		return
	}
	ms := float64(time.Since(res.gen.startedAt()).Microseconds()) / 1000
	if err := writeJSON(s.ctlFile(instancectl.Checkpointed), instancectl.CheckpointedBody{Gen: res.gen.n, Bytes: res.gen.bytes(), MS: ms}); err != nil {
		s.log.Warn("report the checkpoint in the control directory; the host reads it from the logs", "err", err)
	}
}
