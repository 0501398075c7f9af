package envctl

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// An invariant is one property every committed state of the database has, written as a query that
// counts the rows breaking it. The schema's CHECK constraints are not repeated here: PostgreSQL
// enforces them even in a data-only restore. Foreign keys and cross-table properties are different:
// `pg_restore --disable-triggers`, session_replication_role = replica, a restore of only some tables or
// a hand edit skip them, and then the service answers wrongly (a duplicate taken for new, a sequence
// allocated twice, a message that can never be sent) without any error.
type invariant struct {
	name  string
	why   string // what breaks when it does not hold; shown by -h
	query string // SELECT count(*) of violating rows
	args  []any
}

// orphans is the query of the commonest invariant: it counts the rows of table (c) that have no row in
// parent (p) with the same values in every column of on (comma-separated) and, unless also is empty,
// meeting also as well.
func orphans(table, parent, on, also string) string {
	var match []string
	for _, col := range strings.Split(on, ", ") {
		match = append(match, fmt.Sprintf("p.%s = c.%s", col, col))
	}
	if also != "" {
		match = append(match, also)
	}
	return fmt.Sprintf("SELECT count(*) FROM %s c WHERE NOT EXISTS (SELECT FROM %s p WHERE %s)", table, parent, strings.Join(match, " AND "))
}

// invariants is the list `envctl verify` checks, in its output order. Every query returns one bigint.
func invariants() []invariant {
	return []invariant{
		{
			name:  "payload_without_identity",
			why:   "a stored payload whose permanent identity is missing: the event could be accepted again as new",
			query: orphans("inbound_payloads", "event_identities", "tenant_id, event_identity", ""),
		},
		{
			name:  "identity_without_stream",
			why:   "a retained event whose stream row (cursor, replay floor) is missing",
			query: orphans("event_identities", "streams", "tenant_id, project_id, producer_id", ""),
		},
		{
			// The cursor is the floor plus the run of retained sequences floor+1, floor+2, ... without a
			// gap. Sequences are unique per stream, so sequence - row_number() is constant along a run and
			// equals the floor exactly on the first one.
			name: "cursor_not_contiguous",
			why:  "a stream whose cursor is not its replay floor plus the contiguous run of retained sequences above it",
			query: `
WITH ranked AS (
    SELECT i.tenant_id, i.project_id, i.producer_id,
           i.sequence - s.replay_floor
             - row_number() OVER (PARTITION BY i.tenant_id, i.project_id, i.producer_id ORDER BY i.sequence) AS gap
    FROM event_identities i
    JOIN streams s ON s.tenant_id = i.tenant_id AND s.project_id = i.project_id AND s.producer_id = i.producer_id
    WHERE i.sequence > s.replay_floor
), runs AS (
    SELECT tenant_id, project_id, producer_id, count(*) AS run
    FROM ranked WHERE gap = 0
    GROUP BY tenant_id, project_id, producer_id
)
SELECT count(*) FROM streams s
LEFT JOIN runs r ON r.tenant_id = s.tenant_id AND r.project_id = s.project_id AND r.producer_id = s.producer_id
WHERE s.cursor <> s.replay_floor + coalesce(r.run, 0)`,
		},
		{
			name:  "outbound_stream_behind",
			why:   "an outbound envelope whose stream is missing or behind its sequence: the sequence would be issued again",
			query: orphans("outbound_envelopes", "outbound_streams", "tenant_id, project_id, producer_id", "p.last_sequence >= c.sequence"),
		},
		{
			name:  "envelope_without_messages",
			why:   "an outbound envelope with no outbox message: every enqueue stores at least one, so deliveries were lost",
			query: orphans("outbound_envelopes", "outbox_messages", "tenant_id, event_identity", ""),
		},
		{
			name:  "message_without_envelope",
			why:   "an outbox message whose signed envelope is missing: it can never be sent",
			query: orphans("outbox_messages", "outbound_envelopes", "tenant_id, event_identity", ""),
		},
		{
			name: "message_in_flight_without_body",
			why:  "a pending or delivering outbox message whose envelope body is gone (in neither outbound_bodies nor the old column): its next attempt has nothing to send",
			query: `
SELECT count(*) FROM outbox_messages m
WHERE m.status IN ('pending', 'delivering')
  AND NOT EXISTS (SELECT FROM outbound_bodies b WHERE b.tenant_id = m.tenant_id AND b.event_identity = m.event_identity)
  AND NOT EXISTS (SELECT FROM outbound_envelopes o
                  WHERE o.tenant_id = m.tenant_id AND o.event_identity = m.event_identity AND o.envelope IS NOT NULL)`,
		},
		{
			name:  "message_without_endpoint",
			why:   "an outbox message whose endpoint is missing: it can never be claimed",
			query: orphans("outbox_messages", "endpoints", "tenant_id, endpoint_id", ""),
		},
		{
			// attempts only grows: each claim adds one, a settle keeps it, a replay raises max_attempts
			// to attempts + budget. So a message has been claimed at least once per replay, and once
			// more unless it is pending; it is pending only with budget left; and max_attempts never
			// exceeds attempts + budget. A claim after an expired lease adds an attempt without a
			// settle, which is what lease_expiries allows for. A counter reset by hand or by an old
			// backup of this one table shows here.
			name: "attempts_inconsistent",
			why:  "an outbox message whose attempt counter is below what its status, replays and budget imply",
			query: `
SELECT count(*) FROM outbox_messages
WHERE attempts < replays + CASE WHEN status = 'pending' THEN 0 ELSE 1 END
   OR (status = 'pending' AND attempts >= max_attempts)
   OR max_attempts > attempts + budget
   OR max_attempts < budget
   OR (replays = 0 AND max_attempts <> budget)
   OR attempts > max_attempts + lease_expiries`,
		},
		{
			// Delivered clears the error code; dead always records one of the stable codes.
			name: "settlement_inconsistent",
			why:  "a delivered message that kept an error code, or a dead one without a stable error code",
			query: `
SELECT count(*) FROM outbox_messages
WHERE (status = 'delivered' AND last_error_code <> '')
   OR (status = 'dead' AND NOT (last_error_code = ANY ($1::text[])))
   OR delivered_at < created_at
   OR dead_at < created_at`,
			args: []any{store.ErrorCodes()},
		},
		{
			// Each attempt row is written by the settle or claim that ends that attempt, so its number
			// is one the message's counter has reached (contract §8.8). A restore of the history from
			// another backup than the messages, or a counter reset by hand, shows here.
			name:  "attempt_without_message",
			why:   "an attempt history row whose message is missing or whose attempt counter never reached it",
			query: orphans("outbox_attempts", "outbox_messages", "tenant_id, message_id", "p.attempts >= c.attempt"),
		},
		{
			// Migration 0005's trigger gives each ref to one tenant as endpoints are written; a restore
			// without triggers or a hand edit skips it, and a ref several tenants shared before 0005 has
			// no owner at all.
			name:  "secret_ref_not_owned",
			why:   "an endpoint naming a secret ref its tenant does not own: the delivery-worker refuses its messages (secret_ref_foreign)",
			query: orphans("endpoints", "secret_ref_owners", "secret_ref, tenant_id", ""),
		},
		{
			// endpoint add and enable keep a topic within the fan-out bound; a restore, a hand edit or an
			// envctl older than the bound do not, and Enqueue then writes to the first endpoints by id
			// only. Counted: the active endpoints past the bound, which get no messages.
			name: "topic_over_endpoint_limit",
			why:  "active endpoints past the fan-out bound of their (tenant, project, topic): enqueues write no message for them",
			query: `
SELECT coalesce(sum(n - $1), 0)::bigint FROM (
    SELECT count(*) AS n FROM endpoints WHERE state = 'active'
    GROUP BY tenant_id, project_id, topic HAVING count(*) > $1) t`,
			args: []any{store.MaxTopicEndpoints},
		},
	}
}

// verifyResult is the count of violating rows of one invariant.
type verifyResult struct {
	name  string
	count int64
}

// checkInvariants runs every invariant in one read-only REPEATABLE READ transaction, so all counts
// describe one snapshot: verify can run next to live traffic without reporting a half-seen commit.
func checkInvariants(ctx context.Context, db *sql.DB) ([]verifyResult, error) {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() //nolint:errcheck // read-only; nothing to keep
	var out []verifyResult
	for _, inv := range invariants() {
		var n int64
		if err := tx.QueryRowContext(ctx, inv.query, inv.args...).Scan(&n); err != nil {
			return nil, fmt.Errorf("invariant %s: %w", inv.name, err)
		}
		out = append(out, verifyResult{name: inv.name, count: n})
	}
	return out, tx.Commit()
}

func runVerify(ctx context.Context, c *cli, path string, args []string) int {
	fs := c.flagSet(path)
	d := c.addDBFlags(fs, 30*time.Minute)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: %s %s\n\n"+
			"Checks the invariants a backup restore must keep and prints one line per invariant,\n"+
			"\"<name> <violating rows>\"; exit 1 when any count is not 0. Run it as the database owner\n"+
			"(it reads every envelope table). Invariants:\n\n", path, c.usage)
		for _, inv := range invariants() {
			fmt.Fprintf(fs.Output(), "  %-26s %s\n", inv.name, inv.why)
		}
		fmt.Fprintf(fs.Output(), "\nFlags:\n")
		fs.PrintDefaults()
		c.printExample(fs.Output())
	}
	dsn, cctx, cancel, code := c.parseDSN(ctx, fs, path, args, d)
	if dsn == "" {
		return code
	}
	defer cancel()
	// verify opens the database directly, like migrate: it checks a restored database before any
	// service (or store.Open) trusts it.
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return c.failure(path, "cannot open the database: %v", err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	results, err := checkInvariants(cctx, db)
	if err != nil {
		switch {
		case errors.Is(err, context.DeadlineExceeded) || errors.Is(cctx.Err(), context.DeadlineExceeded):
			return c.failure(path, "timed out (see --timeout)")
		case store.SQLState(err) == "42501":
			return c.failure(path, "permission denied: run verify as the database owner (it reads every envelope table)")
		case store.SQLState(err) == "42P01":
			return c.failure(path, "a table is missing: is the schema migrated (envctl migrate)?")
		case store.SQLState(err) != "":
			return c.failure(path, "query failed (SQLSTATE %s)", store.SQLState(err))
		}
		return c.failure(path, "database unavailable")
	}
	violated := 0
	for _, r := range results {
		fmt.Fprintf(c.Stdout, "%s %d\n", r.name, r.count)
		if r.count != 0 {
			violated++
		}
	}
	if violated > 0 {
		return c.failure(path, "%d of %d invariants violated; do not start the services on this database", violated, len(results))
	}
	return ExitOK
}
