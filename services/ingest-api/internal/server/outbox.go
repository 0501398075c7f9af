package server

import (
	"context"
	"crypto/ed25519"
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
	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/services/ingest-api/internal/outboundkeys"
)

// outboxRequest is a checked POST /v1/outbox body.
type outboxRequest struct {
	ProjectID, Topic, IdempotencyKey, Kind string
	Payload                                []byte
	MaxAttempts                            int
	// Traceparent is not a body member: it is the enqueue's trace
	// (outboundTraceparent), written into the envelope's metadata.
	Traceparent string
}

var outboxMembers = map[string]bool{
	"project_id": true, "topic": true, "idempotency_key": true, "kind": true, "payload": true, "max_attempts": true,
}

// parseOutboxRequest reads the body as strictly as an envelope: the
// envelope reader refuses duplicate members, bad UTF-8, lone surrogates and
// the depth and item limits, and yields the JCS form whose digest decides
// "same request content". ok is false for anything malformed
// (invalid_request), and detail then names the rule that failed (the
// envelope reader's sentence for what it refused).
func parseOutboxRequest(body []byte) (r outboxRequest, jcs []byte, detail string, ok bool) {
	fail := func(d string) (outboxRequest, []byte, string, bool) { return outboxRequest{}, nil, d, false }
	jcs, err := envelope.Canonicalize(body)
	if err != nil {
		_, d := envelopeRefusal(err)
		return fail(d)
	}
	if len(jcs) == 0 || jcs[0] != '{' {
		return fail(detailOutboxNotObject)
	}
	// The raw body, not the JCS form, so max_attempts is judged as sent: 8.0
	// or 8e0 canonicalize to 8 but are not the integer the contract asks for.
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return fail(detailOutboxNotObject)
	}
	for name := range m {
		if !outboxMembers[name] {
			return fail(detailOutboxUnknown)
		}
	}
	if r.ProjectID, ok = jsonString(m["project_id"]); !ok || !envelope.ValidIdentity(r.ProjectID) {
		return fail(detailOutboxProject)
	}
	if r.Topic, ok = jsonString(m["topic"]); !ok || !store.ValidTopic(r.Topic) {
		return fail(detailOutboxTopic)
	}
	if r.IdempotencyKey, ok = jsonString(m["idempotency_key"]); !ok || !envelope.ValidIdempotencyKey(r.IdempotencyKey) {
		return fail(detailOutboxKey)
	}
	if r.Kind, ok = jsonString(m["kind"]); !ok || (envelope.Metadata{Kind: r.Kind}).Validate() != nil {
		return fail(detailOutboxKind)
	}
	payload, present := m["payload"]
	if !present {
		return fail(detailOutboxPayload)
	}
	r.Payload = payload
	r.MaxAttempts = store.DefaultMaxAttempts
	if raw, present := m["max_attempts"]; present {
		n, ok := exactInt(raw)
		if !ok || n < store.MinMaxAttempts || n > store.MaxMaxAttempts {
			return fail(detailOutboxMaxAttempts)
		}
		r.MaxAttempts = n
	}
	return r, jcs, "", true
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

// outboxSigner is a tenant's outbound signing key, looked up once a request.
type outboxSigner struct {
	keyID string
	priv  ed25519.PrivateKey
}

// signer looks up the tenant's outbound key; ok is false for a tenant
// without one (no_signing_key), err a failing key source (503).
func (s *Server) signer(ctx context.Context, tenant string) (outboxSigner, bool, error) {
	keyID, priv, err := s.keys.Key(ctx, tenant)
	if errors.Is(err, outboundkeys.ErrNoKey) {
		return outboxSigner{}, false, nil
	}
	if err != nil {
		return outboxSigner{}, false, err
	}
	return outboxSigner{keyID: keyID, priv: priv}, true, nil
}

// enqueueItem is the store's item for one checked request. Build runs inside
// the store's transaction, once the sequence is known, and again if that
// transaction is rerun; each run makes a new event_id, and only the
// committed one is ever seen.
func enqueueItem(actor store.Actor, producer string, r outboxRequest, jcs []byte, sg outboxSigner, issuedAt time.Time) store.EnqueueItem {
	return store.EnqueueItem{Actor: actor, Request: store.EnqueueRequest{
		ProjectID:         r.ProjectID,
		ProducerID:        producer,
		Topic:             r.Topic,
		IdempotencyDigest: envelope.IdempotencyDigest(actor.TenantID, r.ProjectID, r.IdempotencyKey),
		RequestDigest:     sha256.Sum256(jcs),
		MaxAttempts:       r.MaxAttempts,
		Build: func(seq int64) ([]byte, string, error) {
			env, err := envelope.Sign(envelope.Draft{
				TenantID:       actor.TenantID,
				ProjectID:      r.ProjectID,
				ProducerID:     producer,
				EventID:        newOutboundEventID(),
				IdempotencyKey: r.IdempotencyKey,
				KeyID:          sg.keyID,
				Sequence:       seq,
				IssuedAt:       issuedAt,
				Metadata:       envelope.Metadata{Kind: r.Kind, Traceparent: r.Traceparent},
				Payload:        r.Payload,
			}, sg.priv)
			if err != nil {
				return nil, "", err
			}
			return env.Canonical(), env.EventIdentity(), nil
		},
	}}
}

// issuedAt is an outbound envelope's issued_at: whole milliseconds are
// enough to order a stream's envelopes in time, and a short, stable value
// for receivers that parse it.
func (s *Server) issuedAt() time.Time { return s.cfg.Now().UTC().Truncate(time.Millisecond) }

// enqueueReply is one enqueue's answer as POST /v1/outbox gives it: a
// refusal reason, or the status and body of a stored envelope. err is a
// failure that is no answer (503).
type enqueueReply struct {
	status  int
	reason  wire.Reason
	detail  string // of a refusal
	outcome string // created, repeated
	body    []byte
}

func replyOf(a store.EnqueueAnswer) (enqueueReply, error) {
	var envErr *envelope.Error
	switch err := a.Err; {
	case errors.Is(err, store.ErrIdempotencyConflict):
		return enqueueReply{reason: reasonIdempotencyConflict, detail: detailIdempotencyUsed}, nil
	case errors.Is(err, store.ErrNoEndpoint):
		return enqueueReply{reason: reasonNoEndpoint, detail: detailNoEndpoint}, nil
	case errors.Is(err, store.ErrInvalid):
		// The envelope built from the request came out unusable: a
		// permanent answer, as below.
		return enqueueReply{reason: reasonInvalidRequest, detail: detailOutboxEnvelope}, nil
	case errors.As(err, &envErr):
		// The request fit its limits but the envelope built from it does
		// not (it has more members and bytes than the request): a
		// permanent answer, not a 503 to retry forever.
		return enqueueReply{reason: reasonInvalidRequest, detail: detailOutboxEnvelope}, nil
	case err != nil:
		return enqueueReply{}, err
	}
	res := a.Result
	rep := enqueueReply{status: http.StatusCreated, outcome: outcomeCreated}
	if !res.Created {
		rep.status, rep.outcome = http.StatusOK, outcomeRepeated
	}
	ids := res.MessageIDs
	if ids == nil {
		ids = []string{}
	}
	idsJSON, err := json.Marshal(ids)
	if err != nil {
		return enqueueReply{}, err
	}
	// Written by hand so the stored envelope goes out byte for byte: it is
	// what was signed, and a repeat must be byte-identical. A repeat after
	// the body expired has none (§8.9). The body is left open so a batch can
	// add its "status".
	out := make([]byte, 0, len(res.Envelope)+len(idsJSON)+48)
	out = append(out, `{"envelope":`...)
	if res.PayloadExpired {
		out = append(out, `null,"payload_expired":true`...)
	} else {
		out = append(out, res.Envelope...)
	}
	out = append(out, `,"message_ids":`...)
	out = append(out, idsJSON...)
	rep.body = out
	return rep, nil
}

// postOutbox is POST /v1/outbox (contract §4): build, sign and store an
// outbound envelope and one message per active endpoint of the topic. The
// store work goes through the outbox group commit (contract §8.6), so many
// requests of one busy producer share a transaction and take consecutive
// sequences in arrival order.
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
		return s.refuse(c, reasonForbidden, detailRoleService)
	}
	r, jcs, detail, ok := parseOutboxRequest(body)
	if !ok {
		return s.refuse(c, reasonInvalidRequest, detail)
	}
	ctx := c.Request().Context()
	sg, ok, err := s.signer(ctx, id.TenantID)
	if err != nil {
		return s.unavailable(c, "signing_key", err)
	}
	if !ok {
		return s.refuse(c, reasonNoSigningKey, detailNoSigningKey)
	}
	st := state(c)
	r.Traceparent = s.outboundTraceparent(c)
	item := enqueueItem(actorOf(id, st.correlationID), id.DeviceID, r, jcs, sg, s.issuedAt())
	committed := st.groupedPhase(spanCommit)
	a, err := s.outboxCommit.submit(ctx, item)
	committed()
	if errors.Is(err, store.ErrInvalid) {
		// Everything the store checks was checked above, except the
		// credential's device as a producer id.
		return s.refuse(c, reasonInvalidRequest, detailOutboxProducer)
	}
	if err != nil {
		return s.unavailable(c, "enqueue", err)
	}
	rep, err := replyOf(a)
	if err != nil {
		return s.unavailable(c, "enqueue", err)
	}
	if rep.reason != "" {
		return s.refuse(c, rep.reason, rep.detail)
	}
	st.outcome = rep.outcome
	s.metrics.outbox.WithLabelValues(rep.outcome).Inc()
	return c.Blob(rep.status, echo.MIMEApplicationJSON, append(rep.body, '}'))
}

// postOutboxBatch is POST /v1/outbox/batch (contract §8.5): 1–100 bodies of
// POST /v1/outbox, answered per item, in order, as if sent one by one, all
// committed in one transaction (store.EnqueueBatch) or none (503).
//
// Order: the body limit, the peer limiter, authentication and the first
// outbox-limiter token (a refusal is the whole request's 429), the role
// check, then the wrapper (not {"messages":[…]} of 1–100 items: 400
// invalid_request, nothing stored). Items 2…n each take a token; from the
// first refused one on, the rest are answered rate_limited (429) and the
// ones before are processed. Each item is then checked as POST /v1/outbox
// checks its body (400 invalid_request, 422 no_signing_key).
func (s *Server) postOutboxBatch(c echo.Context) error {
	body, ok := s.readBody(c, reasonInvalidRequest)
	if !ok {
		return nil
	}
	id, ok := s.admit(c)
	if !ok {
		return nil
	}
	ctx := c.Request().Context()
	d, err := s.takeOutbox(ctx, id)
	if !s.spend(c, limiterOutbox, d, err) {
		return nil
	}
	if id.Role != store.RoleService {
		return s.refuse(c, reasonForbidden, detailRoleService)
	}
	raws, err := envelope.SplitOutboxBatch(body)
	if err != nil {
		if r, _ := envelope.ReasonOf(err); r == envelope.ReasonBodyTooLarge {
			return s.refuseTooLarge(c)
		}
		_, detail := envelopeRefusal(err)
		return s.refuse(c, reasonInvalidRequest, detail)
	}
	processed := len(raws)
	for i := 1; i < len(raws); i++ {
		d, err := s.takeOutbox(ctx, id)
		if err != nil {
			return s.unavailable(c, limiterOutbox+"_limiter", err)
		}
		if !d.Allowed {
			s.metrics.limiterRefused.WithLabelValues(limiterOutbox).Inc()
			processed = i
			break
		}
	}

	st := state(c)
	actor := actorOf(id, st.correlationID)
	sg, hasKey, err := s.signer(ctx, id.TenantID)
	if err != nil {
		return s.unavailable(c, "signing_key", err)
	}
	replies := make([]enqueueReply, len(raws))
	var items []store.EnqueueItem
	var itemOf []int // replies index of each store item
	issuedAt := s.issuedAt()
	traceparent := s.outboundTraceparent(c)
	for i, raw := range raws {
		switch r, jcs, detail, ok := parseOutboxRequest(raw); {
		case i >= processed:
			replies[i].reason, replies[i].detail = reasonRateLimited, detailOutboxLimited
		case !ok:
			replies[i].reason, replies[i].detail = reasonInvalidRequest, detail
		case !hasKey:
			replies[i].reason, replies[i].detail = reasonNoSigningKey, detailNoSigningKey
		default:
			r.Traceparent = traceparent
			items = append(items, enqueueItem(actor, id.DeviceID, r, jcs, sg, issuedAt))
			itemOf = append(itemOf, i)
		}
	}
	if len(items) > 0 {
		// Detached from the request: once sent, the transaction decides for
		// every item, and a client gone meanwhile must not leave it half
		// answered (it commits or it does not).
		committed := st.phase(spanCommit)
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.StoreTimeout)
		answers, err := s.store.outbox.EnqueueBatch(cctx, items)
		cancel()
		committed()
		if err == nil && len(answers) != len(items) {
			err = errors.New("store returned an answer count unlike the item count")
		}
		if errors.Is(err, store.ErrInvalid) {
			return s.refuse(c, reasonInvalidRequest, detailOutboxProducer) // as in postOutbox: the credential's device
		}
		if err != nil {
			return s.unavailable(c, "enqueue_batch", err)
		}
		for j, a := range answers {
			if replies[itemOf[j]], err = replyOf(a); err != nil {
				return s.unavailable(c, "enqueue_batch", err)
			}
		}
	}

	out := make([]byte, 0, 64*len(replies))
	out = append(out, `{"results":[`...)
	for i, rep := range replies {
		if i > 0 {
			out = append(out, ',')
		}
		if rep.reason != "" {
			b, err := json.Marshal(batchResult{
				Answer: answer{Outcome: outcomeRefused, Reason: rep.reason, CorrelationID: st.correlationID, Detail: rep.detail},
				Status: rep.reason.Status(),
			})
			if err != nil {
				return s.unavailable(c, "encode", err)
			}
			out = append(out, b...)
			continue
		}
		s.metrics.outbox.WithLabelValues(rep.outcome).Inc()
		out = append(out, rep.body...)
		out = append(out, `,"status":`...)
		out = strconv.AppendInt(out, int64(rep.status), 10)
		out = append(out, '}')
	}
	out = append(out, "]}"...)
	st.outcome, st.reason, st.items = "batch", "", len(replies)
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, out)
}

func optTime(t *time.Time) *string {
	if t == nil {
		return nil
	}
	v := wire.FormatTime(*t)
	return &v
}

func statusBody(m store.MessageStatus) wire.MessageStatus {
	b := wire.MessageStatus{
		MessageID: m.MessageID, EndpointID: m.EndpointID, Topic: m.Topic, Status: wire.MessageState(m.Status),
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
	return serveTenantRead(s, c, "outbox_message", func(ctx context.Context, tenant string) (any, error) {
		m, err := s.store.outbox.OutboxMessage(ctx, tenant, c.Param("id"))
		return statusBody(m), err
	})
}

// serveTenantRead answers the read-only routes of service and operator
// credentials (a message's status, its attempts, the outbound keys): the
// same admission, role rule, store timeout, refusals and outcome for each,
// so they cannot drift apart. read gets the credential's tenant; its
// store.ErrNotFound is 404 not_found, any other error 503 (what names the
// failing read in the log).
func serveTenantRead(s *Server, c echo.Context, what string, read func(ctx context.Context, tenant string) (any, error)) error {
	id, ok := s.admit(c)
	if !ok {
		return nil
	}
	if id.Role != store.RoleService && id.Role != store.RoleOperator {
		return s.refuse(c, reasonForbidden, detailRoleServiceOrOps)
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.StoreTimeout)
	defer cancel()
	body, err := read(ctx, id.TenantID)
	if errors.Is(err, store.ErrNotFound) {
		return s.refuse(c, reasonNotFound, detailNoMessage)
	}
	if err != nil {
		return s.unavailable(c, what, err)
	}
	state(c).outcome = outcomeRead
	writeJSON(c, http.StatusOK, body)
	return nil
}

func attemptsAnswer(as []store.Attempt) wire.Attempts {
	out := wire.Attempts{Attempts: make([]wire.Attempt, 0, len(as))}
	for _, a := range as {
		e := wire.Attempt{Attempt: a.Attempt, StartedAt: wire.FormatTime(a.StartedAt), DurationMS: a.Duration.Milliseconds(),
			Result: wire.AttemptResult(a.Result)}
		if a.HTTPStatus != 0 {
			status := a.HTTPStatus
			e.HTTPStatus = &status
		}
		if a.ErrorCode != "" {
			code := a.ErrorCode
			e.ErrorCode = &code
		}
		out.Attempts = append(out.Attempts, e)
	}
	return out
}

// getOutboxAttempts is GET /v1/outbox/{message_id}/attempts: the message's
// latest store.MaxAttemptHistory attempts, oldest first, for the same
// credentials and with the same refusals as GET /v1/outbox/{message_id}.
func (s *Server) getOutboxAttempts(c echo.Context) error {
	return serveTenantRead(s, c, "outbox_attempts", func(ctx context.Context, tenant string) (any, error) {
		as, err := s.store.outbox.OutboxAttempts(ctx, tenant, c.Param("id"))
		return attemptsAnswer(as), err
	})
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
		return s.refuse(c, reasonForbidden, detailRoleOperator)
	}
	q := c.QueryParams()
	projects, present := q["project_id"]
	if !present || len(projects) != 1 || !envelope.ValidIdentity(projects[0]) {
		return s.refuse(c, reasonInvalidRequest, detailQueryProject)
	}
	limit := store.MaxDeadLetterPage
	if vs, present := q["limit"]; present {
		n, err := strconv.Atoi(vs[0])
		if len(vs) != 1 || err != nil || n < 1 || n > store.MaxDeadLetterPage {
			return s.refuse(c, reasonInvalidPage, detailPageLimit)
		}
		limit = n
	}
	after := ""
	if vs, present := q["after"]; present {
		if len(vs) != 1 || vs[0] == "" || len(vs[0]) > maxCursorLen {
			return s.refuse(c, reasonInvalidPage, detailPageCursor)
		}
		after = vs[0]
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.StoreTimeout)
	defer cancel()
	rows, next, err := s.store.outbox.ListDeadLetters(ctx, id.TenantID, projects[0], limit, after)
	if errors.Is(err, store.ErrInvalid) {
		// Parameters were checked above; what is left is a cursor the store
		// cannot read.
		return s.refuse(c, reasonInvalidPage, detailPageCursor)
	}
	if err != nil {
		return s.unavailable(c, "list_dead_letters", err)
	}
	page := wire.DeadLetterPage{DeadLetters: make([]wire.DeadLetter, 0, len(rows)), NextAfter: next}
	for _, d := range rows {
		page.DeadLetters = append(page.DeadLetters, wire.DeadLetter{
			MessageID: d.MessageID, EndpointID: d.EndpointID, Topic: d.Topic, Attempts: d.Attempts,
			ErrorCode: d.ErrorCode, CreatedAt: wire.FormatTime(d.CreatedAt), DeadAt: wire.FormatTime(d.DeadAt),
		})
	}
	state(c).outcome = outcomeRead
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
		return s.refuse(c, reasonForbidden, detailRoleOperator)
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.StoreTimeout)
	defer cancel()
	m, err := s.store.outbox.ReplayDeadLetter(ctx, actorOf(id, state(c).correlationID), c.Param("id"))
	switch {
	case errors.Is(err, store.ErrNotFound):
		return s.refuse(c, reasonNotFound, detailNoMessage)
	case errors.Is(err, store.ErrNotDead):
		return s.refuse(c, reasonNotDead, detailNotDead)
	case errors.Is(err, store.ErrPayloadExpired):
		return s.refuse(c, reasonPayloadExpired, detailBodyExpired)
	case err != nil:
		return s.unavailable(c, "replay_dead_letter", err)
	}
	state(c).outcome = string(wire.OutcomeReplayed)
	writeJSON(c, http.StatusOK, statusBody(m))
	return nil
}
