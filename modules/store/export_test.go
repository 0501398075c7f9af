package store

// ClaimSQL lets the external tests look at the claim's plan.
const ClaimSQL = claimSQL

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
}
