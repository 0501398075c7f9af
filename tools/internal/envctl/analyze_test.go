package envctl

import (
	"database/sql"
	"strings"
	"testing"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// TestAnalyzeGathersParentStatistics: on the partitioned layout, envctl
// analyze writes the parents' statistics (pg_stats rows with inherited =
// true, which autovacuum never writes) for every partitioned table, and says
// so one line a table; a role that may not analyze them is refused before
// anything is analyzed; on the plain layout there is nothing to do.
func TestAnalyzeGathersParentStatistics(t *testing.T) {
	dsn := storetest.NewDatabaseIn(t, migrations.LayoutPartitioned)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`INSERT INTO event_identities (tenant_id, event_identity, project_id, producer_id, sequence,
    idempotency_digest, content_digest, key_id, issued_at)
SELECT 't' || (g % 50), sha256(('e-' || g)::bytea), 'p1', 'd1', g, sha256(('i-' || g)::bytea),
       sha256(('c-' || g)::bytea), 'k1', now()
FROM generate_series(1, 5000) g`); err != nil {
		t.Fatal(err)
	}
	parentStats := func() int {
		t.Helper()
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM pg_stats
WHERE schemaname = current_schema() AND inherited AND tablename = 'event_identities'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := parentStats(); n != 0 {
		t.Fatalf("event_identities has %d parent statistics before any ANALYZE", n)
	}

	// The ingest role owns nothing: refused, and nothing analyzed.
	r := run(t, storetest.DSNForRole(dsn, "envelopeworker_ingest"), "analyze")
	r.expect(t, ExitFailure, "may not analyze")
	if !strings.Contains(r.stderr, "event_identities") || !strings.Contains(r.stderr, "schema owner") {
		t.Errorf("refusal does not name the tables and who may: %q", r.stderr)
	}
	if n := parentStats(); n != 0 {
		t.Fatalf("a refused analyze left %d parent statistics", n)
	}

	r = run(t, dsn, "analyze")
	r.expect(t, ExitOK, "")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	var tables []string
	for _, ts := range migrations.PartitionedTables {
		tables = append(tables, ts...)
	}
	if len(lines) != len(tables) {
		t.Errorf("%d lines for %d partitioned tables:\n%s", len(lines), len(tables), r.stdout)
	}
	for _, table := range tables {
		if !strings.Contains(r.stdout, "analyzed "+table+" and its 8 partitions in ") {
			t.Errorf("no line for %s:\n%s", table, r.stdout)
		}
	}
	if n := parentStats(); n == 0 {
		t.Fatal("envctl analyze wrote no parent statistics for event_identities")
	}

	plain := storetest.NewDatabaseIn(t, migrations.LayoutPlain)
	r = run(t, plain, "analyze")
	r.expect(t, ExitOK, "")
	if r.stdout != "no partitioned table (plain layout): nothing to analyze\n" {
		t.Errorf("plain layout: %q", r.stdout)
	}

	run(t, dsn, "analyze", "extra").expect(t, ExitUsage, "unexpected argument")
}
