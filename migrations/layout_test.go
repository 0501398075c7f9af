package migrations

import (
	"context"
	"database/sql"
	"errors"
	"regexp"
	"slices"
	"testing"
)

// plainTables are the tables every layout keeps as one heap: they grow with
// tenants, devices and endpoints, not with traffic.
var plainTables = []string{"credentials", "producer_keys", "streams", "endpoints", "outbound_streams", "secret_ref_owners",
	"outbox_due_tenants"}

func TestParseLayout(t *testing.T) {
	for _, s := range []string{"plain", "partitioned"} {
		if l, err := ParseLayout(s); err != nil || string(l) != s {
			t.Errorf("ParseLayout(%q) = %q, %v", s, l, err)
		}
	}
	for _, s := range []string{"", "Plain", "sharded", "partitioned "} {
		if _, err := ParseLayout(s); !errors.Is(err, ErrUnknownLayout) {
			t.Errorf("ParseLayout(%q) = %v, want ErrUnknownLayout", s, err)
		}
	}
}

// TestEveryTableHasALayout makes each CREATE TABLE of every migration either
// partitioned (PartitionedTables, at the version that creates it) or named
// plain here, and checks the partitioned variant of every file is built.
func TestEveryTableHasALayout(t *testing.T) {
	re := regexp.MustCompile(`(?m)^CREATE TABLE (?:IF NOT EXISTS )?(\w+)`)
	seen := map[string]bool{}
	for _, m := range All() {
		for _, g := range re.FindAllStringSubmatch(m.SQL, -1) {
			table := g[1]
			seen[table] = true
			switch {
			case slices.Contains(PartitionedTables[m.Version], table):
			case slices.Contains(plainTables, table):
			default:
				t.Errorf("%s creates %s: add it to PartitionedTables (version %d) or to plainTables", m.Name, table, m.Version)
			}
		}
		if _, err := sqlFor(m, LayoutPartitioned); err != nil {
			t.Errorf("partitioned variant: %v", err)
		}
		if s, err := sqlFor(m, LayoutPlain); err != nil || s != m.SQL {
			t.Errorf("%s: the plain layout must run the file as it is", m.Name)
		}
	}
	for v, tables := range PartitionedTables {
		for _, table := range tables {
			if !seen[table] {
				t.Errorf("PartitionedTables[%d] names %s, which no migration creates", v, table)
			}
		}
	}
}

func TestPartitionTableRefusesWhatItCannotRewrite(t *testing.T) {
	for _, src := range []string{
		"CREATE TABLE a (tenant_id text);",                              // not the table asked for
		"CREATE TABLE t (tenant_id text);\nCREATE TABLE t (x int);",     // twice
		"CREATE TABLE t (tenant_id text CHECK (tenant_id <> ')')",       // unterminated
		"CREATE TABLE t (tenant_id text) WITH (fillfactor = 90);",       // options after the columns
		"CREATE TABLE t (tenant_id text DEFAULT 'x);\n",                 // unterminated string
		"CREATE TABLE t (tenant_id text -- a comment ) that never ends", // unterminated comment
	} {
		if out, err := partitionTable(src, "t"); err == nil {
			t.Errorf("partitionTable(%q) = %q, want an error", src, out)
		}
	}
	out, err := partitionTable("CREATE TABLE t (\n  a text CHECK (a IN ('(', ')')), -- a ) here\n  tenant_id text\n);\nSELECT 1;", "t")
	if err != nil {
		t.Fatal(err)
	}
	want := "CREATE TABLE t (\n  a text CHECK (a IN ('(', ')')), -- a ) here\n  tenant_id text\n) PARTITION BY HASH (tenant_id);\n" +
		"CREATE TABLE IF NOT EXISTS t_p0 PARTITION OF t FOR VALUES WITH (MODULUS 8, REMAINDER 0);\n"
	if len(out) < len(want) || out[:len(want)] != want || out[len(out)-len("\nSELECT 1;"):] != "\nSELECT 1;" {
		t.Errorf("partitionTable:\n%s", out)
	}
}

// relkinds maps each table of the public schema that is not a partition to
// its relkind ('r' plain, 'p' partitioned) and counts its partitions.
func relkinds(t *testing.T, db *sql.DB) (map[string]string, map[string]int) {
	t.Helper()
	rows, err := db.Query(`SELECT c.relname, c.relkind::text,
       (SELECT count(*) FROM pg_inherits i WHERE i.inhparent = c.oid)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	kinds, parts := map[string]string{}, map[string]int{}
	for rows.Next() {
		var name, kind string
		var n int
		if err := rows.Scan(&name, &kind, &n); err != nil {
			t.Fatal(err)
		}
		kinds[name], parts[name] = kind, n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return kinds, parts
}

func partitioned() []string {
	var out []string
	for _, ts := range PartitionedTables {
		out = append(out, ts...)
	}
	return out
}

func checkLayout(t *testing.T, db *sql.DB, want Layout) {
	t.Helper()
	l, recorded, err := CurrentLayout(context.Background(), db)
	if err != nil || l != want || !recorded {
		t.Fatalf("CurrentLayout = %q, recorded %v, %v; want %q, recorded", l, recorded, err, want)
	}
	kinds, parts := relkinds(t, db)
	for _, table := range partitioned() {
		if want == LayoutPartitioned && (kinds[table] != "p" || parts[table] != Partitions) {
			t.Errorf("%s: relkind %q with %d partitions, want partitioned by %d", table, kinds[table], parts[table], Partitions)
		}
		if want == LayoutPlain && (kinds[table] != "r" || parts[table] != 0) {
			t.Errorf("%s: relkind %q with %d partitions, want a plain table", table, kinds[table], parts[table])
		}
	}
	for _, table := range plainTables {
		if kinds[table] != "r" {
			t.Errorf("%s: relkind %q, want a plain table in every layout", table, kinds[table])
		}
	}
}

func TestLayoutPlainByDefault(t *testing.T) {
	ctx := context.Background()
	db := open(t, freshDB(t))
	if l, recorded, err := CurrentLayout(ctx, db); err != nil || l != "" || recorded {
		t.Fatalf("CurrentLayout before migrating = %q, %v, %v; want none", l, recorded, err)
	}
	if _, err := Apply(ctx, db); err != nil {
		t.Fatal(err)
	}
	checkLayout(t, db, LayoutPlain)
	_, err := ApplyLayout(ctx, db, LayoutPartitioned)
	if !errors.Is(err, ErrLayoutChange) {
		t.Fatalf("ApplyLayout(partitioned) on a plain database = %v, want ErrLayoutChange", err)
	}
	if applied, err := ApplyLayout(ctx, db, LayoutPlain); err != nil || len(applied) != 0 {
		t.Fatalf("ApplyLayout(plain) again = %v, %v; want nothing applied", applied, err)
	}
	checkLayout(t, db, LayoutPlain)
	if _, err := ApplyLayout(ctx, db, "sharded"); !errors.Is(err, ErrUnknownLayout) {
		t.Fatalf("ApplyLayout(sharded) = %v, want ErrUnknownLayout", err)
	}
}

func TestLayoutPartitioned(t *testing.T) {
	ctx := context.Background()
	db := open(t, freshDB(t))
	applied, err := ApplyLayout(ctx, db, LayoutPartitioned)
	if err != nil || len(applied) != Latest() {
		t.Fatalf("ApplyLayout(partitioned) = %v, %v", applied, err)
	}
	checkLayout(t, db, LayoutPartitioned)
	// A later migrate (the migrate Job of every release) passes no layout.
	if applied, err := Apply(ctx, db); err != nil || len(applied) != 0 {
		t.Fatalf("Apply on a partitioned database = %v, %v; want nothing applied", applied, err)
	}
	if _, err := ApplyLayout(ctx, db, LayoutPlain); !errors.Is(err, ErrLayoutChange) {
		t.Fatalf("ApplyLayout(plain) on a partitioned database = %v, want ErrLayoutChange", err)
	}
	checkLayout(t, db, LayoutPartitioned)

	// A partition grants what its parent grants at table level, to the same
	// roles, and nothing to anyone else.
	var parent, part string
	if err := db.QueryRow(`SELECT array_to_string(ARRAY(SELECT privilege_type FROM aclexplode((SELECT relacl FROM pg_class WHERE relname = 'inbound_payloads')) a
	    JOIN pg_roles r ON r.oid = a.grantee WHERE r.rolname = 'envelopeworker_janitor' ORDER BY 1), ','),
	  array_to_string(ARRAY(SELECT privilege_type FROM aclexplode((SELECT relacl FROM pg_class WHERE relname = 'inbound_payloads_p3')) a
	    JOIN pg_roles r ON r.oid = a.grantee WHERE r.rolname = 'envelopeworker_janitor' ORDER BY 1), ',')`).Scan(&parent, &part); err != nil {
		t.Fatal(err)
	}
	if parent != "DELETE,SELECT" || part != parent {
		t.Errorf("janitor on inbound_payloads: %q, on inbound_payloads_p3: %q; want DELETE,SELECT on both", parent, part)
	}
	var strays int
	if err := db.QueryRow(`SELECT count(*) FROM pg_class c JOIN pg_inherits i ON i.inhrelid = c.oid, aclexplode(c.relacl) a
WHERE a.grantee <> c.relowner AND NOT EXISTS (
    SELECT FROM pg_class p, aclexplode(p.relacl) pa
    WHERE p.oid = i.inhparent AND pa.grantee = a.grantee AND pa.privilege_type = a.privilege_type)`).Scan(&strays); err != nil {
		t.Fatal(err)
	}
	if strays != 0 {
		t.Errorf("%d partition privileges that the parent does not grant", strays)
	}
	// The identity column draws from one sequence through the parent.
	if _, err := db.Exec(`INSERT INTO audit_events (tenant_id, outcome) SELECT 't' || g, 'accepted' FROM generate_series(1, 50) g`); err != nil {
		t.Fatal(err)
	}
	var ids, spread int
	if err := db.QueryRow(`SELECT count(DISTINCT audit_id), count(DISTINCT tableoid) FROM audit_events`).Scan(&ids, &spread); err != nil {
		t.Fatal(err)
	}
	if ids != 50 || spread < 2 {
		t.Errorf("audit_events: %d distinct ids in %d partitions, want 50 ids over several partitions", ids, spread)
	}
}

// TestLayoutOfOlderDatabases: a database migrated before layouts existed is
// plain, recorded so by its next migrate, and cannot become partitioned; a
// layout recorded before any migration ran may still change.
func TestLayoutOfOlderDatabases(t *testing.T) {
	ctx := context.Background()
	db := open(t, freshDB(t))
	if _, err := Apply(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`DROP TABLE schema_layout`); err != nil {
		t.Fatal(err)
	}
	if l, recorded, err := CurrentLayout(ctx, db); err != nil || l != LayoutPlain || recorded {
		t.Fatalf("CurrentLayout of a pre-layout database = %q, recorded %v, %v; want plain, not recorded", l, recorded, err)
	}
	if _, err := ApplyLayout(ctx, db, LayoutPartitioned); !errors.Is(err, ErrLayoutChange) {
		t.Fatalf("ApplyLayout(partitioned) on a pre-layout database = %v, want ErrLayoutChange", err)
	}
	if _, err := Apply(ctx, db); err != nil {
		t.Fatal(err)
	}
	checkLayout(t, db, LayoutPlain)

	empty := open(t, freshDB(t))
	if _, err := empty.Exec(createTable); err != nil {
		t.Fatal(err)
	}
	if _, err := empty.Exec(createLayoutTable + `; INSERT INTO schema_layout (layout, partitions) VALUES ('plain', 1)`); err != nil {
		t.Fatal(err)
	}
	if _, err := ApplyLayout(ctx, empty, LayoutPartitioned); err != nil {
		t.Fatalf("ApplyLayout(partitioned) before any migration ran = %v", err)
	}
	checkLayout(t, empty, LayoutPartitioned)
}
