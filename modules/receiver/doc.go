// Package receiver is the webhook-consumer side of envelopeworker: an
// http.Handler middleware that accepts a delivery only when it is what the
// delivery-worker sent, and hands the handler the verified controlplane/v1
// envelope — never an unverified one.
//
// # What a delivery must pass, in order
//
//  1. POST only (405 method_not_allowed).
//  2. Standard Webhooks headers: webhook-id (printable ASCII, at most 256
//     bytes), webhook-timestamp (decimal Unix seconds) and webhook-signature
//     (space-separated "v1,<base64 HMAC-SHA256>" and "v1a,<base64
//     Ed25519>" entries, at most 16; entries of other versions are skipped
//     as the specification asks). Absent: 400 missing_header; of the wrong
//     form: 400 malformed_header.
//  3. webhook-timestamp within Config.Tolerance (default 5 minutes) of the
//     receiver's clock, either way: 400 stale_timestamp.
//  4. The body, at most 1 MiB: read into a buffer that grows with the bytes
//     that arrive (a declared Content-Length only refuses early, it never
//     sizes an allocation): 413 body_too_large.
//  5. An entry that verifies over id "." timestamp "." body under one of
//     Config.Secrets — whsec_ HMAC keys and whpk_ Ed25519 public keys, old
//     and new during a rotation — compared in constant time: else 401
//     bad_signature.
//  6. The body is a controlplane/v1 envelope (the envelope module's strict
//     reader) with schema_version 1 and valid metadata: 400
//     invalid_envelope. Its issued_at is not judged: a message in retry or
//     a replayed dead letter may be old, and step 3 bounds the attempt.
//  7. Its tenant_id is Config.Tenant when that is set: 403 wrong_tenant.
//  8. Its key_id names one of the tenant's outbound public keys
//     (Config.Keys: StaticKeys, or RemoteKeys fetching GET
//     /v1/outbound-keys): 401 unknown_key once a fresh fetch confirms it is
//     unknown; 503 keys_unavailable (Retry-After: 60) while the keys cannot
//     be fetched or a refresh is not yet allowed (one a minute), so a key
//     rotated a moment ago is retried, not dead-lettered.
//  9. The envelope's Ed25519 signature verifies: 401 bad_envelope_signature.
//
// Every refusal answers {"outcome":"refused","reason":"<Code>"} and never
// echoes request content. Any 4xx except 408, 410 and 429 makes the
// delivery-worker give the message up (a dead letter an operator can
// replay), which is what a misconfigured secret should look like.
//
// # Exactly once
//
// The worker redelivers until it sees a 2xx, so a receiver that crashed
// after its effect but before answering sees the same webhook-id again.
// Handler runs the effect inside a Receipts transaction that also records
// the webhook-id: a redelivery finds the receipt and answers 204 without
// running the effect. Package pgreceipts is the PostgreSQL implementation;
// it lives in its own package so that importing receiver builds no driver.
package receiver
