// Package limiter owns the three rate-limit policies of envelopeworker and the
// keys they are counted under. It is a thin, typed layer over
// github.com/sethvargo/go-limiter.
//
// # Policies
//
//   - Peer: keyed by the remote IP address (never the port), applied to every
//     /v1/ request before any credential work, so an unauthenticated flood
//     cannot turn into database load.
//   - Sync: keyed by the verified tenant, account, device and a purpose
//     (PurposeSyncIngest for inbound envelopes), applied after authentication
//     and before route, key, signature or database work.
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
//
// # Retry-After
//
// Decision.RetryAfter is derived from the store's reset time: the whole number
// of seconds until the reset, rounded up, and never less than one second, so a
// client that honours it is never refused again for the same window.
//
// # Per-replica semantics
//
// The default store is go-limiter's memorystore: buckets live in the process.
// With N replicas behind a load balancer a key may be allowed up to N times
// the configured rate, because each replica counts on its own; operators size
// the per-replica rate as (intended rate / N), or accept the bound. The
// memorystore also refills a whole bucket at each interval boundary (a fixed
// window), so a client can spend up to twice the tokens across a boundary.
// It adds interval/tokens tokens per elapsed interval, so it refills a bucket
// in full only while tokens² ≤ the interval in nanoseconds (31,622 a second,
// 1.8 million an hour); New refuses larger policies with ErrInvalidPolicy
// instead of quietly enforcing a lower rate.
//
// A shared store (any limiter.Store, e.g. a Redis-backed one, passed with
// WithStore) makes the limit global across replicas at the price of one
// network round trip per Take and a new failure mode: a Take error is
// returned to the caller, which must fail closed (ingest-api answers 503
// unavailable) rather than let traffic through unlimited.
package limiter
