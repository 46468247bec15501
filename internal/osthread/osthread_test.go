package osthread_test

import (
	"sync"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/osthread"
	"golang.org/x/sys/unix"
)

// TestRunNeverOnMainThread: however many run at once, none runs on the
// process's main thread (free here: the test's main goroutine waits), and
// each runs on a thread of its own that no later one gets again.
func TestRunNeverOnMainThread(t *testing.T) {
	const n = 300
	var wg sync.WaitGroup
	var mu sync.Mutex
	tids := map[int]int{}
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := osthread.Run(func() error {
				mu.Lock()
				tids[unix.Gettid()]++
				mu.Unlock()
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if tids[unix.Getpid()] > 0 {
		t.Errorf("%d of %d runs were on the main thread", tids[unix.Getpid()], n)
	}
	for tid, runs := range tids {
		if runs > 1 {
			t.Errorf("thread %d ran %d of them; want each on a discarded thread", tid, runs)
		}
	}
	if err := osthread.Run(func() error { return unix.ENOENT }); err != unix.ENOENT {
		t.Errorf("Run returned %v; want fn's error", err)
	}
}
