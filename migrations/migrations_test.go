package migrations

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"net/url"
	"os"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func adminDSN() string {
	if v := os.Getenv("TEST_DATABASE_URL"); v != "" {
		return v
	}
	return "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
}

// freshDB creates an empty database (storetest cannot be used here: it lives in
// the store module, which depends on this one) and drops it after the test.
func freshDB(t *testing.T) string {
	t.Helper()
	admin, err := sql.Open("pgx", adminDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	name := "mig_test_" + hex.EncodeToString(b)
	if _, err := admin.Exec(`CREATE DATABASE ` + name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec(`DROP DATABASE IF EXISTS ` + name + ` WITH (FORCE)`); err != nil {
			t.Errorf("drop database: %v", err)
		}
	})
	u, err := url.Parse(adminDSN())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

func open(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestApplyTwice(t *testing.T) {
	ctx := context.Background()
	db := open(t, freshDB(t))

	if v, err := Version(ctx, db); err != nil || v != 0 {
		t.Fatalf("Version before migrating = %d, %v; want 0, nil", v, err)
	}
	applied, err := Apply(ctx, db)
	if err != nil {
		t.Fatalf("first Apply: %v", err)
	}
	if len(applied) != Latest() {
		t.Fatalf("first Apply applied %v, want all %d", applied, Latest())
	}
	applied, err = Apply(ctx, db)
	if err != nil {
		t.Fatalf("second Apply: %v", err)
	}
	if len(applied) != 0 {
		t.Fatalf("second Apply applied %v, want nothing", applied)
	}
	if v, err := Version(ctx, db); err != nil || v != Latest() {
		t.Fatalf("Version = %d, %v; want %d", v, err, Latest())
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM schema_migrations`).Scan(&n); err != nil || n != Latest() {
		t.Fatalf("schema_migrations rows = %d, %v; want %d", n, err, Latest())
	}
}

func TestApplyConcurrent(t *testing.T) {
	ctx := context.Background()
	dsn := freshDB(t)
	const workers = 8
	var wg sync.WaitGroup
	results := make([][]int, workers)
	errs := make([]error, workers)
	for i := range workers {
		// Separate pools: each migrator has its own sessions, as separate
		// replicas would.
		db := open(t, dsn)
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = Apply(ctx, db)
		}()
	}
	wg.Wait()
	total := 0
	for i := range workers {
		if errs[i] != nil {
			t.Fatalf("worker %d: %v", i, errs[i])
		}
		total += len(results[i])
	}
	if total != Latest() {
		t.Fatalf("migrations applied %d times in total, want exactly %d", total, Latest())
	}
	db := open(t, dsn)
	var locks int
	if err := db.QueryRow(`SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database WHERE l.locktype = 'advisory' AND d.datname = current_database()`).Scan(&locks); err != nil || locks != 0 {
		t.Fatalf("advisory locks still held: %d, %v", locks, err)
	}
}

// Roles are cluster-wide and created by every database's first migration:
// several fresh databases migrating at once must not trip over each other.
func TestApplyConcurrentDatabases(t *testing.T) {
	ctx := context.Background()
	const n = 4
	dbs := make([]*sql.DB, n)
	for i := range dbs {
		dbs[i] = open(t, freshDB(t))
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, db := range dbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = Apply(ctx, db)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("database %d: %v", i, err)
		}
		if v, err := Version(ctx, dbs[i]); err != nil || v != Latest() {
			t.Fatalf("database %d at version %d, %v", i, v, err)
		}
	}
	var roles int
	if err := dbs[0].QueryRow(`SELECT count(*) FROM pg_roles WHERE rolname IN
		('envelopeworker_ingest', 'envelopeworker_delivery', 'envelopeworker_janitor', 'envelopeworker_operator')
		AND rolcanlogin`).Scan(&roles); err != nil || roles != 4 {
		t.Fatalf("login roles: %d, %v", roles, err)
	}
}

func TestApplyRefusesEditedMigration(t *testing.T) {
	ctx := context.Background()
	db := open(t, freshDB(t))
	if _, err := Apply(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE schema_migrations SET checksum = 'x' WHERE version = 1`); err != nil {
		t.Fatal(err)
	}
	_, err := Apply(ctx, db)
	if !errors.Is(err, ErrChecksum) {
		t.Fatalf("Apply after edit = %v, want ErrChecksum", err)
	}
}

func TestApplyCancelled(t *testing.T) {
	db := open(t, freshDB(t))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Apply(ctx, db); !errors.Is(err, context.Canceled) {
		t.Fatalf("Apply with cancelled context = %v, want context.Canceled", err)
	}
	if v, err := Version(context.Background(), db); err != nil || v != 0 {
		t.Fatalf("Version after cancelled Apply = %d, %v; want 0", v, err)
	}
}

func TestLoadRefusesBadSets(t *testing.T) {
	cases := map[string]fstest.MapFS{
		"no underscore": {"0001.sql": {Data: []byte("SELECT 1")}},
		"not a number":  {"abcd_x.sql": {Data: []byte("SELECT 1")}},
		"zero":          {"0000_x.sql": {Data: []byte("SELECT 1")}},
		"duplicate":     {"0001_a.sql": {Data: []byte("SELECT 1")}, "1_b.sql": {Data: []byte("SELECT 1")}},
		"gap":           {"0001_a.sql": {Data: []byte("SELECT 1")}, "0003_c.sql": {Data: []byte("SELECT 1")}},
	}
	for name, fsys := range cases {
		if _, err := load(fsys); err == nil {
			t.Errorf("%s: load accepted a bad migration set", name)
		}
	}
	ms, err := load(fstest.MapFS{
		"0002_b.sql": {Data: []byte("SELECT 2")},
		"0001_a.sql": {Data: []byte("SELECT 1")},
	})
	if err != nil || len(ms) != 2 || ms[0].Name != "0001_a.sql" || ms[1].Version != 2 {
		t.Fatalf("load = %+v, %v", ms, err)
	}
}

func TestEmbeddedSet(t *testing.T) {
	all := All()
	if len(all) == 0 || Latest() != all[len(all)-1].Version {
		t.Fatalf("All/Latest disagree: %d migrations, Latest %d", len(all), Latest())
	}
	all[0].SQL = "changed"
	if All()[0].SQL == "changed" {
		t.Fatal("All returned the package's own slice")
	}
}

// Migration 0005 on a database that already has endpoints and keys: refs of
// one tenant become that tenant's; a ref several tenants' endpoints named
// belongs to none (and the migration does not fail on it); afterwards the
// trigger refuses the shared ref to everyone and another tenant's ref to
// others, and existing keys keep working under the guard.
func TestMigration0005OnPopulatedDatabase(t *testing.T) {
	ctx := context.Background()
	db := open(t, freshDB(t))
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, createTable); err != nil {
		t.Fatal(err)
	}
	for _, m := range All()[:4] {
		if err := applyOne(ctx, conn, m, LayoutPlain); err != nil {
			t.Fatal(err)
		}
	}
	conn.Close()
	if _, err := db.Exec(`
INSERT INTO endpoints (tenant_id, endpoint_id, project_id, topic, url, secret_ref) VALUES
    ('t1', 'ep_1', 'p1', 'x', 'https://a.example/', 'shared'),
    ('t2', 'ep_2', 'p1', 'x', 'https://b.example/', 'shared'),
    ('t1', 'ep_3', 'p1', 'y', 'https://a.example/', 'solo'),
    ('t1', 'ep_4', 'p1', 'z', 'https://a.example/', 'solo');
INSERT INTO producer_keys (tenant_id, key_id, public_key, state, retired_at)
    VALUES ('t1', 'k1', decode(repeat('01', 32), 'hex'), 'retired', now())`); err != nil {
		t.Fatal(err)
	}
	applied, err := Apply(ctx, db)
	if err != nil || len(applied) != Latest()-4 || applied[0] != 5 {
		t.Fatalf("Apply on a populated database: %v, %v", applied, err)
	}

	owners := map[string]sql.NullString{}
	rows, err := db.Query(`SELECT secret_ref, tenant_id FROM secret_ref_owners`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var ref string
		var tenant sql.NullString
		if err := rows.Scan(&ref, &tenant); err != nil {
			t.Fatal(err)
		}
		owners[ref] = tenant
	}
	rows.Close()
	if len(owners) != 2 || owners["shared"].Valid || owners["solo"].String != "t1" {
		t.Fatalf("owners after the backfill: %v", owners)
	}

	insert := func(tenant, id, ref string) error {
		_, err := db.Exec(`INSERT INTO endpoints (tenant_id, endpoint_id, project_id, topic, url, secret_ref)
			VALUES ($1, $2, 'p1', 'x', 'https://c.example/', $3)`, tenant, id, ref)
		return err
	}
	for _, c := range []struct{ tenant, ref string }{{"t1", "shared"}, {"t2", "shared"}, {"t3", "shared"}, {"t2", "solo"}} {
		var pg *pgconn.PgError
		if err := insert(c.tenant, "ep_"+c.tenant+c.ref, c.ref); !errors.As(err, &pg) || pg.Code != "EW002" {
			t.Errorf("%s naming %s after the migration: %v, want EW002", c.tenant, c.ref, err)
		}
	}
	if err := insert("t1", "ep_5", "solo"); err != nil {
		t.Fatalf("the owner naming its ref: %v", err)
	}
	if err := insert("t2", "ep_6", "fresh"); err != nil {
		t.Fatalf("a new ref: %v", err)
	}
	// The repair of docs/operations.md: t2 moves to a ref of its own, t1 keeps the shared one.
	if _, err := db.Exec(`UPDATE endpoints SET secret_ref = 't2/hooks' WHERE tenant_id = 't2' AND secret_ref = 'shared';
		UPDATE secret_ref_owners SET tenant_id = 't1' WHERE secret_ref = 'shared' AND tenant_id IS NULL`); err != nil {
		t.Fatalf("repair: %v", err)
	}
	if err := insert("t1", "ep_7", "shared"); err != nil {
		t.Fatalf("t1 naming the repaired ref: %v", err)
	}
	var notOwned int
	if err := db.QueryRow(`SELECT count(*) FROM endpoints e WHERE NOT EXISTS (SELECT FROM secret_ref_owners o
		WHERE o.secret_ref = e.secret_ref AND o.tenant_id = e.tenant_id)`).Scan(&notOwned); err != nil || notOwned != 0 {
		t.Fatalf("%d endpoints name a ref their tenant does not own after the repair, %v", notOwned, err)
	}
	var pg *pgconn.PgError
	if _, err := db.Exec(`UPDATE producer_keys SET state = 'active' WHERE key_id = 'k1'`); !errors.As(err, &pg) || pg.Code != "EW001" {
		t.Fatalf("un-retiring a key: %v, want EW001", err)
	}
	if _, err := db.Exec(`UPDATE producer_keys SET state = 'revoked', revoked_at = now() WHERE key_id = 'k1'`); err != nil {
		t.Fatalf("revoking a retired key: %v", err)
	}
	if applied, err := Apply(ctx, db); err != nil || len(applied) != 0 {
		t.Fatalf("Apply again: %v, %v", applied, err)
	}

	// Run again over itself (its schema_migrations row removed, as an upgrade test does): the owners
	// stay as they are, the triggers are there once.
	if _, err := db.Exec(`DELETE FROM schema_migrations WHERE version >= 5`); err != nil {
		t.Fatal(err)
	}
	if applied, err := Apply(ctx, db); err != nil || len(applied) != Latest()-4 {
		t.Fatalf("Apply over an applied 0005: %v, %v", applied, err)
	}
	var triggers, owned int
	if err := db.QueryRow(`SELECT count(*) FROM pg_trigger WHERE tgname IN ('producer_keys_guard', 'endpoints_secret_ref_owner')`).Scan(&triggers); err != nil || triggers != 2 {
		t.Fatalf("%d triggers, %v", triggers, err)
	}
	if err := db.QueryRow(`SELECT count(*) FROM secret_ref_owners WHERE tenant_id IS NOT NULL`).Scan(&owned); err != nil || owned != 4 {
		t.Fatalf("%d owned refs after the rerun (shared, solo, fresh, t2/hooks), %v", owned, err)
	}
	if err := insert("t3", "ep_8", "solo"); !errors.As(err, &pg) || pg.Code != "EW002" {
		t.Fatalf("another tenant's ref after the rerun: %v", err)
	}
}

// TestApplyOnNewerSchema: a database a later release already migrated (a
// version this build does not embed) is left as it is: Apply applies
// nothing, succeeds, and keeps the later row; an edited embedded file is
// still reported.
func TestApplyOnNewerSchema(t *testing.T) {
	ctx := context.Background()
	db := open(t, freshDB(t))
	if _, err := Apply(ctx, db); err != nil {
		t.Fatal(err)
	}
	later := Latest() + 1
	if _, err := db.Exec(`INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, 'from_a_later_release.sql', 'not-ours')`, later); err != nil {
		t.Fatal(err)
	}
	var tables int
	if err := db.QueryRow(`SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	applied, err := Apply(ctx, db)
	if err != nil || len(applied) != 0 {
		t.Fatalf("Apply on a newer schema = %v, %v; want nothing applied", applied, err)
	}
	if v, err := Version(ctx, db); err != nil || v != later {
		t.Fatalf("Version = %d, %v; want %d", v, err, later)
	}
	var name, sum string
	var after int
	if err := db.QueryRow(`SELECT name, checksum, (SELECT count(*) FROM pg_tables WHERE schemaname = 'public') FROM schema_migrations WHERE version = $1`, later).
		Scan(&name, &sum, &after); err != nil || name != "from_a_later_release.sql" || sum != "not-ours" || after != tables {
		t.Fatalf("later row %q %q, %d tables (was %d), %v; want it and the tables untouched", name, sum, after, tables, err)
	}
	if _, err := db.Exec(`UPDATE schema_migrations SET checksum = 'x' WHERE version = 1`); err != nil {
		t.Fatal(err)
	}
	if _, err := Apply(ctx, db); !errors.Is(err, ErrChecksum) {
		t.Fatalf("Apply after an edit, on a newer schema = %v, want ErrChecksum", err)
	}
}

// Status reads without writing: on a fresh database everything is pending and no schema_migrations
// table appears; after Apply everything is applied with equal checksums; an edited row is modified
// and a later release's row is newer, after the embedded ones.
func TestStatus(t *testing.T) {
	db := open(t, freshDB(t))
	ctx := context.Background()
	st, err := Status(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != Latest() || st[0].State != StatePending || st[0].EmbeddedChecksum != All()[0].Checksum || st[0].AppliedAt != nil {
		t.Fatalf("status of a fresh database: %+v", st)
	}
	if v, err := Version(ctx, db); err != nil || v != 0 {
		t.Fatalf("Status wrote: version %d, %v", v, err)
	}
	if _, err := Apply(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE schema_migrations SET checksum = 'edited' WHERE version = 2`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, 'later.sql', 'x')`, Latest()+1); err != nil {
		t.Fatal(err)
	}
	st, err = Status(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != Latest()+1 {
		t.Fatalf("status: %d entries", len(st))
	}
	for i, e := range st {
		want := StateApplied
		switch {
		case i == 1:
			want = StateModified
		case i == Latest():
			want = StateNewer
		}
		if e.State != want || e.Version != i+1 || e.AppliedAt == nil {
			t.Errorf("entry %d: %+v, want state %s", i, e, want)
		}
		if want == StateApplied && e.AppliedChecksum != e.EmbeddedChecksum {
			t.Errorf("entry %d: checksums differ: %+v", i, e)
		}
	}
	if last := st[Latest()]; last.Name != "later.sql" || last.EmbeddedChecksum != "" {
		t.Errorf("newer entry: %+v", last)
	}
}
