// Package webhooksink is a local receiver for outbox deliveries, for demos
// and manual runs: it checks each POST as a careful Standard Webhooks
// consumer would (the webhook-signature against the endpoint's whsec_
// secrets, the webhook-timestamp within a tolerance), optionally verifies the
// controlplane/v1 envelope in the body against the tenant's outbound public
// key, and prints one JSON line per request saying what arrived and whether
// it checked out. It is a development tool: it prints payloads, which the
// services never do.
//
// Answers: 204 for a delivery that checks out (also a redelivery of the same
// webhook-id, which it counts), 400 missing_headers, 401 bad_signature or
// stale_timestamp, 405 for other methods, 413 body_too_large, 422
// bad_envelope. The 4xx answers make the delivery-worker give the message up
// (dead letter), which is what a misconfigured secret should look like.
package webhooksink

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
)

// MaxBody bounds a delivery body: an envelope is at most 1 MiB.
const MaxBody = 1 << 20

// ErrSecret reports a secret that is not whsec_ and base64 of 24–64 bytes;
// the message never repeats the secret.
var ErrSecret = errors.New("webhooksink: a secret must be whsec_ followed by base64 of 24 to 64 bytes")

// ParseSecret decodes a whsec_ secret into its HMAC key.
func ParseSecret(s string) ([]byte, error) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(s), "whsec_")
	if !ok {
		return nil, ErrSecret
	}
	key, err := base64.StdEncoding.DecodeString(rest)
	if err != nil || len(key) < 24 || len(key) > 64 {
		return nil, ErrSecret
	}
	return key, nil
}

// Config is what a Sink checks against.
type Config struct {
	Secrets     [][]byte          // HMAC keys; a signature by any of them passes
	EnvelopeKey ed25519.PublicKey // optional: verify the envelope's signature too
	Tolerance   time.Duration     // how far webhook-timestamp may be from now; default 5m
	Now         func() time.Time
	Out         io.Writer // one JSON line per request
}

// Sink is the http.Handler.
type Sink struct {
	cfg  Config
	mu   sync.Mutex
	seen map[string]int
}

// New returns a Sink; it needs at least one secret.
func New(cfg Config) (*Sink, error) {
	if len(cfg.Secrets) == 0 {
		return nil, errors.New("webhooksink: no secret")
	}
	if cfg.Tolerance <= 0 {
		cfg.Tolerance = 5 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	return &Sink{cfg: cfg, seen: map[string]int{}}, nil
}

// Line is what the sink prints for a request.
type Line struct {
	Result    string          `json:"result"` // accepted | refused
	Reason    string          `json:"reason,omitempty"`
	WebhookID string          `json:"webhook_id,omitempty"`
	Timestamp string          `json:"webhook_timestamp,omitempty"`
	Delivery  int             `json:"delivery,omitempty"` // 1 the first time this id arrived, 2 a redelivery, …
	Envelope  *EnvelopeInfo   `json:"envelope,omitempty"`
	Payload   json.RawMessage `json:"payload,omitempty"`
}

// EnvelopeInfo summarizes the delivered envelope.
type EnvelopeInfo struct {
	TenantID      string `json:"tenant_id"`
	ProjectID     string `json:"project_id"`
	ProducerID    string `json:"producer_id"`
	Sequence      int64  `json:"sequence"`
	EventIdentity string `json:"event_identity"`
	Kind          string `json:"kind"`
	KeyID         string `json:"key_id"`
	Signature     string `json:"signature"` // verified | not checked (no --envelope-public-key)
}

func (s *Sink) print(l Line) {
	b, err := json.Marshal(l)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = s.cfg.Out.Write(append(b, '\n'))
}

func (s *Sink) refuse(w http.ResponseWriter, status int, l Line, reason string) {
	l.Result, l.Reason = "refused", reason
	s.print(l)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = fmt.Fprintf(w, `{"reason":%q}`+"\n", reason)
}

// ServeHTTP checks and prints one delivery.
func (s *Sink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		s.refuse(w, http.StatusMethodNotAllowed, Line{}, "method_not_allowed")
		return
	}
	l := Line{WebhookID: r.Header.Get("webhook-id"), Timestamp: r.Header.Get("webhook-timestamp")}
	sig := r.Header.Get("webhook-signature")
	if l.WebhookID == "" || l.Timestamp == "" || sig == "" {
		s.refuse(w, http.StatusBadRequest, l, "missing_headers")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		s.refuse(w, http.StatusRequestEntityTooLarge, l, "body_too_large")
		return
	}
	// The signature first, so nothing unsigned is judged further.
	if !s.signed(l.WebhookID, l.Timestamp, body, sig) {
		s.refuse(w, http.StatusUnauthorized, l, "bad_signature")
		return
	}
	ts, err := strconv.ParseInt(l.Timestamp, 10, 64)
	if err != nil || s.cfg.Now().Sub(time.Unix(ts, 0)).Abs() > s.cfg.Tolerance {
		s.refuse(w, http.StatusUnauthorized, l, "stale_timestamp")
		return
	}
	env, err := envelope.Parse(body)
	if err != nil || !bytes.Equal(env.Canonical(), body) {
		s.refuse(w, http.StatusUnprocessableEntity, l, "bad_envelope")
		return
	}
	info := &EnvelopeInfo{
		TenantID: env.TenantID, ProjectID: env.ProjectID, ProducerID: env.ProducerID, Sequence: env.Sequence,
		EventIdentity: env.EventIdentity(), Kind: env.Metadata.Kind, KeyID: env.KeyID, Signature: "not checked",
	}
	if s.cfg.EnvelopeKey != nil {
		if err := env.Verify(s.cfg.EnvelopeKey); err != nil {
			l.Envelope = info
			s.refuse(w, http.StatusUnprocessableEntity, l, "bad_envelope")
			return
		}
		info.Signature = "verified"
	}
	s.mu.Lock()
	s.seen[l.WebhookID]++
	l.Delivery = s.seen[l.WebhookID]
	s.mu.Unlock()
	l.Result, l.Envelope, l.Payload = "accepted", info, json.RawMessage(env.Payload)
	s.print(l)
	w.WriteHeader(http.StatusNoContent)
}

// signed reports whether any v1 entry of header is the HMAC of
// id.timestamp.body under one of the secrets (Standard Webhooks).
func (s *Sink) signed(id, ts string, body []byte, header string) bool {
	content := make([]byte, 0, len(id)+len(ts)+len(body)+2)
	content = append(content, id...)
	content = append(content, '.')
	content = append(content, ts...)
	content = append(content, '.')
	content = append(content, body...)
	for _, entry := range strings.Fields(header) {
		sig, ok := strings.CutPrefix(entry, "v1,")
		if !ok {
			continue // another scheme (v1a) this sink does not check
		}
		// Strict: the bits past the last whole byte must be zero, so only the
		// one canonical text of a signature passes (the official library
		// compares the base64 text itself).
		got, err := base64.StdEncoding.Strict().DecodeString(sig)
		if err != nil {
			continue
		}
		for _, key := range s.cfg.Secrets {
			m := hmac.New(sha256.New, key)
			m.Write(content)
			if hmac.Equal(m.Sum(nil), got) {
				return true
			}
		}
	}
	return false
}
