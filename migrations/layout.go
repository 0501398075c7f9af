package migrations

// Layouts (issue 18). The plain layout is what the numbered files say. The
// partitioned layout is the same files with each large tenant table
// hash-partitioned by tenant_id into Partitions partitions: the migrator
// rewrites a listed table's CREATE TABLE to end in PARTITION BY HASH
// (tenant_id) and creates its partitions right after it, in the same
// transaction. Nothing else differs, so a file's checksum, the status, the
// readiness version and every later migration are layout-independent, and
// one file never needs two variants.
//
// PostgreSQL 15 allows every constraint the files declare on such a table:
// every primary key and unique index holds tenant_id (0001, 0006), foreign
// keys may point at or from a partitioned table, an identity column draws
// from one sequence on the parent, and an index created on the parent is
// created on every partition.
//
// The layout is chosen once, before the first migration, and recorded in
// schema_layout; changing it later would mean rewriting every large table,
// so ApplyLayout refuses a different layout on a database with any
// migration applied (ErrLayoutChange).

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Layout is how the large tables are stored.
type Layout string

const (
	LayoutPlain       Layout = "plain"       // one heap per table (the default)
	LayoutPartitioned Layout = "partitioned" // the large tables hash-partitioned by tenant_id
)

// Partitions is the number of hash partitions of each large table in the
// partitioned layout. Every large table has the same modulus, so a tenant's
// rows of every table are in partitions with the same remainder (what the
// janitor's per-partition sweep and a colocated distribution rely on).
const Partitions = 8

// ErrLayoutChange reports a layout different from the one the database was
// migrated with.
var ErrLayoutChange = errors.New("migrations: the database was migrated with another layout; a layout is chosen before the first migration and never changes")

// ErrUnknownLayout reports a layout name that is neither plain nor partitioned.
var ErrUnknownLayout = errors.New("migrations: unknown layout (want plain or partitioned)")

// ParseLayout reads a layout name as envctl migrate --layout takes it.
func ParseLayout(s string) (Layout, error) {
	switch l := Layout(s); l {
	case LayoutPlain, LayoutPartitioned:
		return l, nil
	}
	return "", ErrUnknownLayout
}

// PartitionedTables are the tables the partitioned layout partitions, by the
// migration that creates them: the tables that grow with traffic. The
// others (credentials, keys, streams, endpoints, secret ref owners) grow
// with tenants and devices and stay plain. TestEveryTableHasALayout makes a
// new migration's CREATE TABLE choose.
var PartitionedTables = map[int][]string{
	1: {"event_identities", "inbound_payloads", "audit_events"},
	2: {"outbound_envelopes", "outbox_messages"},
	7: {"outbox_attempts"},
	8: {"outbound_bodies"},
}

// PartitionName is partition i (0..Partitions-1) of table in the
// partitioned layout.
func PartitionName(table string, i int) string { return fmt.Sprintf("%s_p%d", table, i) }

const createLayoutTable = `CREATE TABLE IF NOT EXISTS schema_layout (
    only_row    boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
    layout      text        NOT NULL CHECK (layout IN ('plain', 'partitioned')),
    partitions  integer     NOT NULL CHECK (partitions >= 1),
    recorded_at timestamptz NOT NULL DEFAULT now()
)`

// recordLayout runs under the migrators' advisory lock, after
// schema_migrations exists. want "" keeps the recorded layout (plain for a
// new database). A database migrated before layouts existed has
// migrations and no row: it is plain, and is recorded so.
//
// On a schema a later release migrated (newer), nothing is written: Apply
// leaves such a database as it is.
func recordLayout(ctx context.Context, conn *sql.Conn, want Layout, migrated, newer bool) (Layout, error) {
	if want != "" {
		if _, err := ParseLayout(string(want)); err != nil {
			return "", err
		}
	}
	if newer {
		var have Layout = LayoutPlain
		var exists bool
		if err := conn.QueryRowContext(ctx, `SELECT to_regclass('schema_layout') IS NOT NULL`).Scan(&exists); err != nil {
			return "", fmt.Errorf("migrations: read schema_layout: %w", err)
		}
		if exists {
			if err := conn.QueryRowContext(ctx, `SELECT layout FROM schema_layout`).Scan(&have); err != nil && !errors.Is(err, sql.ErrNoRows) {
				return "", fmt.Errorf("migrations: read schema_layout: %w", err)
			}
		}
		if want != "" && want != have {
			return "", fmt.Errorf("%w: it is %s, %s was asked for", ErrLayoutChange, have, want)
		}
		return have, nil
	}
	if _, err := conn.ExecContext(ctx, createLayoutTable); err != nil {
		return "", fmt.Errorf("migrations: create schema_layout: %w", err)
	}
	var have Layout
	err := conn.QueryRowContext(ctx, `SELECT layout FROM schema_layout`).Scan(&have)
	switch {
	case errors.Is(err, sql.ErrNoRows) && migrated:
		have = LayoutPlain
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return "", fmt.Errorf("migrations: read schema_layout: %w", err)
	}
	if have != "" && migrated {
		if want != "" && want != have {
			return "", fmt.Errorf("%w: it is %s, %s was asked for", ErrLayoutChange, have, want)
		}
		want = have
	}
	if want == "" {
		want = LayoutPlain
	}
	// No migration applied yet (or a pre-layout database): nothing depends
	// on the row, so it may still be written or changed.
	if _, err := conn.ExecContext(ctx, `INSERT INTO schema_layout (layout, partitions) VALUES ($1, $2)
ON CONFLICT (only_row) DO UPDATE SET layout = EXCLUDED.layout, partitions = EXCLUDED.partitions, recorded_at = now()
WHERE schema_layout.layout <> EXCLUDED.layout`, string(want), partitionsOf(want)); err != nil {
		return "", fmt.Errorf("migrations: record layout: %w", err)
	}
	return want, nil
}

func partitionsOf(l Layout) int {
	if l == LayoutPartitioned {
		return Partitions
	}
	return 1
}

// CurrentLayout reads the recorded layout. recorded is false when the
// database has no row: never migrated (layout "") or migrated before
// layouts existed (LayoutPlain).
func CurrentLayout(ctx context.Context, db *sql.DB) (l Layout, recorded bool, err error) {
	var hasLayout, hasMigrations bool
	if err := db.QueryRowContext(ctx, `SELECT to_regclass('schema_layout') IS NOT NULL, to_regclass('schema_migrations') IS NOT NULL`).
		Scan(&hasLayout, &hasMigrations); err != nil {
		return "", false, fmt.Errorf("migrations: layout: %w", err)
	}
	if hasLayout {
		// The roles may read schema_migrations (0001) but not this table,
		// which the migrator creates before 0001 runs; the catalog says the
		// same thing, since the layout never changes after 0001.
		var readable bool
		if err := db.QueryRowContext(ctx, `SELECT has_table_privilege('schema_layout', 'SELECT')`).Scan(&readable); err != nil {
			return "", false, fmt.Errorf("migrations: layout: %w", err)
		}
		if !readable {
			var kind string
			err := db.QueryRowContext(ctx, `SELECT coalesce((SELECT relkind::text FROM pg_class WHERE oid = to_regclass('event_identities')), '')`).Scan(&kind)
			switch {
			case err != nil:
				return "", false, fmt.Errorf("migrations: layout: %w", err)
			case kind == "p":
				return LayoutPartitioned, true, nil
			case kind == "r":
				return LayoutPlain, true, nil
			}
			return "", false, nil
		}
		err := db.QueryRowContext(ctx, `SELECT layout FROM schema_layout`).Scan(&l)
		if err == nil {
			return l, true, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return "", false, fmt.Errorf("migrations: layout: %w", err)
		}
	}
	if hasMigrations {
		v, err := Version(ctx, db)
		if err != nil {
			return "", false, err
		}
		if v > 0 {
			return LayoutPlain, false, nil
		}
	}
	return "", false, nil
}

// sqlFor is m's SQL as the layout runs it.
func sqlFor(m Migration, l Layout) (string, error) {
	if l != LayoutPartitioned {
		return m.SQL, nil
	}
	out := m.SQL
	for _, table := range PartitionedTables[m.Version] {
		var err error
		if out, err = partitionTable(out, table); err != nil {
			return "", fmt.Errorf("migrations: %s: %w", m.Name, err)
		}
	}
	return out, nil
}

// partitionTable rewrites the one CREATE TABLE of table in src.
func partitionTable(src, table string) (string, error) {
	re := regexp.MustCompile(`(?m)^CREATE TABLE (IF NOT EXISTS )?` + regexp.QuoteMeta(table) + `\s*\(`)
	locs := re.FindAllStringIndex(src, -1)
	if len(locs) != 1 {
		return "", fmt.Errorf("want one CREATE TABLE %s, found %d", table, len(locs))
	}
	open := locs[0][1] - 1
	end, err := closingParen(src, open)
	if err != nil {
		return "", fmt.Errorf("CREATE TABLE %s: %w", table, err)
	}
	rest := strings.TrimLeft(src[end+1:], " \t\r\n")
	if !strings.HasPrefix(rest, ";") {
		return "", fmt.Errorf("CREATE TABLE %s: the column list must end the statement", table)
	}
	semi := len(src) - len(rest)
	var b strings.Builder
	b.WriteString(src[:end+1])
	b.WriteString(" PARTITION BY HASH (tenant_id);\n")
	for i := 0; i < Partitions; i++ {
		fmt.Fprintf(&b, "CREATE TABLE IF NOT EXISTS %s PARTITION OF %s FOR VALUES WITH (MODULUS %d, REMAINDER %d);\n",
			PartitionName(table, i), table, Partitions, i)
	}
	b.WriteString(src[semi+1:])
	return b.String(), nil
}

// closingParen finds the parenthesis that closes the one at open, skipping
// string literals and -- comments.
func closingParen(s string, open int) (int, error) {
	depth := 0
	for i := open; i < len(s); i++ {
		switch {
		case s[i] == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return 0, errors.New("unterminated string literal")
			}
			i += j + 1
		case strings.HasPrefix(s[i:], "--"):
			j := strings.IndexByte(s[i:], '\n')
			if j < 0 {
				return 0, errors.New("unterminated column list")
			}
			i += j
		case s[i] == '(':
			depth++
		case s[i] == ')':
			if depth--; depth == 0 {
				return i, nil
			}
		}
	}
	return 0, errors.New("unterminated column list")
}

// grantPartitionsSQL gives each partition of a partitioned table the
// table-level privileges its parent grants, after every migration of the
// partitioned layout (a migration may have granted or revoked on a parent).
// Reads and writes go through the parent, whose privileges PostgreSQL
// checks; the retention-janitor alone names partitions, to delete by ctid
// in one partition at a time (modules/store, retention.go). Column
// privileges stay on the parents: nothing reaches a partition's columns
// directly.
const grantPartitionsSQL = `DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT c.oid::regclass AS part, g.rolname
        FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        JOIN pg_class p ON p.oid = i.inhparent AND p.relkind = 'p',
             aclexplode(c.relacl) a
        JOIN pg_roles g ON g.oid = a.grantee
        WHERE a.grantee <> c.relowner
    LOOP
        EXECUTE format('REVOKE ALL ON %s FROM %I', r.part, r.rolname);
    END LOOP;
    FOR r IN
        SELECT c.oid::regclass AS part, g.rolname, string_agg(a.privilege_type, ', ') AS privs
        FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        JOIN pg_class p ON p.oid = i.inhparent AND p.relkind = 'p',
             aclexplode(p.relacl) a
        JOIN pg_roles g ON g.oid = a.grantee
        WHERE a.grantee <> p.relowner
        GROUP BY c.oid, g.rolname
    LOOP
        EXECUTE format('GRANT %s ON %s TO %I', r.privs, r.part, r.rolname);
    END LOOP;
END
$$`
