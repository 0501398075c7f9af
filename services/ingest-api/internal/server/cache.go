package server

import (
	"sync"
	"time"
)

// ttlCache is a bounded map whose entries expire ttl after they were put; a
// ttl of 0 or less turns it off. On overflow it starts over, which costs the
// callers one database round trip per key and nothing else. It is per
// replica, never shared: both of its users (credentials, active keys) stay
// correct without it, and it only saves lookups.
type ttlCache[K comparable, V any] struct {
	ttl time.Duration
	max int
	now func() time.Time

	mu      sync.Mutex
	entries map[K]ttlEntry[V]
}

type ttlEntry[V any] struct {
	v       V
	expires time.Time
}

func newTTLCache[K comparable, V any](ttl time.Duration, max int, now func() time.Time) *ttlCache[K, V] {
	return &ttlCache[K, V]{ttl: ttl, max: max, now: now, entries: make(map[K]ttlEntry[V])}
}

func (c *ttlCache[K, V]) get(k K) (V, bool) {
	var zero V
	if c.ttl <= 0 {
		return zero, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[k]
	if !ok {
		return zero, false
	}
	if !c.now().Before(e.expires) {
		delete(c.entries, k)
		return zero, false
	}
	return e.v, true
}

func (c *ttlCache[K, V]) put(k K, v V) {
	if c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= c.max {
		clear(c.entries)
	}
	c.entries[k] = ttlEntry[V]{v: v, expires: c.now().Add(c.ttl)}
}

func (c *ttlCache[K, V]) drop(k K) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, k)
}
