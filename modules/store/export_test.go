package store

// ClaimSQL lets the external tests look at the claim's plan.
const ClaimSQL = claimSQL

// HotSQL is the hot statements whose plans TestHotStatementPlansUseTheirKeys
// checks, by name.
var HotSQL = map[string]string{
	"lockStream":      lockStreamSQL,
	"decide":          decideSQL,
	"lockStreams":     lockStreamsSQL,
	"streamState":     streamStateSQL,
	"lookup":          lookupSQL,
	"signedBy":        signedBySQL,
	"stream":          streamSQL,
	"readStream":      readStreamSQL,
	"allocate":        allocateSequenceSQL,
	"findOutbound":    findOutboundByKeySQL,
	"messageIDs":      messageIDsSQL,
	"claim":           claimSQL,
	"delivered":       markDeliveredSQL,
	"retry":           markRetrySQL,
	"dead":            markDeadSQL,
	"replay":          replaySQL,
	"status":          outboxMessageSQL,
	"expiredAttempts": deleteExpiredAttemptsSQL,
	"expiredBodies":   deleteExpiredBodiesSQL,
	"backfillBodies":  backfillBodiesSQL,
}
