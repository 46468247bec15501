package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDirWatch: a watch wakes its loop once at its start, then when a file
// is renamed or written into a watched directory, and not while nothing
// happens (the safety tick is set beyond the test); a directory that
// cannot be watched is looked at every fallback instead. A stopped watch
// leaves no reader behind.
func TestDirWatch(t *testing.T) {
	var logged bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	dir := t.TempDir()
	w := watchDirs(log, []string{t.TempDir(), dir}, time.Hour, time.Millisecond)
	if !w.watching() {
		t.Fatal("watchDirs on two directories: not watching; want an inotify watch")
	}
	select {
	case <-w.C: // the first look, for a file made before the watch
	default:
		t.Fatal("no first wake; want one at once")
	}
	select {
	case <-w.C:
		t.Fatal("woken while nothing changed")
	case <-time.After(300 * time.Millisecond):
	}
	tmp := filepath.Join(dir, ".release.tmp")
	if err := os.WriteFile(tmp, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "release")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.C:
	case <-time.After(5 * time.Second):
		t.Fatal("a file renamed into the directory did not wake the loop within 5 s")
	}
	// Drain what the write and the rename left, then stay quiet again.
	time.Sleep(50 * time.Millisecond)
	select {
	case <-w.C:
	default:
	}
	select {
	case <-w.C:
		t.Fatal("woken again while nothing changed")
	case <-time.After(200 * time.Millisecond):
	}

	// A container that serves instance after instance watches again and
	// again: a watch that stops leaves no reader behind.
	w.stop()
	select {
	case <-w.read:
	case <-time.After(5 * time.Second):
		t.Fatal("the watch's reader still runs 5 s after stop")
	}

	gone := watchDirs(log, []string{filepath.Join(dir, "missing")}, time.Hour, 10*time.Millisecond)
	defer gone.stop()
	if gone.watching() {
		t.Fatal("watchDirs on a missing directory: watching; want the fallback tick")
	}
	if out := logged.String(); !strings.Contains(out, "cannot watch") || !strings.Contains(out, "missing") || !strings.Contains(out, "no such file") {
		t.Errorf("log %q: want a warning naming the directory and why it cannot be watched", out)
	}
	<-gone.C
	select {
	case <-gone.C:
	case <-time.After(5 * time.Second):
		t.Fatal("the fallback tick did not wake the loop within 5 s")
	}
}
