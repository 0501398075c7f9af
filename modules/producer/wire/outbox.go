package wire

import (
	"encoding/json"
	"net/url"
	"time"
)

// Routes of the service side: stream reads (contract §2), the outbox and
// dead letters (§4, §8.5, §8.8).
const (
	RouteOutbox      = "/v1/outbox"
	RouteOutboxBatch = "/v1/outbox/batch"
	RouteDeadLetters = "/v1/dead-letters"
)

// StreamEnvelopesPath is GET /v1/streams/{project_id}/{producer_id}/envelopes
// (without its query).
func StreamEnvelopesPath(project, producer string) string {
	return StreamPath(project, producer) + "/envelopes"
}

// OutboxMessagePath is GET /v1/outbox/{message_id}.
func OutboxMessagePath(id string) string { return RouteOutbox + "/" + url.PathEscape(id) }

// OutboxAttemptsPath is GET /v1/outbox/{message_id}/attempts.
func OutboxAttemptsPath(id string) string { return OutboxMessagePath(id) + "/attempts" }

// ReplayPath is POST /v1/dead-letters/{message_id}/replay.
func ReplayPath(id string) string { return RouteDeadLetters + "/" + url.PathEscape(id) + "/replay" }

// The refusal codes only the outbox and dead-letter routes give.
const (
	ReasonNoSigningKey   Reason = "no_signing_key"
	ReasonNoEndpoint     Reason = "no_endpoint"
	ReasonNotDead        Reason = "not_dead"
	ReasonPayloadExpired Reason = "payload_expired" // a replay whose body expired (§8.9)
)

// StreamEnvelope is one entry of a stream page: Envelope is the stored
// canonical envelope as signed, null once its payload expired.
type StreamEnvelope struct {
	Sequence       int64           `json:"sequence"`
	EventIdentity  string          `json:"event_identity"`
	Envelope       json.RawMessage `json:"envelope"`
	PayloadExpired bool            `json:"payload_expired"`
}

// StreamPage is the answer of GET …/envelopes: a reader continues with
// after = the last sequence it got until that equals Cursor (§8.2).
type StreamPage struct {
	Envelopes []StreamEnvelope `json:"envelopes"`
	Cursor    int64            `json:"cursor"`
}

// EnqueueRequest is the body of POST /v1/outbox and one item of a batch.
// MaxAttempts 0 leaves it out (the service's default, 12).
type EnqueueRequest struct {
	ProjectID      string          `json:"project_id"`
	Topic          string          `json:"topic"`
	IdempotencyKey string          `json:"idempotency_key"`
	Kind           string          `json:"kind"`
	Payload        json.RawMessage `json:"payload"`
	MaxAttempts    int             `json:"max_attempts,omitempty"`
}

// EnqueueBatchRequest is the body of POST /v1/outbox/batch (1–100).
type EnqueueBatchRequest struct {
	Messages []EnqueueRequest `json:"messages"`
}

// Enqueued is the 201 (new) or 200 (repeated) answer of POST /v1/outbox.
// After the body expired a repeat has Envelope null and PayloadExpired.
type Enqueued struct {
	Envelope       json.RawMessage `json:"envelope"`
	PayloadExpired bool            `json:"payload_expired,omitempty"`
	MessageIDs     []string        `json:"message_ids"`
}

// EnqueueResult is one item of the batch answer as a client reads it:
// Enqueued, or a refusal (Answer's members), plus the status POST /v1/outbox would
// have given it.
type EnqueueResult struct {
	Enqueued
	Outcome       Outcome `json:"outcome,omitempty"`
	Reason        Reason  `json:"reason,omitempty"`
	CorrelationID string  `json:"correlation_id,omitempty"`
	Detail        string  `json:"detail,omitempty"`
	Status        int     `json:"status"`
}

// EnqueueBatchAnswer is the 200 answer of POST /v1/outbox/batch.
type EnqueueBatchAnswer struct {
	Results []EnqueueResult `json:"results"`
}

// MessageState is an outbox message's status.
type MessageState string

const (
	StatePending    MessageState = "pending"
	StateDelivering MessageState = "delivering"
	StateDelivered  MessageState = "delivered"
	StateDead       MessageState = "dead"
)

// MessageStatus is the answer of GET /v1/outbox/{id} and of a replay;
// null for what is unset. Times are FormatTime's.
type MessageStatus struct {
	MessageID     string       `json:"message_id"`
	EndpointID    string       `json:"endpoint_id"`
	Topic         string       `json:"topic"`
	Status        MessageState `json:"status"`
	Attempts      int          `json:"attempts"`
	LastErrorCode *string      `json:"last_error_code"`
	NextAttemptAt *string      `json:"next_attempt_at"`
	DeliveredAt   *string      `json:"delivered_at"`
	// Only once the envelope's body expired (§8.9).
	PayloadExpired bool `json:"payload_expired,omitempty"`
}

// AttemptResult is what one attempt left its message in.
type AttemptResult string

const (
	AttemptDelivered    AttemptResult = "delivered"
	AttemptRetry        AttemptResult = "retry"
	AttemptDead         AttemptResult = "dead"
	AttemptLeaseExpired AttemptResult = "lease_expired"
)

// Attempt is one entry of GET /v1/outbox/{id}/attempts (§8.8); HTTPStatus
// is null when there was no answer.
type Attempt struct {
	Attempt    int           `json:"attempt"`
	StartedAt  string        `json:"started_at"`
	DurationMS int64         `json:"duration_ms"`
	HTTPStatus *int          `json:"http_status"`
	ErrorCode  *string       `json:"error_code"`
	Result     AttemptResult `json:"result"`
}

// Attempts is the answer of GET /v1/outbox/{id}/attempts, oldest first.
type Attempts struct {
	Attempts []Attempt `json:"attempts"`
}

// DeadLetter is one entry of GET /v1/dead-letters.
type DeadLetter struct {
	MessageID  string `json:"message_id"`
	EndpointID string `json:"endpoint_id"`
	Topic      string `json:"topic"`
	Attempts   int    `json:"attempts"`
	ErrorCode  string `json:"error_code"`
	CreatedAt  string `json:"created_at"`
	DeadAt     string `json:"dead_at"`
}

// DeadLetterPage is the answer of GET /v1/dead-letters; NextAfter is null
// on the last page.
type DeadLetterPage struct {
	DeadLetters []DeadLetter `json:"dead_letters"`
	NextAfter   *string      `json:"next_after"`
}

// FormatTime is how every time of these answers is written: RFC 3339 in
// UTC with as many fractional digits as it has.
func FormatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
