package store_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// grantMatrix is every privilege each role holds after the migrations
// (migrations/0001 to 0011): table-level privileges, UPDATE granted on
// columns only, and SELECT granted on columns only. Anything not listed must
// not be held.
var grantMatrix = map[string]struct {
	tables  map[string]string   // table -> comma-separated table-level privileges
	columns map[string][]string // table -> columns with a column-level UPDATE grant
	selects map[string][]string // table -> columns with a column-level SELECT grant
}{
	roleIngest: {
		tables: map[string]string{
			"schema_migrations": "SELECT",
			"credentials":       "SELECT", "producer_keys": "SELECT",
			"streams":          "SELECT,INSERT",
			"event_identities": "SELECT,INSERT", "inbound_payloads": "SELECT,INSERT",
			"audit_events":       "INSERT",
			"outbound_streams":   "SELECT,INSERT",
			"outbound_envelopes": "SELECT,INSERT", "outbox_messages": "SELECT,INSERT",
			"outbox_attempts": "SELECT",
			"outbound_bodies": "SELECT,INSERT", "outbound_unmoved_bodies": "SELECT",
		},
		columns: map[string][]string{
			"outbox_messages":  {"dead_at", "max_attempts", "next_attempt_at", "replays", "status", "updated_at"},
			"streams":          {"cursor", "updated_at"},
			"outbound_streams": {"last_sequence", "updated_at"},
			"outbound_bodies":  {"expires_at"}, // a replay clears it
		},
		// Enqueue's fan-out; never an endpoint's URL or secret ref (0005).
		selects: map[string][]string{
			"endpoints": {"endpoint_id", "project_id", "state", "tenant_id", "topic"},
		},
	},
	roleDelivery: {
		tables: map[string]string{
			"schema_migrations": "SELECT",
			"outbox_messages":   "SELECT", "endpoints": "SELECT", "outbound_envelopes": "SELECT",
			"secret_ref_owners": "SELECT", "outbox_attempts": "INSERT",
			"outbound_bodies": "SELECT",
			// The round reads it; the claim raises due_at (0011).
			"outbox_due_tenants": "SELECT",
		},
		columns: map[string][]string{
			"outbound_bodies":    {"expires_at"}, // a settle fixes it
			"outbox_due_tenants": {"due_at"},
			"outbox_messages": {"attempts", "dead_at", "delivered_at", "last_error_code", "lease_expires_at",
				"lease_expiries", "next_attempt_at", "status", "updated_at"},
			"endpoints": {"disabled_reason", "state", "updated_at"},
		},
	},
	roleJanitor: {
		tables: map[string]string{
			"schema_migrations": "SELECT",
			"inbound_payloads":  "SELECT,DELETE",
			// Outbound retention (0008): bodies and attempt rows only.
			"outbound_bodies": "SELECT,DELETE", "outbox_attempts": "SELECT,DELETE",
		},
		// Which messages are still in flight; never a destination or budget.
		selects: map[string][]string{
			"outbox_messages": {"event_identity", "message_id", "status", "tenant_id"},
		},
	},
	roleOperator: {
		tables: map[string]string{
			"schema_migrations":       "SELECT",
			"credentials":             "SELECT,INSERT",
			"producer_keys":           "SELECT,INSERT,DELETE",
			"streams":                 "SELECT,INSERT",
			"event_identities":        "SELECT",
			"audit_events":            "SELECT,INSERT",
			"endpoints":               "SELECT,INSERT",
			"outbox_messages":         "SELECT",
			"secret_ref_owners":       "SELECT",
			"outbox_attempts":         "SELECT",
			"outbound_unmoved_bodies": "SELECT",
		},
		columns: map[string][]string{
			"outbox_messages": {"dead_at", "max_attempts", "next_attempt_at", "replays", "status", "updated_at"},
			"outbound_bodies": {"expires_at"}, // a replay clears it; the body stays out of reach
			"credentials":     {"revoked_at", "status"},
			"producer_keys":   {"retired_at", "revoked_at", "state"},
			"streams":         {"cursor", "replay_floor", "updated_at"},
			"endpoints":       {"disabled_reason", "secret_ref", "state", "updated_at", "url"},
		},
		selects: map[string][]string{
			"outbound_bodies": {"event_identity", "expires_at", "tenant_id"},
		},
	},
}

var tablePrivileges = []string{"SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER"}

// TestRolePrivilegeMatrix reads every role's effective privileges on every
// table, column and sequence of the schema from the catalog
// (has_table_privilege and friends, which count PUBLIC, memberships and
// ownership) and compares them with grantMatrix both ways: a grant nobody
// listed fails, and so does a listed one that is missing. Then it runs, as
// each role, every statement the matrix says the role may not run — SELECT,
// INSERT, DELETE and TRUNCATE on each table it lacks them on, and UPDATE of
// each column it may not update — and wants insufficient_privilege for each
// (each in a transaction that is rolled back). It also holds the role
// attributes (no superuser, CREATEROLE, CREATEDB, REPLICATION, BYPASSRLS, no
// membership in another role), no CREATE on the schema or the database, and
// no superuser-only setting but the janitor's wal_compression.
func TestRolePrivilegeMatrix(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	parameterACLs := f.parameterACLs()
	views := map[string]bool{}
	if err := func() error {
		rows, err := f.admin.QueryContext(ctx, `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind = 'v'`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var v string
			if err := rows.Scan(&v); err != nil {
				return err
			}
			views[v] = true
		}
		return rows.Err()
	}(); err != nil {
		t.Fatal(err)
	}
	parents := partitionParents(t, f.admin)
	columns := map[string][]string{} // table -> columns
	rows, err := f.admin.QueryContext(ctx, `
SELECT c.relname, a.attname FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
ORDER BY 1, a.attnum`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var table, col string
		if err := rows.Scan(&table, &col); err != nil {
			t.Fatal(err)
		}
		columns[table] = append(columns[table], col)
	}
	rows.Close()
	tables := make([]string, 0, len(columns))
	for tb := range columns {
		tables = append(tables, tb)
	}
	sort.Strings(tables)
	if len(tables) < 11 {
		t.Fatalf("only %d tables: %v", len(tables), tables)
	}

	var refused []struct{ role, stmt string }
	roles := make([]string, 0, len(grantMatrix))
	for r := range grantMatrix {
		roles = append(roles, r)
	}
	sort.Strings(roles)
	checks := 0
	for _, role := range roles {
		want := grantMatrix[role]
		for tb := range want.tables {
			if _, ok := columns[tb]; !ok {
				t.Errorf("matrix lists %s for %s, which does not exist", tb, role)
			}
		}
		for _, tb := range tables {
			allowed := strings.Split(want.tables[tb], ",")
			wantColumns, wantSelects := want.columns[tb], want.selects[tb]
			if parent := parents[tb]; parent != "" {
				// The partitioned layout: a partition grants its parent's
				// table-level privileges and no column's (migrations/layout.go).
				allowed = strings.Split(want.tables[parent], ",")
				wantColumns, wantSelects = nil, nil
			}
			for _, p := range tablePrivileges {
				var has bool
				if err := f.admin.QueryRowContext(ctx, `SELECT has_table_privilege($1, $2, $3)`, role, "public."+tb, p).Scan(&has); err != nil {
					t.Fatal(err)
				}
				checks++
				if exp := slices.Contains(allowed, p); has != exp {
					t.Errorf("%s %s on %s: held %v, matrix %v", role, p, tb, has, exp)
				}
			}
			for _, col := range columns[tb] {
				for _, p := range []string{"SELECT", "INSERT", "UPDATE", "REFERENCES"} {
					var has bool
					if err := f.admin.QueryRowContext(ctx, `SELECT has_column_privilege($1, $2, $3, $4)`, role, "public."+tb, col, p).Scan(&has); err != nil {
						t.Fatal(err)
					}
					checks++
					exp := slices.Contains(allowed, p) || p == "UPDATE" && slices.Contains(wantColumns, col) ||
						p == "SELECT" && slices.Contains(wantSelects, col)
					if has != exp {
						t.Errorf("%s %s on %s.%s: held %v, matrix %v", role, p, tb, col, has, exp)
					}
					if p == "UPDATE" && !exp {
						refused = append(refused, struct{ role, stmt string }{role, fmt.Sprintf(`UPDATE %s SET %s = DEFAULT`, tb, col)})
					}
					if p == "SELECT" && !exp && len(wantSelects) > 0 {
						refused = append(refused, struct{ role, stmt string }{role, fmt.Sprintf(`SELECT %s FROM %s`, col, tb)})
					}
				}
			}
			for _, p := range []string{"SELECT", "INSERT", "DELETE", "TRUNCATE"} {
				// A SELECT naming no column needs only some column's SELECT;
				// the column reads above are refused one by one instead.
				if slices.Contains(allowed, p) || p == "SELECT" && len(wantSelects) > 0 ||
					p == "TRUNCATE" && views[tb] { // a view cannot be truncated by anyone
					continue
				}
				stmt := map[string]string{
					"SELECT": `SELECT FROM ` + tb, "INSERT": `INSERT INTO ` + tb + ` DEFAULT VALUES`,
					"DELETE": `DELETE FROM ` + tb, "TRUNCATE": `TRUNCATE ` + tb,
				}[p]
				refused = append(refused, struct{ role, stmt string }{role, stmt})
			}
		}
		// No sequence is usable directly (identity columns need none).
		var seqs int
		if err := f.admin.QueryRowContext(ctx, `
SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind = 'S' AND (has_sequence_privilege($1, c.oid, 'USAGE')
   OR has_sequence_privilege($1, c.oid, 'SELECT') OR has_sequence_privilege($1, c.oid, 'UPDATE'))`, role).Scan(&seqs); err != nil {
			t.Fatal(err)
		}
		if seqs != 0 {
			t.Errorf("%s may use %d sequences", role, seqs)
		}
		// Attributes, memberships, schema and database.
		var attrs, schemaCreate, schemaUsage, dbCreate bool
		var members int
		if err := f.admin.QueryRowContext(ctx, `
SELECT r.rolsuper OR r.rolcreaterole OR r.rolcreatedb OR r.rolreplication OR r.rolbypassrls,
       (SELECT count(*) FROM pg_auth_members m WHERE m.member = r.oid OR m.roleid = r.oid),
       has_schema_privilege(r.rolname, 'public', 'CREATE'), has_schema_privilege(r.rolname, 'public', 'USAGE'),
       has_database_privilege(r.rolname, current_database(), 'CREATE')
FROM pg_roles r WHERE r.rolname = $1`, role).Scan(&attrs, &members, &schemaCreate, &schemaUsage, &dbCreate); err != nil {
			t.Fatal(err)
		}
		if attrs || members != 0 || schemaCreate || !schemaUsage || dbCreate {
			t.Errorf("%s: elevated attribute %v, %d memberships, CREATE on schema %v, USAGE %v, CREATE on database %v",
				role, attrs, members, schemaCreate, schemaUsage, dbCreate)
		}
		// Settings (PostgreSQL 15 grants them one by one): the janitor may SET
		// wal_compression (migration 0004); nobody may SET any other
		// superuser-only one, nor ALTER SYSTEM any setting at all.
		if parameterACLs {
			var set, alter string
			if err := f.admin.QueryRowContext(ctx, `
SELECT coalesce(string_agg(name, ',' ORDER BY name) FILTER (WHERE context = 'superuser' AND has_parameter_privilege($1, name, 'SET')), ''),
       coalesce(string_agg(name, ',' ORDER BY name) FILTER (WHERE has_parameter_privilege($1, name, 'ALTER SYSTEM')), '')
FROM pg_settings`, role).Scan(&set, &alter); err != nil {
				t.Fatal(err)
			}
			want := ""
			if role == roleJanitor {
				want = "wal_compression"
			}
			if set != want || alter != "" {
				t.Errorf("%s may SET %q (want %q) and ALTER SYSTEM %q (want none)", role, set, want, alter)
			}
		}
	}

	// Every statement outside the matrix, run as its role.
	dbs := map[string]*sql.DB{}
	for _, role := range roles {
		dbs[role] = openRole(t, f.dsn, role)
	}
	perRole := map[string]int{}
	for _, r := range refused {
		db := dbs[r.role]
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = tx.ExecContext(ctx, r.stmt)
		_ = tx.Rollback()
		var pg *pgconn.PgError
		if err == nil {
			t.Errorf("%s may run %q", r.role, r.stmt)
		} else if !errors.As(err, &pg) || pg.Code != "42501" {
			t.Errorf("%s: %q failed with %v, want insufficient_privilege", r.role, r.stmt, err)
		}
		perRole[r.role]++
	}
	t.Logf("%d tables, %d catalog checks; refused statements run: %d (%v)", len(tables), checks, len(refused), perRole)
}
