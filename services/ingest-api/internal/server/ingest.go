package server

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/limiter"
	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
	"github.com/envelopeworker/envelopeworker/modules/store"
)

// admit runs the peer limiter (step 0) and authentication (step 1). ok is
// false when the request has been answered.
func (s *Server) admit(c echo.Context) (store.Identity, bool) {
	ctx := c.Request().Context()
	addr, _ := netip.ParseAddr(c.RealIP())
	d, err := s.peer.Take(ctx, limiter.NewPeerKey(addr))
	if !s.spend(c, limiterPeer, d, err) {
		return store.Identity{}, false
	}
	authenticated := state(c).phase(spanAuthenticate)
	id, err := s.authenticate(ctx, c.Request().Header.Get(echo.HeaderAuthorization))
	authenticated()
	if errors.Is(err, errUnauthenticated) {
		s.refuse(c, reasonUnauthenticated, authDetail(err))
		return store.Identity{}, false
	}
	if err != nil {
		s.unavailable(c, "verify_credential", err)
		return store.Identity{}, false
	}
	state(c).identity = &id
	return id, true
}

// takeSync spends one sync-limiter token of the identity (step 1b).
func (s *Server) takeSync(ctx context.Context, id store.Identity) (limiter.Decision, error) {
	return s.sync.Take(ctx, identityKey(id, limiter.PurposeSyncIngest))
}

// takeOutbox spends one outbox-limiter token of the identity: one per
// message request (contract §8.4), so a batch route calls it per message.
func (s *Server) takeOutbox(ctx context.Context, id store.Identity) (limiter.Decision, error) {
	return s.outbox.Take(ctx, identityKey(id, limiter.PurposeOutboxEnqueue))
}

func identityKey(id store.Identity, purpose string) limiter.SyncKey {
	return limiter.SyncKey{Tenant: id.TenantID, Account: id.AccountID, Device: id.DeviceID, Purpose: purpose}
}

// spend answers the request when a token could not be had: 503 when the
// limiter failed (fail closed), 429 with Retry-After when it refused. ok is
// false when the request has been answered.
func (s *Server) spend(c echo.Context, policy string, d limiter.Decision, err error) bool {
	if err != nil {
		s.unavailable(c, policy+"_limiter", err)
		return false
	}
	if !d.Allowed {
		s.rateLimited(c, policy, d.RetryAfterSeconds())
		return false
	}
	return true
}

func actorOf(id store.Identity, correlationID string) store.Actor {
	return store.Actor{TenantID: id.TenantID, AccountID: id.AccountID, DeviceID: id.DeviceID, CorrelationID: correlationID}
}

// decision is the outcome of steps 2–4 for one envelope: a BatchItem to
// commit (an ingest, or the audit row of a refusal) and, for a refusal, the
// answer already decided.
type decision struct {
	item    store.BatchItem
	refusal *answer
}

// refusalDecision is a refusal of steps 1c–4; detail is its fixed sentence
// (answered and logged, never audited: the audit row keeps the reason).
func refusalDecision(actor store.Actor, project, eventIdentity string, reason wire.Reason, detail string) decision {
	return decision{
		item: store.BatchItem{Actor: actor, Refusal: &store.AuditEntry{
			ProjectID: project, EventIdentity: eventIdentity, Outcome: string(outcomeRefused), Reason: string(reason),
		}},
		refusal: &answer{Outcome: outcomeRefused, Reason: reason, EventIdentity: eventIdentity, Detail: detail},
	}
}

// idempotencyHeader is the request's Idempotency-Key header, if any.
type idempotencyHeader struct {
	present bool
	values  []string
}

func (h idempotencyHeader) matches(key string) bool {
	return len(h.values) == 1 && h.values[0] == key
}

// keyCache remembers key lookups within one request (a batch usually has
// one signing key).
type keyCache map[string]store.Key

// decide runs steps 2, 3 and 4 for one envelope. An error is a failing
// store (503). With shared set (the single-envelope route), active keys may
// come from the replica's cache, and the decision carries the public key it
// verified with so that the store re-checks it at commit (see activeKeys).
func (s *Server) decide(ctx context.Context, actor store.Actor, raw []byte, idem idempotencyHeader, keys keyCache, shared *activeKeys, now time.Time) (decision, error) {
	p, dec, err := s.resolve(ctx, actor, raw, idem, keys, shared)
	if p == nil || err != nil {
		return dec, err
	}
	return s.finish(ctx, actor, p, shared != nil, now)
}

// signatureVerdict is what is known of an envelope's signature under the
// key it was resolved with.
type signatureVerdict int8

const (
	signatureUnchecked signatureVerdict = iota
	signatureValid
	signatureInvalid
)

// resolved is an envelope that passed step 2 and whose key was found: what
// remains is its signature (step 3) and step 4.
type resolved struct {
	env       *envelope.Envelope
	key       store.Key
	signature signatureVerdict
}

// validSignature reports whether the signature verifies under the resolved
// key, verifying it now unless a batch check or the key cache already did.
func (r *resolved) validSignature() bool {
	if r.signature == signatureUnchecked {
		r.signature = signatureInvalid
		if r.env.Verify(r.key.PublicKey) == nil {
			r.signature = signatureValid
		}
	}
	return r.signature == signatureValid
}

// resolve runs step 2 and finds the envelope's key (the first half of step
// 3). It returns either the envelope with its key, or (nil and) the decision
// already made: a refusal. An error is a failing store (503).
func (s *Server) resolve(ctx context.Context, actor store.Actor, raw []byte, idem idempotencyHeader, keys keyCache, shared *activeKeys) (*resolved, decision, error) {
	env, err := envelope.ParseWithLimits(raw, envelope.DefaultLimits())
	if err != nil {
		reason, detail := envelopeRefusal(err)
		return nil, refusalDecision(actor, "", "", reason, detail), nil
	}
	project, eid := env.ProjectID, env.EventIdentity()
	if env.TenantID != actor.TenantID {
		return nil, refusalDecision(actor, project, eid, reasonRouteMismatch, detailTenantMismatch), nil
	}
	if env.ProducerID != actor.DeviceID {
		return nil, refusalDecision(actor, project, eid, reasonRouteMismatch, detailProducerMismatch), nil
	}
	if idem.present && !idem.matches(env.IdempotencyKey) {
		return nil, refusalDecision(actor, project, eid, reasonIdempotencyKeyMismatch, detailIdempotencyHeader), nil
	}

	// Step 3: the key.
	key, ok := keys[env.KeyID]
	if !ok && shared != nil {
		if key, ok = shared.get(actor.TenantID, env.KeyID); ok {
			// A signature that fails against a cached key is decided from a
			// fresh lookup: the key id may have been pruned and added again.
			if env.Verify(key.PublicKey) == nil {
				return &resolved{env: env, key: key, signature: signatureValid}, decision{}, nil
			}
			shared.drop(actor.TenantID, env.KeyID)
			ok = false
		}
	}
	if !ok {
		lctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
		key, err = s.store.credentials.LookupKey(lctx, actor.TenantID, env.KeyID)
		cancel()
		if errors.Is(err, store.ErrNotFound) {
			return nil, refusalDecision(actor, project, eid, reasonUnknownKey, detailUnknownKey), nil
		}
		if err != nil {
			return nil, decision{}, opError{"lookup_key", err}
		}
		keys[env.KeyID] = key
		if shared != nil {
			shared.put(key)
		}
	}
	return &resolved{env: env, key: key}, decision{}, nil
}

// batchCheckable reports whether a batch check of the signature may stand
// in for finish's own: for active and retired keys finish always verifies;
// for a revoked key it verifies only an exact duplicate of what the key
// signed, so checking it up front would be wasted work.
func (r *resolved) batchCheckable() bool {
	return r.signature == signatureUnchecked && (r.key.State == store.KeyActive || r.key.State == store.KeyRetired)
}

// verifyBatch checks the signatures of a batch's resolved envelopes with one
// batch equation (envelope.BatchVerifier, which accepts exactly what
// Envelope.Verify accepts and gives each item its own verdict). Items
// without a key, or with a revoked one, are left to finish.
func verifyBatch(items []*resolved) {
	var pick []*resolved
	for _, r := range items {
		if r != nil && r.batchCheckable() {
			pick = append(pick, r)
		}
	}
	if len(pick) < 2 {
		return // one signature: finish verifies it on its own
	}
	v := envelope.NewBatchVerifier(len(pick))
	for _, r := range pick {
		v.Add(r.key.PublicKey, r.env.SigningInput(), r.env.Signature)
	}
	_, valid := v.Verify()
	for i, r := range pick {
		r.signature = signatureInvalid
		if valid[i] {
			r.signature = signatureValid
		}
	}
}

// finish runs the rest of step 3 (the signature and the key's state) and
// step 4 for a resolved envelope. cached is the single route's: the key may
// have come from the replica's cache, so an accepted decision carries the
// public key for the store to re-check at commit.
func (s *Server) finish(ctx context.Context, actor store.Actor, r *resolved, cached bool, now time.Time) (decision, error) {
	env, key := r.env, r.key
	project, eid := env.ProjectID, env.EventIdentity()
	switch key.State {
	case store.KeyActive:
		if !r.validSignature() {
			return refusalDecision(actor, project, eid, wire.ReasonBadSignature, detailBadSignature), nil
		}
	case store.KeyRetired:
		if !r.validSignature() {
			return refusalDecision(actor, project, eid, wire.ReasonBadSignature, detailBadSignature), nil
		}
		if key.RetiredAt == nil || env.IssuedAt.After(*key.RetiredAt) {
			return refusalDecision(actor, project, eid, reasonKeyRetired, detailKeyRetired), nil
		}
	default:
		// Revoked (or a state this build does not know: fail closed). Only
		// an exact duplicate of what the key already signed gets through,
		// to be answered duplicate at step 5; whether the signature of
		// anything else would verify is not revealed.
		sctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
		signed, err := s.store.credentials.SignedBy(sctx, actor.TenantID, eid, env.ContentDigest(), env.KeyID)
		cancel()
		if err != nil {
			return decision{}, opError{"signed_by", err}
		}
		if !signed || key.State != store.KeyRevoked {
			return refusalDecision(actor, project, eid, reasonKeyRevoked, detailKeyRevoked), nil
		}
		if !r.validSignature() {
			return refusalDecision(actor, project, eid, wire.ReasonBadSignature, detailBadSignature), nil
		}
	}

	// Step 4.
	if err := env.Validate(now, s.cfg.ReplayWindow); err != nil {
		reason, detail := envelopeRefusal(err)
		return refusalDecision(actor, project, eid, reason, detail), nil
	}

	var verifiedWith []byte
	if cached && key.State == store.KeyActive {
		verifiedWith = key.PublicKey
	}
	return decision{item: store.BatchItem{Actor: actor, Ingest: &store.IngestInput{
		ProjectID:         env.ProjectID,
		ProducerID:        env.ProducerID,
		EventIdentity:     eid,
		KeyID:             env.KeyID,
		IdempotencyDigest: env.IdempotencyDigest(),
		ContentDigest:     env.ContentDigest(),
		Sequence:          env.Sequence,
		IssuedAt:          env.IssuedAt,
		Canonical:         env.Canonical(),
		ExpiresAt:         now.Add(s.cfg.PayloadRetention),
		MaxAhead:          s.cfg.MaxSequenceAhead,
		VerifiedWith:      verifiedWith,
	}}}, nil
}

// opError names the store operation that failed, for the 503's log line and
// metric.
type opError struct {
	op  string
	err error
}

func (e opError) Error() string { return e.op + ": " + e.err.Error() }
func (e opError) Unwrap() error { return e.err }

// answerOf turns a decision and, for items that reached the store, the
// store's result into the contract answer (without correlation id).
func answerOf(d decision, r store.Result) answer {
	if d.refusal != nil {
		return *d.refusal
	}
	a := answer{Outcome: wire.Outcome(r.Outcome), EventIdentity: r.EventIdentity}
	if a.EventIdentity == "" {
		a.EventIdentity = d.item.Ingest.EventIdentity
	}
	switch a.Outcome {
	case outcomeAccepted, outcomeDuplicate:
		cursor := r.Cursor
		a.Cursor = &cursor
	default:
		a.Outcome = outcomeRefused
		a.Reason = wire.Reason(r.Reason)
		a.Detail = storeDetail[a.Reason]
	}
	return a
}

// admitPost runs the steps both post routes share, in contract order: body
// limit, peer limiter, authentication, and the first sync-limiter token
// (steps 0–1b). ok is false when the request has been answered.
func (s *Server) admitPost(c echo.Context) ([]byte, store.Identity, bool) {
	body, ok := s.readBody(c, reasonInvalidEnvelope)
	if !ok {
		return nil, store.Identity{}, false
	}
	id, ok := s.admit(c)
	if !ok {
		return nil, store.Identity{}, false
	}
	d, err := s.takeSync(c.Request().Context(), id)
	if !s.spend(c, limiterSync, d, err) {
		return nil, store.Identity{}, false
	}
	return body, id, true
}

func (s *Server) postEnvelope(c echo.Context) error {
	body, id, ok := s.admitPost(c)
	if !ok {
		return nil
	}
	ctx := c.Request().Context()
	st := state(c)
	actor := actorOf(id, st.correlationID)

	values := c.Request().Header.Values(wire.HeaderIdempotencyKey)
	idem := idempotencyHeader{present: len(values) > 0, values: values}
	var dec decision
	var err error
	verified := st.phase(spanVerify)
	if id.Role != store.RoleDevice {
		dec = refusalDecision(actor, "", "", reasonForbidden, detailRoleDevice)
	} else if dec, err = s.decide(ctx, actor, body, idem, keyCache{}, s.activeKeys, s.cfg.Now()); err != nil {
		return s.storeFailure(c, err)
	}
	verified()
	st.envelopeParent(dec)
	committed := st.groupedPhase(spanCommit)
	res, err := s.commit.submit(ctx, dec.item)
	committed()
	if err == nil && res.Outcome == store.OutcomeStale {
		// The key changed since it was cached: decide again from a fresh
		// lookup, without the cache (the store then checks nothing more).
		s.activeKeys.drop(actor.TenantID, dec.item.Ingest.KeyID)
		verified = st.phase(spanVerify)
		if dec, err = s.decide(ctx, actor, body, idem, keyCache{}, nil, s.cfg.Now()); err != nil {
			return s.storeFailure(c, err)
		}
		verified()
		st.envelopeParent(dec)
		committed = st.groupedPhase(spanCommit)
		res, err = s.commit.submit(ctx, dec.item)
		committed()
	}
	if err != nil {
		return s.storeFailure(c, opError{"ingest", err})
	}
	s.writeAnswer(c, answerOf(dec, res))
	return nil
}

// storeFailure answers 503 for an error from decide or a commit.
func (s *Server) storeFailure(c echo.Context, err error) error {
	op := "store"
	var oe opError
	if errors.As(err, &oe) {
		op = oe.op
	}
	return s.unavailable(c, op, err)
}

func (s *Server) postBatch(c echo.Context) error {
	body, id, ok := s.admitPost(c)
	if !ok {
		return nil
	}
	ctx := c.Request().Context()
	st := state(c)
	actor := actorOf(id, st.correlationID)

	// Whole-request refusals after the limiter are audited once.
	wholeRefusal := func(reason wire.Reason, detail string) error {
		dec := refusalDecision(actor, "", "", reason, detail)
		if _, err := s.commit.submit(ctx, dec.item); err != nil {
			return s.storeFailure(c, opError{"audit", err})
		}
		s.writeAnswer(c, *dec.refusal)
		return nil
	}
	if id.Role != store.RoleDevice {
		return wholeRefusal(reasonForbidden, detailRoleDevice)
	}
	raws, err := envelope.SplitBatch(body)
	if err != nil {
		_, detail := envelopeRefusal(err)
		return wholeRefusal(reasonInvalidEnvelope, detail)
	}

	results := make([]batchResult, len(raws))
	decisions := make([]decision, len(raws))
	pending := make([]*resolved, len(raws))
	processed := len(raws)
	now := s.cfg.Now()
	keys := keyCache{}
	verified := st.phase(spanVerify)
	// Steps 2–4 in three passes: each item parsed and its key found, then
	// every signature that needs checking checked in one batch, then the
	// rest of each item's steps 3 and 4 with its own verdict. The answers
	// are those of deciding the items one by one.
	for i, raw := range raws {
		if i > 0 {
			d, err := s.takeSync(ctx, id)
			if err != nil {
				return s.unavailable(c, limiterSync+"_limiter", err)
			}
			if !d.Allowed {
				s.metrics.limiterRefused.WithLabelValues(limiterSync).Inc()
				processed = i
				break
			}
		}
		pending[i], decisions[i], err = s.resolve(ctx, actor, raw, idempotencyHeader{}, keys, nil)
		if err != nil {
			return s.storeFailure(c, err)
		}
	}
	verifyBatch(pending[:processed])
	for i, r := range pending[:processed] {
		if r == nil {
			continue
		}
		if decisions[i], err = s.finish(ctx, actor, r, false, now); err != nil {
			return s.storeFailure(c, err)
		}
	}

	verified()

	items := make([]store.BatchItem, processed)
	for i := range processed {
		items[i] = decisions[i].item
	}
	committed := st.phase(spanCommit)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.StoreTimeout)
	storeResults, err := s.store.inbound.IngestBatch(cctx, items)
	cancel()
	committed()
	if err == nil && len(storeResults) != len(items) {
		err = errors.New("store returned a result count unlike the item count")
	}
	if err != nil {
		return s.storeFailure(c, opError{"ingest_batch", err})
	}

	for i := range results {
		var a answer
		if i < processed {
			a = answerOf(decisions[i], storeResults[i])
		} else {
			a = answer{Outcome: outcomeRefused, Reason: reasonRateLimited, Detail: detailSyncLimited}
		}
		a.CorrelationID = st.correlationID
		s.metrics.envelopes.WithLabelValues(string(a.Outcome), string(a.Reason)).Inc()
		results[i] = batchResult{Answer: a, Status: a.Reason.Status()}
	}
	st.outcome, st.reason, st.items = "batch", "", len(results)
	st.traceItems(decisions[:processed], results)
	writeJSON(c, http.StatusOK, batchAnswer{Results: results})
	return nil
}
