package store

import (
	"database/sql"
	"strconv"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
)

// renderDB only formats bun queries into text; it never connects.
var renderDB = bun.NewDB(new(sql.DB), pgdialect.New())

// param is the bind parameter $n, which a bun query rendered with it in
// place of a value carries to the plan tests' PREPARE.
func param(n int) bun.Safe { return bun.Safe("$" + strconv.Itoa(n)) }

// HotSQL is the hot statements whose plans TestHotStatementPlansUseTheirKeys
// checks, by name. The bun queries among them (listDead, listDeadAfter,
// outboxAttempts) are rendered with parameters for their values; their
// limits are the ones the store passes.
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
	"outboxAttempts": outboxAttemptsQuery(renderDB, param(1), param(2), MaxAttemptHistory).String(),
	// Settles, replay and message reads (outbox_settle.go, outbox_deadletters.go, outbox.go).
	"settle": settleSQL,
	"replay": replaySQL,
	"listDead": listDeadQuery(renderDB, (*outboxMessageModel)(nil), param(1), param(2), false, nil, nil,
		MaxDeadLetterPage+1).String(),
	"listDeadAfter": listDeadQuery(renderDB, (*outboxMessageModel)(nil), param(1), param(2), true, param(3), param(4),
		MaxDeadLetterPage+1).String(),
	"messageExists": messageExistsSQL,
	"outboxMessage": outboxMessageSQL,
	// Outbound retention (outbox_retention.go, migration 0008).
	"expiredAttempts": deleteExpiredAttemptsSQL,
	"expiredBodies":   deleteExpiredBodiesSQL,
	"backfillBodies":  backfillBodiesSQL,
}

// CrossTenantSQL is the statements that read every tenant's rows by design,
// which TestHotStatementsTouchOnePartition names and bounds.
var CrossTenantSQL = map[string]string{
	"dueTenants":      dueTenantsSQL,
	"outboxStats":     outboxStatsSQL,
	"expiredPayloads": deleteExpiredSQL,
	"expiredAttempts": deleteExpiredAttemptsSQL,
	"expiredBodies":   deleteExpiredBodiesSQL,
	"backfillBodies":  backfillBodiesSQL,
}

// PartitionSweepSQL is the retention deletes as the partitioned layout runs
// them, on the partitions of one hash bound (partitions.go).
func PartitionSweepSQL(payloads, bodies, attempts string) map[string]string {
	return map[string]string{
		"expiredPayloads": deleteExpiredPayloadsSQL(payloads),
		"expiredAttempts": deleteExpiredAttemptsFrom(bodies, attempts),
		"expiredBodies":   deleteExpiredBodiesFrom(bodies),
	}
}

// SetDigestsEqual replaces the comparison that decides a credential until
// the returned function restores it.
func SetDigestsEqual(f func(stored, digest []byte) int) (restore func()) {
	old := digestsEqual
	digestsEqual = f
	return func() { digestsEqual = old }
}
