// Package keyedmutex is one mutex per key (an app, a deployment ID) that
// exists only while someone holds or waits for it, so that the set of keys
// a long-running agent has seen does not grow without bound.
package keyedmutex

import "sync"

// Map is a set of mutexes by key. The zero value is ready to use.
type Map[K comparable] struct {
	mu sync.Mutex
	m  map[K]*entry
}

type entry struct {
	sync.Mutex
	refs int // holders and waiters
}

func (km *Map[K]) acquire(k K) *entry {
	km.mu.Lock()
	defer km.mu.Unlock()
	if km.m == nil {
		km.m = map[K]*entry{}
	}
	e, ok := km.m[k]
	if !ok {
		e = &entry{}
		km.m[k] = e
	}
	e.refs++
	return e
}

func (km *Map[K]) release(k K, e *entry) {
	km.mu.Lock()
	defer km.mu.Unlock()
	if e.refs--; e.refs == 0 {
		delete(km.m, k)
	}
}

// Lock locks k's mutex, waiting while another holds it, and returns the
// function that unlocks it.
func (km *Map[K]) Lock(k K) (unlock func()) {
	e := km.acquire(k)
	e.Lock()
	return func() {
		e.Unlock()
		km.release(k, e)
	}
}

// TryLock locks k's mutex if nobody holds it; ok is false otherwise.
func (km *Map[K]) TryLock(k K) (unlock func(), ok bool) {
	e := km.acquire(k)
	if !e.TryLock() {
		km.release(k, e)
		return nil, false
	}
	return func() {
		e.Unlock()
		km.release(k, e)
	}, true
}

// Len is how many keys are held or waited for now.
func (km *Map[K]) Len() int {
	km.mu.Lock()
	defer km.mu.Unlock()
	return len(km.m)
}
