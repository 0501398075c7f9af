package store_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// crossTenantCases are the statements that read every tenant's rows by
// design, with why, how often they run, and the arguments to run them with.
// Each must stop at its LIMIT where it has one; how many partitions it
// touches is logged, not bounded: all of them is the point. How each reads
// a large table is TestHotStatementPlansUseTheirKeys' business (the
// janitor's deletes are there); on the seeded partitions here, most of them
// a few hundred rows, a sequential scan is the planner's right choice.
// dueTenants reads outbox_due_tenants (0011), one plain table, by its due
// index up to its LIMIT (TestHotStatementPlansUseTheirKeys): no partition.
var crossTenantCases = []struct {
	name, args, why string
	limited         bool
}{
	{"dueTenants", `100`, "the worker's round: which tenants have due work (one per polling round)", true},
	{"outboxStats", ``, "the worker's backlog gauge, no tenant breakdown (one per metrics scrape)", false},
	{"expiredPayloads", `now(), 1000`, "the janitor's delete on the plain layout; the partitioned one runs PartitionSweepSQL", true},
	{"expiredAttempts", `now(), 1000`, "as expiredPayloads, outbound attempt rows", true},
	{"expiredBodies", `now(), 1000`, "as expiredPayloads, outbound bodies", true},
	{"backfillBodies", `'', ''::bytea, 1000, 7776000000000`, "envctl outbox backfill-bodies: key order across tenants, once per upgrade", true},
}

// TestHotStatementsTouchOnePartition is the stand-in for "routes to one
// shard": on a populated partitioned database every hot statement
// (store.HotSQL, the statements themselves, so changes to them are
// checked) that names a tenant, and each per-partition retention delete,
// executes a scan of at most one partition of each table, with custom
// plans (pruned when planned) and generic ones (pruned when the executor
// starts, "Subplans Removed", or while it runs, a subplan "never
// executed"). EXPLAIN ANALYZE counts what ran, so both kinds of pruning
// are judged by the same measure; each statement runs in a transaction
// that is rolled back.
func TestHotStatementsTouchOnePartition(t *testing.T) {
	dsn := storetest.NewDatabaseIn(t, migrations.LayoutPartitioned)
	db := storetest.AdminDB(t, dsn)
	seedPlanTables(t, db, 1, 20000)
	if _, err := db.Exec(`ANALYZE ` + strings.Join(planTables, ", ")); err != nil {
		t.Fatal(err)
	}
	parents := partitionParents(t, db)
	if spread := countInt(t, db, `SELECT count(DISTINCT tableoid) FROM outbox_messages`); spread < 3 {
		t.Fatalf("the seeded messages are in %d partitions; the test needs tenants in several", spread)
	}

	sweeps := store.PartitionSweepSQL(pgx.Identifier{migrations.PartitionName("inbound_payloads", 0)}.Sanitize(),
		pgx.Identifier{migrations.PartitionName("outbound_bodies", 0)}.Sanitize(),
		pgx.Identifier{migrations.PartitionName("outbox_attempts", 0)}.Sanitize())
	type stmt struct{ name, query, args string }
	var tenantStmts []stmt
	for _, c := range planCases {
		if _, cross := store.CrossTenantSQL[c.name]; cross {
			continue
		}
		tenantStmts = append(tenantStmts, stmt{c.name, store.HotSQL[c.name], c.args})
	}
	for name := range store.HotSQL {
		_, cross := store.CrossTenantSQL[name]
		if !cross && !slices.ContainsFunc(planCases, func(c planCase) bool { return c.name == name }) {
			t.Errorf("store.HotSQL[%q] has no plan case: give it arguments in planCases", name)
		}
	}
	for _, name := range []string{"expiredPayloads", "expiredAttempts", "expiredBodies"} {
		tenantStmts = append(tenantStmts, stmt{name + " (partition 0)", sweeps[name], `now(), 1000`})
	}
	reached := 0 // statements that scanned a partition: the check is not vacuous
	for _, c := range tenantStmts {
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			plan := explainAnalyze(t, db, c.query, c.args, mode)
			touched := partitionsRun(plan, parents)
			if len(touched) > 0 {
				reached++
			}
			for table, parts := range touched {
				if len(parts) > 1 {
					t.Errorf("%s, %s: scans %d partitions of %s (%v); a statement of one tenant must reach one",
						c.name, mode, len(parts), table, parts)
				}
			}
		}
	}
	if reached < len(tenantStmts) {
		t.Errorf("only %d of %d plans of tenant statements scanned a partition", reached, 2*len(tenantStmts))
	}
	for _, c := range crossTenantCases {
		if store.CrossTenantSQL[c.name] == "" {
			t.Fatalf("no cross-tenant statement %q", c.name)
		}
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			plan := explainAnalyze(t, db, store.CrossTenantSQL[c.name], c.args, mode)
			if c.limited && !hasNode(plan, "Limit") {
				t.Errorf("%s (%s), %s: no Limit in the plan", c.name, c.why, mode)
			}
			t.Logf("%s, %s: partitions run %v (%s)", c.name, mode, summarize(partitionsRun(plan, parents)), c.why)
		}
	}
}

func countInt(t *testing.T, db *sql.DB, q string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// explainAnalyze runs query in a transaction it rolls back and returns
// EXPLAIN (ANALYZE, FORMAT JSON)'s root node.
func explainAnalyze(t *testing.T, db *sql.DB, query, args, mode string) map[string]any {
	t.Helper()
	if query == "" {
		t.Fatal("no such statement")
	}
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `BEGIN`); err != nil {
		t.Fatal(err)
	}
	defer conn.ExecContext(ctx, `ROLLBACK`) //nolint:errcheck // the connection is closed next either way
	if _, err := conn.ExecContext(ctx, `PREPARE hot AS `+query); err != nil {
		t.Fatalf("prepare: %v\n%s", err, query)
	}
	if _, err := conn.ExecContext(ctx, `SET LOCAL plan_cache_mode = `+mode); err != nil {
		t.Fatal(err)
	}
	exec := `EXECUTE hot`
	if args != "" {
		exec += ` (` + args + `)`
	}
	var out []byte
	if err := conn.QueryRowContext(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+exec).Scan(&out); err != nil {
		t.Fatalf("explain analyze: %v\n%s", err, query)
	}
	if _, err := conn.ExecContext(ctx, `DEALLOCATE hot`); err != nil {
		t.Fatal(err)
	}
	var doc []struct {
		Plan map[string]any `json:"Plan"`
	}
	if err := json.Unmarshal(out, &doc); err != nil || len(doc) != 1 {
		t.Fatalf("explain output: %v", err)
	}
	return doc[0].Plan
}

// partitionsRun lists, per partitioned table, the partitions a plan node
// actually scanned (Actual Loops > 0): a subplan removed at executor start
// is absent, one pruned while running shows zero loops.
func partitionsRun(n map[string]any, parents map[string]string) map[string][]string {
	out := map[string][]string{}
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		rel, _ := n["Relation Name"].(string)
		loops, _ := n["Actual Loops"].(float64)
		if parent := parents[rel]; parent != "" && loops > 0 && !slices.Contains(out[parent], rel) {
			out[parent] = append(out[parent], rel)
		}
		kids, _ := n["Plans"].([]any)
		for _, k := range kids {
			if m, ok := k.(map[string]any); ok {
				walk(m)
			}
		}
	}
	walk(n)
	return out
}

func hasNode(n map[string]any, typ string) bool {
	if n["Node Type"] == typ {
		return true
	}
	kids, _ := n["Plans"].([]any)
	for _, k := range kids {
		if m, ok := k.(map[string]any); ok && hasNode(m, typ) {
			return true
		}
	}
	return false
}

func summarize(m map[string][]string) string {
	var parts []string
	for table, ps := range m {
		parts = append(parts, fmt.Sprintf("%s:%d", table, len(ps)))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}
