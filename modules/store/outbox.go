package store

// Outbox (contract §4). This file, outbox_claim.go, outbox_settle.go and
// outbox_deadletters.go own the outbound side: the outbound streams (their own sequences, never visible in the
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
	"context"
	"database/sql"
	"errors"
	"regexp"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
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
	// past them (topicEndpointsSQL).
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

// Enqueue runs POST /v1/outbox alone: EnqueueBatch of one item (see
// outbox_batch.go), which takes the outbound stream lock and the next
// sequence; answers a repeat of the idempotency key with the stored envelope
// and ids (same RequestDigest) or ErrIdempotencyConflict; finds the topic's
// active endpoints (none: ErrNoEndpoint); Builds the signed envelope; and
// stores it once with one pending message per endpoint. Only a new enqueue
// takes a sequence.
//
// The stream lock orders enqueues of one producer, so the repeat check sees
// every earlier commit. The same key from another producer of the project is
// a race the lock does not cover: the unique index refuses the second, and
// the rerun transaction answers it as a repeat or conflict.
func (s *Outbox) Enqueue(ctx context.Context, a Actor, r EnqueueRequest) (EnqueueResult, error) {
	const op = "enqueue"
	answers, err := s.EnqueueBatch(ctx, []EnqueueItem{{Actor: a, Request: r}})
	if err != nil {
		return EnqueueResult{}, err
	}
	if len(answers) != 1 {
		return EnqueueResult{}, newErr(op, ErrInternal)
	}
	if answers[0].Err != nil {
		return EnqueueResult{}, answers[0].Err
	}
	return answers[0].Result, nil
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
FROM outbox_messages m WHERE m.tenant_id = @tenant AND m.message_id = @message_id`

// OutboxMessage returns one message of tenant. Unknown ids, malformed ids and
// other tenants' ids are all ErrNotFound.
func (s *Outbox) OutboxMessage(ctx context.Context, tenant, id string) (MessageStatus, error) {
	const op = "outbox message"
	if !validIdentity(tenant) {
		return MessageStatus{}, newErr(op, ErrInvalid)
	}
	if !messageIDRE.MatchString(id) {
		return MessageStatus{}, newErr(op, ErrNotFound)
	}
	var expired bool
	m, err := scanStatus(s.sqlDB().QueryRowContext(ctx, outboxMessageStmt.text,
		outboxMessageStmt.bind(pgx.StrictNamedArgs{"tenant": tenant, "message_id": id})), &expired)
	m.PayloadExpired = expired
	if errors.Is(err, sql.ErrNoRows) {
		return MessageStatus{}, newErr(op, ErrNotFound)
	}
	if err != nil {
		return MessageStatus{}, classify(ctx, op, err)
	}
	return m, nil
}
