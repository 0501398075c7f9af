package store_test

import (
	"database/sql"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// TestUnanalyzedParentsPlanAsAnalyzed: autovacuum analyzes the partitions of
// a partitioned table but never the parent (docs/scaling.md), so a
// production database on the partitioned layout has statistics on every
// partition and none on the parents. On such a database (large, skewed,
// partitions analyzed), every hot statement (store.HotSQL), every
// cross-tenant one (store.CrossTenantSQL), the per-partition janitor deletes
// and the operator's audit read must read the same tables through the same
// indexes as once the parents are analyzed too, custom and generic; the hot
// ones are also held to their keys (checkPlan, no ties allowed). What the
// parents' statistics may still change is how the same scans are put
// together: a Memoize over a repeated probe, a parallel Gather, a Merge
// Append for a Sort. Those plans are logged, with the time each took here
// (EXPLAIN ANALYZE, best of five; a figure, not a check), and
// docs/scaling.md says what they mean.
func TestUnanalyzedParentsPlanAsAnalyzed(t *testing.T) {
	dsn := storetest.NewDatabaseIn(t, migrations.LayoutPartitioned)
	db := storetest.AdminDB(t, dsn)
	seedPlanTables(t, db, 1, 100000)
	if _, err := db.Exec(`INSERT INTO audit_events (tenant_id, project_id, account_id, device_id, event_identity, outcome, correlation_id, at)
SELECT CASE WHEN g % 10 = 0 THEN 't' || (g % 100) ELSE 't1' END, 'p' || (g % 3), 'acct', 'd1',
       encode(sha256(('e-' || g)::bytea), 'hex'), 'accepted', 'corr-' || g, now() - g * interval '1 second'
FROM generate_series(1, 100000) g`); err != nil {
		t.Fatal(err)
	}
	parents := partitionParents(t, db)
	var partitioned, leaves []string
	for _, table := range planTables {
		isParent := false
		for child, parent := range parents {
			if parent == table {
				isParent = true
				leaves = append(leaves, pgx.Identifier{child}.Sanitize())
			}
		}
		if isParent {
			partitioned = append(partitioned, table)
		} else {
			leaves = append(leaves, table)
		}
	}
	if len(partitioned) < 7 {
		t.Fatalf("only %d of the plan tables are partitioned (%v): not the partitioned layout", len(partitioned), partitioned)
	}
	// What autovacuum leaves: every leaf analyzed, no parent.
	if _, err := db.Exec(`ANALYZE ` + strings.Join(leaves, ", ")); err != nil {
		t.Fatal(err)
	}
	// From here on only this test's ANALYZE of the parents changes
	// statistics: the timed runs below execute the writing statements (and
	// roll them back), which can bring a small leaf such as
	// outbox_due_tenants to autovacuum's threshold between the two plans of
	// a statement, and its new statistics changed a plan's scans.
	for _, leaf := range leaves {
		if _, err := db.Exec(`ALTER TABLE ` + leaf + ` SET (autovacuum_enabled = off)`); err != nil {
			t.Fatal(err)
		}
	}
	parentStats := func() int {
		return countInt(t, db, fmt.Sprintf(`SELECT count(*) FROM pg_stats WHERE schemaname = current_schema() AND inherited AND tablename IN ('%s')`,
			strings.Join(partitioned, "', '")))
	}
	if n := parentStats(); n != 0 {
		t.Fatalf("the parents hold %d column statistics before their ANALYZE (autovacuum on a parent?)", n)
	}

	type stmt struct {
		name, query, args string
		keys              *planCase // the keys a hot statement must use
	}
	var stmts []stmt
	for i := range planCases {
		c := &planCases[i]
		stmts = append(stmts, stmt{c.name, store.HotSQL[c.name], c.args, c})
	}
	for _, c := range crossTenantCases {
		if _, hot := store.HotSQL[c.name]; !hot {
			stmts = append(stmts, stmt{c.name, store.CrossTenantSQL[c.name], c.args, nil})
		}
	}
	t1 := t1Partitions(t, db, parents)
	part := func(table string) string {
		for child, parent := range t1 {
			if parent == table {
				return pgx.Identifier{child}.Sanitize()
			}
		}
		t.Fatalf("no partition of %s holds t1", table)
		return ""
	}
	for name, q := range store.PartitionSweepSQL(part("inbound_payloads"), part("outbound_bodies"), part("outbox_attempts")) {
		stmts = append(stmts, stmt{name + " (t1's partition)", q, `now(), 1000`, nil})
	}
	stmts = append(stmts, stmt{"listAudit", store.OperatorSQL["listAudit"], `'t1', 'p1'`, nil},
		stmt{"listAudit (window)", store.OperatorSQL["listAudit (window)"], `'t1', now() - interval '1 hour', now(), 'accepted'`, nil})

	modes := []string{"force_custom_plan", "force_generic_plan"}
	before, beforeScans, beforeMS := map[string]string{}, map[string]string{}, map[string]float64{}
	for _, c := range stmts {
		for _, mode := range modes {
			plan := explainPlan(t, db, c.query, c.args, mode)
			before[c.name+" "+mode] = planShape(plan)
			beforeScans[c.name+" "+mode] = planScans(plan)
			beforeMS[c.name+" "+mode] = bestRun(t, db, c.query, c.args, mode)
			if c.keys != nil {
				renamePartitions(plan, parents, t1)
				cc := *c.keys
				cc.emptyTies = nil
				for _, problem := range checkPlan(plan, cc) {
					t.Errorf("unanalyzed parents, %s, %s: %s", c.name, mode, problem)
				}
			}
		}
	}

	if _, err := db.Exec(`ANALYZE ` + strings.Join(partitioned, ", ")); err != nil {
		t.Fatal(err)
	}
	if parentStats() == 0 {
		t.Fatal("ANALYZE of the parents wrote no statistics: the comparison would compare nothing")
	}
	changed := 0
	for _, c := range stmts {
		for _, mode := range modes {
			k := c.name + " " + mode
			plan := explainPlan(t, db, c.query, c.args, mode)
			if scans := planScans(plan); scans != beforeScans[k] {
				t.Errorf("%s, %s: the scans change once the parents are analyzed\nunanalyzed parents:\n%s\nanalyzed parents:\n%s",
					c.name, mode, before[k], planShape(plan))
				continue
			}
			if after := planShape(plan); after != before[k] {
				changed++
				t.Logf("%s, %s: same scans, other assembly once the parents are analyzed; best of five %.2f ms unanalyzed, %.2f ms analyzed\nunanalyzed parents:\n%s\nanalyzed parents:\n%s",
					c.name, mode, beforeMS[k], bestRun(t, db, c.query, c.args, mode), before[k], after)
			}
		}
	}
	t.Logf("%d of %d plans keep their scans and differ in assembly only", changed, len(stmts)*len(modes))
}

// planScans lists, sorted, every table access of plan: node type, relation
// and the index it goes through (a bitmap scan's index is its child's).
func planScans(plan map[string]any) string {
	var scans []string
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		if rel, ok := n["Relation Name"].(string); ok && n["Node Type"] != "ModifyTable" {
			index, _ := n["Index Name"].(string)
			if n["Node Type"] == "Bitmap Heap Scan" {
				kids, _ := n["Plans"].([]any)
				for _, k := range kids {
					if m, _ := k.(map[string]any); m["Node Type"] == "Bitmap Index Scan" {
						name, _ := m["Index Name"].(string)
						index += name + " "
					}
				}
			}
			scans = append(scans, fmt.Sprintf("%s %s %s", n["Node Type"], rel, index))
		}
		kids, _ := n["Plans"].([]any)
		for _, k := range kids {
			if m, ok := k.(map[string]any); ok {
				walk(m)
			}
		}
	}
	walk(plan)
	slices.Sort(scans)
	return strings.Join(scans, "\n")
}

// bestRun is the least Actual Total Time of five EXPLAIN ANALYZE runs (each
// rolled back), in ms.
func bestRun(t *testing.T, db *sql.DB, query, args, mode string) float64 {
	t.Helper()
	best := math.Inf(1)
	for range 5 {
		ms, _ := explainAnalyze(t, db, query, args, mode)["Actual Total Time"].(float64)
		best = min(best, ms)
	}
	return best
}

// planShape is a plan without its estimates: each node's type, strategy,
// join type, relation and index, indented by depth.
func planShape(plan map[string]any) string {
	var b strings.Builder
	var walk func(n map[string]any, depth int)
	walk = func(n map[string]any, depth int) {
		b.WriteString(strings.Repeat("  ", depth))
		for _, key := range []string{"Node Type", "Strategy", "Join Type", "Relation Name", "Index Name", "Subplans Removed"} {
			if v, ok := n[key]; ok {
				fmt.Fprintf(&b, "%s=%v ", key, v)
			}
		}
		b.WriteString("\n")
		kids, _ := n["Plans"].([]any)
		for _, k := range kids {
			if m, ok := k.(map[string]any); ok {
				walk(m, depth+1)
			}
		}
	}
	walk(plan, 0)
	return b.String()
}
