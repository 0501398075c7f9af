package store

// Outbox (contract §4). This file and outbox_delivery.go own the outbound
// side: the outbound streams (their own sequences, never visible in the
// inbound read API), the signed envelope of each enqueue stored once as the
// exact bytes every attempt sends, and one leased message per active
// endpoint of the topic (endpoints.go). Signing keys and webhook secrets
// never reach the database: Build signs in the service, and SecretRef names
// secrets the worker resolves.
//
// Leases follow River's shape: Claim locks due rows with FOR UPDATE SKIP
// LOCKED and leases them in the same statement, so no transaction or
// connection is held while HTTP is in flight; the attempt counter is the
// fencing token of every later settle (ErrFenced when it moved on).
//
// Choices where the contract is silent:
//   - Idempotency is scoped to (tenant, project, key), whichever service
//     device sends it. The repeat check runs before the endpoint check, so a
//     repeat answers with the original even after its endpoints were disabled.
//   - Ids are "ep_" and "msg_" plus 24 lowercase hex; an enqueue's message
//     ids are ordered by endpoint id. Malformed ids read as ErrNotFound
//     (Get*, OutboxMessage, ReplayDeadLetter) and are ErrInvalid in settles.
//   - Topics follow the identity rule with up to 128 characters
//     (ValidTopic); secret refs may also hold ':' and '/' (ValidSecretRef).
//   - While a message is delivering, next_attempt_at reads as its lease
//     expiry: the earliest another attempt can start.
//   - MarkDelivered clears last_error_code; a replay keeps it (it is still the
//     last attempt's error) and lets attempts keep counting.
//   - A replayed message of a disabled endpoint waits, like any other of its
//     messages, until the endpoint is enabled.
//   - Dead letters are listed oldest death first; next_after is base64url of
//     "<dead_at µs>.<message id>", opaque to clients, and only positions the
//     scan inside the caller's own tenant and project.
//   - Settles record only the fixed Code* strings (ValidErrorCode).

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"time"
)

// Outbox answers the caller acts on (errors.Is). Like ErrConflict they are
// answers, not failures.
var (
	// ErrIdempotencyConflict: the idempotency key was used with other
	// request content (HTTP 422 idempotency_conflict).
	ErrIdempotencyConflict = errors.New("store: idempotency conflict")
	// ErrNoEndpoint: no active endpoint subscribes to the topic (HTTP 422
	// no_endpoint). Nothing was stored and no sequence was taken.
	ErrNoEndpoint = errors.New("store: no active endpoint")
	// ErrNotDead: a replay of a message that is not dead (HTTP 409 not_dead).
	ErrNotDead = errors.New("store: message is not dead")
	// ErrFenced: a settle for an attempt that no longer owns the message
	// (its lease expired and it was claimed again, or it was settled already).
	// The row is unchanged; the worker drops its result.
	ErrFenced = errors.New("store: attempt fenced")
	// ErrPayloadExpired: a replay of a dead letter whose envelope body the
	// retention-janitor deleted (HTTP 409 payload_expired, §8.9). Nothing
	// was changed.
	ErrPayloadExpired = errors.New("store: payload expired")
)

// Outbox bounds.
const (
	MinMaxAttempts     = 1
	MaxMaxAttempts     = 50
	DefaultMaxAttempts = 12
	MaxClaim           = 100       // messages per Claim
	MaxLease           = time.Hour // longest lease a Claim may take
	MaxDeadLetterPage  = 100
	MaxDueTenants      = 1000

	// MaxTopicEndpoints bounds the active endpoints of one (tenant, project,
	// topic), and so the messages one enqueue writes (contract §8.12).
	// AddEndpoint and SetEndpointState enforce it; Enqueue holds to it even
	// past them (activeEndpointsSQL).
	MaxTopicEndpoints = 64
)

// Message statuses.
const (
	StatusPending    = "pending"
	StatusDelivering = "delivering"
	StatusDelivered  = "delivered"
	StatusDead       = "dead"
)

// Delivery error codes: the only values a settle may record. They are fixed
// strings so nothing from a response (body, header, token) or payload can
// reach a dead letter.
const (
	CodeHTTP4xx         = "http_4xx"
	CodeHTTP410         = "http_410"
	CodeHTTP5xx         = "http_5xx"
	CodeHTTP429         = "http_429"
	CodeTimeout         = "timeout"
	CodeConnectFailed   = "connect_failed"
	CodeRedirectRefused = "redirect_refused"
	CodeBlockedAddress  = "blocked_address"
	CodeTLSFailed       = "tls_failed"
	CodeNoSecret        = "no_secret"
	// CodeSecretRefForeign: the endpoint names a secret ref its tenant does
	// not own; the worker refuses to sign with it (dead at once, never sent).
	CodeSecretRefForeign = "secret_ref_foreign"
	// CodePayloadExpired: the claimed message's envelope body is gone
	// (§8.9); the worker does not send an empty body (dead at once).
	CodePayloadExpired = "payload_expired"
)

var errorCodes = map[string]bool{
	CodeHTTP4xx: true, CodeHTTP410: true, CodeHTTP5xx: true, CodeHTTP429: true,
	CodeTimeout: true, CodeConnectFailed: true, CodeRedirectRefused: true, CodeBlockedAddress: true,
	CodeTLSFailed: true, CodeNoSecret: true, CodeSecretRefForeign: true, CodePayloadExpired: true,
}

// ValidErrorCode reports whether code is one of the Code* constants.
func ValidErrorCode(code string) bool { return errorCodes[code] }

// ErrorCodes returns every Code* constant, sorted.
func ErrorCodes() []string {
	out := make([]string, 0, len(errorCodes))
	for c := range errorCodes {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

var messageIDRE = regexp.MustCompile(`^msg_[0-9a-f]{24}$`)

// EnqueueRequest is one POST /v1/outbox after the service checked it. The
// tenant is the actor's. Build makes and signs the envelope for the sequence
// the store allocated; it runs inside the transaction (keep it to signing)
// and may run again if the transaction is retried after a race.
type EnqueueRequest struct {
	ProjectID, ProducerID, Topic     string
	IdempotencyDigest, RequestDigest [32]byte // RequestDigest = sha256(JCS(request body))
	MaxAttempts                      int
	Build                            func(sequence int64) (canonical []byte, eventIdentity string, err error)
}

// EnqueueResult is the stored envelope (byte-identical on a repeat) and its
// message ids, ordered by endpoint id. Created is false for a repeat.
// PayloadExpired: a repeat whose envelope body expired (§8.9); Envelope is
// nil then.
type EnqueueResult struct {
	Envelope       []byte
	MessageIDs     []string
	Created        bool
	PayloadExpired bool
}

// allocateSequenceSQL takes the outbound stream lock and the next sequence
// in one statement; the lock holds until the transaction ends, and a
// rollback (refusal, repeat, failure) gives the sequence back.
const allocateSequenceSQL = `
INSERT INTO outbound_streams (tenant_id, project_id, producer_id, last_sequence) VALUES ($1, $2, $3, 1)
ON CONFLICT (tenant_id, project_id, producer_id)
DO UPDATE SET last_sequence = outbound_streams.last_sequence + 1, updated_at = now()
RETURNING last_sequence`

// findOutboundByKeySQL reads the body new-then-old (migration 0008); NULL
// when the retention-janitor deleted it.
const findOutboundByKeySQL = `
SELECT o.event_identity, o.request_digest,
       coalesce((SELECT b.envelope FROM outbound_bodies b
                 WHERE b.tenant_id = o.tenant_id AND b.event_identity = o.event_identity), o.envelope)
FROM outbound_envelopes o
WHERE o.tenant_id = $1 AND o.project_id = $2 AND o.idempotency_digest = $3`

const messageIDsSQL = `
SELECT message_id FROM outbox_messages
WHERE tenant_id = $1 AND event_identity = $2
ORDER BY endpoint_id, message_id`

// activeEndpointsSQL is the fan-out: at most $4 (MaxTopicEndpoints) active
// endpoints, the first by id. The endpoint guard keeps a topic within the
// bound, so the LIMIT cuts only rows written past it (by hand, a restore, a
// concurrent add by an envctl older than the guard); then the enqueue still
// writes at most the bound, and the endpoints past the first by id get
// nothing, which envctl verify reports (topic_over_endpoint_limit). Refusing
// the enqueue instead would stop the whole topic over one surplus row.
const activeEndpointsSQL = `
SELECT endpoint_id FROM endpoints
WHERE tenant_id = $1 AND project_id = $2 AND topic = $3 AND state = 'active'
ORDER BY endpoint_id
LIMIT $4`

// The body goes to outbound_bodies only (migration 0008); the identity row
// keeps none.
const insertOutboundSQL = `
WITH env AS (
    INSERT INTO outbound_envelopes (tenant_id, event_identity, project_id, producer_id, sequence, topic,
                                    idempotency_digest, request_digest)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
    RETURNING tenant_id, event_identity
), body AS (
    INSERT INTO outbound_bodies (tenant_id, event_identity, envelope)
    SELECT tenant_id, event_identity, $9 FROM env
)
INSERT INTO outbox_messages (tenant_id, message_id, project_id, topic, endpoint_id, event_identity,
                             max_attempts, budget, next_attempt_at)
SELECT env.tenant_id, m.id, $3, $6, m.endpoint, env.event_identity, $10, $10, now()
FROM env, unnest($11::text[], $12::text[]) AS m(id, endpoint)`

// Enqueue runs POST /v1/outbox in one transaction: take the outbound stream
// lock and the next sequence; answer a repeat of the idempotency key with the
// stored envelope and ids (same RequestDigest) or ErrIdempotencyConflict;
// find the topic's active endpoints (none: ErrNoEndpoint); Build the signed
// envelope; store it once and one pending message per endpoint. Every answer
// but a new enqueue rolls back, so it takes no sequence.
//
// The stream lock orders enqueues of one producer, so the repeat check sees
// every earlier commit. The same key from another producer of the project is
// a race the lock does not cover: the unique index refuses the second, and
// the rerun transaction answers it as a repeat or conflict.
func (s *Store) Enqueue(ctx context.Context, a Actor, r EnqueueRequest) (EnqueueResult, error) {
	const op = "enqueue"
	if !validActor(a) || !validIdentity(r.ProjectID, r.ProducerID) || !ValidTopic(r.Topic) ||
		r.MaxAttempts < MinMaxAttempts || r.MaxAttempts > MaxMaxAttempts || r.Build == nil {
		return EnqueueResult{}, newErr(op, ErrInvalid)
	}
	var res EnqueueResult
	var err error
	for attempt := 0; ; attempt++ {
		err = s.inTx(ctx, func(tx *sql.Tx) error {
			var txErr error
			res, txErr = enqueueTx(ctx, tx, a.TenantID, r)
			return txErr
		})
		if err == nil || !retryable(err) || attempt >= s.opts.MaxRetries || ctx.Err() != nil {
			break
		}
	}
	if errors.Is(err, errRepeat) {
		return res, nil
	}
	if err != nil {
		return EnqueueResult{}, classify(ctx, op, err)
	}
	return res, nil
}

// errRepeat ends the transaction of a repeated request with a rollback; the
// answer is already in the result.
var errRepeat = errors.New("store: repeated enqueue")

func enqueueTx(ctx context.Context, tx *sql.Tx, tenant string, r EnqueueRequest) (EnqueueResult, error) {
	const op = "enqueue"
	var seq int64
	if err := tx.QueryRowContext(ctx, allocateSequenceSQL, tenant, r.ProjectID, r.ProducerID).Scan(&seq); err != nil {
		return EnqueueResult{}, err
	}

	var ident, reqDigest, envelope []byte
	err := tx.QueryRowContext(ctx, findOutboundByKeySQL, tenant, r.ProjectID, r.IdempotencyDigest[:]).
		Scan(&ident, &reqDigest, &envelope)
	switch {
	case err == nil:
		if !bytes.Equal(reqDigest, r.RequestDigest[:]) {
			return EnqueueResult{}, newErr(op, ErrIdempotencyConflict)
		}
		ids, err := queryStrings(ctx, tx, messageIDsSQL, tenant, ident)
		if err != nil {
			return EnqueueResult{}, err
		}
		// The caller sees Created=false; returning an error rolls the
		// sequence back.
		return EnqueueResult{Envelope: envelope, MessageIDs: ids, PayloadExpired: envelope == nil}, errRepeat
	case !errors.Is(err, sql.ErrNoRows):
		return EnqueueResult{}, err
	}

	endpoints, err := queryStrings(ctx, tx, activeEndpointsSQL, tenant, r.ProjectID, r.Topic, MaxTopicEndpoints)
	if err != nil {
		return EnqueueResult{}, err
	}
	if len(endpoints) == 0 {
		return EnqueueResult{}, newErr(op, ErrNoEndpoint)
	}

	canonical, eventIdentity, err := r.Build(seq)
	if err != nil {
		return EnqueueResult{}, fmt.Errorf("store: enqueue: build envelope: %w", err)
	}
	ev, ok := decodeEventIdentity(eventIdentity)
	if !ok || len(canonical) == 0 {
		return EnqueueResult{}, newErr(op+": build returned no envelope or a bad identity", ErrInvalid)
	}
	ids := make([]string, len(endpoints))
	for i := range ids {
		if ids[i], err = newID("msg_"); err != nil {
			return EnqueueResult{}, err
		}
	}
	if _, err := tx.ExecContext(ctx, insertOutboundSQL, tenant, ev, r.ProjectID, r.ProducerID, seq, r.Topic,
		r.IdempotencyDigest[:], r.RequestDigest[:], canonical, r.MaxAttempts, ids, endpoints); err != nil {
		return EnqueueResult{}, err
	}
	return EnqueueResult{Envelope: canonical, MessageIDs: ids, Created: true}, nil
}

func queryStrings(ctx context.Context, tx *sql.Tx, query string, args ...any) ([]string, error) {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// MessageStatus is GET /v1/outbox/{id}. NextAttemptAt is when the message is
// next due: the retry time while pending, the lease expiry while delivering
// (the earliest another attempt can start), nil once delivered or dead.
//
// PayloadExpired: the retention-janitor deleted the envelope's body (§8.9).
type MessageStatus struct {
	MessageID, EndpointID, Topic, Status, LastErrorCode string
	Attempts                                            int
	NextAttemptAt, DeliveredAt                          *time.Time
	PayloadExpired                                      bool
}

const messageStatusColumns = `message_id, endpoint_id, topic, status, last_error_code, attempts,
    next_attempt_at, delivered_at`

// scanStatus reads messageStatusColumns, then the extra destinations.
func scanStatus(sc interface{ Scan(...any) error }, extra ...any) (MessageStatus, error) {
	var m MessageStatus
	var next, delivered sql.NullTime
	if err := sc.Scan(append([]any{&m.MessageID, &m.EndpointID, &m.Topic, &m.Status, &m.LastErrorCode, &m.Attempts,
		&next, &delivered}, extra...)...); err != nil {
		return MessageStatus{}, err
	}
	if next.Valid {
		m.NextAttemptAt = &next.Time
	}
	if delivered.Valid {
		m.DeliveredAt = &delivered.Time
	}
	return m, nil
}

// outboxMessageSQL adds whether the body is gone: in neither table
// (migration 0008 moves it from the old column to outbound_bodies).
const outboxMessageSQL = `SELECT ` + messageStatusColumns + `,
    NOT EXISTS (SELECT FROM outbound_bodies b WHERE b.tenant_id = m.tenant_id AND b.event_identity = m.event_identity)
    AND NOT EXISTS (SELECT FROM outbound_unmoved_bodies u
                    WHERE u.tenant_id = m.tenant_id AND u.event_identity = m.event_identity)
FROM outbox_messages m WHERE m.tenant_id = $1 AND m.message_id = $2`

// OutboxMessage returns one message of tenant. Unknown ids, malformed ids and
// other tenants' ids are all ErrNotFound.
func (s *Store) OutboxMessage(ctx context.Context, tenant, id string) (MessageStatus, error) {
	const op = "outbox message"
	if !validIdentity(tenant) {
		return MessageStatus{}, newErr(op, ErrInvalid)
	}
	if !messageIDRE.MatchString(id) {
		return MessageStatus{}, newErr(op, ErrNotFound)
	}
	var expired bool
	m, err := scanStatus(s.sqlDB().QueryRowContext(ctx, outboxMessageSQL, tenant, id), &expired)
	m.PayloadExpired = expired
	if errors.Is(err, sql.ErrNoRows) {
		return MessageStatus{}, newErr(op, ErrNotFound)
	}
	if err != nil {
		return MessageStatus{}, classify(ctx, op, err)
	}
	return m, nil
}
