package server

import (
	"crypto/ed25519"
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
	c *ttlCache[activeKeyID, ed25519.PublicKey]
}

type activeKeyID struct{ tenant, keyID string }

const (
	// activeKeyTTL bounds how long an entry lives without being refreshed;
	// correctness does not depend on it (see activeKeys).
	activeKeyTTL = time.Minute
	// maxActiveKeys bounds memory.
	maxActiveKeys = 100_000
)

func newActiveKeys(now func() time.Time) *activeKeys {
	return &activeKeys{c: newTTLCache[activeKeyID, ed25519.PublicKey](activeKeyTTL, maxActiveKeys, now)}
}

// get returns the key as an active store.Key when cached and fresh.
func (k *activeKeys) get(tenant, keyID string) (store.Key, bool) {
	pub, ok := k.c.get(activeKeyID{tenant, keyID})
	if !ok {
		return store.Key{}, false
	}
	return store.Key{TenantID: tenant, KeyID: keyID, PublicKey: pub, State: store.KeyActive}, true
}

// put remembers key if it is active.
func (k *activeKeys) put(key store.Key) {
	if key.State == store.KeyActive {
		k.c.put(activeKeyID{key.TenantID, key.KeyID}, key.PublicKey)
	}
}

// drop forgets a key the store found no longer active.
func (k *activeKeys) drop(tenant, keyID string) { k.c.drop(activeKeyID{tenant, keyID}) }
