package store

import (
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
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
// worker serving tenants in this order does not starve anyone.
const dueTenantsSQL = `
SELECT m.tenant_id` + dueSQL + `
GROUP BY m.tenant_id
ORDER BY min(m.next_attempt_at), m.tenant_id
LIMIT $1`

// DueTenants returns up to limit (1..MaxDueTenants) tenants that have
// claimable messages, oldest due first. It reads every due message (cost
// grows with the backlog, not the table); call it once per polling round.
func (s *Store) DueTenants(ctx context.Context, limit int) ([]string, error) {
	const op = "due tenants"
	if limit < 1 || limit > MaxDueTenants {
		return nil, newErr(op, ErrInvalid)
	}
	rows, err := s.sqlDB().QueryContext(ctx, dueTenantsSQL, limit)
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

// claimSQL locks up to $2 due messages of tenant $1, skipping rows another
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
// $2): the due scan follows outbox_messages_due_idx in ORDER BY order and
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
//
//	$1 tenant  $2 max  $3 lease in microseconds  $4 payload retention in microseconds
const claimSQL = `
WITH due AS (
    SELECT m.message_id, (m.status = 'delivering' AND m.attempts >= m.max_attempts) AS exhausted,
           m.status = 'delivering' AS expired, m.attempts, m.updated_at, m.lease_expires_at` + dueSQL + ` AND m.tenant_id = $1
    ORDER BY m.next_attempt_at, m.message_id
    LIMIT $2
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
    WHERE m.tenant_id = $1 AND m.message_id = ANY (ARRAY(SELECT message_id FROM due WHERE exhausted))
), exhausted_expiry AS (
    -- As raiseExpiry, for each envelope of a message made dead here: each
    -- body locked by its key in a LATERAL lookup, then joined back on the
    -- whole key (no constant on b, so the join is a key lookup per row).
    UPDATE outbound_bodies b
    SET expires_at = greatest(b.expires_at, now() + $4::bigint * interval '1 microsecond')
    FROM (
        SELECT l.tenant_id, l.event_identity
        FROM (SELECT m.event_identity FROM outbox_messages m
              WHERE m.tenant_id = $1 AND m.message_id = ANY (ARRAY(SELECT message_id FROM due WHERE exhausted))) s
        CROSS JOIN LATERAL (
            SELECT l.tenant_id, l.event_identity FROM outbound_bodies l
            WHERE l.tenant_id = $1 AND l.event_identity = s.event_identity
            OFFSET 0 FOR UPDATE SKIP LOCKED) l
    ) k
    WHERE b.tenant_id = k.tenant_id AND b.event_identity = k.event_identity
), claimed AS (
    UPDATE outbox_messages m SET
        attempts         = m.attempts + 1,
        lease_expiries   = m.lease_expiries + CASE WHEN m.status = 'delivering' THEN 1 ELSE 0 END,
        status           = 'delivering',
        next_attempt_at  = now() + $3::bigint * interval '1 microsecond',
        lease_expires_at = now() + $3::bigint * interval '1 microsecond',
        updated_at       = now()
    WHERE m.tenant_id = $1 AND m.message_id = ANY (ARRAY(SELECT message_id FROM due WHERE NOT exhausted))
    RETURNING m.message_id, m.endpoint_id, m.event_identity, m.attempts, m.max_attempts, m.lease_expires_at
), lease_expired AS (
    INSERT INTO outbox_attempts (tenant_id, message_id, attempt, started_at, duration_ms, http_status, error_code, result)
    SELECT $1, d.message_id, d.attempts, d.updated_at,
           greatest((extract(epoch FROM d.lease_expires_at - d.updated_at) * 1000)::bigint, 0),
           NULL, '` + CodeTimeout + `', '` + string(AttemptLeaseExpired) + `'
    FROM due d WHERE d.expired
    ON CONFLICT DO NOTHING
)
SELECT c.message_id, c.endpoint_id, e.url, e.secret_ref,
       coalesce((SELECT r.tenant_id = $1 FROM secret_ref_owners r WHERE r.secret_ref = e.secret_ref), false),
       c.event_identity, c.attempts, c.max_attempts,
       coalesce((SELECT b.envelope FROM outbound_bodies b WHERE b.tenant_id = $1 AND b.event_identity = c.event_identity),
                (SELECT o.envelope FROM outbound_envelopes o WHERE o.tenant_id = $1 AND o.event_identity = c.event_identity)),
       c.lease_expires_at
FROM claimed c
LEFT JOIN LATERAL (
    SELECT e.url, e.secret_ref FROM endpoints e WHERE e.tenant_id = $1 AND e.endpoint_id = c.endpoint_id
    OFFSET 0
) e ON true`

// Claim leases at most max (1..MaxClaim) due messages of one tenant for lease
// (0 < lease <= MaxLease), incrementing each one's attempt counter. The
// returned messages are in no particular order.
func (s *Store) Claim(ctx context.Context, tenant string, max int, lease time.Duration) ([]Claimed, error) {
	const op = "claim"
	if !validIdentity(tenant) || max < 1 || max > MaxClaim || lease < time.Microsecond || lease > MaxLease {
		return nil, newErr(op, ErrInvalid)
	}
	rows, err := s.sqlDB().QueryContext(ctx, claimSQL, tenant, max, lease.Microseconds(), s.retentionMicros())
	if err != nil {
		return nil, classify(ctx, op, err)
	}
	defer rows.Close()
	var out []Claimed
	for rows.Next() {
		c := Claimed{TenantID: tenant}
		var ident []byte
		if err := rows.Scan(&c.MessageID, &c.EndpointID, &c.URL, &c.SecretRef, &c.SecretRefOwned, &ident, &c.Attempt,
			&c.MaxAttempts, &c.Body, &c.LeaseExpiresAt); err != nil {
			return nil, classify(ctx, op, err)
		}
		c.EventIdentity = hexIdentity(ident)
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, classify(ctx, op, err)
	}
	return out, nil
}

// settleSQL applies a batch of settles of tenant $1 in one statement, one
// array element a settle (SettleBatch). Each is fenced on its own row: it
// changes the message only while the message is delivering under the
// attempt it claimed, so after a lease expired and another worker claimed
// the message (attempts moved on) a stale worker's settle changes nothing.
// A row another transaction changes between this statement's snapshot and
// its update is re-checked against the fence on its new version.
//
// The outcome decides the new state: delivered; retry, pending again at its
// next time or dead (code kept) when the claimed attempt was the last of
// its budget; dead with its code, its endpoint disabled in the same
// statement when asked (a 410 Gone answer; the first such settle of an
// endpoint names the reason, as a sequence of single settles would).
//
// The settles that leave a message delivered or dead raise the expiry of
// its envelope's body to at least now() + retention (§8.9), so the last
// settle of an envelope leaves its own time plus the retention. Whether
// that settle was the last one is not decided here: the janitor deletes a
// body only when none of its messages is pending or delivering
// (noneInFlight), a check on the latest committed rows. A body another
// transaction holds is skipped, not waited for (SKIP LOCKED), so a settle
// never waits on a body and batches sharing envelopes cannot deadlock on
// them; whoever holds it fixes the expiry instead (a sibling's settle, or
// a replay, which clears it for a message that will settle again). The
// envelopes are read from the statement's snapshot, so one whose settle
// then turns out fenced may be raised too: harmless, for the same reason.
//
// Each settle that matched writes its attempt row in the same statement
// (§8.8): the result is the status it left (a retry on the last attempt is
// dead), the code the one stored. A settle without its own timing ($8,
// $9 NULL) records what the database knows: the claim's time (updated_at
// as claimed, from pre) and the time since. A row already there (attempts
// reset by hand) is kept: the history never stops a settle. (No conflict
// target: naming one needs SELECT on the history, which the worker does
// not have.)
//
// Every table is reached by its key whatever the statistics say
// (TestHotStatementPlansUseTheirKeys): the messages through = ANY of the
// batch's ids on the primary key, each body by a LATERAL key lookup (OFFSET
// 0 keeps it from being flattened into a join the planner could turn into
// a scan), then joined back on the whole key. Messages are locked in index
// order, so two batches over the same rows lock them in the same order.
// The statement returns the ordinality of each settle that matched.
//
//	$1 tenant  $2 message ids  $3 attempts  $4 outcomes  $5 next attempt times
//	$6 codes  $7 disable endpoint  $8 started at  $9 durations (ms)  $10 HTTP statuses
//	$11 payload retention in microseconds
const settleSQL = `
WITH s AS (
    SELECT * FROM unnest($2::text[], $3::int[], $4::text[], $5::timestamptz[], $6::text[], $7::boolean[],
                         $8::timestamptz[], $9::bigint[], $10::smallint[])
        WITH ORDINALITY AS s(message_id, attempt, outcome, next_at, code, disable, started_at, duration_ms,
                             http_status, ord)
), pre AS (
    SELECT s.*, o.event_identity, o.updated_at AS claimed_at, o.attempts >= o.max_attempts AS last
    FROM s CROSS JOIN LATERAL (
        SELECT o.event_identity, o.updated_at, o.attempts, o.max_attempts FROM outbox_messages o
        WHERE o.tenant_id = $1 AND o.message_id = s.message_id AND o.attempts = s.attempt AND o.status = 'delivering'
        OFFSET 0) o
), expiry AS (
    UPDATE outbound_bodies b
    SET expires_at = greatest(b.expires_at, now() + $11::bigint * interval '1 microsecond')
    FROM (
        SELECT l.tenant_id, l.event_identity
        FROM (SELECT DISTINCT p.event_identity FROM pre p
              WHERE p.outcome <> '` + string(SettleRetry) + `' OR p.last) e
        CROSS JOIN LATERAL (
            SELECT l.tenant_id, l.event_identity FROM outbound_bodies l
            WHERE l.tenant_id = $1 AND l.event_identity = e.event_identity
            OFFSET 0 FOR UPDATE SKIP LOCKED) l
    ) k
    WHERE b.tenant_id = k.tenant_id AND b.event_identity = k.event_identity
), m AS (
    UPDATE outbox_messages o SET
        (status, delivered_at, dead_at, next_attempt_at, last_error_code) = (
            SELECT CASE WHEN p.outcome = '` + string(SettleDelivered) + `' THEN 'delivered'
                        WHEN p.outcome = '` + string(SettleDead) + `' OR p.last THEN 'dead' ELSE 'pending' END,
                   CASE WHEN p.outcome = '` + string(SettleDelivered) + `' THEN now() ELSE o.delivered_at END,
                   CASE WHEN p.outcome = '` + string(SettleDelivered) + `' THEN o.dead_at
                        WHEN p.outcome = '` + string(SettleDead) + `' OR p.last THEN now() END,
                   CASE WHEN p.outcome = '` + string(SettleRetry) + `' AND NOT p.last THEN p.next_at END,
                   CASE WHEN p.outcome = '` + string(SettleDelivered) + `' THEN '' ELSE p.code END
            FROM pre p WHERE p.message_id = o.message_id),
        lease_expires_at = NULL,
        updated_at       = now()
    WHERE o.tenant_id = $1 AND o.message_id = ANY (ARRAY(SELECT message_id FROM pre)) AND o.status = 'delivering'
      AND o.attempts = (SELECT p.attempt FROM pre p WHERE p.message_id = o.message_id)
    RETURNING o.message_id, o.endpoint_id, o.attempts, o.status, o.last_error_code
), settled AS (
    SELECT m.*, p.disable, p.ord, p.claimed_at, p.started_at, p.duration_ms, p.http_status
    FROM m JOIN pre p USING (message_id)
), e AS (
    UPDATE endpoints SET state = 'disabled', disabled_reason = g.code, updated_at = now()
    FROM (SELECT DISTINCT ON (d.endpoint_id) d.endpoint_id, d.last_error_code AS code FROM settled d
          WHERE d.disable ORDER BY d.endpoint_id, d.ord) g
    WHERE endpoints.tenant_id = $1 AND endpoints.endpoint_id = g.endpoint_id AND endpoints.state = 'active'
), attempt AS (
    INSERT INTO outbox_attempts (tenant_id, message_id, attempt, started_at, duration_ms, http_status, error_code, result)
    SELECT $1, d.message_id, d.attempts, coalesce(d.started_at, d.claimed_at),
           coalesce(d.duration_ms, greatest((extract(epoch FROM now() - d.claimed_at) * 1000)::bigint, 0)),
           d.http_status, nullif(d.last_error_code, ''),
           CASE d.status WHEN 'pending' THEN '` + string(AttemptRetry) + `' ELSE d.status END
    FROM settled d
    ON CONFLICT DO NOTHING
)
SELECT ord FROM settled`

const messageExistsSQL = `SELECT EXISTS (SELECT FROM outbox_messages WHERE tenant_id = $1 AND message_id = $2)`

func validSettle(tenant, id string, attempt int) bool {
	return validIdentity(tenant) && messageIDRE.MatchString(id) && attempt >= 1
}

// settled turns "no row matched the fence" into ErrFenced, or ErrNotFound
// when the message does not exist for tenant.
func (s *Store) settled(ctx context.Context, op, tenant, id string, n int64) error {
	if n > 0 {
		return nil
	}
	var exists bool
	if err := s.sqlDB().QueryRowContext(ctx, messageExistsSQL, tenant, id).Scan(&exists); err != nil {
		return classify(ctx, op, err)
	}
	if !exists {
		return newErr(op, ErrNotFound)
	}
	return newErr(op, ErrFenced)
}

// settleOne is a single settle through settleSQL, answering as SettleBatch
// does for one settlement but under op.
func (s *Store) settleOne(ctx context.Context, op, tenant string, st Settlement) error {
	applied, err := s.settleSet(ctx, tenant, []Settlement{st})
	if err != nil {
		return classify(ctx, op, err)
	}
	return s.settled(ctx, op, tenant, st.MessageID, boolCount(applied[0]))
}

func boolCount(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// MarkDelivered settles a 2xx answer for the claimed attempt. ErrFenced when
// the attempt no longer owns the message; ErrNotFound for an unknown id. The
// attempt is recorded with the database's timing (see Settlement).
func (s *Store) MarkDelivered(ctx context.Context, tenant, id string, attempt int) error {
	const op = "mark delivered"
	if !validSettle(tenant, id, attempt) {
		return newErr(op, ErrInvalid)
	}
	return s.settleOne(ctx, op, tenant, Settlement{MessageID: id, Attempt: attempt, Outcome: SettleDelivered})
}

// MarkRetry records a retryable failure (code: one of the Code* constants)
// and makes the message due again at next; when the claimed attempt was the
// last of its budget the message is dead instead, with the same code.
func (s *Store) MarkRetry(ctx context.Context, tenant, id string, attempt int, next time.Time, code string) error {
	const op = "mark retry"
	if !validSettle(tenant, id, attempt) || next.IsZero() || !ValidErrorCode(code) {
		return newErr(op, ErrInvalid)
	}
	return s.settleOne(ctx, op, tenant, Settlement{MessageID: id, Attempt: attempt, Outcome: SettleRetry, Next: next, Code: code})
}

// MarkDead makes the message dead at once with code. With disableEndpoint
// (a 410 Gone answer) its endpoint is disabled in the same transaction, with
// code as the reason: later messages wait and new enqueues skip it.
func (s *Store) MarkDead(ctx context.Context, tenant, id string, attempt int, code string, disableEndpoint bool) error {
	const op = "mark dead"
	if !validSettle(tenant, id, attempt) || !ValidErrorCode(code) {
		return newErr(op, ErrInvalid)
	}
	return s.settleOne(ctx, op, tenant, Settlement{MessageID: id, Attempt: attempt, Outcome: SettleDead, Code: code,
		DisableEndpoint: disableEndpoint})
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
func (s *Store) OutboxStats(ctx context.Context) (OutboxStats, error) {
	const op = "outbox stats"
	var st OutboxStats
	var micros int64
	if err := s.sqlDB().QueryRowContext(ctx, outboxStatsSQL).Scan(&st.Due, &micros); err != nil {
		return OutboxStats{}, classify(ctx, op, err)
	}
	st.OldestDueAge = time.Duration(max(micros, 0)) * time.Microsecond
	return st, nil
}

// DeadLetter is one entry of GET /v1/dead-letters. ErrorCode is the stable
// code of the last attempt.
type DeadLetter struct {
	MessageID, EndpointID, Topic, ErrorCode string
	Attempts                                int
	CreatedAt, DeadAt                       time.Time
}

// listDeadSQL pages by (dead_at, message_id), the order of the partial index.
// dead_at IS NOT NULL (the same rows as status = 'dead', by a CHECK) is the
// index's predicate, which a replay's status = 'dead' does not imply: on a
// never-analyzed table a partial index looks empty, and a replay took it
// over the primary key (migration 0009).
const listDeadSQL = `
SELECT message_id, endpoint_id, topic, last_error_code, attempts, created_at, dead_at
FROM outbox_messages
WHERE tenant_id = $1 AND project_id = $2 AND status = 'dead' AND dead_at IS NOT NULL
  AND ($3::timestamptz IS NULL OR (dead_at, message_id) > ($3::timestamptz, $4::text))
ORDER BY dead_at, message_id
LIMIT $5`

// deadCursor encodes a page position. It is opaque to clients; it carries
// only a time and a message id the caller already saw.
func deadCursor(d DeadLetter) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(d.DeadAt.UnixMicro(), 10) + "." + d.MessageID))
}

// DeadLetterCursorAt is the ListDeadLetters cursor whose next page starts at
// the first dead letter that died at or after t: the position just past
// every message that died a microsecond earlier (dead_at has microsecond
// precision, and no message id sorts after the largest one).
func DeadLetterCursorAt(t time.Time) string {
	return deadCursor(DeadLetter{DeadAt: t.Truncate(time.Microsecond).Add(-time.Microsecond), MessageID: "msg_ffffffffffffffffffffffff"})
}

func parseDeadCursor(c string) (time.Time, string, bool) {
	if len(c) > 128 {
		return time.Time{}, "", false
	}
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return time.Time{}, "", false
	}
	micros, id, ok := strings.Cut(string(b), ".")
	if !ok || !messageIDRE.MatchString(id) {
		return time.Time{}, "", false
	}
	us, err := strconv.ParseInt(micros, 10, 64)
	if err != nil || strconv.FormatInt(us, 10) != micros {
		return time.Time{}, "", false
	}
	return time.UnixMicro(us).UTC(), id, true
}

// ListDeadLetters pages a project's dead messages, oldest death first. limit
// is 1..MaxDeadLetterPage; after is "" for the first page or the next_after
// of the previous one. The returned cursor is nil on the last page. A limit
// out of range or a malformed cursor is ErrInvalid. A replayed message leaves
// the list; if it dies again it comes back with its new dead_at, so pages
// never repeat or skip an entry that stayed dead.
func (s *Store) ListDeadLetters(ctx context.Context, tenant, project string, limit int, after string) ([]DeadLetter, *string, error) {
	const op = "list dead letters"
	if !validIdentity(tenant, project) || limit < 1 || limit > MaxDeadLetterPage {
		return nil, nil, newErr(op, ErrInvalid)
	}
	var afterAt sql.NullTime
	var afterID string
	if after != "" {
		t, id, ok := parseDeadCursor(after)
		if !ok {
			return nil, nil, newErr(op, ErrInvalid)
		}
		afterAt, afterID = sql.NullTime{Time: t, Valid: true}, id
	}
	rows, err := s.sqlDB().QueryContext(ctx, listDeadSQL, tenant, project, afterAt, afterID, limit+1)
	if err != nil {
		return nil, nil, classify(ctx, op, err)
	}
	defer rows.Close()
	out := []DeadLetter{}
	for rows.Next() {
		var d DeadLetter
		if err := rows.Scan(&d.MessageID, &d.EndpointID, &d.Topic, &d.ErrorCode, &d.Attempts, &d.CreatedAt,
			&d.DeadAt); err != nil {
			return nil, nil, classify(ctx, op, err)
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, classify(ctx, op, err)
	}
	if len(out) <= limit {
		return out, nil, nil
	}
	out = out[:limit]
	next := deadCursor(out[limit-1])
	return out, &next, nil
}

// replaySQL puts a dead message back to pending with a fresh budget
// (max_attempts = attempts + the request's max_attempts; attempts keeps
// counting), clears its envelope body's expiry and writes the audit row, in
// one statement. It changes nothing when the body is gone (§8.9): the body
// update comes first (m reads it), so a janitor deleting the body at the
// same moment either committed first (no row: nothing replayed) or waits
// for the replay and then finds the expiry cleared. A body not yet moved
// out of the old column (migration 0008) counts as present.
//
//	$1 tenant  $2 message  $3 account  $4 device  $5 correlation id
const replaySQL = `
WITH target AS (
    SELECT event_identity FROM outbox_messages WHERE tenant_id = $1 AND message_id = $2 AND status = 'dead'
), body AS (
    UPDATE outbound_bodies b SET expires_at = NULL
    WHERE b.tenant_id = $1 AND b.event_identity = (SELECT event_identity FROM target)
    RETURNING b.event_identity
), m AS (
    UPDATE outbox_messages SET status = 'pending', max_attempts = attempts + budget, replays = replays + 1,
        next_attempt_at = now(), dead_at = NULL, updated_at = now()
    WHERE tenant_id = $1 AND message_id = $2 AND status = 'dead'
      AND (EXISTS (SELECT FROM body)
           OR EXISTS (SELECT FROM outbound_unmoved_bodies u
                      WHERE u.tenant_id = $1 AND u.event_identity = (SELECT event_identity FROM target)))
    RETURNING ` + messageStatusColumns + `, project_id, event_identity
), audit AS (
    INSERT INTO audit_events (tenant_id, project_id, account_id, device_id, event_identity,
                              outcome, reason, correlation_id)
    SELECT $1, m.project_id, $3, $4, encode(m.event_identity, 'hex'), 'replayed', '', $5
    FROM m
)
SELECT ` + messageStatusColumns + ` FROM m`

// OutcomeReplayed is the audit outcome of a dead-letter replay.
const OutcomeReplayed = "replayed"

// ReplayDeadLetter puts the actor's tenant's dead message id back to pending
// and returns its new status. Ids and body stay; the attempt counter keeps
// growing. ErrNotDead when the message is not dead, ErrPayloadExpired when
// it is dead but its envelope body expired, ErrNotFound when it does
// not exist for the tenant. A message of a disabled endpoint is replayed too
// and waits until the endpoint is enabled.
func (s *Store) ReplayDeadLetter(ctx context.Context, a Actor, id string) (MessageStatus, error) {
	const op = "replay dead letter"
	if !validActor(a) {
		return MessageStatus{}, newErr(op, ErrInvalid)
	}
	if !messageIDRE.MatchString(id) {
		return MessageStatus{}, newErr(op, ErrNotFound)
	}
	m, err := scanStatus(s.sqlDB().QueryRowContext(ctx, replaySQL, a.TenantID, id, a.AccountID, a.DeviceID,
		a.CorrelationID))
	if err == nil {
		return m, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return MessageStatus{}, classify(ctx, op, err)
	}
	st, err := s.OutboxMessage(ctx, a.TenantID, id)
	if err != nil {
		return MessageStatus{}, err
	}
	if st.Status == StatusDead && st.PayloadExpired {
		return MessageStatus{}, newErr(op, ErrPayloadExpired)
	}
	return MessageStatus{}, newErr(op, ErrNotDead)
}

// SettleOutcome is what a Settlement records.
type SettleOutcome string

const (
	SettleDelivered SettleOutcome = "delivered" // as MarkDelivered
	SettleRetry     SettleOutcome = "retry"     // as MarkRetry: Next and Code
	SettleDead      SettleOutcome = "dead"      // as MarkDead: Code and DisableEndpoint
)

// Settlement is one settle of SettleBatch. StartedAt, Duration and
// HTTPStatus go to the attempt's history row (contract §8.8); a zero
// StartedAt records the claim's time and the time since it instead, as the
// Mark* calls do.
type Settlement struct {
	MessageID       string
	Attempt         int
	Outcome         SettleOutcome
	Next            time.Time // retry only
	Code            string    // retry and dead
	DisableEndpoint bool      // dead only
	StartedAt       time.Time // when the request began
	Duration        time.Duration
	HTTPStatus      int // 0: no answer (timeout, connection failure, never sent)
}

// MaxSettleBatch bounds one SettleBatch.
const MaxSettleBatch = 1000

func (st Settlement) valid() bool {
	if !messageIDRE.MatchString(st.MessageID) || st.Attempt < 1 || st.Duration < 0 ||
		(st.HTTPStatus != 0 && (st.HTTPStatus < 100 || st.HTTPStatus > 599)) {
		return false
	}
	switch st.Outcome {
	case SettleDelivered:
		return st.Code == "" && st.Next.IsZero() && !st.DisableEndpoint
	case SettleRetry:
		return ValidErrorCode(st.Code) && !st.Next.IsZero() && !st.DisableEndpoint
	case SettleDead:
		return ValidErrorCode(st.Code) && st.Next.IsZero()
	}
	return false
}

// SettleBatch applies several settles of one tenant in one statement, one
// round trip and one commit: each exactly as the single Mark* call, fenced
// on its own attempt, and each recording its attempt row with the
// settlement's timing and status. The durable commit is what a settle
// costs on most disks, so a worker that gathers the answers finishing at
// about the same time settles many per commit, and one statement a batch
// keeps PostgreSQL's per-statement work out of the per-message cost. The
// result has one entry per settlement, in order: nil, ErrFenced or
// ErrNotFound; a settlement repeating an earlier one's message is answered
// as it would be after that one (it no longer owns the message). The error
// is for the batch as a whole (ErrInvalid for any malformed settlement,
// before any database work; or a database failure, after which none of the
// batch is applied).
func (s *Store) SettleBatch(ctx context.Context, tenant string, ss []Settlement) ([]error, error) {
	const op = "settle batch"
	if !validIdentity(tenant) || len(ss) > MaxSettleBatch {
		return nil, newErr(op, ErrInvalid)
	}
	for _, st := range ss {
		if !st.valid() {
			return nil, newErr(op, ErrInvalid)
		}
	}
	if len(ss) == 0 {
		return nil, nil
	}
	applied, err := s.settleSet(ctx, tenant, ss)
	if err != nil {
		return nil, classify(ctx, op, err)
	}
	results := make([]error, len(ss))
	for i, st := range ss {
		if !applied[i] {
			results[i] = s.settled(ctx, op, tenant, st.MessageID, 0)
			if !errors.Is(results[i], ErrFenced) && !errors.Is(results[i], ErrNotFound) {
				return nil, results[i]
			}
		}
	}
	return results, nil
}

// settleSet runs settleSQL over valid settlements and reports which of them
// matched their fence. A message named again later in ss is sent once, at
// its first settlement: after that one the message is no longer delivering
// under the attempt, so the repeats match nothing, as they would in turn.
func (s *Store) settleSet(ctx context.Context, tenant string, ss []Settlement) ([]bool, error) {
	n := len(ss)
	var (
		ids      = make([]string, 0, n)
		attempts = make([]int32, 0, n)
		outcomes = make([]string, 0, n)
		nexts    = make([]*time.Time, 0, n)
		codes    = make([]string, 0, n)
		disable  = make([]bool, 0, n)
		started  = make([]*time.Time, 0, n)
		duration = make([]*int64, 0, n)
		statuses = make([]*int16, 0, n)
		sent     = make([]int, 0, n) // index in ss of each element sent
		seen     = make(map[string]bool, n)
	)
	for i, st := range ss {
		if seen[st.MessageID] {
			continue
		}
		seen[st.MessageID] = true
		sent = append(sent, i)
		ids = append(ids, st.MessageID)
		attempts = append(attempts, int32(st.Attempt))
		outcomes = append(outcomes, string(st.Outcome))
		codes = append(codes, st.Code)
		disable = append(disable, st.DisableEndpoint)
		var next, start *time.Time
		var ms *int64
		var status *int16
		if !st.Next.IsZero() {
			next = &st.Next
		}
		if !st.StartedAt.IsZero() {
			d := st.Duration.Milliseconds()
			start, ms = &st.StartedAt, &d
		}
		if st.HTTPStatus != 0 {
			v := int16(st.HTTPStatus)
			status = &v
		}
		nexts, started, duration, statuses = append(nexts, next), append(started, start), append(duration, ms),
			append(statuses, status)
	}
	applied := make([]bool, n)
	err := s.withPgx(ctx, func(c *pgx.Conn) error {
		rows, err := c.Query(ctx, settleSQL, tenant, ids, attempts, outcomes, nexts, codes, disable, started, duration,
			statuses, s.retentionMicros())
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var ord int64
			if err := rows.Scan(&ord); err != nil {
				return err
			}
			applied[sent[ord-1]] = true
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return applied, nil
}
