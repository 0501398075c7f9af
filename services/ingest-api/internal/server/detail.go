package server

import (
	"errors"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
)

// The "detail" sentences of this service's refusals (contract §8.11): each
// names the rule that failed and, where there is one, the contract member it
// concerns, and never anything taken from the request. Refusals decided by
// the envelope module carry that module's sentences (envelope.KnownDetails);
// everything else says one of these. 5xx answers carry none: what failed
// inside is the log's business, and a client can only retry.
const (
	detailNoCredential      = "Authorization must be a Bearer credential"
	detailBadCredential     = "the Bearer credential is not a live credential"
	detailPeerLimited       = "the client address has used up its request rate"
	detailSyncLimited       = "the credential has used up its sync-ingest rate"
	detailOutboxLimited     = "the credential has used up its outbox-enqueue rate"
	detailRoleDevice        = "only role device may use this route"
	detailRoleService       = "only role service may use this route"
	detailRoleOperator      = "only role operator may use this route"
	detailRoleServiceOrOps  = "only roles service and operator may use this route"
	detailOwnStream         = "a device may read only its own producer's stream"
	detailTenantMismatch    = "tenant_id must be the credential's tenant"
	detailProducerMismatch  = "producer_id must be the credential's device"
	detailIdempotencyHeader = "the Idempotency-Key header must equal the envelope's idempotency_key"
	detailUnknownKey        = "key_id names no key of the credential's tenant"
	detailBadSignature      = "signature does not verify with the key key_id names"
	detailKeyRetired        = "key_id names a key retired before issued_at"
	detailKeyRevoked        = "key_id names a revoked key, which verifies only exact duplicates"
	detailEventConflict     = "event_id is already retained with other content"
	detailIdempotencyUsed   = "idempotency_key is already used with other content"
	detailBelowFloor        = "sequence is at or below the stream's replay floor"
	detailSequenceTaken     = "sequence is already held by another event"
	detailTooFarAhead       = "sequence is too far ahead of the stream's cursor"
	detailUnreadableBody    = "the request body could not be read"
	detailNoRoute           = "no route has this path"
	detailNoMethod          = "the route does not take this method"
	detailNoMessage         = "message_id names no message of the credential's tenant"
	detailNotDead           = "the message is not a dead letter"
	detailBodyExpired       = "the message's envelope body has expired"
	detailNoSigningKey      = "the tenant has no outbound signing key"
	detailNoEndpoint        = "no active endpoint subscribes to the topic"
	detailPathProject       = "project_id must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
	detailPathProducer      = "producer_id must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
	detailQueryProject      = "project_id is required, once, and must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
	detailPageLimit         = "limit must be an integer in 1..100"
	detailPageAfter         = "after must be a non-negative integer"
	detailPageCursor        = "after must be a next_after cursor of this route"
	detailOutboxNotObject   = "the request must be a JSON object"
	detailOutboxUnknown     = "the request has a member the route does not take"
	detailOutboxProject     = "project_id must be a string matching ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
	detailOutboxTopic       = "topic must be a string matching ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
	detailOutboxKey         = "idempotency_key must be a string of 1-255 bytes, each 0x21-0x7E"
	detailOutboxKind        = "kind must be a string matching ^[a-z][a-z0-9_.-]{0,63}$"
	detailOutboxPayload     = "payload is required"
	detailOutboxMaxAttempts = "max_attempts must be an integer in 1..50"
	detailOutboxEnvelope    = "the envelope built from the request would break the envelope limits"
	detailOutboxProducer    = "the credential's device is not a valid producer_id"
)

// ownDetails lists every sentence above, for the tests that hold each
// refusal to a known sentence.
var ownDetails = []string{
	detailNoCredential, detailBadCredential, detailPeerLimited, detailSyncLimited, detailOutboxLimited,
	detailRoleDevice, detailRoleService, detailRoleOperator, detailRoleServiceOrOps, detailOwnStream,
	detailTenantMismatch, detailProducerMismatch, detailIdempotencyHeader, detailUnknownKey, detailBadSignature,
	detailKeyRetired, detailKeyRevoked, detailEventConflict, detailIdempotencyUsed, detailBelowFloor,
	detailSequenceTaken, detailTooFarAhead, detailUnreadableBody, detailNoRoute, detailNoMethod, detailNoMessage,
	detailNotDead, detailBodyExpired, detailNoSigningKey, detailNoEndpoint, detailPathProject, detailPathProducer,
	detailQueryProject, detailPageLimit, detailPageAfter, detailPageCursor, detailOutboxNotObject,
	detailOutboxUnknown, detailOutboxProject, detailOutboxTopic, detailOutboxKey, detailOutboxKind,
	detailOutboxPayload, detailOutboxMaxAttempts, detailOutboxEnvelope, detailOutboxProducer,
}

// storeDetail is the sentence of a refusal the store decides at step 5
// (contract §2): one rule each, so the reason alone names it.
var storeDetail = map[wire.Reason]string{
	wire.ReasonEventConflict:       detailEventConflict,
	wire.ReasonIdempotencyConflict: detailIdempotencyUsed,
	wire.ReasonBelowReplayFloor:    detailBelowFloor,
	wire.ReasonSequenceConflict:    detailSequenceTaken,
	wire.ReasonSequenceTooFarAhead: detailTooFarAhead,
}

// limiterDetail is the sentence of a 429, by limiter policy.
var limiterDetail = map[string]string{
	limiterPeer:   detailPeerLimited,
	limiterSync:   detailSyncLimited,
	limiterOutbox: detailOutboxLimited,
}

// envelopeRefusal is the reason and detail of an envelope-module refusal;
// an error that carries none (it cannot happen) is invalid_envelope without
// a detail rather than a guess.
func envelopeRefusal(err error) (wire.Reason, string) {
	var e *envelope.Error
	if errors.As(err, &e) {
		return wire.Reason(e.Reason), e.Detail
	}
	return reasonInvalidEnvelope, ""
}
