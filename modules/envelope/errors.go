package envelope

import "errors"

// Reason is a stable refusal code of the public contract. The values are
// part of the wire format: never rename them.
type Reason string

// Reasons this package decides. The other refusal codes of the contract
// (route_mismatch, unknown_key, duplicate handling, ...) need state this
// package does not own.
const (
	ReasonInvalidEnvelope   Reason = "invalid_envelope"
	ReasonInvalidMetadata   Reason = "invalid_metadata"
	ReasonUnsupportedSchema Reason = "unsupported_schema"
	ReasonBadSignature      Reason = "bad_signature"
	ReasonIssuedInFuture    Reason = "issued_in_future"
	ReasonExpired           Reason = "expired"
	ReasonBodyTooLarge      Reason = "body_too_large"
)

// Error is a refusal with its contract reason. Detail is one of the fixed
// sentences of details.go (KnownDetails), so it is safe to log or return to
// the client (contract §8.11): it never echoes a value, an unknown member's
// name, an offset or any other request content.
type Error struct {
	Reason Reason
	Detail string
}

func (e *Error) Error() string {
	if e.Detail == "" {
		return "envelope: " + string(e.Reason)
	}
	return "envelope: " + string(e.Reason) + ": " + e.Detail
}

// ReasonOf returns the contract reason carried by err or anything it wraps.
func ReasonOf(err error) (Reason, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason, true
	}
	return "", false
}

// ErrInvalidPublicKey is wrapped by every refusal of ValidatePublicKey,
// ParsePublicKey and by Verify when handed a key of the wrong length. It is
// not a contract reason: a bad key is a registration or configuration
// problem, not something the sender of an envelope did.
var ErrInvalidPublicKey = errors.New("envelope: invalid public key")

// ErrInvalidPrivateKey is returned by Sign for a private key that is not a
// well-formed Ed25519 key.
var ErrInvalidPrivateKey = errors.New("envelope: invalid private key")

// invalid is an invalid_envelope refusal; detail is a sentence of details.go.
func invalid(detail string) *Error {
	return &Error{Reason: ReasonInvalidEnvelope, Detail: detail}
}

// invalidJSON is the strict reader's refusal of a grammar problem.
func invalidJSON(what syntax) *Error { return invalid(prefixJSON + string(what)) }
