package main

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// dirWatch wakes a loop that waits for a file (an order, a release, a
// checkpoint request) to appear in one of a few directories. It watches
// them with inotify, so that an instance waiting in a warm pool spends no
// CPU while nothing happens (looking every 50 ms costs a slot about 9 ms
// of CPU a second: its entrypoint and the Go runtime woken 20 times a
// second). It also ticks every `every`, for what a watch cannot see
// (a directory replaced or mounted over after the watch was added); where
// no directory can be watched it ticks every `fallback` instead.
type dirWatch struct {
	// C receives a value at once (a file may have appeared before the
	// watch), after something changed in a directory, and at every tick;
	// the loop then looks for its files. It never closes.
	C      <-chan struct{}
	f      *os.File
	ticker *time.Ticker
	done   chan struct{}
	// read is closed once the goroutine reading the watch has ended.
	read chan struct{}
}

// How often a dirWatch ticks: with its directories watched (a safety net),
// and without (the only way to see a file appear).
const (
	watchSafety   = time.Second
	watchFallback = 50 * time.Millisecond
)

// The inotify events a dirWatch wakes at: a file created (some writers
// create and then write it: IN_CLOSE_WRITE), or renamed into place.
const watchEvents = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_CLOSE_WRITE

// watchDirs watches dirs (at least one); the caller looks for its files at
// every value of C, the first of which is there at once. stop ends the
// watch. Where the directories cannot be watched, it says so in log, with
// why, and ticks every fallback.
func watchDirs(log *slog.Logger, dirs []string, every, fallback time.Duration) *dirWatch {
	c := make(chan struct{}, 1)
	c <- struct{}{}
	w := &dirWatch{C: c, done: make(chan struct{}), read: make(chan struct{})}
	wake := func() {
		select {
		case c <- struct{}{}:
		default:
		}
	}
	f, err := inotifyOn(dirs)
	if err != nil {
		log.Warn("cannot watch the control directories; looking for their files at every tick", "dirs", dirs, "every", fallback, "err", err)
		every = fallback
		close(w.read)
	} else {
		w.f = f
		go func() {
			defer close(w.read)
			// The descriptor is non-blocking: Read parks in the runtime's
			// poller, and stop's Close ends it.
			buf := make([]byte, 4096)
			for {
				if _, err := f.Read(buf); err != nil {
					return
				}
				wake()
			}
		}()
	}
	w.ticker = time.NewTicker(every)
	go func() {
		for {
			select {
			case <-w.done:
				return
			case <-w.ticker.C:
				wake()
			}
		}
	}()
	return w
}

// watching says whether the watch has inotify (false: it only ticks).
func (w *dirWatch) watching() bool { return w.f != nil }

// stop ends the watch; the loop no longer hears from it.
func (w *dirWatch) stop() {
	w.ticker.Stop()
	close(w.done)
	if w.f != nil {
		_ = w.f.Close()
	}
}

// inotifyOn returns a non-blocking inotify descriptor watching dirs.
func inotifyOn(dirs []string) (*os.File, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	for _, dir := range dirs {
		if _, err := unix.InotifyAddWatch(fd, dir, watchEvents); err != nil {
			_ = unix.Close(fd)
			return nil, fmt.Errorf("watch %s: %w", dir, err)
		}
	}
	return os.NewFile(uintptr(fd), "inotify"), nil
}
