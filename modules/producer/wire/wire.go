// Package wire holds the request and answer types of the HTTP API of
// controlplane/v1: the inbound routes (contract §2, §7, §8.2, §8.11), stream
// reads, the outbox and dead letters (§4, §8.5, §8.8, §8.9). It is the one
// definition that ingest-api writes and producers, envctl and the tools
// read. It has no dependencies, so the service can import it without the
// producer's HTTP client.
package wire

import (
	"net/http"
	"net/url"
)

// Routes of the inbound API, relative to the service's base URL.
const (
	RouteEnvelopes = "/v1/envelopes"
	RouteBatch     = "/v1/envelopes/batch"
)

// StreamPath is the route of a producer's stream state,
// GET /v1/streams/{project_id}/{producer_id}.
func StreamPath(project, producer string) string {
	return "/v1/streams/" + url.PathEscape(project) + "/" + url.PathEscape(producer)
}

// Headers the inbound routes read or write besides Authorization.
const (
	HeaderCorrelationID  = "X-Correlation-Id"
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderRetryAfter     = "Retry-After"
)

// Outcome is an answer's outcome.
type Outcome string

const (
	OutcomeAccepted  Outcome = "accepted"
	OutcomeDuplicate Outcome = "duplicate"
	OutcomeRefused   Outcome = "refused"
	// OutcomeReplayed is the audit outcome of a dead-letter replay (§4); no
	// envelope answer carries it.
	OutcomeReplayed Outcome = "replayed"
)

// Reason is a stable refusal code. The values are part of the wire format.
type Reason string

// The refusal codes of the inbound routes, in the order of the contract's
// table. The envelope module decides the step-2 and step-4 ones too; its
// envelope.Reason values are the same strings.
const (
	ReasonInvalidEnvelope        Reason = "invalid_envelope"
	ReasonInvalidMetadata        Reason = "invalid_metadata"
	ReasonUnsupportedSchema      Reason = "unsupported_schema"
	ReasonIdempotencyKeyMismatch Reason = "idempotency_key_mismatch"
	ReasonIssuedInFuture         Reason = "issued_in_future"
	ReasonExpired                Reason = "expired"
	ReasonInvalidRequest         Reason = "invalid_request"
	ReasonInvalidPage            Reason = "invalid_page"
	ReasonUnauthenticated        Reason = "unauthenticated"
	ReasonRouteMismatch          Reason = "route_mismatch"
	ReasonUnknownKey             Reason = "unknown_key"
	ReasonKeyRetired             Reason = "key_retired"
	ReasonKeyRevoked             Reason = "key_revoked"
	ReasonBadSignature           Reason = "bad_signature"
	ReasonForbidden              Reason = "forbidden"
	ReasonEventConflict          Reason = "event_conflict"
	ReasonSequenceConflict       Reason = "sequence_conflict"
	ReasonBelowReplayFloor       Reason = "below_replay_floor"
	ReasonSequenceTooFarAhead    Reason = "sequence_too_far_ahead"
	ReasonIdempotencyConflict    Reason = "idempotency_conflict"
	ReasonBodyTooLarge           Reason = "body_too_large"
	ReasonRateLimited            Reason = "rate_limited"
	ReasonUnavailable            Reason = "unavailable"
	ReasonNotFound               Reason = "not_found"
	ReasonMethodNotAllowed       Reason = "method_not_allowed"
)

// Status is the HTTP status the contract gives reason (§2, §4, §7, §8);
// the empty reason (accepted, duplicate) is 200. An unknown reason
// is 500: a programming error must not be guessed into a refusal.
func (r Reason) Status() int {
	switch r {
	case "":
		return http.StatusOK
	case ReasonInvalidEnvelope, ReasonInvalidMetadata, ReasonUnsupportedSchema, ReasonIdempotencyKeyMismatch,
		ReasonIssuedInFuture, ReasonExpired, ReasonInvalidRequest, ReasonInvalidPage:
		return http.StatusBadRequest
	case ReasonUnauthenticated:
		return http.StatusUnauthorized
	case ReasonRouteMismatch, ReasonUnknownKey, ReasonKeyRetired, ReasonKeyRevoked, ReasonBadSignature, ReasonForbidden:
		return http.StatusForbidden
	case ReasonEventConflict, ReasonSequenceConflict, ReasonBelowReplayFloor, ReasonSequenceTooFarAhead,
		ReasonNotDead, ReasonPayloadExpired:
		return http.StatusConflict
	case ReasonIdempotencyConflict, ReasonNoSigningKey, ReasonNoEndpoint:
		return http.StatusUnprocessableEntity
	case ReasonBodyTooLarge:
		return http.StatusRequestEntityTooLarge
	case ReasonRateLimited:
		return http.StatusTooManyRequests
	case ReasonUnavailable:
		return http.StatusServiceUnavailable
	case ReasonNotFound:
		return http.StatusNotFound
	case ReasonMethodNotAllowed:
		return http.StatusMethodNotAllowed
	default:
		return http.StatusInternalServerError
	}
}

// Answer is the body of every envelope answer and every refusal; field
// order is the contract's. Cursor is a pointer because 0 is a real cursor
// on accepted and duplicate answers and must be absent on refusals.
type Answer struct {
	Outcome       Outcome `json:"outcome"`
	Reason        Reason  `json:"reason,omitempty"`
	EventIdentity string  `json:"event_identity,omitempty"`
	Cursor        *int64  `json:"cursor,omitempty"`
	CorrelationID string  `json:"correlation_id"`
	// Detail is one fixed sentence naming the rule that failed (§8.11); it
	// never holds request content.
	Detail string `json:"detail,omitempty"`
}

// BatchResult is one item of a batch answer: the single-route answer plus
// the status that route would have given it.
type BatchResult struct {
	Answer
	Status int `json:"status"`
}

// BatchAnswer is the 200 answer of POST /v1/envelopes/batch.
type BatchAnswer struct {
	Results []BatchResult `json:"results"`
}

// StreamState is the answer of GET /v1/streams/{project}/{producer}.
type StreamState struct {
	Cursor      int64 `json:"cursor"`
	ReplayFloor int64 `json:"replay_floor"`
}
