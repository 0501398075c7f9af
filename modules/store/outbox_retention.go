package store

// Outbound retention (contract §8.9). An outbound envelope's identity
// (outbound_envelopes) stays for good; its body (outbound_bodies, migration
// 0008) expires OutboxPayloadRetention after the last of its messages became
// delivered or dead. The settles raise the expiry (settleSQL), a replay
// clears it (replaySQL), the retention-janitor deletes expired bodies and
// their messages' attempt rows here, and BackfillBodies moves the bodies
// older releases wrote into the old column.

import (
	"bytes"
	"context"
	"time"
)

func (s *pool) retentionMicros() int64 { return s.opts.OutboxPayloadRetention.Microseconds() }

// noneInFlight holds for a body none of whose messages may still be
// attempted: the janitor's test of "the envelope's last message settled".
// A replay clears the body's expiry in the statement that makes its message
// pending, so a janitor that sees the message dead and the body expired in
// its snapshot still finds the body changed when it comes to delete it. The
// body's alias must be b. The status test is written as NOT IN the settled
// states (the same rows, by the table's CHECK) so that it cannot match the
// partial outbox_messages_due_idx: the lookup goes by envelope. OFFSET 0
// keeps it a lookup per body rather than an anti-join the planner could
// run as a scan of every message.
const noneInFlight = `NOT EXISTS (SELECT FROM outbox_messages f
                   WHERE f.tenant_id = b.tenant_id AND f.event_identity = b.event_identity
                     AND f.status NOT IN ('delivered', 'dead') OFFSET 0)`

// expiredBodies is the janitor's candidate scan: bodies expired at $1 with
// no message in flight, oldest expiry first along the partial index. bodies
// is the heap the ctids are of: outbound_bodies, or one of its partitions
// (partitions.go).
func expiredBodies(bodies string) string {
	return `
    SELECT b.tenant_id, b.event_identity, b.ctid FROM ` + bodies + ` b
    WHERE b.expires_at <= $1 AND ` + noneInFlight + `
    ORDER BY b.expires_at`
}

// deleteExpiredAttemptsSQL deletes up to $2 attempt rows of the messages of
// bodies expired at $1. Attempt rows go first, so a body is deleted only
// once its history is (deleteExpiredBodiesSQL): a run stopped between the
// two leaves a body to find again, never an attempt row nothing points to.
// As for inbound payloads (retention.go), the janitor's role has no UPDATE,
// so no row locks: rows are chosen by ctid in a subquery and deleted in the
// same statement (see deleteExpiredSQL), and attempt rows of settled
// messages are no longer written, so only another janitor contends. The
// LATERAL subqueries with OFFSET 0 keep each step an index lookup per row
// (no join the planner could turn into a scan of a large table). In the
// partitioned layout bodies and attempts are the partitions of one hash
// bound, which hold the same tenants' rows; a message is reached through
// its parent table by its tenant.
func deleteExpiredAttemptsFrom(bodies, attempts string) string {
	return `
DELETE FROM ` + attempts + ` a
WHERE a.ctid = ANY (ARRAY(
    SELECT x.ctid
    FROM (` + expiredBodies(bodies) + `
          OFFSET 0) e
    CROSS JOIN LATERAL (
        SELECT m.message_id FROM outbox_messages m
        WHERE m.tenant_id = e.tenant_id AND m.event_identity = e.event_identity OFFSET 0) m
    CROSS JOIN LATERAL (
        SELECT x.ctid FROM ` + attempts + ` x
        WHERE x.tenant_id = e.tenant_id AND x.message_id = m.message_id OFFSET 0) x
    LIMIT $2))`
}

var deleteExpiredAttemptsSQL = deleteExpiredAttemptsFrom("outbound_bodies", "outbox_attempts")

// deleteExpiredBodiesSQL deletes up to $2 bodies expired at $1, oldest
// expiry first, whose messages are all settled and have no attempt rows
// left. The repeated checks are what a concurrent replay changes (it
// clears expires_at); a ctid names the same row for the whole statement
// (see deleteExpiredSQL, which TestRetentionTablesAreHeapsTheDeletesName guards the same way).
//
// A body past its expiry with a message still in flight (a replay, or a
// message waiting on a disabled endpoint) is passed over on every batch
// until that message settles and raises the expiry again; such bodies are
// few (the retention is months, a delivery budget hours).
func deleteExpiredBodiesFrom(bodies string) string {
	return `
DELETE FROM ` + bodies + ` b
WHERE b.ctid = ANY (ARRAY(
    SELECT e.ctid FROM (` + expiredBodies(bodies) + `
                        OFFSET 0) e
    WHERE NOT EXISTS (
        SELECT FROM outbox_messages m
        CROSS JOIN LATERAL (SELECT FROM outbox_attempts x
                            WHERE x.tenant_id = m.tenant_id AND x.message_id = m.message_id LIMIT 1) x
        WHERE m.tenant_id = e.tenant_id AND m.event_identity = e.event_identity OFFSET 0)
    LIMIT $2))
  AND b.expires_at <= $1 AND ` + noneInFlight
}

var deleteExpiredBodiesSQL = deleteExpiredBodiesFrom("outbound_bodies")

// OutboundDeleted is one DeleteExpiredOutbound: rows of one kind only.
type OutboundDeleted struct {
	Attempts, Bodies int
}

// DeleteExpiredOutbound runs one DELETE of at most batch (1..MaxDeleteBatch)
// rows: the attempt rows of messages whose envelope body expired at or
// before now while any are left, then the expired bodies. Zero of both means
// nothing is due. Message ids, statuses, idempotency keys and sequences stay
// (§8.9).
func (s *Retention) DeleteExpiredOutbound(ctx context.Context, now time.Time, batch int) (OutboundDeleted, error) {
	const op = "delete expired outbound"
	if batch < 1 || batch > MaxDeleteBatch || now.IsZero() {
		return OutboundDeleted{}, newErr(op, ErrInvalid)
	}
	groups, err := s.partitions(ctx, "outbound_bodies", "outbox_attempts")
	if err != nil {
		return OutboundDeleted{}, classify(ctx, op, err)
	}
	var d OutboundDeleted
	if groups == nil {
		n, err := s.execCount(ctx, deleteExpiredAttemptsSQL, now, batch)
		if err != nil {
			return OutboundDeleted{}, classify(ctx, op, err)
		}
		if d.Attempts = n; n > 0 {
			return d, nil
		}
		if d.Bodies, err = s.execCount(ctx, deleteExpiredBodiesSQL, now, batch); err != nil {
			return OutboundDeleted{}, classify(ctx, op, err)
		}
		return d, nil
	}
	// As DeleteExpiredPayloads: one partition per statement until the batch
	// is full, attempt rows of every partition before any body.
	order := s.sweepOrder(groups)
	for _, g := range order {
		n, err := s.execCount(ctx, deleteExpiredAttemptsFrom(g["outbound_bodies"], g["outbox_attempts"]), now, batch-d.Attempts)
		if err != nil {
			return d, classify(ctx, op, err)
		}
		if d.Attempts += n; d.Attempts == batch {
			return d, nil
		}
	}
	if d.Attempts > 0 {
		return d, nil
	}
	for _, g := range order {
		n, err := s.execCount(ctx, deleteExpiredBodiesFrom(g["outbound_bodies"]), now, batch-d.Bodies)
		if err != nil {
			return d, classify(ctx, op, err)
		}
		if d.Bodies += n; d.Bodies == batch {
			break
		}
	}
	return d, nil
}

func (s *Retention) execCount(ctx context.Context, query string, args ...any) (int, error) {
	res, err := s.sqlDB().ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// backfillBodiesSQL moves the bodies of up to $3 envelopes after the key
// ($1, $2), in key order, from the old column to outbound_bodies and clears
// the column, in one transaction. Only envelopes whose messages are all
// settled move, with the expiry their last settle would have set: a message
// settling while its body moved could not see the new row (its statement's
// snapshot is older) and would leave no expiry. The rest stay where every
// reader still finds them (new-then-old) and move on a later run. A replay
// racing the move is safe: the janitor never deletes a body with a message
// in flight.
//
// It returns the rows moved, the bodies left in the old column in this key
// range, and the last key examined (NULL when the range was empty: done).
//
//	$1 tenant  $2 event identity (exclusive start)  $3 batch  $4 retention in microseconds
const backfillBodiesSQL = `
WITH batch AS (
    SELECT o.tenant_id, o.event_identity, o.envelope FROM outbound_envelopes o
    WHERE (o.tenant_id, o.event_identity) > ($1::text, $2::bytea)
    ORDER BY o.tenant_id, o.event_identity
    LIMIT $3
), movable AS (
    SELECT b.tenant_id, b.event_identity, b.envelope,
           (SELECT max(coalesce(m.delivered_at, m.dead_at)) FROM outbox_messages m
            WHERE m.tenant_id = b.tenant_id AND m.event_identity = b.event_identity)
           + $4::bigint * interval '1 microsecond' AS expires_at
    FROM batch b
    WHERE b.envelope IS NOT NULL AND ` + noneInFlight + `
), moved AS (
    INSERT INTO outbound_bodies (tenant_id, event_identity, envelope, expires_at)
    SELECT tenant_id, event_identity, envelope, expires_at FROM movable
    ON CONFLICT (tenant_id, event_identity) DO NOTHING
), cleared AS (
    UPDATE outbound_envelopes o SET envelope = NULL
    FROM movable v
    WHERE o.tenant_id = v.tenant_id AND o.event_identity = v.event_identity
    RETURNING 1
), last AS (
    SELECT tenant_id, event_identity FROM batch ORDER BY tenant_id DESC, event_identity DESC LIMIT 1
)
SELECT (SELECT count(*) FROM cleared),
       (SELECT count(*) FROM batch WHERE envelope IS NOT NULL) - (SELECT count(*) FROM cleared),
       (SELECT tenant_id FROM last), (SELECT event_identity FROM last)`

// BackfillCursor is where a BackfillBodies run continues; the zero value
// starts at the beginning.
type BackfillCursor struct {
	TenantID      string
	EventIdentity []byte
}

// BackfillStep is one BackfillBodies transaction.
type BackfillStep struct {
	Moved int // bodies moved to outbound_bodies
	Left  int // bodies left in the old column: a message still in flight
	Next  BackfillCursor
	Done  bool // the key range is exhausted
}

// BackfillBodies moves the bodies older releases stored in
// outbound_envelopes.envelope to outbound_bodies, up to batch
// (1..MaxBackfillBatch) envelopes after cursor per transaction (migration
// 0008's expand step; docs/operations.md). retention is the delivery
// workers' OUTBOX_PAYLOAD_RETENTION. It is idempotent and resumable: a moved
// body is not moved again, and a run restarted from the zero cursor only
// re-reads keys. It needs the schema owner's rights (the body column is out
// of every service role's reach but ingest's).
func (s *Retention) BackfillBodies(ctx context.Context, cursor BackfillCursor, batch int, retention time.Duration) (BackfillStep, error) {
	const op = "backfill outbound bodies"
	if batch < 1 || batch > MaxBackfillBatch || retention <= 0 {
		return BackfillStep{}, newErr(op, ErrInvalid)
	}
	var st BackfillStep
	var tenant *string
	var ident []byte
	ev := cursor.EventIdentity
	if ev == nil {
		ev = []byte{}
	}
	if err := s.sqlDB().QueryRowContext(ctx, backfillBodiesSQL, cursor.TenantID, ev, batch,
		retention.Microseconds()).Scan(&st.Moved, &st.Left, &tenant, &ident); err != nil {
		return BackfillStep{}, classify(ctx, op, err)
	}
	if tenant == nil {
		return BackfillStep{Done: true, Next: cursor}, nil
	}
	st.Next = BackfillCursor{TenantID: *tenant, EventIdentity: bytes.Clone(ident)}
	return st, nil
}
