// Coalescing lookups: simultaneous pool hits each want to know the app's newest generation, and
// one listing of the pool answers them all.

package deploy

import (
	"context"
	"sync"
)

// coalesce shares the calls of a lookup among the callers that ask for the
// same key at once. A caller always gets the answer of a call that started
// after it asked, never an older one: one that arrives while a call is
// under way waits for the next, which starts when that one ends and
// answers everyone who arrived meanwhile. At most one call per key runs at
// a time. The zero value is ready to use.
type coalesce[K comparable, V any] struct {
	mu sync.Mutex
	// running is the call under way per key; queued the one that starts
	// when it ends.
	running, queued map[K]*coalesced[V]
}

type coalesced[V any] struct {
	done chan struct{}
	fn   func() (V, error)
	v    V
	err  error
}

// Do returns the answer of a call of fn (or of the same lookup asked by
// another caller) that started after Do was called.
func (c *coalesce[K, V]) Do(ctx context.Context, key K, fn func() (V, error)) (V, error) {
	c.mu.Lock()
	if c.running == nil {
		c.running, c.queued = map[K]*coalesced[V]{}, map[K]*coalesced[V]{}
	}
	call := c.running[key]
	if call == nil {
		call = &coalesced[V]{done: make(chan struct{}), fn: fn}
		c.running[key] = call
		c.mu.Unlock()
		c.run(key, call)
		return call.v, call.err
	}
	if c.queued[key] == nil {
		c.queued[key] = &coalesced[V]{done: make(chan struct{}), fn: fn}
	}
	call = c.queued[key]
	c.mu.Unlock()
	select {
	case <-call.done:
		return call.v, call.err
	case <-ctx.Done():
		var zero V
		return zero, ctx.Err()
	}
}

// run makes call, answers its callers, and starts the call queued behind
// it, if any.
func (c *coalesce[K, V]) run(key K, call *coalesced[V]) {
	call.v, call.err = call.fn()
	close(call.done)
	c.mu.Lock()
	next := c.queued[key]
	delete(c.queued, key)
	if next != nil {
		c.running[key] = next
	} else {
		delete(c.running, key)
	}
	c.mu.Unlock()
	if next != nil {
		go c.run(key, next)
	}
}
