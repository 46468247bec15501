package keyedmutex

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestExclusivePerKeyAndForgotten(t *testing.T) {
	var km Map[string]
	var inside [4]atomic.Int32
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := i % 4
			unlock := km.Lock(strconv.Itoa(k))
			if n := inside[k].Add(1); n != 1 {
				t.Errorf("key %d held by %d goroutines at once", k, n)
			}
			time.Sleep(100 * time.Microsecond)
			inside[k].Add(-1)
			unlock()
		}()
	}
	wg.Wait()
	if n := km.Len(); n != 0 {
		t.Fatalf("%d keys kept after every holder unlocked; want 0", n)
	}
	for i := range 1000 { // many distinct keys, as deployment IDs are
		km.Lock("dep-" + strconv.Itoa(i))()
	}
	if n := km.Len(); n != 0 {
		t.Fatalf("%d keys kept after 1000 distinct keys were locked and unlocked; want 0", n)
	}
}

func TestTryLock(t *testing.T) {
	var km Map[string]
	unlock := km.Lock("a")
	if _, ok := km.TryLock("a"); ok {
		t.Fatal("TryLock of a held key succeeded")
	}
	u2, ok := km.TryLock("b")
	if !ok {
		t.Fatal("TryLock of a free key failed")
	}
	u2()
	unlock()
	u3, ok := km.TryLock("a")
	if !ok {
		t.Fatal("TryLock after unlock failed")
	}
	u3()
	if n := km.Len(); n != 0 {
		t.Fatalf("Len = %d after all unlocks", n)
	}
}

func TestWaiterKeepsEntry(t *testing.T) {
	var km Map[int]
	unlock := km.Lock(1)
	got := make(chan struct{})
	go func() {
		km.Lock(1)()
		close(got)
	}()
	for km.mu.Lock(); km.m[1].refs != 2; km.mu.Lock() {
		km.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
	km.mu.Unlock()
	unlock() // the waiter's reference keeps the same mutex in the map
	<-got
	if n := km.Len(); n != 0 {
		t.Fatalf("Len = %d", n)
	}
}
