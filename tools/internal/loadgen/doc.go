// Package loadgen drives ingest-api over HTTP, alone, to measure what a fleet of producers gets from it.
//
// It owns two steps, both reachable from the loadgen-ingest command:
//
//   - Setup issues one device credential and registers one Ed25519 key per producer through the store
//     (DATABASE_URL), and writes them to a credentials file (mode 0600: it holds tokens and seeds).
//   - Plan signs every envelope ahead of time (one stream per producer, sequences 1, 2, 3, … in a fresh
//     project per run), so that signing cost never shows up in the measurement; Run then sends them with
//     C concurrent producers, each one request in flight like a real device, on the single route or the
//     batch route, flat out or at a fixed total rate, until every envelope is sent or the duration ends.
//     With Config.SDK the plan holds the same events unsigned, and each producer is a modules/producer
//     Producer (in-memory store, the lean conn as its transport) that signs and numbers them as it
//     sends: what a fleet of SDK producers gets, client cost included.
//
// Latency is per request. At a fixed rate it is measured from the moment the request was due, not when
// it was sent, so a server that falls behind shows up in the tail instead of silently slowing the
// generator (coordinated omission). Throughput counts accepted envelopes per second of wall time.
//
// Only loopback URLs are accepted: a load generator pointed at someone else's service is an attack.
package loadgen
