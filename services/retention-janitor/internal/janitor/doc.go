// Package janitor owns the retention-janitor run: one cycle that deletes
// expired inbound payloads (contract §5), then expired outbound envelope
// bodies and their delivery attempt rows (§8.9), and exits, as a Kubernetes
// CronJob.
//
// A cycle deletes payload rows whose expires_at has passed, at most
// Config.BatchSize (≤ 1,000) rows per DELETE, until a DELETE finds none due
// or JANITOR_TIMEOUT ends the cycle. Each DELETE is its own short transaction,
// so a timeout or SIGTERM cancels at most the statement in flight, which rolls
// back whole; what is left is due again at the next run. The cutoff is the
// database's clock, read once at the start, so payloads expiring during a run
// wait for the next one and the cycle always ends.
//
// Only payloads are deleted (store.DeleteExpiredPayloads): identities,
// sequences, cursors, replay floors and audit rows stay, so an expired event
// sent again is still a duplicate. The janitor's PostgreSQL role,
// envelopeworker_janitor, holds SELECT and DELETE on inbound_payloads and
// nothing else, so the database enforces this too.
//
// Outbound bodies (store.DeleteExpiredOutbound) go the same way, after the
// payloads, in the same cycle budget, batch size and pace: first the attempt
// rows of the messages of expired bodies, then the bodies, one DELETE of at
// most Config.BatchSize rows each. A body is deleted only when none of its
// envelope's messages is pending or delivering, whatever its expiry says.
// Message ids, statuses, idempotency keys and sequences stay. For this the
// role also holds SELECT and DELETE on outbound_bodies and outbox_attempts
// and SELECT on four columns of outbox_messages (which messages are in
// flight), and nothing more (migration 0008).
//
// Overlapping runs. A CronJob can start twice (a missed schedule caught up, a
// retried pod); concurrencyPolicy Forbid does not cover every case. A run
// therefore takes a session-level advisory lock (pg_try_advisory_lock, which
// PostgreSQL grants to every role) on a connection of its own; a run that
// finds it held logs that and exits 0 without deleting or pushing, since the
// holder will report. If the lock is lost with its connection (a failover), the
// store's deletes are still safe to overlap: a second janitor that picks rows
// another one is deleting waits for it and then deletes none of them, so every
// row is deleted and counted once.
//
// Key pruning is not done here. Deleting a retired or revoked key needs DELETE
// on producer_keys and reads of event_identities (every envelope the key signed
// must be older than the replay window); giving the janitor's role those
// rights would let the one unattended, scheduled binary delete keys. Pruning
// stays an operator action, envctl key prune, under the operator role.
//
// Reporting. Every run that got its configuration writes exactly one JSON log
// line, msg "retention summary", with rows_deleted, batches,
// outbound_bodies_deleted, outbound_attempts_deleted, outbound_batches,
// duration_seconds and stopped_by (done, timeout, canceled, lock_held or error). With
// PUSHGATEWAY_URL set the same figures are pushed to a Prometheus Pushgateway
// under job "envelopeworker_retention_janitor": a successful run replaces the
// group (PUT), a failed run updates only its own figures (POST) so that
// envelopeworker_janitor_last_success_timestamp_seconds keeps the last success
// for alerting. A failed push makes the run fail, so a silent monitoring gap
// shows up as a failed Job.
// PUSHGATEWAY_URL's user info (sent as basic auth) and query (sent with
// every push) never appear in the log line or the error, nor does the
// gateway's answer to a refused push: only its status (pushMetrics).
//
// Exit status: 0 for done, timeout, canceled (SIGTERM) and lock_held; non-zero
// when the database refused or failed, the schema is older than this binary
// expects, or the push failed.
package janitor
