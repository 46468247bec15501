// Package osthread runs code that changes what only its OS thread holds
// (its namespaces, root, working directory, credentials) on a thread of its
// own, which the Go runtime discards afterwards.
package osthread

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// Run runs fn on an OS thread locked to it and never unlocked, so that the
// runtime discards the thread once fn has returned, with whatever fn
// changed, and returns fn's error.
//
// The thread is never the process's main thread. Go cannot discard that
// one: it parks it for good, still in the namespaces fn entered, and
// /proc/self, which is the main thread's, would then show the process's
// mounts and namespaces as that thread sees them (an agent would look for
// its own mounts in an instance's mount namespace, and pin it).
func Run(fn func() error) error {
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// The main thread stays locked to this goroutine, which waits,
			// so the one Run starts now runs on another thread; then this
			// one gives the main thread back as it found it.
			ch <- Run(fn)
			runtime.UnlockOSThread()
			return
		}
		ch <- fn()
	}()
	return <-ch
}
