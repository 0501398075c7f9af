package receiver

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"time"
)

// Standard Webhooks header names, as the specification writes them (HTTP
// header names are case-insensitive).
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// Bounds on what the headers may hold. A sender that signs with more
// secrets than maxSignatureEntries is misconfigured; the bound keeps the
// Ed25519 work per request small whatever a client sends.
const (
	maxIDBytes          = 256
	maxTimestampDigits  = 19
	maxSignatureEntries = 16
	minHMACKeyBytes     = 24
	maxHMACKeyBytes     = 64
)

// ErrSecret reports an unusable secret or public key; the message names the
// position and the rule, never the key.
var ErrSecret = errors.New("receiver: invalid secret")

// secret is one way a webhook-signature entry can verify: a v1 HMAC key or
// a v1a Ed25519 public key.
type secret struct {
	hmacKey []byte
	pub     ed25519.PublicKey
}

// parseSecret reads whsec_<base64> (HMAC key, 24–64 bytes) or
// whpk_<base64> (32-byte Ed25519 public key); base64 padded or not.
func parseSecret(text string) (secret, error) {
	if rest, ok := strings.CutPrefix(text, "whsec_"); ok {
		key, err := decodeStdBase64(rest)
		if err != nil || len(key) < minHMACKeyBytes || len(key) > maxHMACKeyBytes {
			return secret{}, errors.New("whsec_ must be base64 of 24 to 64 bytes")
		}
		return secret{hmacKey: key}, nil
	}
	if rest, ok := strings.CutPrefix(text, "whpk_"); ok {
		key, err := decodeStdBase64(rest)
		if err != nil || len(key) != ed25519.PublicKeySize {
			return secret{}, errors.New("whpk_ must be base64 of a 32-byte Ed25519 public key")
		}
		return secret{pub: ed25519.PublicKey(key)}, nil
	}
	if strings.HasPrefix(text, "whsk_") {
		return secret{}, errors.New("whsk_ is the sender's private key; a receiver verifies with its whpk_ public key")
	}
	return secret{}, errors.New("must start with whsec_ or whpk_")
}

func decodeStdBase64(s string) ([]byte, error) {
	return base64.RawStdEncoding.Strict().DecodeString(strings.TrimRight(s, "="))
}

// webhookHeaders is what the three headers said, parsed but not verified.
type webhookHeaders struct {
	id        string
	timestamp int64
	tsText    string
	v1        [][]byte // decoded HMAC-SHA256 values
	v1a       [][]byte // decoded Ed25519 signatures
}

// parseHeaders checks the form of the headers. Entries of versions other
// than v1 and v1a are skipped, as the specification asks, so a sender can
// add a scheme without breaking receivers; an entry of a known version with
// a value that is not base64 of the right size is malformed.
func parseHeaders(id, ts, sig string) (webhookHeaders, *Error) {
	if id == "" || ts == "" || sig == "" {
		return webhookHeaders{}, refusal(CodeMissingHeader)
	}
	if len(id) > maxIDBytes || !printableASCII(id) {
		return webhookHeaders{}, refusal(CodeMalformedHeader)
	}
	if len(ts) > maxTimestampDigits || !allDigits(ts) {
		return webhookHeaders{}, refusal(CodeMalformedHeader)
	}
	n, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return webhookHeaders{}, refusal(CodeMalformedHeader)
	}
	h := webhookHeaders{id: id, timestamp: n, tsText: ts}
	entries := strings.Fields(sig)
	if len(entries) == 0 || len(entries) > maxSignatureEntries {
		return webhookHeaders{}, refusal(CodeMalformedHeader)
	}
	for _, e := range entries {
		version, value, ok := strings.Cut(e, ",")
		if !ok {
			return webhookHeaders{}, refusal(CodeMalformedHeader)
		}
		switch version {
		case "v1":
			b, err := base64.StdEncoding.Strict().DecodeString(value)
			if err != nil || len(b) != sha256.Size {
				return webhookHeaders{}, refusal(CodeMalformedHeader)
			}
			h.v1 = append(h.v1, b)
		case "v1a":
			b, err := base64.StdEncoding.Strict().DecodeString(value)
			if err != nil || len(b) != ed25519.SignatureSize {
				return webhookHeaders{}, refusal(CodeMalformedHeader)
			}
			h.v1a = append(h.v1a, b)
		}
	}
	if len(h.v1) == 0 && len(h.v1a) == 0 {
		// Only unknown versions: nothing this receiver can check.
		return webhookHeaders{}, refusal(CodeBadSignature)
	}
	return h, nil
}

// checkTime applies the tolerance in both directions: a timestamp from the
// future is as suspect as an old one.
func (h webhookHeaders) checkTime(now time.Time, tolerance time.Duration) *Error {
	limit := int64(tolerance / time.Second)
	d := now.Unix() - h.timestamp
	if d > limit || d < -limit {
		return refusal(CodeStaleTimestamp)
	}
	return nil
}

// verify reports whether any entry verifies under any secret. Every
// comparison is constant-time; which secret matched is not observable.
func (h webhookHeaders) verify(secrets []secret, body []byte) bool {
	content := make([]byte, 0, len(h.id)+len(h.tsText)+2+len(body))
	content = append(content, h.id...)
	content = append(content, '.')
	content = append(content, h.tsText...)
	content = append(content, '.')
	content = append(content, body...)
	ok := false
	for _, s := range secrets {
		switch {
		case s.hmacKey != nil && len(h.v1) > 0:
			m := hmac.New(sha256.New, s.hmacKey)
			m.Write(content)
			want := m.Sum(nil)
			for _, got := range h.v1 {
				if hmac.Equal(want, got) {
					ok = true
				}
			}
		case s.pub != nil:
			for _, got := range h.v1a {
				if ed25519.Verify(s.pub, content, got) {
					ok = true
				}
			}
		}
	}
	return ok
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
