package server

import (
	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
)

// The inbound routes' reason codes, outcomes and answer types are defined
// once, in the producer module's wire package, which producers decode with;
// these names keep the handlers short.
const (
	reasonUnauthenticated        = wire.ReasonUnauthenticated
	reasonRateLimited            = wire.ReasonRateLimited
	reasonForbidden              = wire.ReasonForbidden
	reasonRouteMismatch          = wire.ReasonRouteMismatch
	reasonIdempotencyKeyMismatch = wire.ReasonIdempotencyKeyMismatch
	reasonUnknownKey             = wire.ReasonUnknownKey
	reasonKeyRetired             = wire.ReasonKeyRetired
	reasonKeyRevoked             = wire.ReasonKeyRevoked
	reasonBodyTooLarge           = wire.ReasonBodyTooLarge
	reasonInvalidEnvelope        = wire.ReasonInvalidEnvelope
	reasonUnavailable            = wire.ReasonUnavailable
	reasonInvalidRequest         = wire.ReasonInvalidRequest
	reasonInvalidPage            = wire.ReasonInvalidPage
	reasonNotFound               = wire.ReasonNotFound
	reasonMethodNotAllowed       = wire.ReasonMethodNotAllowed
	reasonIdempotencyConflict    = wire.ReasonIdempotencyConflict
	reasonNoSigningKey           = wire.ReasonNoSigningKey
	reasonNoEndpoint             = wire.ReasonNoEndpoint
	reasonNotDead                = wire.ReasonNotDead
	reasonPayloadExpired         = wire.ReasonPayloadExpired
)

const (
	outcomeAccepted  = wire.OutcomeAccepted
	outcomeDuplicate = wire.OutcomeDuplicate
	outcomeRefused   = wire.OutcomeRefused
)

// The outcomes the access log and the requests metric give answers that
// are not envelope answers (health, reads, enqueues): with the wire
// outcomes, the closed set of that metric's outcome label.
const (
	outcomeOK       = "ok"
	outcomeRead     = "read"
	outcomeCreated  = "created"
	outcomeRepeated = "repeated"
)

type (
	answer      = wire.Answer
	batchResult = wire.BatchResult
	batchAnswer = wire.BatchAnswer
)
