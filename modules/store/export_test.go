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
	"markDelivered": markDeliveredSQL,
	"markRetry":     markRetrySQL,
	"markDead":      markDeadSQL,
	"replay":        replaySQL,
	"listDead":      listDeadSQL,
	"messageExists": messageExistsSQL,
	"outboxMessage": outboxMessageSQL,
	// Outbound retention (outbox_retention.go, migration 0008).
	"expiredAttempts": deleteExpiredAttemptsSQL,
	"expiredBodies":   deleteExpiredBodiesSQL,
	"backfillBodies":  backfillBodiesSQL,
}

// SetDigestsEqual replaces the comparison that decides a credential until
// the returned function restores it.
func SetDigestsEqual(f func(stored, digest []byte) int) (restore func()) {
	old := digestsEqual
	digestsEqual = f
	return func() { digestsEqual = old }
}
