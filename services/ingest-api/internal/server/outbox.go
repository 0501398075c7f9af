package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/services/ingest-api/internal/outboundkeys"
)

// Outbox reason codes (contract §4).
const (
	reasonNoSigningKey        = "no_signing_key"
	reasonNoEndpoint          = "no_endpoint"
	reasonIdempotencyConflict = "idempotency_conflict"
	reasonNotDead             = "not_dead"
	// reasonPayloadExpired: a replay of a dead letter whose envelope body
	// the retention-janitor deleted (§8.9).
	reasonPayloadExpired = "payload_expired"
)

// outboxRequest is a checked POST /v1/outbox body.
type outboxRequest struct {
	ProjectID, Topic, IdempotencyKey, Kind string
	Payload                                []byte
	MaxAttempts                            int
}

var outboxMembers = map[string]bool{
	"project_id": true, "topic": true, "idempotency_key": true, "kind": true, "payload": true, "max_attempts": true,
}

// parseOutboxRequest reads the body as strictly as an envelope: the
// envelope reader refuses duplicate members, bad UTF-8, lone surrogates and
// the depth and item limits, and yields the JCS form whose digest decides
// "same request content". ok is false for anything malformed
// (invalid_request).
func parseOutboxRequest(body []byte) (r outboxRequest, jcs []byte, ok bool) {
	jcs, err := envelope.Canonicalize(body)
	if err != nil || len(jcs) == 0 || jcs[0] != '{' {
		return outboxRequest{}, nil, false
	}
	// The raw body, not the JCS form, so max_attempts is judged as sent: 8.0
	// or 8e0 canonicalize to 8 but are not the integer the contract asks for.
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return outboxRequest{}, nil, false
	}
	for name := range m {
		if !outboxMembers[name] {
			return outboxRequest{}, nil, false
		}
	}
	if r.ProjectID, ok = jsonString(m["project_id"]); !ok || !envelope.ValidIdentity(r.ProjectID) {
		return outboxRequest{}, nil, false
	}
	if r.Topic, ok = jsonString(m["topic"]); !ok || !store.ValidTopic(r.Topic) {
		return outboxRequest{}, nil, false
	}
	if r.IdempotencyKey, ok = jsonString(m["idempotency_key"]); !ok || !envelope.ValidIdempotencyKey(r.IdempotencyKey) {
		return outboxRequest{}, nil, false
	}
	if r.Kind, ok = jsonString(m["kind"]); !ok || (envelope.Metadata{Kind: r.Kind}).Validate() != nil {
		return outboxRequest{}, nil, false
	}
	payload, present := m["payload"]
	if !present {
		return outboxRequest{}, nil, false
	}
	r.Payload = payload
	r.MaxAttempts = store.DefaultMaxAttempts
	if raw, present := m["max_attempts"]; present {
		n, ok := exactInt(raw)
		if !ok || n < store.MinMaxAttempts || n > store.MaxMaxAttempts {
			return outboxRequest{}, nil, false
		}
		r.MaxAttempts = n
	}
	return r, jcs, true
}

// jsonString decodes raw when it is a JSON string; null, which
// encoding/json would take as "leave it empty", is not one.
func jsonString(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false
	}
	return s, true
}

// exactInt accepts a non-negative JSON integer written without sign,
// fraction or exponent, small enough to matter here.
func exactInt(raw json.RawMessage) (int, bool) {
	if len(raw) == 0 || len(raw) > 9 {
		return 0, false
	}
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(string(raw))
	return n, err == nil
}

// newOutboundEventID is a fresh event_id for an outbound envelope: 128
// random bits, so ids never collide across replicas or restarts.
func newOutboundEventID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return "ob-" + hex.EncodeToString(b[:])
}

// postOutbox is POST /v1/outbox (contract §4): build, sign and store an
// outbound envelope and one message per active endpoint of the topic.
func (s *Server) postOutbox(c echo.Context) error {
	body, ok := s.readBody(c, reasonInvalidRequest)
	if !ok {
		return nil
	}
	id, ok := s.admit(c)
	if !ok {
		return nil
	}
	d, err := s.takeOutbox(c.Request().Context(), id)
	if !s.spend(c, limiterOutbox, d, err) {
		return nil
	}
	if id.Role != store.RoleService {
		return s.refuse(c, reasonForbidden)
	}
	r, jcs, ok := parseOutboxRequest(body)
	if !ok {
		return s.refuse(c, reasonInvalidRequest)
	}
	ctx := c.Request().Context()
	keyID, priv, err := s.keys.Key(ctx, id.TenantID)
	if errors.Is(err, outboundkeys.ErrNoKey) {
		return s.refuse(c, reasonNoSigningKey)
	}
	if err != nil {
		return s.unavailable(c, "signing_key", err)
	}

	// Whole milliseconds: enough to order a stream's envelopes in time, and
	// a short, stable issued_at for receivers that parse it.
	issuedAt := s.cfg.Now().UTC().Truncate(time.Millisecond)
	req := store.EnqueueRequest{
		ProjectID:         r.ProjectID,
		ProducerID:        id.DeviceID,
		Topic:             r.Topic,
		IdempotencyDigest: envelope.IdempotencyDigest(id.TenantID, r.ProjectID, r.IdempotencyKey),
		RequestDigest:     sha256.Sum256(jcs),
		MaxAttempts:       r.MaxAttempts,
		// Build runs inside the store's transaction, once per attempt of
		// it; each run makes a new event_id, and only the committed one is
		// ever seen.
		Build: func(seq int64) ([]byte, string, error) {
			env, err := envelope.Sign(envelope.Draft{
				TenantID:       id.TenantID,
				ProjectID:      r.ProjectID,
				ProducerID:     id.DeviceID,
				EventID:        newOutboundEventID(),
				IdempotencyKey: r.IdempotencyKey,
				KeyID:          keyID,
				Sequence:       seq,
				IssuedAt:       issuedAt,
				Metadata:       envelope.Metadata{Kind: r.Kind},
				Payload:        r.Payload,
			}, priv)
			if err != nil {
				return nil, "", err
			}
			return env.Canonical(), env.EventIdentity(), nil
		},
	}
	sctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
	res, err := s.store.Enqueue(sctx, actorOf(id, state(c).correlationID), req)
	cancel()
	switch {
	case errors.Is(err, store.ErrIdempotencyConflict):
		return s.refuse(c, reasonIdempotencyConflict)
	case errors.Is(err, store.ErrNoEndpoint):
		return s.refuse(c, reasonNoEndpoint)
	case errors.Is(err, store.ErrInvalid):
		// Everything the store checks was checked above, except the
		// credential's device as a producer id.
		return s.refuse(c, reasonInvalidRequest)
	case err != nil:
		var envErr *envelope.Error
		if errors.As(err, &envErr) {
			// The request fit its limits but the envelope built from it
			// does not (it has more members and bytes than the request):
			// a permanent answer, not a 503 to retry forever.
			return s.refuse(c, reasonInvalidRequest)
		}
		return s.unavailable(c, "enqueue", err)
	}

	status, outcome := http.StatusCreated, "created"
	if !res.Created {
		status, outcome = http.StatusOK, "repeated"
	}
	ids := res.MessageIDs
	if ids == nil {
		ids = []string{}
	}
	idsJSON, err := json.Marshal(ids)
	if err != nil {
		return s.unavailable(c, "encode", err)
	}
	// Written by hand so the stored envelope goes out byte for byte: it is
	// what was signed, and a repeat must be byte-identical. A repeat after
	// the body expired has none (§8.9).
	out := make([]byte, 0, len(res.Envelope)+len(idsJSON)+48)
	out = append(out, `{"envelope":`...)
	if res.PayloadExpired {
		out = append(out, `null,"payload_expired":true`...)
	} else {
		out = append(out, res.Envelope...)
	}
	out = append(out, `,"message_ids":`...)
	out = append(out, idsJSON...)
	out = append(out, '}')
	st := state(c)
	st.outcome = outcome
	s.metrics.outbox.WithLabelValues(outcome).Inc()
	return c.Blob(status, echo.MIMEApplicationJSON, out)
}

// outboxStatus is the contract's message status object; null for what is
// unset.
type outboxStatus struct {
	MessageID     string  `json:"message_id"`
	EndpointID    string  `json:"endpoint_id"`
	Topic         string  `json:"topic"`
	Status        string  `json:"status"`
	Attempts      int     `json:"attempts"`
	LastErrorCode *string `json:"last_error_code"`
	NextAttemptAt *string `json:"next_attempt_at"`
	DeliveredAt   *string `json:"delivered_at"`
	// Only once the envelope's body expired (§8.9).
	PayloadExpired bool `json:"payload_expired,omitempty"`
}

func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func optTime(t *time.Time) *string {
	if t == nil {
		return nil
	}
	v := formatTime(*t)
	return &v
}

func statusBody(m store.MessageStatus) outboxStatus {
	b := outboxStatus{
		MessageID: m.MessageID, EndpointID: m.EndpointID, Topic: m.Topic, Status: m.Status,
		Attempts: m.Attempts, NextAttemptAt: optTime(m.NextAttemptAt), DeliveredAt: optTime(m.DeliveredAt),
		PayloadExpired: m.PayloadExpired,
	}
	if m.LastErrorCode != "" {
		code := m.LastErrorCode
		b.LastErrorCode = &code
	}
	return b
}

// getOutboxMessage is GET /v1/outbox/{message_id}, for service and operator
// credentials of the message's tenant. Another tenant's id is not_found, as
// an unknown one: existence is not revealed across tenants.
func (s *Server) getOutboxMessage(c echo.Context) error {
	id, ok := s.admit(c)
	if !ok {
		return nil
	}
	if id.Role != store.RoleService && id.Role != store.RoleOperator {
		return s.refuse(c, reasonForbidden)
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.StoreTimeout)
	defer cancel()
	m, err := s.store.OutboxMessage(ctx, id.TenantID, c.Param("id"))
	if errors.Is(err, store.ErrNotFound) {
		return s.refuse(c, reasonNotFound)
	}
	if err != nil {
		return s.unavailable(c, "outbox_message", err)
	}
	state(c).outcome = "read"
	writeJSON(c, http.StatusOK, statusBody(m))
	return nil
}

type deadLetter struct {
	MessageID  string `json:"message_id"`
	EndpointID string `json:"endpoint_id"`
	Topic      string `json:"topic"`
	Attempts   int    `json:"attempts"`
	ErrorCode  string `json:"error_code"`
	CreatedAt  string `json:"created_at"`
	DeadAt     string `json:"dead_at"`
}

type deadLetterPage struct {
	DeadLetters []deadLetter `json:"dead_letters"`
	NextAfter   *string      `json:"next_after"`
}

// maxCursorLen bounds the opaque cursor before the store parses it.
const maxCursorLen = 256

// getDeadLetters is GET /v1/dead-letters for operators: a project's dead
// messages in the credential's tenant, oldest death first.
func (s *Server) getDeadLetters(c echo.Context) error {
	id, ok := s.admit(c)
	if !ok {
		return nil
	}
	if id.Role != store.RoleOperator {
		return s.refuse(c, reasonForbidden)
	}
	q := c.QueryParams()
	projects, present := q["project_id"]
	if !present || len(projects) != 1 || !envelope.ValidIdentity(projects[0]) {
		return s.refuse(c, reasonInvalidRequest)
	}
	limit := store.MaxDeadLetterPage
	if vs, present := q["limit"]; present {
		n, err := strconv.Atoi(vs[0])
		if len(vs) != 1 || err != nil || n < 1 || n > store.MaxDeadLetterPage {
			return s.refuse(c, reasonInvalidPage)
		}
		limit = n
	}
	after := ""
	if vs, present := q["after"]; present {
		if len(vs) != 1 || vs[0] == "" || len(vs[0]) > maxCursorLen {
			return s.refuse(c, reasonInvalidPage)
		}
		after = vs[0]
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.StoreTimeout)
	defer cancel()
	rows, next, err := s.store.ListDeadLetters(ctx, id.TenantID, projects[0], limit, after)
	if errors.Is(err, store.ErrInvalid) {
		// Parameters were checked above; what is left is a cursor the store
		// cannot read.
		return s.refuse(c, reasonInvalidPage)
	}
	if err != nil {
		return s.unavailable(c, "list_dead_letters", err)
	}
	page := deadLetterPage{DeadLetters: make([]deadLetter, 0, len(rows)), NextAfter: next}
	for _, d := range rows {
		page.DeadLetters = append(page.DeadLetters, deadLetter{
			MessageID: d.MessageID, EndpointID: d.EndpointID, Topic: d.Topic, Attempts: d.Attempts,
			ErrorCode: d.ErrorCode, CreatedAt: formatTime(d.CreatedAt), DeadAt: formatTime(d.DeadAt),
		})
	}
	state(c).outcome = "read"
	writeJSON(c, http.StatusOK, page)
	return nil
}

// replayDeadLetter is POST /v1/dead-letters/{message_id}/replay for
// operators; the store writes the "replayed" audit row in the same
// transaction.
func (s *Server) replayDeadLetter(c echo.Context) error {
	id, ok := s.admit(c)
	if !ok {
		return nil
	}
	if id.Role != store.RoleOperator {
		return s.refuse(c, reasonForbidden)
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.StoreTimeout)
	defer cancel()
	m, err := s.store.ReplayDeadLetter(ctx, actorOf(id, state(c).correlationID), c.Param("id"))
	switch {
	case errors.Is(err, store.ErrNotFound):
		return s.refuse(c, reasonNotFound)
	case errors.Is(err, store.ErrNotDead):
		return s.refuse(c, reasonNotDead)
	case errors.Is(err, store.ErrPayloadExpired):
		return s.refuse(c, reasonPayloadExpired)
	case err != nil:
		return s.unavailable(c, "replay_dead_letter", err)
	}
	state(c).outcome = store.OutcomeReplayed
	writeJSON(c, http.StatusOK, statusBody(m))
	return nil
}
