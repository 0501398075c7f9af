package store

// HotSQL is the hot statements whose plans TestHotStatementPlansUseTheirKeys
// checks, by name.
var HotSQL = map[string]string{
	"lockStream":     lockStreamSQL,
	"decide":         decideSQL,
	"lockStreams":    lockStreamsSQL,
	"streamState":    streamStateSQL,
	"lookup":         lookupSQL,
	"signedBy":       signedBySQL,
	"stream":         streamSQL,
	"readStream":     readStreamSQL,
	"lockOutbound":   lockOutboundStreamsSQL,
	"outboundByKey":  outboundByKeySQL,
	"topicEndpoints": topicEndpointsSQL,
	"claim":          claimSQL,
	"outboxAttempts": outboxAttemptsSQL,
	// Settles, replay and message reads (outbox_delivery.go, outbox.go).
	"settle":        settleSQL,
	"replay":        replaySQL,
	"listDead":      listDeadSQL,
	"messageExists": messageExistsSQL,
	"outboxMessage": outboxMessageSQL,
	// Outbound retention (outbox_retention.go, migration 0008).
	"expiredAttempts": deleteExpiredAttemptsSQL,
	"expiredBodies":   deleteExpiredBodiesSQL,
	"backfillBodies":  backfillBodiesSQL,
}
