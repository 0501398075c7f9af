package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Claimed is one message a worker now holds until LeaseExpiresAt. Attempt is
// the fencing token every settle must pass back. Body is the stored signed
// envelope, byte-identical on every attempt.
type Claimed struct {
	TenantID, MessageID, EndpointID, URL, SecretRef, EventIdentity string
	// SecretRefOwned: the tenant owns SecretRef (secret_ref_owners). When
	// false the message must not be signed with it: the endpoint names
	// another tenant's ref, or one nobody owns, written past the schema's
	// check (a restore without triggers, a hand edit).
	SecretRefOwned       bool
	Attempt, MaxAttempts int
	Body                 []byte
	LeaseExpiresAt       time.Time
}

// dueSQL is the claimable set: pending and past its retry time, or
// delivering with an expired lease (both are next_attempt_at <= now), and the
// endpoint active. Messages of a disabled endpoint wait in place.
const dueSQL = `
FROM outbox_messages m
JOIN endpoints e ON e.tenant_id = m.tenant_id AND e.endpoint_id = m.endpoint_id
WHERE m.status IN ('pending', 'delivering') AND m.next_attempt_at <= now() AND e.state = 'active'`

// dueTenantsSQL lists tenants with due work, the longest-waiting first, so a
// worker serving tenants in this order does not starve anyone. It reads
// outbox_due_tenants (migration 0011) through its (due_at, tenant_id) index
// from the start to now() and stops at the LIMIT: the cost is that of
// @limit index entries, whatever the backlog and however many tenants have
// nothing due. due_at is a lower bound of each tenant's due messages (on
// active endpoints), exact after the tenant's last claim; a tenant listed on
// a stale bound costs one claim that finds nothing, and that claim raises it.
const dueTenantsSQL = `
SELECT d.tenant_id FROM outbox_due_tenants d
WHERE d.due_at <= now()
ORDER BY d.due_at, d.tenant_id
LIMIT @limit`

// DueTenants returns up to limit (1..MaxDueTenants) tenants that have
// claimable messages, oldest due first. A tenant may be listed once more
// after its due work ran out (its claim then finds nothing and takes it off
// the list).
func (s *Outbox) DueTenants(ctx context.Context, limit int) ([]string, error) {
	const op = "due tenants"
	if limit < 1 || limit > MaxDueTenants {
		return nil, newErr(op, ErrInvalid)
	}
	rows, err := s.sqlDB().QueryContext(ctx, dueTenantsStmt.text, dueTenantsStmt.bind(pgx.StrictNamedArgs{"limit": limit}))
	if err != nil {
		return nil, classify(ctx, op, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, classify(ctx, op, err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, classify(ctx, op, err)
	}
	return out, nil
}

// lockDueTenantSQL takes the tenant's due row for the raise that follows it
// in the claim's transaction, or nothing when a writer that lowers due_at
// holds it (FOR KEY SHARE until it commits, migration 0011): then the row
// stays as low as it is, and the raise is left to a later claim. It never
// waits, so a claim never queues behind a busy tenant's enqueues. Taking the
// row marks the transaction (a setting local to it, dueLockedSetting), so
// the raise, sent in the same pipeline, knows whether to run without a
// round trip to ask.
//
// The lock is in a CTE (locking CTEs are never inlined) so set_config runs
// on the rows the lock returned only: in the locking query's own target
// list it could run before SKIP LOCKED skipped the row.
const lockDueTenantSQL = `
WITH l AS (SELECT d.tenant_id FROM outbox_due_tenants d WHERE d.tenant_id = @tenant FOR UPDATE SKIP LOCKED)
SELECT set_config('` + dueLockedSetting + `', l.tenant_id, true) FROM l`

// dueLockedSetting names the tenant whose due row the claim's transaction
// holds (lockDueTenantSQL); empty or unset otherwise.
const dueLockedSetting = "envelopeworker.due_locked"

// raiseDueTenantSQL sets the tenant's due_at to its earliest pending or
// delivering message on an active endpoint ('infinity' when none): the
// claimed messages count with their lease expiry. It changes the row only
// when lockDueTenantSQL took it (the setting is checked before the row is
// locked, so it never waits for a writer), as a statement of its own, so its snapshot
// holds every message of every writer that lowered the row before the lock
// (none can lower it while it is held). The earliest message is the first
// entry of the tenant's range of outbox_messages_due_idx whose endpoint is
// active: one index entry unless a disabled endpoint's messages come first
// (the claim pays the same walk). The endpoint is a scalar subquery, which
// the planner never turns into a join, so it is a lookup by its key per
// message whatever the statistics; as a bare boolean it is estimated to keep
// half the rows, so the LIMIT 1 walk of the due index is cheaper than a
// bitmap of the tenant's messages and a sort (an equality with 'active' was
// estimated to keep one row in 200, and got the bitmap and the sort: 100
// messages read a raise). The value is computed once, in a materialized CTE,
// and not at all when the lock was not taken; an unchanged value is not
// written.
const raiseDueTenantSQL = `
WITH n AS MATERIALIZED (
    SELECT coalesce((
        SELECT m.next_attempt_at FROM outbox_messages m
        WHERE m.tenant_id = @tenant AND m.next_attempt_at IS NOT NULL
          AND (SELECT e.state = 'active' FROM endpoints e WHERE e.tenant_id = @tenant AND e.endpoint_id = m.endpoint_id)
        ORDER BY m.next_attempt_at
        LIMIT 1), 'infinity') AS due_at
    WHERE current_setting('` + dueLockedSetting + `', true) = @tenant
)
UPDATE outbox_due_tenants d SET due_at = n.due_at
FROM n
WHERE d.tenant_id = @tenant AND d.due_at <> n.due_at`

// claimSQL locks up to @max due messages of @tenant, skipping rows another
// claimer holds, and leases them in the same statement (one round trip, one
// short transaction: no lock outlives the claim). A row another claimer
// updated and committed between our scan and our lock is re-checked against
// the WHERE clause on its new version, so it is never claimed twice for one
// lease. Claiming a message whose lease expired counts a lease expiry. A
// message whose lease expired on its last allowed attempt is not attempted
// again: it goes dead with code timeout (its fate at the receiver is
// unknown; an operator may replay it), so a message that keeps killing
// workers cannot run past max_attempts. Either way the expired attempt is
// recorded (lease_expired, code timeout, as the dead letter says): it
// started at the claim that leased it (updated_at is set by the claim and
// by nothing else until a settle) and lasted its lease. The rows come from
// due, which reads each message as locked, before this claim's update.
//
// The plan is pinned to index lookups whatever the statistics say (a new
// tenant's rows are often not analyzed yet, and a generic plan does not know
// @max): the due scan follows outbox_messages_due_idx in ORDER BY order and
// stops at the LIMIT; the update finds its rows by primary key through
// = ANY(array); endpoint, body and the secret ref's owner come from per-row
// primary-key lookups (the endpoint's a LATERAL subquery that OFFSET 0
// keeps from being flattened into a join the planner could turn into a
// scan; one lookup serves URL, ref and owner). Each claim costs O(claimed
// rows), not O(table).
//
// The body is read from outbound_bodies first and from the old column of
// outbound_envelopes only when it has not been moved there yet (migration
// 0008, expand/contract); coalesce evaluates the second lookup only then.
// A message made dead here as exhausted settles like any other
// (raiseExpiry).
const claimSQL = `
WITH due AS (
    SELECT m.message_id, (m.status = 'delivering' AND m.attempts >= m.max_attempts) AS exhausted,
           m.status = 'delivering' AS expired, m.attempts, m.updated_at, m.lease_expires_at` + dueSQL + ` AND m.tenant_id = @tenant
    ORDER BY m.next_attempt_at, m.message_id
    LIMIT @max
    FOR UPDATE OF m SKIP LOCKED
), exhausted AS (
    UPDATE outbox_messages m SET
        status           = 'dead',
        dead_at          = now(),
        next_attempt_at  = NULL,
        lease_expires_at = NULL,
        lease_expiries   = m.lease_expiries + 1,
        last_error_code  = 'timeout',
        updated_at       = now()
    WHERE m.tenant_id = @tenant AND m.message_id = ANY (ARRAY(SELECT message_id FROM due WHERE exhausted))
), exhausted_expiry AS (
    -- As raiseExpiry, for each envelope of a message made dead here: each
    -- body locked by its key in a LATERAL lookup, then joined back on the
    -- whole key (no constant on b, so the join is a key lookup per row).
    UPDATE outbound_bodies b
    SET expires_at = greatest(b.expires_at, now() + @retention_us::bigint * interval '1 microsecond')
    FROM (
        SELECT l.tenant_id, l.event_identity
        FROM (SELECT m.event_identity FROM outbox_messages m
              WHERE m.tenant_id = @tenant AND m.message_id = ANY (ARRAY(SELECT message_id FROM due WHERE exhausted))) s
        CROSS JOIN LATERAL (
            SELECT l.tenant_id, l.event_identity FROM outbound_bodies l
            WHERE l.tenant_id = @tenant AND l.event_identity = s.event_identity
            OFFSET 0 FOR UPDATE SKIP LOCKED) l
    ) k
    WHERE b.tenant_id = k.tenant_id AND b.event_identity = k.event_identity
), claimed AS (
    UPDATE outbox_messages m SET
        attempts         = m.attempts + 1,
        lease_expiries   = m.lease_expiries + CASE WHEN m.status = 'delivering' THEN 1 ELSE 0 END,
        status           = 'delivering',
        next_attempt_at  = now() + @lease_us::bigint * interval '1 microsecond',
        lease_expires_at = now() + @lease_us::bigint * interval '1 microsecond',
        updated_at       = now()
    WHERE m.tenant_id = @tenant AND m.message_id = ANY (ARRAY(SELECT message_id FROM due WHERE NOT exhausted))
    RETURNING m.message_id, m.endpoint_id, m.event_identity, m.attempts, m.max_attempts, m.lease_expires_at
), lease_expired AS (
    INSERT INTO outbox_attempts (tenant_id, message_id, attempt, started_at, duration_ms, http_status, error_code, result)
    SELECT @tenant, d.message_id, d.attempts, d.updated_at,
           greatest((extract(epoch FROM d.lease_expires_at - d.updated_at) * 1000)::bigint, 0),
           NULL, '` + CodeTimeout + `', '` + string(AttemptLeaseExpired) + `'
    FROM due d WHERE d.expired
    ON CONFLICT DO NOTHING
)
SELECT c.message_id, c.endpoint_id, e.url, e.secret_ref,
       coalesce((SELECT r.tenant_id = @tenant FROM secret_ref_owners r WHERE r.secret_ref = e.secret_ref), false),
       c.event_identity, c.attempts, c.max_attempts,
       coalesce((SELECT b.envelope FROM outbound_bodies b WHERE b.tenant_id = @tenant AND b.event_identity = c.event_identity),
                (SELECT o.envelope FROM outbound_envelopes o WHERE o.tenant_id = @tenant AND o.event_identity = c.event_identity)),
       c.lease_expires_at
FROM claimed c
LEFT JOIN LATERAL (
    SELECT e.url, e.secret_ref FROM endpoints e WHERE e.tenant_id = @tenant AND e.endpoint_id = c.endpoint_id
    OFFSET 0
) e ON true`

// claimPlanModeSQL chooses the plan mode of the claim's transaction, every
// claim anew: generic plans once outbox_messages has statistics of at
// least ClaimGenericMinRows rows (pg_class.reltuples, kept by autovacuum;
// on the partitioned layout the parent's, which only an ANALYZE of the
// parent sets (envctl analyze), and its partitions' together), PostgreSQL's
// own choice (auto) otherwise. Left to itself PostgreSQL planned the claim
// anew on every call (0.65-1.1 ms, as much as running a claim of 50 rows:
// the fixed cost that makes a tenant's claims at its share expensive). A
// generic plan is not safe to keep before such statistics: one made for a
// table the planner takes for empty reaches the claimed messages by tenant
// alone (TestHotStatementPlansUseTheirKeys, the claim's emptyTies), and
// statistics of a few hundred rows may give a plan that scans what a minute
// later holds tens of thousands; every connection would keep it until an
// ANALYZE. Deciding per claim, not once per process, follows the table down
// as well as up (emptied and vacuumed: auto again). The statement rides in
// the claim's pipeline: no round trip; set_config(…, true) is local to the
// transaction.
const claimPlanModeSQL = `
SELECT set_config('plan_cache_mode', CASE
    WHEN bool_and(c.reltuples >= 0)
     AND max(c.reltuples) FILTER (WHERE c.oid = 'outbox_messages'::regclass) >= @min_rows
     AND coalesce(sum(c.reltuples) FILTER (WHERE c.oid <> 'outbox_messages'::regclass), @min_rows) >= @min_rows
    THEN 'force_generic_plan' ELSE 'auto' END, true)
FROM pg_class c
WHERE c.oid = 'outbox_messages'::regclass
   OR c.oid IN (SELECT i.inhrelid FROM pg_inherits i WHERE i.inhparent = 'outbox_messages'::regclass)`

// ClaimGenericMinRows is the analyzed size of outbox_messages from which the
// claim runs on generic plans (claimPlanModeSQL;
// TestHotStatementPlansUseTheirKeys checks them at that size).
const ClaimGenericMinRows = 10000

// claimPlanModeArgs are claimPlanModeSQL's arguments, the same for every
// claim (a bound statement is only read, so claims share it).
var claimPlanModeArgs = claimPlanModeStmt.bind(pgx.StrictNamedArgs{"min_rows": ClaimGenericMinRows})

// Claim leases at most max (1..MaxClaim) due messages of one tenant for lease
// (0 < lease <= MaxLease), incrementing each one's attempt counter. The
// returned messages are in no particular order. In the same transaction it
// raises the tenant's due_at to what is left (raiseDueTenantSQL), so a
// tenant whose due work ran out leaves the round's list.
func (s *Outbox) Claim(ctx context.Context, tenant string, max int, lease time.Duration) ([]Claimed, error) {
	const op = "claim"
	if !validIdentity(tenant) || max < 1 || max > MaxClaim || lease < time.Microsecond || lease > MaxLease {
		return nil, newErr(op, ErrInvalid)
	}
	var out []Claimed
	err := s.withPgx(ctx, func(c *pgx.Conn) error {
		var err error
		out, err = runClaim(ctx, c, tenant, max, lease.Microseconds(), s.retentionMicros())
		return err
	})
	if err != nil {
		return nil, classify(ctx, op, err)
	}
	return out, nil
}

// runClaim sends BEGIN, the plan mode (claimPlanModeSQL), the claim, the
// due row's lock, the raise and COMMIT as one pipeline: one round trip, as
// the claim alone took before. A failure part-way aborts the transaction
// (the server skips the rest of the pipeline, COMMIT included), so nothing
// is claimed without its raise. Every path leaves the connection idle, or
// marks it bad so the pool drops it.
func runClaim(ctx context.Context, c *pgx.Conn, tenant string, max int, leaseMicros, retentionMicros int64) (_ []Claimed, err error) {
	defer func() {
		if err != nil {
			err = releaseAfterError(ctx, c, err)
		}
	}()
	named := pgx.StrictNamedArgs{"tenant": tenant}
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	b.Queue(claimPlanModeStmt.text, claimPlanModeArgs)
	b.Queue(claimStmt.text, claimStmt.bind(pgx.StrictNamedArgs{"tenant": tenant, "max": max,
		"lease_us": leaseMicros, "retention_us": retentionMicros}))
	b.Queue(lockDueTenantStmt.text, lockDueTenantStmt.bind(named))
	b.Queue(raiseDueTenantStmt.text, raiseDueTenantStmt.bind(named))
	b.Queue("COMMIT")
	br := c.SendBatch(ctx, b)
	out, tag, err := readClaim(br, tenant)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	if tag.String() != "COMMIT" {
		return nil, errRolledBack
	}
	return out, nil
}

// readClaim reads the pipeline's results: BEGIN, the plan mode, the
// claimed rows, the lock (a row or none), the raise and COMMIT's tag.
func readClaim(br pgx.BatchResults, tenant string) ([]Claimed, pgconn.CommandTag, error) {
	var none pgconn.CommandTag
	for range 2 { // BEGIN, the plan mode
		if _, err := br.Exec(); err != nil {
			return nil, none, err
		}
	}
	rows, err := br.Query()
	if err != nil {
		return nil, none, err
	}
	var out []Claimed
	for rows.Next() {
		c := Claimed{TenantID: tenant}
		var ident []byte
		if err := rows.Scan(&c.MessageID, &c.EndpointID, &c.URL, &c.SecretRef, &c.SecretRefOwned, &ident, &c.Attempt,
			&c.MaxAttempts, &c.Body, &c.LeaseExpiresAt); err != nil {
			rows.Close()
			return nil, none, err
		}
		c.EventIdentity = hexIdentity(ident)
		out = append(out, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, none, err
	}
	if _, err := br.Exec(); err != nil { // the lock: a row or none
		return nil, none, err
	}
	if _, err := br.Exec(); err != nil { // the raise
		return nil, none, err
	}
	tag, err := br.Exec() // COMMIT
	return out, tag, err
}

// OutboxStats is the worker's view of the backlog across tenants.
type OutboxStats struct {
	Due          int64         // claimable messages now
	OldestDueAge time.Duration // how long the longest-waiting one has been due; 0 when none
}

const outboxStatsSQL = `
SELECT count(*), coalesce((extract(epoch FROM now() - min(m.next_attempt_at)) * 1000000)::bigint, 0)` + dueSQL

// OutboxStats counts claimable messages and the age of the oldest, for
// metrics (no tenant breakdown: tenant ids are not metric labels).
func (s *Outbox) OutboxStats(ctx context.Context) (OutboxStats, error) {
	const op = "outbox stats"
	var st OutboxStats
	var micros int64
	if err := s.sqlDB().QueryRowContext(ctx, outboxStatsSQL).Scan(&st.Due, &micros); err != nil {
		return OutboxStats{}, classify(ctx, op, err)
	}
	st.OldestDueAge = time.Duration(max(micros, 0)) * time.Microsecond
	return st, nil
}
