package store

// Delivery attempt history (contract §8.8). The rows are written by the
// statements that end an attempt: a settle (settleSQL, in
// outbox_settle.go) or the claim that finds the attempt's lease expired
// (claimSQL). Nothing else writes them; the retention janitor deletes them
// with the outbound body (§8.9). They hold only what explains a failure: no
// body, header, secret or payload can reach them, since the code is one of
// the fixed Code* strings and the status a number. started_at is the
// worker's clock for a settled attempt (just before its request) and the
// database's for an expired lease (the claim that leased it).

import (
	"cmp"
	"context"
	"database/sql"
	"slices"
	"time"
)

// AttemptResult is what an attempt left the message in. A settle records
// the status it set (settleSQL), so delivered and dead are those
// statuses by definition.
type AttemptResult string

const (
	AttemptDelivered AttemptResult = StatusDelivered
	AttemptRetry     AttemptResult = "retry" // pending again
	AttemptDead      AttemptResult = StatusDead
	// AttemptLeaseExpired: the worker holding the attempt did not settle it
	// before its lease ran out (it died, hung, or lost the database); what
	// the receiver saw is unknown. The next claim records it.
	AttemptLeaseExpired AttemptResult = "lease_expired"
)

// MaxAttemptHistory is how many of a message's attempts OutboxAttempts
// returns: the latest ones.
const MaxAttemptHistory = 100

// Attempt is one entry of GET /v1/outbox/{id}/attempts.
type Attempt struct {
	Attempt    int
	StartedAt  time.Time
	Duration   time.Duration // whole milliseconds
	HTTPStatus int           // 0: no answer
	ErrorCode  string        // "": none
	Result     AttemptResult
}

// outboxAttemptsSQL reads the message (so an unknown id is told from one
// never attempted) and its latest attempts, newest first, in one statement:
// both by primary key, the history backwards from its end. A message
// without attempts is one row of NULLs.
//
//	$1 tenant  $2 message  $3 limit
const outboxAttemptsSQL = `
SELECT a.attempt, a.started_at, a.duration_ms, a.http_status, a.error_code, a.result
FROM outbox_messages m
LEFT JOIN LATERAL (
    SELECT a.attempt, a.started_at, a.duration_ms, a.http_status, a.error_code, a.result
    FROM outbox_attempts a
    WHERE a.tenant_id = $1 AND a.message_id = $2
    ORDER BY a.attempt DESC
    LIMIT $3
) a ON true
WHERE m.tenant_id = $1 AND m.message_id = $2`

// OutboxAttempts returns the latest MaxAttemptHistory recorded attempts of
// one message of tenant, oldest first (empty, not nil, when none is).
// Unknown ids, malformed ids and other tenants' ids are all ErrNotFound, as
// in OutboxMessage.
func (s *Outbox) OutboxAttempts(ctx context.Context, tenant, id string) ([]Attempt, error) {
	const op = "outbox attempts"
	if !validIdentity(tenant) {
		return nil, newErr(op, ErrInvalid)
	}
	if !messageIDRE.MatchString(id) {
		return nil, newErr(op, ErrNotFound)
	}
	rows, err := s.sqlDB().QueryContext(ctx, outboxAttemptsSQL, tenant, id, MaxAttemptHistory)
	if err != nil {
		return nil, classify(ctx, op, err)
	}
	defer rows.Close()
	found := false
	out := []Attempt{}
	for rows.Next() {
		found = true
		var (
			n       sql.NullInt64
			started sql.NullTime
			ms      sql.NullInt64
			status  sql.NullInt64
			code    sql.NullString
			result  sql.NullString
		)
		if err := rows.Scan(&n, &started, &ms, &status, &code, &result); err != nil {
			return nil, classify(ctx, op, err)
		}
		if !n.Valid {
			continue // the message, never attempted
		}
		out = append(out, Attempt{
			Attempt: int(n.Int64), StartedAt: started.Time, Duration: time.Duration(ms.Int64) * time.Millisecond,
			HTTPStatus: int(status.Int64), ErrorCode: code.String, Result: AttemptResult(result.String),
		})
	}
	if err := rows.Err(); err != nil {
		return nil, classify(ctx, op, err)
	}
	if !found {
		return nil, newErr(op, ErrNotFound)
	}
	// Read newest first so the LIMIT keeps the latest; answered oldest first.
	slices.SortFunc(out, func(a, b Attempt) int { return cmp.Compare(a.Attempt, b.Attempt) })
	return out, nil
}
