package receiver

import "net/http"

// Code is the stable reason of a refused delivery, sent as
// {"outcome":"refused","reason":"<code>"}. The values are part of the
// receiver's wire behaviour: never rename them.
type Code string

const (
	// CodeMethodNotAllowed: the request is not a POST (405).
	CodeMethodNotAllowed Code = "method_not_allowed"
	// CodeMissingHeader: webhook-id, webhook-timestamp or
	// webhook-signature is absent or empty (400).
	CodeMissingHeader Code = "missing_header"
	// CodeMalformedHeader: a webhook header is present but not of its
	// form (400).
	CodeMalformedHeader Code = "malformed_header"
	// CodeStaleTimestamp: webhook-timestamp is further from now than the
	// tolerance, in either direction (400).
	CodeStaleTimestamp Code = "stale_timestamp"
	// CodeBadSignature: no webhook-signature entry verifies under any
	// configured secret or public key (401).
	CodeBadSignature Code = "bad_signature"
	// CodeBodyTooLarge: the body exceeds the limit (413).
	CodeBodyTooLarge Code = "body_too_large"
	// CodeInvalidEnvelope: the body is not a valid controlplane/v1
	// envelope (400).
	CodeInvalidEnvelope Code = "invalid_envelope"
	// CodeWrongTenant: the envelope belongs to another tenant than the
	// one the receiver was configured for (403).
	CodeWrongTenant Code = "wrong_tenant"
	// CodeUnknownKey: the envelope names a key id that is not among the
	// tenant's outbound public keys, even after a refresh (401).
	CodeUnknownKey Code = "unknown_key"
	// CodeBadEnvelopeSignature: the envelope's Ed25519 signature does not
	// verify under its key (401).
	CodeBadEnvelopeSignature Code = "bad_envelope_signature"
	// CodeKeysUnavailable: the outbound keys could not be fetched, or a
	// refresh for an unknown key id is not yet allowed; the sender should
	// retry (503, Retry-After).
	CodeKeysUnavailable Code = "keys_unavailable"
	// CodeEffectFailed: the handler's effect failed; nothing was
	// committed and the sender should retry (500).
	CodeEffectFailed Code = "effect_failed"
)

// Status is the HTTP status a refusal with this code answers.
func (c Code) Status() int {
	switch c {
	case CodeMethodNotAllowed:
		return http.StatusMethodNotAllowed
	case CodeBadSignature, CodeUnknownKey, CodeBadEnvelopeSignature:
		return http.StatusUnauthorized
	case CodeBodyTooLarge:
		return http.StatusRequestEntityTooLarge
	case CodeWrongTenant:
		return http.StatusForbidden
	case CodeKeysUnavailable:
		return http.StatusServiceUnavailable
	case CodeEffectFailed:
		return http.StatusInternalServerError
	default:
		return http.StatusBadRequest
	}
}

// Error is a refused delivery. It never carries request content.
type Error struct{ Code Code }

func (e *Error) Error() string { return "receiver: " + string(e.Code) }

func refusal(c Code) *Error { return &Error{Code: c} }
