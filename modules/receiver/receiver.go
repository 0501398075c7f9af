package receiver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
)

// DefaultTolerance is how far webhook-timestamp may be from the receiver's
// clock, either way (the Standard Webhooks recommendation).
const DefaultTolerance = 5 * time.Minute

// MaxBodyBytes is the largest body accepted: an envelope is at most 1 MiB.
const MaxBodyBytes = envelope.MaxDocumentBytes

// Config is what a Verifier checks deliveries against.
type Config struct {
	// Secrets verify webhook-signature: whsec_<base64> HMAC keys (v1) and
	// whpk_<base64> Ed25519 public keys (v1a). List the old and the new
	// during a rotation; an entry that verifies under any of them passes.
	Secrets []string
	// Keys resolves the outbound public key an envelope names: StaticKeys
	// or NewRemoteKeys. Required.
	Keys KeySource
	// Tenant, when set, is the only tenant_id an envelope may carry.
	Tenant string
	// Tolerance defaults to DefaultTolerance.
	Tolerance time.Duration
	// MaxBodyBytes may only tighten MaxBodyBytes.
	MaxBodyBytes int64
	// Now is the clock for webhook-timestamp; default time.Now.
	Now func() time.Time
}

// Verifier checks deliveries. It is safe for concurrent use.
type Verifier struct {
	cfg     Config
	secrets []secret
}

// New checks cfg and returns its Verifier. Errors name the rule and the
// position of a secret, never the secret.
func New(cfg Config) (*Verifier, error) {
	if len(cfg.Secrets) == 0 {
		return nil, fmt.Errorf("%w: at least one whsec_ or whpk_ secret is required", ErrSecret)
	}
	if cfg.Keys == nil {
		return nil, errors.New("receiver: Config.Keys is required")
	}
	if cfg.Tenant != "" && !envelope.ValidIdentity(cfg.Tenant) {
		return nil, errors.New("receiver: Config.Tenant is not a valid identity")
	}
	v := &Verifier{cfg: cfg}
	for i, text := range cfg.Secrets {
		s, err := parseSecret(strings.TrimSpace(text))
		if err != nil {
			return nil, fmt.Errorf("%w: secret %d: %v", ErrSecret, i+1, err)
		}
		v.secrets = append(v.secrets, s)
	}
	if v.cfg.Tolerance <= 0 {
		v.cfg.Tolerance = DefaultTolerance
	}
	if v.cfg.MaxBodyBytes <= 0 || v.cfg.MaxBodyBytes > MaxBodyBytes {
		v.cfg.MaxBodyBytes = MaxBodyBytes
	}
	if v.cfg.Now == nil {
		v.cfg.Now = time.Now
	}
	return v, nil
}

// Delivery is a verified webhook: its headers matched a secret, and its
// body is a controlplane/v1 envelope whose signature verified under the
// tenant's outbound key.
type Delivery struct {
	// WebhookID is the outbox message id, stable across attempts: the
	// receipt key.
	WebhookID string
	// Timestamp is this attempt's webhook-timestamp.
	Timestamp time.Time
	// Envelope is the verified envelope; Envelope.Payload is the event.
	Envelope *envelope.Envelope
}

// Verify checks one request and reads its body. It returns a *Error for a
// delivery to refuse, and never a Delivery that did not verify.
func (v *Verifier) Verify(r *http.Request) (*Delivery, error) {
	if r.Method != http.MethodPost {
		return nil, refusal(CodeMethodNotAllowed)
	}
	h, rerr := parseHeaders(r.Header.Get(HeaderID), r.Header.Get(HeaderTimestamp),
		strings.Join(r.Header.Values(HeaderSignature), " "))
	if rerr != nil {
		return nil, rerr
	}
	if rerr := h.checkTime(v.cfg.Now(), v.cfg.Tolerance); rerr != nil {
		return nil, rerr
	}
	body, rerr := v.readBody(r)
	if rerr != nil {
		return nil, rerr
	}
	if !h.verify(v.secrets, body) {
		return nil, refusal(CodeBadSignature)
	}
	env, err := envelope.ParseWithLimits(body, envelope.Limits{MaxBytes: int(v.cfg.MaxBodyBytes)})
	if err != nil {
		return nil, refusal(CodeInvalidEnvelope)
	}
	// Step 4 without its time window: a message in retry, or a replayed
	// dead letter, may rightly carry an issued_at older than any window,
	// and the webhook-timestamp already bounds this attempt's age. Judging
	// at the envelope's own issued_at keeps the schema and metadata checks.
	if err := env.Validate(env.IssuedAt, 0); err != nil {
		return nil, refusal(CodeInvalidEnvelope)
	}
	if v.cfg.Tenant != "" && env.TenantID != v.cfg.Tenant {
		return nil, refusal(CodeWrongTenant)
	}
	pub, err := v.cfg.Keys.PublicKey(r.Context(), env.KeyID)
	switch {
	case errors.Is(err, ErrUnknownKey):
		return nil, refusal(CodeUnknownKey)
	case err != nil:
		return nil, refusal(CodeKeysUnavailable)
	}
	if err := env.Verify(pub); err != nil {
		return nil, refusal(CodeBadEnvelopeSignature)
	}
	return &Delivery{WebhookID: h.id, Timestamp: time.Unix(h.timestamp, 0), Envelope: env}, nil
}

// readBody reads at most MaxBodyBytes. The buffer grows with the bytes that
// arrive; a declared Content-Length is only used to refuse early, never to
// size an allocation.
func (v *Verifier) readBody(r *http.Request) ([]byte, *Error) {
	limit := v.cfg.MaxBodyBytes
	if r.ContentLength > limit {
		return nil, refusal(CodeBodyTooLarge)
	}
	if r.Body == nil {
		return nil, refusal(CodeInvalidEnvelope)
	}
	var buf bytes.Buffer
	n, err := buf.ReadFrom(io.LimitReader(r.Body, limit+1))
	if n > limit {
		return nil, refusal(CodeBodyTooLarge)
	}
	if err != nil {
		return nil, refusal(CodeInvalidEnvelope)
	}
	return buf.Bytes(), nil
}

type ctxKey struct{}

// FromContext returns the verified Delivery that Middleware put in the
// request's context.
func FromContext(ctx context.Context) (*Delivery, bool) {
	d, ok := ctx.Value(ctxKey{}).(*Delivery)
	return d, ok && d != nil
}

// Middleware verifies every request before next sees it: a refused
// delivery is answered with its code and next is not called; a verified
// one reaches next with the Delivery in its context (FromContext) and the
// body already read.
func (v *Verifier) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, err := v.Verify(r)
		if err != nil {
			Refuse(w, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, d)))
	})
}

// Refuse answers err: a *Error with its code and status, anything else as
// effect_failed (500, so the sender retries).
func Refuse(w http.ResponseWriter, err error) {
	code := CodeEffectFailed
	var e *Error
	if errors.As(err, &e) {
		code = e.Code
	}
	if code == CodeKeysUnavailable {
		w.Header().Set("Retry-After", "60")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code.Status())
	// code is one of the constants: no escaping is needed.
	_, _ = io.WriteString(w, `{"outcome":"refused","reason":"`+string(code)+`"}`)
}
