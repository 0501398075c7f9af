package store

// HotSQL is the hot statements whose plans TestHotStatementPlansUseTheirKeys
// checks, by name.
var HotSQL = map[string]string{
	"lockStream":   lockStreamSQL,
	"decide":       decideSQL,
	"lockStreams":  lockStreamsSQL,
	"streamState":  streamStateSQL,
	"lookup":       lookupSQL,
	"signedBy":     signedBySQL,
	"stream":       streamSQL,
	"readStream":   readStreamSQL,
	"allocate":     allocateSequenceSQL,
	"findOutbound": findOutboundByKeySQL,
	"messageIDs":   messageIDsSQL,
	"claim":        claimSQL,
	// Settles, replay and message reads (outbox_delivery.go, outbox.go).
	"markDelivered":   markDeliveredSQL,
	"markRetry":       markRetrySQL,
	"markDead":        markDeadSQL,
	"replay":          replaySQL,
	"listDead":        listDeadSQL,
	"messageExists":   messageExistsSQL,
	"outboxMessage":   outboxMessageSQL,
	"activeEndpoints": activeEndpointsSQL,
}
