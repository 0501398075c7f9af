// Package store owns the durable state of the inbound side of controlplane/v1
// in PostgreSQL: credentials (SHA-256 digests of opaque tokens only), producer
// keys and their lifecycle, streams (cursor and replay floor), permanent event
// identities, expiring payloads (the canonical signed envelope), and the audit
// trail. It runs contract §2 steps 5–6 — lock the stream, decide duplicate or
// conflict or accept in the contract's order, commit identity, payload,
// cursor advance and audit row together — and the reads built on them.
//
// It also owns the outbound side (contract §4): endpoints, outbound streams
// and envelopes, and the outbox of messages with their leases, fenced
// settles, dead letters and replays (endpoints.go, outbox.go,
// outbox_claim.go, outbox_settle.go, outbox_deadletters.go; the design notes
// head outbox.go).
//
// The schema lives in the migrations module; this package assumes it and
// never creates tables.
//
// # Concerns
//
// Open returns a Store: the pool, Close, Ping and the schema version and
// readiness (CheckSchema, NewReadiness). The statements are grouped by
// concern into types that share that one pool, each reached from the Store:
//
//   - Credentials: credentials and producer keys (credentials.go, keys.go)
//   - Inbound: ingest, the audit trail and streams (ingest.go, audit.go, streams.go)
//   - Outbox: endpoints, enqueue, claim, settle, dead letters, attempts (endpoints.go, outbox*.go)
//   - Retention: expiry deletes and the body-expiry backfill (retention.go, outbox_retention.go)
//
// A caller keeps only the concerns it uses: the delivery-worker an *Outbox,
// the retention-janitor a *Retention. TryLock's SessionLock is the one
// statement outside the pool: a session-level advisory lock on a
// connection of its own, for a run that must not overlap another.
//
// # Errors
//
// Every failure is an *Error whose message is fixed text: never SQL, driver
// messages or values. Test the kind with errors.Is against ErrNotFound,
// ErrConflict, ErrInvalid, ErrUnavailable or ErrInternal. Connection
// failures, timeouts, cancelled contexts, server restarts and exhausted
// retries are ErrUnavailable (a cancelled context also matches
// context.Canceled). The driver cause stays reachable with errors.As for
// diagnostics; log SQLState(err), never the cause's message.
package store

// Design notes. They are kept here, beside the code, rather than in the
// package documentation, which says what the package owns and how to call it.
//
// # Transactions
//
// Ingest (and a batch of one envelope) sends BEGIN, the stream lock (an
// upsert of the stream row) and decideSQL, one statement that decides and
// writes, as one pgx pipeline, reads the answer, and then sends COMMIT: two
// round trips and one commit. Under READ COMMITTED each statement takes a
// fresh snapshot, so the decision, taken after the lock was granted, sees
// everything the previous lock holder committed. The cursor advance is
// computed in SQL.
//
// IngestBatch of more than one item decides set-based (ingest_set.go): BEGIN,
// every stream lock in a fixed order, and two reads (stream states; what each
// envelope is compared with) go out as one pipeline; the decisions are made
// in Go in item order, mirroring decideSQL; one statement then writes every
// identity, payload, cursor and audit row, pipelined with COMMIT. Per-envelope
// statements cost ~0.2 ms of server CPU each; the set-based form does the
// same index work in two statements. TestIngestBatchMatchesOneByOne holds the
// two forms to the same answers and the same rows on random workloads.
//
// The server commits only on the client's COMMIT, so a cancelled context or a
// killed session leaves nothing behind.
//
// An input may name the public key its signature was verified with
// (IngestInput.VerifiedWith); the decision then also requires that key to be
// active with that public key in the same transaction, else the answer is
// OutcomeStale and nothing is written. This is what lets ingest-api cache
// active keys without delaying a retirement, revocation or prune.
//
// The few races the stream lock does not cover (two streams of one project
// writing the same event or idempotency key, deadlocks between batches) end
// in a unique violation or deadlock error; the whole transaction is rerun
// (Options.MaxRetries) and then answers duplicate or conflict.
//
// # bun and pgx
//
// Operator CRUD and listings (endpoints, keys, credentials, audit, dead
// letters, attempt history) are bun models, one per table, and bun queries
// on pgdialect: a few rows of one table at operator pace. The hot paths
// (ingest, enqueue, claim, settle) stay hand-written SQL on pgx, their
// arguments named as pgx.StrictNamedArgs takes them,
// a missing name an error rather than a NULL, but rewritten to $n once, not
// per call (named.go).
// Each is one set-based statement (unnest arrays, data-modifying CTEs,
// LATERAL lookups kept apart by OFFSET 0) that bun cannot express, pipelined
// with BEGIN and COMMIT on one connection (withPgx) so a request costs two
// round trips, and sent with bind parameters so one cached prepared
// statement and its generic plan serve every call. bun formats values into
// the text instead, so each distinct query is prepared anew (a round trip
// more) and takes a slot in pgx's statement cache: fine for a listing, not
// for a per-request read, which is why VerifyCredential, LookupKey and
// SignedBy keep bind parameters too.
//
// # Choices where the contract is silent
//
//   - A stream row is created by the first envelope that reaches step 5, even
//     a refused one; it reads as cursor 0, floor 0 like a stream never written.
//   - Retiring a retired key and revoking a revoked key are no-ops; retiring a
//     revoked key is ErrConflict. Revoking a credential twice is a no-op.
//   - ReadStream reports a payload as expired from its expires_at on, whether
//     or not the janitor has deleted the row yet.
//   - Audit rows carry the transaction's time (now()), so the rows of one
//     batch share a timestamp and are ordered by their id.
