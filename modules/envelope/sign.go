package envelope

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	"filippo.io/edwards25519"
)

// Verify performs step 3 for an already resolved key: it checks the Ed25519
// signature over SigningInput. A signature that does not verify is an *Error
// with ReasonBadSignature. A key that is not 32 bytes is a caller or
// configuration fault, reported as an error wrapping ErrInvalidPublicKey
// (and never a panic, which crypto/ed25519 would raise).
//
// Verify does not re-run ValidatePublicKey: keys are validated once, when
// they are registered, which keeps a point decompression off the hot path.
func (e *Envelope) Verify(pub ed25519.PublicKey) error {
	if len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("%w: want %d bytes, have %d", ErrInvalidPublicKey, ed25519.PublicKeySize, len(pub))
	}
	if !VerifySignature(pub, e.signingInput, e.Signature) {
		return &Error{Reason: ReasonBadSignature, Detail: detailBadSignature}
	}
	return nil
}

// VerifySignature reports whether sig is a valid Ed25519 signature of msg by
// pub under the ZIP-215 rules (package doc, "Which signatures verify"), the
// same set BatchVerifier accepts. Wrong key or signature lengths give false
// instead of a panic.
func VerifySignature(pub ed25519.PublicKey, msg, sig []byte) bool {
	return verifyZIP215(pub, msg, sig)
}

// ValidatePublicKey is the registration check for device keys: exactly 32
// bytes, the canonical encoding of a curve point, and not of small order.
// Non-canonical encodings would let one key be registered under several
// spellings; small-order keys admit signatures that verify for many
// messages, so a device could not be held to what it signed.
func ValidatePublicKey(pub []byte) error {
	if len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("%w: want %d bytes, have %d", ErrInvalidPublicKey, ed25519.PublicKeySize, len(pub))
	}
	p, err := new(edwards25519.Point).SetBytes(pub)
	if err != nil {
		return fmt.Errorf("%w: not a curve point", ErrInvalidPublicKey)
	}
	// SetBytes accepts y >= p and the (x = 0, sign = 1) spelling; only the
	// re-encoding tells a canonical key from those.
	if !bytes.Equal(p.Bytes(), pub) {
		return fmt.Errorf("%w: not a canonical point encoding", ErrInvalidPublicKey)
	}
	if new(edwards25519.Point).MultByCofactor(p).Equal(edwards25519.NewIdentityPoint()) == 1 {
		return fmt.Errorf("%w: small-order point", ErrInvalidPublicKey)
	}
	return nil
}

// ParsePublicKey decodes base64url, with or without padding, and applies
// ValidatePublicKey. Characters outside the base64url alphabet (including
// the CR/LF that Go's decoder would skip) are refused.
func ParsePublicKey(s string) (ed25519.PublicKey, error) {
	body := s
	if strings.HasSuffix(body, "=") {
		body = strings.TrimRight(body, "=")
		if len(s)%4 != 0 || len(s)-len(body) > 2 {
			return nil, fmt.Errorf("%w: malformed base64url padding", ErrInvalidPublicKey)
		}
	}
	for i := 0; i < len(body); i++ {
		if c := body[i]; !isAlnum(c) && c != '-' && c != '_' {
			return nil, fmt.Errorf("%w: not base64url", ErrInvalidPublicKey)
		}
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(body)
	if err != nil {
		return nil, fmt.Errorf("%w: not base64url", ErrInvalidPublicKey)
	}
	if err := ValidatePublicKey(raw); err != nil {
		return nil, err
	}
	return ed25519.PublicKey(raw), nil
}

// Draft is an envelope to be built and signed. Payload is any JSON value and
// is canonicalized; the schema version is always 1.
type Draft struct {
	TenantID, ProjectID, ProducerID, EventID, IdempotencyKey, KeyID string
	Sequence                                                        int64
	IssuedAt                                                        time.Time
	Metadata                                                        Metadata
	Payload                                                         []byte
}

// placeholderSignature stands in for the signature while the draft is parsed:
// it has the final length, so the signature can later be written in place.
var placeholderSignature = strings.Repeat("A", 86)

// Sign builds the envelope described by d, checks it exactly as Parse would
// (step 2: a bad draft yields the same *Error a receiver would return),
// signs its signing input with priv and returns the parsed result, whose
// Canonical() is the form to store and send. Metadata and the time window
// (step 4) are not judged, so tests can build envelopes that receivers
// refuse at step 4; call Validate to check them.
//
// IssuedAt is written in UTC with as many fraction digits as it needs; a
// zero IssuedAt is refused as it is almost certainly a forgotten field.
func Sign(d Draft, priv ed25519.PrivateKey) (*Envelope, error) {
	if len(priv) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("%w: want %d bytes, have %d", ErrInvalidPrivateKey, ed25519.PrivateKeySize, len(priv))
	}
	// A private key whose public half does not match its seed signs with
	// one key while claiming another; nobody could verify the result.
	if !bytes.Equal(ed25519.NewKeyFromSeed(priv.Seed())[32:], priv[32:]) {
		return nil, fmt.Errorf("%w: public half does not match the seed", ErrInvalidPrivateKey)
	}
	if d.IssuedAt.IsZero() {
		return nil, invalid(detailIssuedAtMissing)
	}
	if len(d.Payload) == 0 {
		return nil, invalid(detailPayloadMissing)
	}
	payload, err := Canonicalize(d.Payload)
	if err != nil {
		return nil, err
	}
	doc := make([]byte, 0, 512+len(payload))
	doc = append(doc, `{"event_id":`...)
	doc = appendCanonicalString(doc, d.EventID)
	doc = append(doc, `,"idempotency_key":`...)
	doc = appendCanonicalString(doc, d.IdempotencyKey)
	doc = append(doc, `,"issued_at":`...)
	doc = appendCanonicalString(doc, d.IssuedAt.UTC().Format(time.RFC3339Nano))
	doc = append(doc, `,"key_id":`...)
	doc = appendCanonicalString(doc, d.KeyID)
	doc = append(doc, `,"metadata":{`...)
	if d.Metadata.CorrelationID != "" {
		doc = append(doc, `"correlation_id":`...)
		doc = appendCanonicalString(doc, d.Metadata.CorrelationID)
		doc = append(doc, ',')
	}
	doc = append(doc, `"kind":`...)
	doc = appendCanonicalString(doc, d.Metadata.Kind)
	if d.Metadata.Traceparent != "" {
		doc = append(doc, `,"traceparent":`...)
		doc = appendCanonicalString(doc, d.Metadata.Traceparent)
	}
	doc = append(doc, `},"payload":`...)
	doc = append(doc, payload...)
	doc = append(doc, `,"producer_id":`...)
	doc = appendCanonicalString(doc, d.ProducerID)
	doc = append(doc, `,"project_id":`...)
	doc = appendCanonicalString(doc, d.ProjectID)
	doc = append(doc, `,"schema_version":1,"sequence":`...)
	doc = strconv.AppendInt(doc, d.Sequence, 10)
	doc = append(doc, `,"signature":"`...)
	doc = append(doc, placeholderSignature...)
	doc = append(doc, `","tenant_id":`...)
	doc = appendCanonicalString(doc, d.TenantID)
	doc = append(doc, '}')

	e, err := Parse(doc)
	if err != nil {
		return nil, err
	}
	sig := ed25519.Sign(priv, e.signingInput)
	base64.RawURLEncoding.Encode(e.canonical[e.sigValue:e.sigValue+86], sig)
	e.Signature = sig
	return e, nil
}
