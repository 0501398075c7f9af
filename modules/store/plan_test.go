package store_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/store"
)

// planScan is one table access a statement must make through an index, with
// every listed column an Index Cond and none of them a Filter (a key
// column re-checked per row, such as an = ANY of the batch, costs a scan of
// the batch a row).
type planScan struct {
	table, index string
	cols         []string
}

// planCase is one hot statement: its SQL (store.HotSQL), realistic EXECUTE
// arguments (SQL expressions), the scans it must make, and, for an INSERT …
// ON CONFLICT, the arbiter index.
type planCase struct {
	name, args string
	scans      []planScan
	arbiter    string
	notEmpty   bool // checked on the fresh and large states only (reason at the case)
	// emptyTies are key columns that may be a filter instead of an Index
	// Cond on the empty, never-analyzed tables only, the index being right:
	// there the planner estimates one row for tenant_id alone, so comparing
	// the rest of the key in the index or on that one row costs the same
	// (an InitPlan's array or a CTE row; an ANALYZE or the fresh table's
	// size settles it).
	emptyTies []string
	// emptyKeyed are scans that the same tie states may make by another of
	// the listed indexes instead (the settle reaches a message it locked by
	// its ctid, or on those states by its primary key, tenant first: the
	// same one-row estimate).
	emptyKeyed []planScan
}

var (
	byStream    = []string{"tenant_id", "project_id", "producer_id"}
	bySequence  = []string{"tenant_id", "project_id", "producer_id", "sequence"}
	byIdentity  = []string{"tenant_id", "event_identity"}
	byInIdem    = []string{"tenant_id", "idempotency_digest"}
	byMessage   = []string{"tenant_id", "message_id"}
	streamsPkey = planScan{"streams", "streams_pkey", byStream}
	identPkey   = planScan{"event_identities", "event_identities_pkey", byIdentity}
	identIdem   = planScan{"event_identities", "event_identities_idempotency_idx", byInIdem}
	identSeq    = planScan{"event_identities", "event_identities_sequence_idx", bySequence}
	keysPkey    = planScan{"producer_keys", "producer_keys_pkey", []string{"tenant_id", "key_id"}}
	messagePkey = planScan{"outbox_messages", "outbox_messages_pkey", byMessage}
	// The claim and the 410 settle reach an endpoint by its key.
	endpointPkey = planScan{"endpoints", "endpoints_pkey", []string{"tenant_id", "endpoint_id"}}
	ownerPkey    = planScan{"secret_ref_owners", "secret_ref_owners_pkey", []string{"secret_ref"}}
	// Outbound bodies (0008) and the attempt history (0007).
	bodiesPkey    = planScan{"outbound_bodies", "outbound_bodies_pkey", byIdentity}
	envelopesPkey = planScan{"outbound_envelopes", "outbound_envelopes_pkey", byIdentity}
	// A row the statement locked by key, then changed by its ctid.
	bodiesCtid   = planScan{"outbound_bodies", "ctid", nil}
	messagesCtid = planScan{"outbox_messages", "ctid", nil}
	// The janitor's scan: the expiry bound is the Index Cond.
	bodiesExpiry       = planScan{"outbound_bodies", "outbound_bodies_expires_at_idx", []string{"expires_at"}}
	messagesByEnvelope = planScan{"outbox_messages", "outbox_messages_envelope_idx", byIdentity}
	attemptsPkey       = planScan{"outbox_attempts", "outbox_attempts_pkey", byMessage}
	// The tenants with due work (0011).
	dueTenantsPkey  = planScan{"outbox_due_tenants", "outbox_due_tenants_pkey", []string{"tenant_id"}}
	dueTenantsByDue = planScan{"outbox_due_tenants", "outbox_due_tenants_due_idx", []string{"due_at"}}
)

// digest is a 32-byte bytea expression; the same seed names the same row
// seedPlanTables wrote.
func digest(seed string) string { return fmt.Sprintf("sha256(%s::bytea)", quoteLit(seed)) }

func quoteLit(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// claimTransaction names the statements of the claim's transaction, which
// runs on generic plans once the table has statistics (the analyzed state).
var claimTransaction = map[string]bool{"claim": true, "lockDueTenant": true, "raiseDueTenant": true}

var planCases = []planCase{
	// Inbound, one envelope (ingest.go).
	{name: "lockStream", args: `'t1', 'p1', 'd1'`, arbiter: "streams_pkey"},
	{name: "decide", args: `'t1', 'p1', 'd1', ` + digest("e-new") + `, ` + digest("i-new") + `, ` + digest("c-new") +
		`, 200001, 'k1', now(), '\x7b7d'::bytea, now() + interval '1 day', 1024, 'acct', 'dev', 'hex', 'corr', ` + digest("pk-1"),
		scans: []planScan{streamsPkey, identPkey, identIdem, identSeq, keysPkey}},
	// Inbound, set-based (ingest_set.go).
	{name: "lockStreams", args: `ARRAY['t1'], ARRAY['p1'], ARRAY['d1']`, arbiter: "streams_pkey"},
	{name: "streamState", args: `ARRAY['t1'], ARRAY['p1'], ARRAY['d1']`,
		scans: []planScan{streamsPkey, {"event_identities", "event_identities_sequence_idx", bySequence}}},
	{name: "lookup", args: `ARRAY['t1'], ARRAY[` + digest("e-new") + `], ARRAY[` + digest("i-new") + `], ARRAY['k1'], ARRAY[` + digest("pk-1") + `]`,
		scans: []planScan{keysPkey, identPkey, identIdem}},
	{name: "signedBy", args: `'t1', ` + digest("e-7") + `, ` + digest("c-7") + `, 'k1'`, scans: []planScan{identPkey}},
	// Stream reads (streams.go).
	{name: "stream", args: `'t1', 'p1', 'd1'`, scans: []planScan{streamsPkey}},
	{name: "readStream", args: `'t1', 'p1', 'd1', 100, 100, 4194304`,
		scans: []planScan{streamsPkey, identSeq, {"inbound_payloads", "inbound_payloads_pkey", byIdentity}}},
	// Outbox enqueue (outbox_batch.go).
	{name: "lockOutbound", args: `ARRAY['t1'], ARRAY['p1'], ARRAY['svc1']`,
		scans: []planScan{{"outbound_streams", "outbound_streams_pkey", byStream}}},
	{name: "outboundByKey", args: `ARRAY['t1'], ARRAY['p1'], ARRAY[` + digest("o-new") + `]`,
		scans: []planScan{
			{"outbound_envelopes", "outbound_envelopes_idempotency_idx", []string{"tenant_id", "project_id", "idempotency_digest"}},
			{"outbox_messages", "outbox_messages_envelope_idx", byIdentity},
			bodiesPkey,
		}},
	{name: "topicEndpoints", args: `ARRAY['t1'], ARRAY['p1'], ARRAY['task.proposals'], 64`,
		scans: []planScan{{"endpoints", "endpoints_topic_idx", []string{"tenant_id", "project_id", "topic"}}}},
	// A message's latest attempts, by the history's key (outbox_attempts.go).
	// The history's inserts (claimSQL, settleSQL) read nothing of
	// it: their ON CONFLICT has no target (the worker may not read the
	// table), so there is no arbiter to check either.
	{name: "outboxAttempts", args: `'t1', 'msg_000000000000000000000001'`,
		scans: []planScan{{"outbox_attempts", "outbox_attempts_pkey", byMessage}}},
	// The claim (outbox_claim.go) scans the tenant's due messages in due
	// order and reaches each claimed message, its endpoint, envelope and
	// secret ref owner by key, never scanning endpoints or owners per row.
	// The envelope is read from outbound_bodies first (0008); a message made
	// dead as exhausted raises its body's expiry by the body's key.
	{name: "claim", args: `'t1', 100, 60000000, 7776000000000`,
		scans: []planScan{bodiesPkey, {"outbound_envelopes", "outbound_envelopes_pkey", byIdentity}, endpointPkey, ownerPkey,
			{"outbox_messages", "outbox_messages_due_idx", []string{"tenant_id", "next_attempt_at"}}, messagePkey},
		emptyTies: []string{"endpoint_id", "message_id"}},
	// The round and the claim's raise of a tenant's due row (outbox_claim.go,
	// migration 0011). The round reads the due index from its start and
	// stops at its LIMIT; the raise locks and updates the tenant's row by its
	// key and reads the tenant's earliest message from its range of the
	// message due index, each message's endpoint by key.
	{name: "dueTenants", args: `100`, scans: []planScan{dueTenantsByDue}},
	{name: "lockDueTenant", args: `'t1'`, scans: []planScan{dueTenantsPkey}},
	{name: "raiseDueTenant", args: `'t1'`,
		scans: []planScan{dueTenantsPkey, {"outbox_messages", "outbox_messages_due_idx", []string{"tenant_id"}}, endpointPkey}},
	// Settles and replay (outbox_settle.go, outbox_deadletters.go). A settle batch finds its
	// messages by key (= ANY of its ids), raises each settled body's expiry
	// by the body's key (§8.9) and disables a 410's endpoint by its key; a
	// batch of three (one of each outcome, the dead one a 410). A replay
	// clears the body's expiry and looks for a body not moved yet by the old
	// table's key.
	{name: "settle", args: `'t1', ARRAY['msg_' || lpad(to_hex(13), 24, '0'), 'msg_' || lpad(to_hex(26), 24, '0'),
		'msg_' || lpad(to_hex(39), 24, '0')], ARRAY[1, 1, 1], ARRAY['delivered', 'retry', 'dead'],
		ARRAY[NULL, now(), NULL]::timestamptz[], ARRAY['', 'http_5xx', 'http_410'], ARRAY[false, false, true],
		ARRAY[now(), now(), NULL]::timestamptz[], ARRAY[5, 7, NULL]::bigint[], ARRAY[200, 503, 410]::smallint[], 7776000000000`,
		scans: []planScan{messagePkey, messagesCtid, endpointPkey, bodiesPkey}, emptyTies: []string{"endpoint_id", "message_id"},
		emptyKeyed: []planScan{messagesCtid}},
	{name: "replay", args: `'t1', 'msg_' || lpad(to_hex(7), 24, '0'), 'acct', 'dev', 'corr'`,
		scans: []planScan{messagePkey, bodiesPkey, envelopesPkey}},
	// The dead-letter pages (bun queries): the first, and one after a cursor.
	{name: "listDead", args: `'t1', 'p1'`,
		scans: []planScan{{"outbox_messages", "outbox_messages_dead_idx", []string{"tenant_id", "project_id"}}}},
	{name: "listDeadAfter", args: `'t1', 'p1', now() - interval '1 day', 'msg_000000000000000000000000'`,
		scans: []planScan{{"outbox_messages", "outbox_messages_dead_idx", []string{"tenant_id", "project_id"}}}},
	{name: "messageExists", args: `'t1', 'msg_' || lpad(to_hex(7), 24, '0')`, scans: []planScan{messagePkey}},
	{name: "outboxMessage", args: `'t1', 'msg_' || lpad(to_hex(7), 24, '0')`,
		scans: []planScan{messagePkey, bodiesPkey, envelopesPkey}},
	// The retention-janitor's outbound deletes (outbox_retention.go): the
	// expiry index, then each body's messages and attempt rows by key.
	{name: "expiredAttempts", args: `now(), 1000`,
		scans: []planScan{bodiesExpiry, messagesByEnvelope, attemptsPkey, {"outbox_attempts", "ctid", nil}},
		// On an empty, never-analyzed outbox_attempts the delete by ctid
		// is planned as a scan of the (empty) table. The janitor opens its
		// connections per run and closes them at its end, so no plan made
		// on an empty table outlives the run, and there is nothing to
		// delete in it.
		notEmpty: true},
	{name: "expiredBodies", args: `now(), 1000`,
		scans: []planScan{bodiesExpiry, bodiesCtid, messagesByEnvelope, attemptsPkey}},
}

// planTables are the tables the hot statements read: autovacuum stays off on
// them in the test database, so no ANALYZE runs but the test's own.
var planTables = []string{"streams", "event_identities", "inbound_payloads", "producer_keys", "endpoints",
	"outbound_streams", "outbound_envelopes", "outbox_messages", "audit_events", "secret_ref_owners",
	"outbound_bodies", "outbox_attempts", "outbox_due_tenants"}

// seedPlanTables adds rows from..to-1 to every table the hot statements
// read, set-based. Nine rows in ten belong to tenant t1, project p1 (one
// stream, one outbound stream): the skew that makes an index on tenant alone,
// or on (tenant, project), look as good as the right one until statistics
// say otherwise. Row g's digests are sha256 of "e-g", "i-g", "c-g", "o-g",
// "oe-g"; its message is msg_ followed by g in 24 hex digits.
func seedPlanTables(t *testing.T, db *sql.DB, from, to int) {
	t.Helper()
	const tenant = `(CASE WHEN g % 10 = 0 THEN 't' || (g % 100) ELSE 't1' END)`
	stmts := []string{
		`INSERT INTO producer_keys (tenant_id, key_id, public_key)
SELECT ` + tenant + `, 'k' || g, sha256(('pk-' || g)::bytea) FROM generate_series($1::int, $2::int - 1) g`,
		`INSERT INTO endpoints (tenant_id, endpoint_id, project_id, topic, url, secret_ref)
SELECT ` + tenant + `, 'ep_' || lpad(to_hex(g), 24, '0'), 'p1', CASE WHEN g = 1 THEN 'task.proposals' ELSE 'topic-' || g END,
       'https://hooks.example.test/', 'sec-' || g
FROM generate_series($1::int, $2::int - 1) g`,
		`INSERT INTO streams (tenant_id, project_id, producer_id)
SELECT ` + tenant + `, 'p1', CASE WHEN g = 1 THEN 'd1' ELSE 'd' || g END FROM generate_series($1::int, $2::int - 1) g`,
		`INSERT INTO event_identities (tenant_id, event_identity, project_id, producer_id, sequence, idempotency_digest,
                              content_digest, key_id, issued_at)
SELECT ` + tenant + `, sha256(('e-' || g)::bytea), 'p1', 'd1', g, sha256(('i-' || g)::bytea), sha256(('c-' || g)::bytea),
       'k1', now() FROM generate_series($1::int, $2::int - 1) g`,
		`INSERT INTO inbound_payloads (tenant_id, event_identity, envelope, expires_at)
SELECT ` + tenant + `, sha256(('e-' || g)::bytea), '\x7b7d'::bytea, now() + (g % 1000) * interval '1 hour'
FROM generate_series($1::int, $2::int - 1) g`,
		`INSERT INTO outbound_streams (tenant_id, project_id, producer_id, last_sequence)
SELECT ` + tenant + `, 'p1', 'svc' || g, 1 FROM generate_series($1::int, $2::int - 1) g`,
		`INSERT INTO outbound_envelopes (tenant_id, event_identity, project_id, producer_id, sequence, topic,
                                idempotency_digest, request_digest, envelope)
SELECT ` + tenant + `, sha256(('oe-' || g)::bytea), 'p1', 'svc1', g, 'task.proposals', sha256(('o-' || g)::bytea),
       sha256(('r-' || g)::bytea), '\x7b7d'::bytea FROM generate_series($1::int, $2::int - 1) g`,
		// Messages of t1 go to t1's endpoint; the others' to an endpoint of
		// their own tenant (row g - g % 100 + g % 100 shares g's tenant).
		`INSERT INTO outbox_messages (tenant_id, message_id, project_id, topic, endpoint_id, event_identity, status,
                             attempts, max_attempts, budget, next_attempt_at, delivered_at, dead_at)
SELECT ` + tenant + `, 'msg_' || lpad(to_hex(g), 24, '0'), 'p1', 'task.proposals',
       'ep_' || lpad(to_hex(CASE WHEN g % 10 = 0 THEN g % 100 + 100 ELSE 1 END), 24, '0'), sha256(('oe-' || g)::bytea),
       s.status, 1, 12, 12, CASE WHEN s.status = 'pending' THEN now() END,
       CASE WHEN s.status = 'delivered' THEN now() END, CASE WHEN s.status = 'dead' THEN now() END
FROM generate_series($1::int, $2::int - 1) g,
     LATERAL (SELECT CASE WHEN g % 7 = 0 THEN 'dead' WHEN g % 13 = 0 THEN 'pending' ELSE 'delivered' END) s(status)`,
		// One to three attempts a message: the history is a few times the
		// size of the messages, all under one tenant's key prefix.
		`INSERT INTO outbox_attempts (tenant_id, message_id, attempt, started_at, duration_ms, http_status, error_code, result)
SELECT ` + tenant + `, 'msg_' || lpad(to_hex(g), 24, '0'), a, now(), g % 500, 503, 'http_5xx', 'retry'
FROM generate_series($1::int, $2::int - 1) g, generate_series(1, 1 + g % 3) a`,
		// Bodies (0008): settled ones expire over the next thousand hours,
		// a few are past it; every message has two attempt rows.
		`INSERT INTO outbound_bodies (tenant_id, event_identity, envelope, expires_at)
SELECT ` + tenant + `, sha256(('oe-' || g)::bytea), '\x7b7d'::bytea,
       CASE WHEN g % 13 <> 0 THEN now() + (g % 1000 - 10) * interval '1 hour' END
FROM generate_series($1::int, $2::int - 1) g`,
	}
	// Tenants with nothing due, as most of a deployment's are: the due rows
	// the round must not read (migration 0011); the seeded messages' tenants
	// got theirs from its trigger.
	stmts = append(stmts, `INSERT INTO outbox_due_tenants (tenant_id, due_at)
SELECT 'idle-' || g, CASE WHEN g % 2 = 0 THEN 'infinity' ELSE now() + g * interval '1 second' END
FROM generate_series($1::int, $2::int - 1) g`)
	for _, q := range stmts {
		if _, err := db.Exec(q, from, to); err != nil {
			t.Fatalf("seed %d..%d: %v\n%s", from, to, err, q)
		}
	}
}

// TestHotStatementPlansUseTheirKeys runs EXPLAIN on every hot statement,
// custom and generic plans (a pooled connection keeps the generic plan it
// made on an empty table until something invalidates it), on three table
// states: empty and never analyzed, fresh (rows just written, never
// analyzed), and large, skewed and analyzed. Every table access must go
// through its key with each equality column in the Index Cond.
func TestHotStatementPlansUseTheirKeys(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	// A partitioned table takes no storage options: its partitions do.
	rows, err := f.admin.QueryContext(ctx, `SELECT c.oid::regclass::text FROM pg_class c
WHERE c.relkind = 'r' AND (c.relname = ANY ($1) OR EXISTS (
    SELECT FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent WHERE i.inhrelid = c.oid AND p.relname = ANY ($1)))`, planTablesArray())
	if err != nil {
		t.Fatal(err)
	}
	var heaps []string
	for rows.Next() {
		var h string
		if err := rows.Scan(&h); err != nil {
			t.Fatal(err)
		}
		heaps = append(heaps, h)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	for _, h := range heaps {
		if _, err := f.admin.ExecContext(ctx, `ALTER TABLE `+h+` SET (autovacuum_enabled = off)`); err != nil {
			t.Fatal(err)
		}
	}
	// The endpoints and messages of the non-t1 tenants (rows 100..199 in
	// seedPlanTables' numbering) exist before the messages that name them.
	states := []struct {
		name    string
		prepare func()
	}{
		{"empty", func() {
			if n := f.count(`SELECT count(*) FROM pg_class WHERE relname = ANY ($1) AND reltuples >= 0`, planTablesArray()); n != 0 {
				t.Fatalf("%d of the tables were analyzed already; the empty state needs never-analyzed tables", n)
			}
		}},
		{"fresh", func() { seedPlanTables(t, f.admin, 1, 5000) }},
		// The claim's transaction runs on generic plans from
		// store.ClaimGenericMinRows analyzed rows of outbox_messages on
		// (claimPlanModeSQL): its statements' generic plans at that size,
		// the smallest they are used at, are checked here.
		{"analyzed", func() {
			seedPlanTables(t, f.admin, 5000, store.ClaimGenericMinRows)
			if _, err := f.admin.ExecContext(ctx, `ANALYZE `+strings.Join(planTables, ", ")); err != nil {
				t.Fatal(err)
			}
		}},
		{"large", func() {
			seedPlanTables(t, f.admin, store.ClaimGenericMinRows, 100000)
			if _, err := f.admin.ExecContext(ctx, `ANALYZE `+strings.Join(planTables, ", ")); err != nil {
				t.Fatal(err)
			}
		}},
	}
	// In the partitioned layout the statements' tenant t1 lives in one
	// partition of each table: those are the heaps whose scans must use
	// the keys (named by their parents); the other partitions, some of them
	// small enough for a sequential scan, are pruned (checked by
	// TestHotStatementsTouchOnePartition) and left out. The janitor's
	// deletes run on t1's partitions, as the store runs them there.
	partitions := partitionParents(t, f.admin)
	parents := partitions
	hot := maps.Clone(store.HotSQL)
	if len(partitions) > 0 {
		parents = t1Partitions(t, f.admin, partitions)
		part := func(table string) string {
			for child, parent := range parents {
				if parent == table {
					return child
				}
			}
			t.Fatalf("no partition of %s holds t1", table)
			return ""
		}
		maps.Copy(hot, store.PartitionSweepSQL(part("inbound_payloads"), part("outbound_bodies"), part("outbox_attempts")))
	}
	for _, st := range states {
		st.prepare()
		for _, c := range planCases {
			if c.notEmpty && st.name == "empty" {
				continue
			}
			for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
				if st.name == "analyzed" && (!claimTransaction[c.name] || mode != "force_generic_plan") {
					continue // the state is there for the claim transaction's generic plans
				}
				plan := explainPlan(t, f.admin, hot[c.name], c.args, mode)
				renamePartitions(plan, partitions, parents)
				cc := c
				// On the partitioned layout the fresh partitions are as
				// never analyzed as the empty tables, and their parents have
				// no statistics until an ANALYZE of the parent (autovacuum
				// analyzes partitions only; docs/scaling.md): the same ties
				// hold until then.
				if st.name != "empty" && (st.name != "fresh" || len(partitions) == 0) {
					cc.emptyTies, cc.emptyKeyed = nil, nil
				}
				for _, problem := range checkPlan(plan, cc) {
					t.Errorf("%s, %s, %s: %s", st.name, c.name, mode, problem)
				}
			}
		}
	}
}

func planTablesArray() string { return "{" + strings.Join(planTables, ",") + "}" }

// partitionParents maps each partition, and each partition's index, to its
// parent table or index (none in the plain layout).
func partitionParents(t *testing.T, db *sql.DB) map[string]string {
	t.Helper()
	rows, err := db.Query(`SELECT c.relname, p.relname FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var child, parent string
		if err := rows.Scan(&child, &parent); err != nil {
			t.Fatal(err)
		}
		out[child] = parent
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// t1Partitions keeps of parents the partitions that hold tenant t1's rows,
// and their indexes.
func t1Partitions(t *testing.T, db *sql.DB, parents map[string]string) map[string]string {
	t.Helper()
	rows, err := db.Query(`
WITH t1 AS (
    SELECT c.oid FROM pg_class c JOIN pg_inherits i ON i.inhrelid = c.oid
    WHERE c.relkind = 'r' AND satisfies_hash_partition(i.inhparent, $1,
          substring(c.relname FROM '_p([0-9]+)$')::int, 't1'::text))
SELECT relname FROM pg_class WHERE oid IN (SELECT oid FROM t1)
UNION ALL
SELECT x.relname FROM pg_index ix JOIN pg_class x ON x.oid = ix.indexrelid WHERE ix.indrelid IN (SELECT oid FROM t1)`, migrations.Partitions)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		out[name] = parents[name]
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// renamePartitions names each partition and partition index in plan by its
// parent, so that one expectation holds in both layouts: in the
// partitioned one, a scan of one partition through its copy of an index is
// the scan of the table through that index (TestHotStatementsTouchOnePartition
// checks it is one partition).
// Of partitions (partitionParents), those not in keep are named by nothing
// the checks expect.
func renamePartitions(n map[string]any, partitions, keep map[string]string) {
	for _, key := range []string{"Relation Name", "Index Name"} {
		if name, ok := n[key].(string); ok && partitions[name] != "" {
			n[key] = keep[name]
		}
	}
	kids, _ := n["Plans"].([]any)
	for _, k := range kids {
		if m, ok := k.(map[string]any); ok {
			renamePartitions(m, partitions, keep)
		}
	}
}

// explainPlan prepares query on a connection of its own (a fresh plan for
// the current table state) and returns EXPLAIN (FORMAT JSON)'s root node.
func explainPlan(t *testing.T, db *sql.DB, query, args, mode string) map[string]any {
	t.Helper()
	if query == "" {
		t.Fatal("no such statement in store.HotSQL")
	}
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `PREPARE hot AS `+query); err != nil {
		t.Fatalf("prepare: %v\n%s", err, query)
	}
	defer conn.ExecContext(ctx, `DEALLOCATE hot`) //nolint:errcheck // the connection goes back to the pool either way
	if _, err := conn.ExecContext(ctx, `SET plan_cache_mode = `+mode); err != nil {
		t.Fatal(err)
	}
	defer conn.ExecContext(ctx, `RESET plan_cache_mode`) //nolint:errcheck
	var out []byte
	exec := `EXECUTE hot`
	if args != "" {
		exec += ` (` + args + `)`
	}
	if err := conn.QueryRowContext(ctx, `EXPLAIN (FORMAT JSON) `+exec).Scan(&out); err != nil {
		t.Fatalf("explain: %v", err)
	}
	var doc []struct {
		Plan map[string]any `json:"Plan"`
	}
	if err := json.Unmarshal(out, &doc); err != nil || len(doc) != 1 {
		t.Fatalf("explain output: %v", err)
	}
	return doc[0].Plan
}

// checkPlan lists what is wrong with plan: a scan of one of c's tables that
// is not through one of the listed indexes, a listed column missing from the
// Index Cond or present in the Filter, a listed scan that never happens, an
// arbiter that is not the key.
func checkPlan(plan map[string]any, c planCase) []string {
	var problems []string
	want := map[string][]planScan{}
	for _, s := range c.scans {
		want[s.table] = append(want[s.table], s)
	}
	seen := map[string]bool{} // table + index
	arbiter := false
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		typ, _ := n["Node Type"].(string)
		if idx, ok := n["Conflict Arbiter Indexes"].([]any); ok {
			for _, a := range idx {
				arbiter = arbiter || a == c.arbiter
			}
		}
		rel, _ := n["Relation Name"].(string)
		if scans, ok := want[rel]; ok && typ != "ModifyTable" {
			index, _ := n["Index Name"].(string)
			cond, _ := n["Index Cond"].(string)
			filter, _ := n["Filter"].(string)
			switch typ {
			case "Bitmap Heap Scan":
				// One bitmap of one index is a lookup by that index. The
				// bitmap is the outer child; the others are subplans of the
				// scan's filter.
				var bitmaps []map[string]any
				kids, _ := n["Plans"].([]any)
				for _, kid := range kids {
					if k, _ := kid.(map[string]any); k["Parent Relationship"] == "Outer" {
						bitmaps = append(bitmaps, k)
					}
				}
				if len(bitmaps) == 1 && bitmaps[0]["Node Type"] == "Bitmap Index Scan" {
					index, _ = bitmaps[0]["Index Name"].(string)
					cond, _ = bitmaps[0]["Index Cond"].(string)
				}
			case "Tid Scan":
				index, cond = "ctid", fmt.Sprint(n["TID Cond"])
			}
			var match *planScan
			for i := range scans {
				if scans[i].index == index {
					match = &scans[i]
				}
			}
			switch {
			case match == nil:
				problems = append(problems, fmt.Sprintf("%s on %s (index %q), want one of %v", typ, rel, index, scans))
			default:
				seen[rel+" "+index] = true
				for _, col := range match.cols {
					if slices.Contains(c.emptyTies, col) && !mentions(cond, col) {
						continue
					}
					if !mentions(cond, col) {
						problems = append(problems, fmt.Sprintf("%s using %s: %s not in Index Cond %q", typ, index, col, cond))
					}
					if mentions(filter, col) {
						problems = append(problems, fmt.Sprintf("%s using %s: %s in Filter %q", typ, index, col, filter))
					}
				}
			}
		}
		children, _ := n["Plans"].([]any)
		for _, ch := range children {
			if m, ok := ch.(map[string]any); ok {
				walk(m)
			}
		}
	}
	walk(plan)
	for _, s := range c.scans {
		if !seen[s.table+" "+s.index] && !slices.ContainsFunc(c.emptyKeyed, func(k planScan) bool { return k.table == s.table && k.index == s.index }) {
			problems = append(problems, fmt.Sprintf("no scan of %s using %s", s.table, s.index))
		}
	}
	if c.arbiter != "" && !arbiter {
		problems = append(problems, "conflict arbiter is not "+c.arbiter)
	}
	if len(problems) > 0 {
		b, _ := json.MarshalIndent(plan, "", " ")
		problems = append(problems, "plan:\n"+compactPlan(string(b)))
	}
	return problems
}

var planKeyRE = regexp.MustCompile(`"(Node Type|Relation Name|Index Name|Index Cond|Filter|Recheck Cond)": (".*")`)

// compactPlan keeps the lines of a JSON plan that say how a table is read.
func compactPlan(js string) string {
	var b strings.Builder
	for _, m := range planKeyRE.FindAllStringSubmatch(js, -1) {
		b.WriteString("  " + m[1] + ": " + m[2] + "\n")
	}
	return b.String()
}

// mentions reports whether expr compares column col (qualified or not).
func mentions(expr, col string) bool {
	return regexp.MustCompile(`(^|[(\s.])` + regexp.QuoteMeta(col) + `\s*(=|<>|>=|<=|>|<|IS\b)`).MatchString(expr)
}
