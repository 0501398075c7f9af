// Package limiter owns the three rate-limit policies of envelopeworker and the
// keys they are counted under. It is a thin, typed layer over
// github.com/sethvargo/go-limiter.
//
// # Policies
//
//   - Peer: keyed by the client address (never the port): an IPv4 address,
//     or an IPv6 /64, since one IPv6 subscriber is usually given a whole /64.
//     Applied to every /v1/ request before any credential work, so an
//     unauthenticated flood cannot turn into database load. The client
//     address is the TCP peer's unless that peer is a trusted proxy
//     (TrustedProxies.ClientAddr: X-Forwarded-For, walked from the right).
//   - Sync: keyed by the verified tenant, account, device and a purpose
//     (PurposeSyncIngest for inbound envelopes, PurposeOutboxEnqueue for
//     outbox messages, each in a limiter of its own), applied after
//     authentication and before route, key, signature or database work.
//   - Delivery: keyed by a trusted tenant-scheduler key (DeliveryKey), used by
//     the delivery worker.
//
// Each policy is configured on its own (tokens per interval) and gets its own
// store, so the same key value in two policies never shares a bucket.
//
// # Keys
//
// Callers never build key strings. PeerKey, SyncKey and DeliveryKey are typed
// values; the package encodes them with a policy tag and length-prefixed
// fields, so ("ab","c") and ("a","bc") can never collide, and then hashes the
// encoding with SHA-256. Hashing bounds the memory a hostile key can pin and
// keeps tenant and device ids out of the store in clear text, which matters
// once the store is shared (see below). A Limiter is generic over its key type,
// so a peer limiter cannot be asked about a SyncKey by mistake.
package limiter

// Design notes. They are kept here, beside the code, rather than in the
// package documentation, which says what the package owns and how to call it.
//
// # Token buckets
//
// A Policy is a token bucket: it holds at most Tokens and is refilled
// continuously at Tokens/Interval. Every policy with 1 ≤ Tokens ≤ 1,000,000
// and Interval ≥ 1 ms (contract §8.3) is enforced exactly and nothing inside
// that range is refused; anything outside it is ErrInvalidPolicy. The
// default store, MemoryStore, keeps each level in integer fixed point (whole
// tokens plus a remainder in 1/Interval(ns) of a token), so 1,000,000 an
// hour and 1 an hour are both exact, and time split into any number of
// steps refills what the whole span would. It replaced go-limiter's
// memorystore, which adds interval/tokens tokens per elapsed interval
// (integer division) and so enforced less than configured once tokens²
// exceeded the interval in nanoseconds (31,623 a second).
//
// Buckets live only while they matter: a sweeper drops a bucket once it has
// refilled to capacity (a returning key gets a new, equally full one) and
// rebuilds a shard's map once it has emptied out, so memory follows the set
// of keys active within one interval, not every key ever seen.
//
// # Retry-After
//
// Decision.Reset is when the bucket next gains a whole token, and
// Decision.RetryAfter the whole number of seconds until then, rounded up and
// never less than one second, so a client that honours it is never refused
// again for want of that token.
//
// # Per-replica semantics
//
// Buckets live in the process. With N replicas behind a load balancer a key
// may be allowed up to N times the configured rate, because each replica
// counts on its own; operators size the per-replica rate as (intended rate
// / N), or accept the bound.
//
// A shared store (any limiter.Store, e.g. a Redis-backed one, passed with
// WithStore) makes the limit global across replicas at the price of one
// network round trip per Take and a new failure mode: a Take error is
// returned to the caller, which must fail closed (ingest-api answers 503
// unavailable) rather than let traffic through unlimited.
