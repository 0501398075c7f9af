package store

import (
	"context"

	"github.com/jackc/pgx/v5"
)

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
	"dueTenants":     positional(dueTenantsSQL),
	// The claim's raise of the tenant's due row (outbox_claim.go, 0011).
	"lockDueTenant":  positional(lockDueTenantSQL),
	"raiseDueTenant": positional(raiseDueTenantSQL),
	"outboxAttempts": outboxAttemptsSQL,
	// Settles, replay and message reads (outbox_settle.go, outbox_deadletters.go, outbox.go).
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

// CrossTenantSQL is the statements that read every tenant's rows by design,
// which TestHotStatementsTouchOnePartition names and bounds.
var CrossTenantSQL = map[string]string{
	"dueTenants":      positional(dueTenantsSQL),
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

// positional is a statement written with pgx.NamedArgs as PREPARE takes it:
// pgx numbers the names $1, $2, … in the order they first appear, which is
// the order of a plan case's arguments.
func positional(sql string) string {
	q, _, err := pgx.NamedArgs{}.RewriteQuery(context.Background(), nil, sql, nil)
	if err != nil {
		panic(err)
	}
	return q
}
