// Package signer owns the Standard Webhooks headers of one delivery attempt:
// webhook-id (the outbox message id), webhook-timestamp (Unix seconds of the
// attempt), webhook-signature (one entry per current secret of the
// endpoint, space-separated, so receivers keep verifying across a rotation),
// Idempotency-Key (the message id) and Content-Type.
//
// The signed content is id "." timestamp "." body, exactly as the Standard
// Webhooks specification defines it, with the stored envelope bytes as the
// body. A v1 entry is "v1," + base64(HMAC-SHA256(key, content)); a v1a entry
// is "v1a," + base64(Ed25519(key, content)).
package signer

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/secrets"
)

// Header names (lowercase as the specification writes them; net/http
// canonicalises them on the wire, and HTTP header names are case-insensitive).
const (
	HeaderID          = "webhook-id"
	HeaderTimestamp   = "webhook-timestamp"
	HeaderSignature   = "webhook-signature"
	HeaderIdempotency = "Idempotency-Key"
)

// ErrNoSecret reports a message whose secret ref resolves to no secret.
var ErrNoSecret = errors.New("signer: no secret for the endpoint's secret ref")

// Signature computes the webhook-signature header value over id, ts and
// body with every secret, in the given order.
func Signature(id string, ts time.Time, body []byte, secs []secrets.Secret) (string, error) {
	if len(secs) == 0 {
		return "", ErrNoSecret
	}
	content := make([]byte, 0, len(id)+len(body)+24)
	content = append(content, id...)
	content = append(content, '.')
	content = strconv.AppendInt(content, ts.Unix(), 10)
	content = append(content, '.')
	content = append(content, body...)

	parts := make([]string, 0, len(secs))
	for _, s := range secs {
		switch s.Scheme() {
		case secrets.HMACSHA256:
			m := hmac.New(sha256.New, s.HMACKey())
			m.Write(content)
			parts = append(parts, "v1,"+base64.StdEncoding.EncodeToString(m.Sum(nil)))
		case secrets.Ed25519:
			parts = append(parts, "v1a,"+base64.StdEncoding.EncodeToString(ed25519.Sign(s.Ed25519Key(), content)))
		default:
			return "", errors.New("signer: secret of unknown scheme")
		}
	}
	return strings.Join(parts, " "), nil
}

// SetHeaders signs and sets every delivery header on h.
func SetHeaders(h http.Header, id string, ts time.Time, body []byte, secs []secrets.Secret) error {
	sig, err := Signature(id, ts, body, secs)
	if err != nil {
		return err
	}
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(HeaderSignature, sig)
	h.Set(HeaderIdempotency, id)
	h.Set("Content-Type", "application/json")
	return nil
}
