package server

import (
	"crypto/ed25519"
	"sync"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// activeKeys remembers, per replica, the public keys of producer keys last
// seen active, so the single-envelope route can verify a signature without a
// key lookup. The cache is only a hint: every envelope verified with a cached
// key carries it to the store (IngestInput.VerifiedWith), which decides it
// only if that key is still active with that public key inside the ingest
// transaction. A retirement, revocation or prune therefore takes effect for
// every envelope committed after it, cached or not; a stale answer drops the
// entry and the envelope is decided again from a fresh lookup.
//
// Only active keys are kept (retired and revoked ones need the full step-3
// rules and are looked up every time), and unknown keys never are, so a key
// added a moment ago works at once.
type activeKeys struct {
	ttl time.Duration
	now func() time.Time

	mu      sync.Mutex
	entries map[activeKeyID]activeKey
}

type activeKeyID struct{ tenant, keyID string }

type activeKey struct {
	pub     ed25519.PublicKey
	expires time.Time
}

const (
	// activeKeyTTL bounds how long an entry lives without being refreshed;
	// correctness does not depend on it (see activeKeys).
	activeKeyTTL = time.Minute
	// maxActiveKeys bounds memory; on overflow the cache starts over.
	maxActiveKeys = 100_000
)

func newActiveKeys(now func() time.Time) *activeKeys {
	return &activeKeys{ttl: activeKeyTTL, now: now, entries: make(map[activeKeyID]activeKey)}
}

// get returns the key as an active store.Key when cached and fresh.
func (c *activeKeys) get(tenant, keyID string) (store.Key, bool) {
	id := activeKeyID{tenant, keyID}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[id]
	if !ok {
		return store.Key{}, false
	}
	if !c.now().Before(e.expires) {
		delete(c.entries, id)
		return store.Key{}, false
	}
	return store.Key{TenantID: tenant, KeyID: keyID, PublicKey: e.pub, State: store.KeyActive}, true
}

// put remembers k if it is active.
func (c *activeKeys) put(k store.Key) {
	if k.State != store.KeyActive {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= maxActiveKeys {
		clear(c.entries)
	}
	c.entries[activeKeyID{k.TenantID, k.KeyID}] = activeKey{pub: k.PublicKey, expires: c.now().Add(c.ttl)}
}

// drop forgets a key the store found no longer active.
func (c *activeKeys) drop(tenant, keyID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, activeKeyID{tenant, keyID})
}
