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
	"slices"
	"time"

	"github.com/uptrace/bun"
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

// Attempt is one entry of GET /v1/outbox/{id}/attempts.
type Attempt struct {
	Attempt    int
	StartedAt  time.Time
	Duration   time.Duration // whole milliseconds
	HTTPStatus int           // 0: no answer
	ErrorCode  string        // "": none
	Result     AttemptResult
}

// attemptModel is a row of the attempt history. A column the LEFT JOIN of
// outboxAttemptsQuery leaves NULL (a message never attempted) scans as the
// zero value: attempt numbers start at 1, so Attempt 0 is "none".
type attemptModel struct {
	bun.BaseModel `bun:"table:outbox_attempts"`

	TenantID   string    `bun:"tenant_id"`
	MessageID  string    `bun:"message_id"`
	Attempt    int       `bun:"attempt"`
	StartedAt  time.Time `bun:"started_at"`
	DurationMS int64     `bun:"duration_ms"`
	HTTPStatus int       `bun:"http_status"` // NULL: no answer
	ErrorCode  string    `bun:"error_code"`  // NULL: none
	Result     string    `bun:"result"`
}

// outboxAttemptsQuery reads the message (so an unknown id is told from one
// never attempted) and its latest limit attempts, newest first, in one
// statement: both by primary key, the history backwards from its end. A
// message without attempts is one row of NULLs. The lateral join is SQL
// bun has no builder for; the arguments are any so that the plan tests can
// render it with parameters.
func outboxAttemptsQuery(db *bun.DB, tenant, id any, limit int) *bun.SelectQuery {
	latest := db.NewSelect().Model((*attemptModel)(nil)).
		Column("attempt", "started_at", "duration_ms", "http_status", "error_code", "result").
		Where("tenant_id = ?", tenant).Where("message_id = ?", id).
		OrderExpr("attempt DESC").Limit(limit)
	return db.NewSelect().Model((*outboxMessageModel)(nil)).ModelTableExpr("outbox_messages AS m").
		Join("LEFT JOIN LATERAL (?) AS a ON true", latest).ColumnExpr("a.*").
		Where("m.tenant_id = ?", tenant).Where("m.message_id = ?", id)
}

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
	var rows []attemptModel
	if err := outboxAttemptsQuery(s.db, tenant, id, MaxAttemptHistory).Scan(ctx, &rows); err != nil {
		return nil, classify(ctx, op, err)
	}
	if len(rows) == 0 {
		return nil, newErr(op, ErrNotFound)
	}
	out := []Attempt{}
	for _, r := range rows {
		if r.Attempt == 0 {
			continue // the message, never attempted
		}
		out = append(out, Attempt{Attempt: r.Attempt, StartedAt: r.StartedAt,
			Duration: time.Duration(r.DurationMS) * time.Millisecond, HTTPStatus: r.HTTPStatus,
			ErrorCode: r.ErrorCode, Result: AttemptResult(r.Result)})
	}
	// Read newest first so the LIMIT keeps the latest; answered oldest first.
	slices.SortFunc(out, func(a, b Attempt) int { return cmp.Compare(a.Attempt, b.Attempt) })
	return out, nil
}
