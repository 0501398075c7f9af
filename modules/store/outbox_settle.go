package store

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// settleSQL applies a batch of settles of @tenant in one statement, one
// array element a settle (SettleBatch). Each is fenced on its own row: it
// changes the message only while the message is delivering under the
// attempt it claimed, so after a lease expired and another worker claimed
// the message (attempts moved on) a stale worker's settle changes nothing.
// Each message is found by its key and locked (FOR NO KEY UPDATE) in pre,
// in the batch's order, which settleSet sorts by message id: a row another
// transaction changed is re-checked against the fence on its latest
// version, and two batches over the same rows lock them in the same order.
// The update then changes the row pre locked, by its ctid, joining pre's
// row for its values; correlated subqueries into pre instead scanned the
// whole batch once per message (82 us a message at 100, 130 at 1,000;
// now 71 and 33: BenchmarkSettleBatchSize, docs/benchmarks.md). A version committed while pre
// waited for its lock is not in this statement's snapshot, so its update
// does not match; settleSet sends such a settle again.
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
// dead), the code the one stored. A settle without its own timing
// (@started_at, @duration_ms NULL) records what the database knows: the
// claim's time (updated_at as claimed, from pre) and the time since. A row already there (attempts
// reset by hand) is kept: the history never stops a settle. (No conflict
// target: naming one needs SELECT on the history, which the worker does
// not have.)
//
// Every table is reached by its key whatever the statistics say
// (TestHotStatementPlansUseTheirKeys): the messages through their primary
// key in pre's LATERAL lookup and then by the ctid it found, each body by a
// LATERAL key lookup (OFFSET 0 keeps either from being flattened into a
// join the planner could turn into a scan), then joined back on the whole
// key. The statement returns the ordinality of each settle that matched.
// @retention_us is the payload retention in microseconds.
const settleSQL = `
WITH s AS (
    SELECT * FROM unnest(@message_ids::text[], @attempts::int[], @outcomes::text[], @next_attempt_at::timestamptz[],
                         @codes::text[], @disable_endpoint::boolean[], @started_at::timestamptz[],
                         @duration_ms::bigint[], @http_statuses::smallint[])
        WITH ORDINALITY AS s(message_id, attempt, outcome, next_at, code, disable, started_at, duration_ms,
                             http_status, ord)
), pre AS (
    SELECT s.*, o.ctid AS row, o.event_identity, o.updated_at AS claimed_at, o.attempts >= o.max_attempts AS last
    FROM s CROSS JOIN LATERAL (
        SELECT o.ctid, o.event_identity, o.updated_at, o.attempts, o.max_attempts FROM outbox_messages o
        WHERE o.tenant_id = @tenant AND o.message_id = s.message_id AND o.attempts = s.attempt AND o.status = 'delivering'
        OFFSET 0 FOR NO KEY UPDATE) o
), expiry AS (
    UPDATE outbound_bodies b
    SET expires_at = greatest(b.expires_at, now() + @retention_us::bigint * interval '1 microsecond')
    FROM (
        SELECT l.tenant_id, l.event_identity
        FROM (SELECT DISTINCT p.event_identity FROM pre p
              WHERE p.outcome <> '` + string(SettleRetry) + `' OR p.last) e
        CROSS JOIN LATERAL (
            SELECT l.tenant_id, l.event_identity FROM outbound_bodies l
            WHERE l.tenant_id = @tenant AND l.event_identity = e.event_identity
            OFFSET 0 FOR UPDATE SKIP LOCKED) l
    ) k
    WHERE b.tenant_id = k.tenant_id AND b.event_identity = k.event_identity
), m AS (
    UPDATE outbox_messages o SET
        status           = CASE WHEN p.outcome = '` + string(SettleDelivered) + `' THEN 'delivered'
                                WHEN p.outcome = '` + string(SettleDead) + `' OR p.last THEN 'dead' ELSE 'pending' END,
        delivered_at     = CASE WHEN p.outcome = '` + string(SettleDelivered) + `' THEN now() ELSE o.delivered_at END,
        dead_at          = CASE WHEN p.outcome = '` + string(SettleDelivered) + `' THEN o.dead_at
                                WHEN p.outcome = '` + string(SettleDead) + `' OR p.last THEN now() END,
        next_attempt_at  = CASE WHEN p.outcome = '` + string(SettleRetry) + `' AND NOT p.last THEN p.next_at END,
        last_error_code  = CASE WHEN p.outcome = '` + string(SettleDelivered) + `' THEN '' ELSE p.code END,
        lease_expires_at = NULL,
        updated_at       = now()
    FROM pre p
    WHERE o.ctid = p.row AND o.tenant_id = @tenant AND o.message_id = p.message_id
    RETURNING o.message_id, o.endpoint_id, o.attempts, o.status, o.last_error_code,
              p.disable, p.ord, p.claimed_at, p.started_at, p.duration_ms, p.http_status
), e AS (
    UPDATE endpoints SET state = 'disabled', disabled_reason = g.code, updated_at = now()
    FROM (SELECT DISTINCT ON (d.endpoint_id) d.endpoint_id, d.last_error_code AS code FROM m d
          WHERE d.disable ORDER BY d.endpoint_id, d.ord) g
    WHERE endpoints.tenant_id = @tenant AND endpoints.endpoint_id = g.endpoint_id AND endpoints.state = 'active'
), attempt AS (
    INSERT INTO outbox_attempts (tenant_id, message_id, attempt, started_at, duration_ms, http_status, error_code, result)
    SELECT @tenant, d.message_id, d.attempts, coalesce(d.started_at, d.claimed_at),
           coalesce(d.duration_ms, greatest((extract(epoch FROM now() - d.claimed_at) * 1000)::bigint, 0)),
           d.http_status, nullif(d.last_error_code, ''),
           CASE d.status WHEN 'pending' THEN '` + string(AttemptRetry) + `' ELSE d.status END
    FROM m d
    ON CONFLICT DO NOTHING
)
SELECT ord FROM m`

const messageExistsSQL = `SELECT EXISTS (SELECT FROM outbox_messages WHERE tenant_id = @tenant AND message_id = @message_id)`

func validSettle(tenant, id string, attempt int) bool {
	return validIdentity(tenant) && messageIDRE.MatchString(id) && attempt >= 1
}

// settled turns "no row matched the fence" into ErrFenced, or ErrNotFound
// when the message does not exist for tenant.
func (s *Outbox) settled(ctx context.Context, op, tenant, id string, n int64) error {
	if n > 0 {
		return nil
	}
	var exists bool
	if err := s.sqlDB().QueryRowContext(ctx, messageExistsStmt.text,
		messageExistsStmt.bind(pgx.StrictNamedArgs{"tenant": tenant, "message_id": id})).Scan(&exists); err != nil {
		return classify(ctx, op, err)
	}
	if !exists {
		return newErr(op, ErrNotFound)
	}
	return newErr(op, ErrFenced)
}

// settleOne is a single settle through settleSQL, answering as SettleBatch
// does for one settlement but under op.
func (s *Outbox) settleOne(ctx context.Context, op, tenant string, st Settlement) error {
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
func (s *Outbox) MarkDelivered(ctx context.Context, tenant, id string, attempt int) error {
	const op = "mark delivered"
	if !validSettle(tenant, id, attempt) {
		return newErr(op, ErrInvalid)
	}
	return s.settleOne(ctx, op, tenant, Settlement{MessageID: id, Attempt: attempt, Outcome: SettleDelivered})
}

// MarkRetry records a retryable failure (code: one of the Code* constants)
// and makes the message due again at next; when the claimed attempt was the
// last of its budget the message is dead instead, with the same code.
func (s *Outbox) MarkRetry(ctx context.Context, tenant, id string, attempt int, next time.Time, code string) error {
	const op = "mark retry"
	if !validSettle(tenant, id, attempt) || next.IsZero() || !ValidErrorCode(code) {
		return newErr(op, ErrInvalid)
	}
	return s.settleOne(ctx, op, tenant, Settlement{MessageID: id, Attempt: attempt, Outcome: SettleRetry, Next: next, Code: code})
}

// MarkDead makes the message dead at once with code. With disableEndpoint
// (a 410 Gone answer) its endpoint is disabled in the same transaction, with
// code as the reason: later messages wait and new enqueues skip it.
func (s *Outbox) MarkDead(ctx context.Context, tenant, id string, attempt int, code string, disableEndpoint bool) error {
	const op = "mark dead"
	if !validSettle(tenant, id, attempt) || !ValidErrorCode(code) {
		return newErr(op, ErrInvalid)
	}
	return s.settleOne(ctx, op, tenant, Settlement{MessageID: id, Attempt: attempt, Outcome: SettleDead, Code: code,
		DisableEndpoint: disableEndpoint})
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
func (s *Outbox) SettleBatch(ctx context.Context, tenant string, ss []Settlement) ([]error, error) {
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
//
// A settlement that matched nothing is sent once more, with the others that
// missed, in a statement of its own: pre locks the latest version of each
// message, and when a transaction that changed a message without touching
// its fence (a hand edit, a backfill) committed while the batch waited for
// that lock, the batch's update cannot see that version in its snapshot
// (READ COMMITTED). The second statement's snapshot holds it. One that
// misses again is fenced (or its message unknown), as SettleBatch reports;
// only a stale worker's settles pay for the second statement.
func (s *Outbox) settleSet(ctx context.Context, tenant string, ss []Settlement) ([]bool, error) {
	// Sorted by message id, the order the statement locks the messages in:
	// two batches over the same rows lock them in the same order. Stable,
	// so a repeated message is sent at its first settlement.
	order := make([]int, len(ss))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(ss[a].MessageID, ss[b].MessageID) })
	sent := make([]int, 0, len(ss)) // index in ss of each settlement sent
	seen := make(map[string]bool, len(ss))
	for _, i := range order {
		if !seen[ss[i].MessageID] {
			seen[ss[i].MessageID] = true
			sent = append(sent, i)
		}
	}
	applied := make([]bool, len(ss))
	err := s.withPgx(ctx, func(c *pgx.Conn) error {
		if err := s.runSettle(ctx, c, tenant, ss, sent, applied); err != nil {
			return err
		}
		missed := slices.DeleteFunc(slices.Clone(sent), func(i int) bool { return applied[i] })
		if len(missed) == 0 {
			return nil
		}
		return s.runSettle(ctx, c, tenant, ss, missed, applied)
	})
	if err != nil {
		return nil, err
	}
	return applied, nil
}

// runSettle sends settleSQL for ss[i] of each i in idx, in that order, and
// marks those that matched in applied.
func (s *Outbox) runSettle(ctx context.Context, c *pgx.Conn, tenant string, ss []Settlement, idx []int, applied []bool) error {
	n := len(idx)
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
	)
	for _, i := range idx {
		st := ss[i]
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
	rows, err := c.Query(ctx, settleStmt.text, settleStmt.bind(pgx.StrictNamedArgs{"tenant": tenant, "message_ids": ids,
		"attempts": attempts, "outcomes": outcomes, "next_attempt_at": nexts, "codes": codes,
		"disable_endpoint": disable, "started_at": started, "duration_ms": duration, "http_statuses": statuses,
		"retention_us": s.retentionMicros()}))
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var ord int64
		if err := rows.Scan(&ord); err != nil {
			return err
		}
		applied[idx[ord-1]] = true
	}
	return rows.Err()
}
