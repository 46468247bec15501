package deploy

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestCoalesce: callers that ask while a lookup is under way share the
// next one, which starts after they asked; none gets an answer older than
// its question; one lookup runs at a time.
func TestCoalesce(t *testing.T) {
	var c coalesce[string, int64]
	var calls, running atomic.Int64
	release := make(chan struct{})
	started := make(chan struct{}, 10)
	lookup := func() (int64, error) {
		if running.Add(1) > 1 {
			t.Errorf("two lookups of one key at once")
		}
		defer running.Add(-1)
		n := calls.Add(1)
		started <- struct{}{}
		<-release
		return n, nil
	}
	ctx := context.Background()
	first := make(chan int64, 1)
	go func() { v, _ := c.Do(ctx, "k", lookup); first <- v }()
	<-started // the first lookup is under way: the next callers arrive after it began
	var wg sync.WaitGroup
	got := make([]int64, 5)
	for i := range got {
		wg.Go(func() { got[i], _ = c.Do(ctx, "k", lookup) })
	}
	time.Sleep(50 * time.Millisecond) // let them queue
	release <- struct{}{}
	if v := <-first; v != 1 {
		t.Errorf("first caller got lookup %d; want 1", v)
	}
	<-started
	release <- struct{}{}
	wg.Wait()
	for i, v := range got {
		if v != 2 {
			t.Errorf("caller %d, which asked during lookup 1, got lookup %d; want 2 (one lookup for all, started after it asked)", i, v)
		}
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("%d lookups for 6 callers; want 2", n)
	}
	// Another key does not wait; a cancelled caller returns at once.
	go func() { <-started; release <- struct{}{} }()
	if v, err := c.Do(ctx, "other", lookup); err != nil || v != 3 {
		t.Errorf("other key = %d, %v; want 3", v, err)
	}
	busy := make(chan int64, 1)
	go func() { v, _ := c.Do(ctx, "k", lookup); busy <- v }()
	<-started
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Do(cctx, "k", lookup); err == nil {
		t.Errorf("a cancelled caller waiting behind a lookup got an answer instead of its context's error")
	}
	release <- struct{}{}
	<-busy
	<-started // the queued lookup runs for nobody but still ends
	release <- struct{}{}
}
