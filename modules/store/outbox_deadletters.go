package store

import (
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/uptrace/bun"
)

// DeadLetter is one entry of GET /v1/dead-letters. ErrorCode is the stable
// code of the last attempt.
type DeadLetter struct {
	MessageID, EndpointID, Topic, ErrorCode string
	Attempts                                int
	CreatedAt, DeadAt                       time.Time
}

// outboxMessageModel is an outbox message as the dead-letter listing reads
// it. Messages are written and moved only by the hand-written enqueue,
// claim, settle and replay statements.
type outboxMessageModel struct {
	bun.BaseModel `bun:"table:outbox_messages"`

	TenantID      string    `bun:"tenant_id"`
	MessageID     string    `bun:"message_id"`
	ProjectID     string    `bun:"project_id"`
	EndpointID    string    `bun:"endpoint_id"`
	Topic         string    `bun:"topic"`
	Status        string    `bun:"status"`
	LastErrorCode string    `bun:"last_error_code"`
	Attempts      int       `bun:"attempts"`
	CreatedAt     time.Time `bun:"created_at"`
	DeadAt        time.Time `bun:"dead_at,nullzero"`
}

// listDeadQuery selects one page of dead letters into model, by (dead_at,
// message_id), the order of the partial index; after the position (afterAt,
// afterID) when paged. dead_at IS NOT NULL (the same rows as status =
// 'dead', by a CHECK) is the index's predicate, which a replay's status =
// 'dead' does not imply: on a never-analyzed table a partial index looks
// empty, and a replay took it over the primary key (migration 0009). The
// arguments are any so that the plan tests can render it with parameters.
func listDeadQuery(db *bun.DB, model any, tenant, project any, paged bool, afterAt, afterID any, limit int) *bun.SelectQuery {
	q := db.NewSelect().Model(model).
		Column("message_id", "endpoint_id", "topic", "last_error_code", "attempts", "created_at", "dead_at").
		Where("tenant_id = ?", tenant).Where("project_id = ?", project).
		Where("status = ?", StatusDead).Where("dead_at IS NOT NULL")
	if paged {
		q = q.Where("(dead_at, message_id) > (?, ?)", afterAt, afterID)
	}
	return q.Order("dead_at", "message_id").Limit(limit)
}

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
func (s *Outbox) ListDeadLetters(ctx context.Context, tenant, project string, limit int, after string) ([]DeadLetter, *string, error) {
	const op = "list dead letters"
	if !validIdentity(tenant, project) || limit < 1 || limit > MaxDeadLetterPage {
		return nil, nil, newErr(op, ErrInvalid)
	}
	var afterAt time.Time
	var afterID string
	if after != "" {
		t, id, ok := parseDeadCursor(after)
		if !ok {
			return nil, nil, newErr(op, ErrInvalid)
		}
		afterAt, afterID = t, id
	}
	var rows []outboxMessageModel
	if err := listDeadQuery(s.db, &rows, tenant, project, after != "", afterAt, afterID, limit+1).Scan(ctx); err != nil {
		return nil, nil, classify(ctx, op, err)
	}
	out := make([]DeadLetter, len(rows))
	for i, r := range rows {
		out[i] = DeadLetter{MessageID: r.MessageID, EndpointID: r.EndpointID, Topic: r.Topic,
			ErrorCode: r.LastErrorCode, Attempts: r.Attempts, CreatedAt: r.CreatedAt, DeadAt: r.DeadAt}
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
func (s *Outbox) ReplayDeadLetter(ctx context.Context, a Actor, id string) (MessageStatus, error) {
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
