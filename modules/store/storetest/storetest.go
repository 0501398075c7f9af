// Package storetest gives each test its own PostgreSQL database, cloned from
// a migrated template, so tests run against the real schema, in parallel,
// without seeing each other's rows.
//
// The template is named after a hash of the embedded migrations, so a changed
// migration gets a new template. Creating it is serialized by an advisory lock
// in the admin database, which makes parallel test processes (go test ./...
// runs packages at once) safe; a template is marked complete by IS_TEMPLATE
// only after its migrations committed, so a crashed creator is redone.
package storetest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/store"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
)

// DefaultAdminDSN is used when TEST_DATABASE_URL is unset.
const DefaultAdminDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// templateLockKey serializes template creation across test processes.
const templateLockKey int64 = 0x7374_6f72_6574_6d70 // "storetmp"

// AdminDSN is TEST_DATABASE_URL or DefaultAdminDSN.
func AdminDSN() string {
	if v := os.Getenv("TEST_DATABASE_URL"); v != "" {
		return v
	}
	return DefaultAdminDSN
}

// LayoutEnv names the layout (plain or partitioned, migrations/layout.go)
// of every database NewDatabase makes; plain when unset. scripts/test.sh runs
// the store and a subset of the end-to-end tests a second time with it set
// to partitioned.
const LayoutEnv = "TEST_LAYOUT"

// Layout is the layout LayoutEnv asks for. An unknown name panics: a test
// run on another layout than the one asked for would prove nothing.
func Layout() migrations.Layout {
	v := os.Getenv(LayoutEnv)
	if v == "" {
		return migrations.LayoutPlain
	}
	l, err := migrations.ParseLayout(v)
	if err != nil {
		panic(fmt.Sprintf("storetest: %s=%q: %v", LayoutEnv, v, err))
	}
	return l
}

// TemplateName is the migrated template database for the embedded migrations
// in Layout().
func TemplateName() string { return templateName(Layout()) }

func templateName(l migrations.Layout) string {
	h := sha256.New()
	// The layout, and the version of the migrator's own tables (schema_layout
	// came with layouts), change the template as much as a migration does.
	fmt.Fprintf(h, "layout %s schema_layout 1\n", l)
	for _, m := range migrations.All() {
		fmt.Fprintf(h, "%d %s %s\n", m.Version, m.Name, m.Checksum)
	}
	return "envelopeworker_tmpl_" + hex.EncodeToString(h.Sum(nil))[:16]
}

// NewDatabase creates a fresh migrated database in Layout(), dropped when the
// test ends, and returns its DSN (admin user).
func NewDatabase(t testing.TB) string {
	t.Helper()
	return NewDatabaseIn(t, Layout())
}

// NewDatabaseIn is NewDatabase in layout l, whatever LayoutEnv says: for a
// test about one layout.
func NewDatabaseIn(t testing.TB, l migrations.Layout) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, err := sql.Open("pgx", AdminDSN())
	if err != nil {
		t.Fatalf("storetest: open admin: %v", err)
	}
	defer admin.Close()
	tmpl := templateName(l)
	if err := ensureTemplate(ctx, admin, tmpl, l); err != nil {
		t.Fatalf("storetest: template: %v", err)
	}
	name := "envelopeworker_test_" + randomHex(8)
	if _, err := admin.ExecContext(ctx, fmt.Sprintf(`CREATE DATABASE %s TEMPLATE %s`, name, tmpl)); err != nil {
		t.Fatalf("storetest: create database: %v", err)
	}
	t.Cleanup(func() { dropDatabase(t, name) })
	// Tests check what commits, not that commits survive a server crash;
	// skipping the WAL flush wait keeps them fast on slow disks. Benchmarks
	// that measure durable commits use Durable.
	if _, err := admin.ExecContext(ctx, `ALTER DATABASE `+name+` SET synchronous_commit = off`); err != nil {
		t.Fatalf("storetest: configure database: %v", err)
	}
	return WithDatabase(AdminDSN(), name)
}

// Durable sets synchronous_commit = on for the database behind dsn (made by
// NewDatabase), for sessions opened afterwards, whatever the server's default
// (the throwaway cluster of scripts/pg.sh turns it off server-wide).
func Durable(t testing.TB, dsn string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("storetest: DSN is not a URL: %v", err)
	}
	admin, err := sql.Open("pgx", AdminDSN())
	if err != nil {
		t.Fatalf("storetest: open admin: %v", err)
	}
	defer admin.Close()
	if _, err := admin.Exec(`ALTER DATABASE ` + pgIdent(u.Path[1:]) + ` SET synchronous_commit = on`); err != nil {
		t.Fatalf("storetest: configure database: %v", err)
	}
}

func pgIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// NewEmptyDatabase creates an unmigrated database, dropped when the test ends.
func NewEmptyDatabase(t testing.TB) string {
	t.Helper()
	admin, err := sql.Open("pgx", AdminDSN())
	if err != nil {
		t.Fatalf("storetest: open admin: %v", err)
	}
	defer admin.Close()
	name := "envelopeworker_test_" + randomHex(8)
	if _, err := admin.Exec(`CREATE DATABASE ` + name); err != nil {
		t.Fatalf("storetest: create database: %v", err)
	}
	t.Cleanup(func() { dropDatabase(t, name) })
	return WithDatabase(AdminDSN(), name)
}

func dropDatabase(t testing.TB, name string) {
	admin, err := sql.Open("pgx", AdminDSN())
	if err != nil {
		t.Errorf("storetest: open admin: %v", err)
		return
	}
	defer admin.Close()
	if _, err := admin.Exec(`DROP DATABASE IF EXISTS ` + name + ` WITH (FORCE)`); err != nil {
		t.Errorf("storetest: drop database %s: %v", name, err)
	}
}

func ensureTemplate(ctx context.Context, admin *sql.DB, tmpl string, l migrations.Layout) (err error) {
	conn, err := admin.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, templateLockKey); err != nil {
		return err
	}
	defer func() {
		if _, uerr := conn.ExecContext(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, templateLockKey); uerr != nil && err == nil {
			err = uerr
		}
	}()
	var ready sql.NullBool
	err = conn.QueryRowContext(ctx, `SELECT datistemplate FROM pg_database WHERE datname = $1`, tmpl).Scan(&ready)
	if err != nil && err != sql.ErrNoRows {
		return err
	}
	if ready.Valid && ready.Bool {
		return nil
	}
	if _, err := conn.ExecContext(ctx, `DROP DATABASE IF EXISTS `+tmpl+` WITH (FORCE)`); err != nil {
		return err
	}
	if _, err := conn.ExecContext(ctx, `CREATE DATABASE `+tmpl); err != nil {
		return err
	}
	db, err := sql.Open("pgx", WithDatabase(AdminDSN(), tmpl))
	if err != nil {
		return err
	}
	_, err = migrations.ApplyLayout(ctx, db, l)
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	_, err = conn.ExecContext(ctx, `ALTER DATABASE `+tmpl+` WITH IS_TEMPLATE true`)
	return err
}

// WithDatabase returns dsn pointing at database name.
func WithDatabase(dsn, name string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		panic(fmt.Sprintf("storetest: admin DSN is not a URL: %v", err))
	}
	u.Path = "/" + name
	return u.String()
}

// DSNForRole returns dsn logging in as role (no password: the test cluster
// trusts local connections), e.g. "envelopeworker_janitor".
func DSNForRole(dsn, role string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		panic(fmt.Sprintf("storetest: DSN is not a URL: %v", err))
	}
	u.User = url.User(role)
	return u.String()
}

// Open opens a store on dsn with a small pool (many test databases share one
// server's connection limit), closed when the test ends.
func Open(t testing.TB, dsn string) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), dsn, store.Options{MaxOpenConns: 8})
	if err != nil {
		t.Fatalf("storetest: open store: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// AdminDB opens a plain pool on dsn (a database NewDatabase made, or any
// DSN a test names), closed when the test ends: the handle tests use to set
// up rows and look behind the store's API, which keeps its own pool to
// itself. It does not connect until first used.
func AdminDB(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatalf("storetest: open admin pool: %v", err)
	}
	// Small, as Open's: many test databases share one server's connection
	// limit.
	db.SetMaxOpenConns(8)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
