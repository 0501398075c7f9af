package server

import "net/http"

// Reason codes decided here (the envelope and store packages own the rest).
const (
	reasonUnauthenticated        = "unauthenticated"
	reasonRateLimited            = "rate_limited"
	reasonForbidden              = "forbidden"
	reasonRouteMismatch          = "route_mismatch"
	reasonIdempotencyKeyMismatch = "idempotency_key_mismatch"
	reasonUnknownKey             = "unknown_key"
	reasonKeyRetired             = "key_retired"
	reasonKeyRevoked             = "key_revoked"
	reasonBodyTooLarge           = "body_too_large"
	reasonInvalidEnvelope        = "invalid_envelope"
	reasonUnavailable            = "unavailable"
	reasonInvalidRequest         = "invalid_request"
	reasonInvalidPage            = "invalid_page"
	reasonNotFound               = "not_found"
	reasonMethodNotAllowed       = "method_not_allowed"
)

const (
	outcomeAccepted  = "accepted"
	outcomeDuplicate = "duplicate"
	outcomeRefused   = "refused"
)

// answer is the contract's body of every envelope answer; field order is the
// contract's. Cursor is a pointer because 0 is a real cursor on accepted and
// duplicate answers and must be absent on refusals.
type answer struct {
	Outcome       string `json:"outcome"`
	Reason        string `json:"reason,omitempty"`
	EventIdentity string `json:"event_identity,omitempty"`
	Cursor        *int64 `json:"cursor,omitempty"`
	CorrelationID string `json:"correlation_id"`
}

// batchResult is one batch item: the single-route answer plus its status.
type batchResult struct {
	answer
	Status int `json:"status"`
}

type batchAnswer struct {
	Results []batchResult `json:"results"`
}

// statusOf maps a reason code to its HTTP status, as in contract §2; an
// accepted or duplicate answer (no reason) is 200. An unknown reason is a
// programming error and answers 500 rather than a guessed refusal.
func statusOf(reason string) int {
	switch reason {
	case "":
		return http.StatusOK
	case "invalid_envelope", "invalid_metadata", "unsupported_schema", reasonIdempotencyKeyMismatch,
		"issued_in_future", "expired", reasonInvalidRequest, reasonInvalidPage:
		return http.StatusBadRequest
	case reasonUnauthenticated:
		return http.StatusUnauthorized
	case reasonRouteMismatch, reasonUnknownKey, reasonKeyRetired, reasonKeyRevoked, "bad_signature", reasonForbidden:
		return http.StatusForbidden
	case "event_conflict", "sequence_conflict", "below_replay_floor", "sequence_too_far_ahead":
		return http.StatusConflict
	case reasonIdempotencyConflict, reasonNoSigningKey, reasonNoEndpoint:
		return http.StatusUnprocessableEntity
	case reasonNotDead, reasonPayloadExpired:
		return http.StatusConflict
	case reasonBodyTooLarge:
		return http.StatusRequestEntityTooLarge
	case reasonRateLimited:
		return http.StatusTooManyRequests
	case reasonUnavailable:
		return http.StatusServiceUnavailable
	case reasonNotFound:
		return http.StatusNotFound
	case reasonMethodNotAllowed:
		return http.StatusMethodNotAllowed
	default:
		return http.StatusInternalServerError
	}
}
