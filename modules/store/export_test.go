package store

import (
	"context"
	"database/sql"
	"regexp"
	"strconv"

	"github.com/jackc/pgx/v5"

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
	"lockStream": numbered(lockStreamSQL, "tenant", "project", "producer"),
	"decide": numbered(decideSQL, "tenant", "project", "producer", "event", "idempotency_digest", "content_digest",
		"sequence", "key_id", "issued_at", "envelope", "expires_at", "max_ahead", "account", "device", "event_hex",
		"correlation_id", "verified_with"),
	"lockStreams":    numbered(lockStreamsSQL, "tenants", "projects", "producers"),
	"streamState":    numbered(streamStateSQL, "tenants", "projects", "producers"),
	"lookup":         numbered(lookupSQL, "tenants", "events", "idempotency_digests", "key_ids", "verified_with"),
	"signedBy":       signedBySQL,
	"stream":         streamSQL,
	"readStream":     readStreamSQL,
	"lockOutbound":   numbered(lockOutboundStreamsSQL, "tenants", "projects", "producers"),
	"outboundByKey":  numbered(outboundByKeySQL, "tenants", "projects", "idempotency_digests"),
	"topicEndpoints": numbered(topicEndpointsSQL, "tenants", "projects", "topics", "max_endpoints"),
	"claim":          numbered(claimSQL, "tenant", "max", "lease_us", "retention_us"),
	"outboxAttempts": outboxAttemptsQuery(renderDB, param(1), param(2), MaxAttemptHistory).String(),
	"dueTenants":     dueTenantsStmt.sql,
	// The claim's raise of the tenant's due row (outbox_claim.go, 0011).
	"lockDueTenant":  lockDueTenantStmt.sql,
	"raiseDueTenant": raiseDueTenantStmt.sql,
	// Settles, replay and message reads (outbox_settle.go, outbox_deadletters.go, outbox.go).
	"settle": numbered(settleSQL, "tenant", "message_ids", "attempts", "outcomes", "next_attempt_at", "codes",
		"disable_endpoint", "started_at", "duration_ms", "http_statuses", "retention_us"),
	"replay": replaySQL,
	"listDead": listDeadQuery(renderDB, (*outboxMessageModel)(nil), param(1), param(2), false, nil, nil,
		MaxDeadLetterPage+1).String(),
	"listDeadAfter": listDeadQuery(renderDB, (*outboxMessageModel)(nil), param(1), param(2), true, param(3), param(4),
		MaxDeadLetterPage+1).String(),
	"messageExists": numbered(messageExistsSQL, "tenant", "message_id"),
	"outboxMessage": numbered(outboxMessageSQL, "tenant", "message_id"),
	// Outbound retention (outbox_retention.go, migration 0008).
	"expiredAttempts": deleteExpiredAttemptsSQL,
	"expiredBodies":   deleteExpiredBodiesSQL,
	"backfillBodies":  backfillBodiesSQL,
}

// numbered is query, written with pgx named arguments, as pgx rewrites it
// for the server, except that the parameter of names[i] is $(i+1): the order
// the plan cases give their arguments in. A name the query uses but names
// lacks becomes $0, which PREPARE refuses.
func numbered(query string, names ...string) string {
	place := map[string]int{}
	na := pgx.NamedArgs{}
	for i, n := range names {
		place[n] = i + 1
		na[n] = n
	}
	rewritten, args, err := na.RewriteQuery(context.Background(), nil, query, nil)
	if err != nil {
		panic(err)
	}
	// pgx numbers the names in the order they first appear; args[k] is the
	// name it made $(k+1).
	return ordinalRE.ReplaceAllStringFunc(rewritten, func(m string) string {
		k, _ := strconv.Atoi(m[1:])
		name, _ := args[k-1].(string)
		return "$" + strconv.Itoa(place[name])
	})
}

var ordinalRE = regexp.MustCompile(`\$[0-9]+`)

// CrossTenantSQL is the statements that read every tenant's rows by design,
// which TestHotStatementsTouchOnePartition names and bounds.
var CrossTenantSQL = map[string]string{
	"dueTenants":      dueTenantsStmt.sql,
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

// SessionSetting reads the setting name in one of s's pooled sessions.
func SessionSetting(ctx context.Context, s *Store, name string) (string, error) {
	var v string
	err := s.sqlDB().QueryRowContext(ctx, `SELECT current_setting($1)`, name).Scan(&v)
	return v, err
}

// ClaimPlanMode is the plan mode a claim would run in now
// (claimPlanModeSQL).
func ClaimPlanMode(ctx context.Context, db *sql.DB) (string, error) {
	var mode string
	err := db.QueryRowContext(ctx, claimPlanModeStmt.text, claimPlanModeArgs).Scan(&mode)
	return mode, err
}
