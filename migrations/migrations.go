// Package migrations owns the PostgreSQL schema of envelopeworker: the versioned
// SQL files embedded in this module and the small migrator that applies them.
//
// Each file NNNN_name.sql is one migration, applied at most once, inside its own
// transaction, and recorded in schema_migrations together with a SHA-256 of its
// text (an applied file that was edited afterwards is reported, never re-run).
// Apply serializes concurrent migrators with a session-level PostgreSQL advisory
// lock taken on one dedicated connection: if the migrating process dies, the
// server ends the session and releases the lock, unlike a lock row in a table.
//
// Binaries compare the applied version (the highest recorded) with Latest and
// stay not-ready while the schema is older than they expect; a newer schema
// keeps them ready (contract §8.1), because every migration is additive
// (docs/operations.md, "Rolling upgrades"). For the same reason Apply on a
// database that a later release already migrated (versions above Latest) is a
// no-op: it still checks the checksums of the versions it embeds, applies
// nothing and leaves the later rows alone, so re-running an older migrate Job
// during a rollback succeeds without touching the schema.
//
// The migrations also create one PostgreSQL role per binary —
// envelopeworker_ingest, envelopeworker_delivery, envelopeworker_janitor — and
// envelopeworker_operator for envctl, LOGIN without password (operators set
// passwords or certificates), each granted only what its job needs; PUBLIC
// keeps no privilege on the tables or CREATE on the schema. Roles are
// cluster-wide, so creating them tolerates a concurrent creator; grants are
// per database. Apply itself runs as the schema owner (an administrator).
package migrations

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"
)

//go:embed *.sql
var files embed.FS

// LockKey is the pg_advisory_lock key that serializes migrators. It is shared by
// every database of a cluster (advisory locks are per database, so migrators of
// different databases never wait for each other).
const LockKey int64 = 0x656e76656c6f7065 // "envelope"

// Migration is one embedded SQL file.
type Migration struct {
	Version  int
	Name     string
	SQL      string
	Checksum string // hex SHA-256 of SQL
}

// ErrChecksum reports that an applied migration's file was changed afterwards.
var ErrChecksum = errors.New("migrations: applied migration differs from embedded file")

var loaded = mustLoad()

func mustLoad() []Migration {
	ms, err := load(files)
	if err != nil {
		// The files are embedded at build time; a bad name is a build defect.
		panic(err)
	}
	return ms
}

func load(fsys fs.FS) ([]Migration, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, fmt.Errorf("migrations: list: %w", err)
	}
	var ms []Migration
	seen := map[int]string{}
	for _, name := range names {
		prefix, _, ok := strings.Cut(name, "_")
		if !ok {
			return nil, fmt.Errorf("migrations: %s: name must be NNNN_name.sql", name)
		}
		v, err := strconv.Atoi(prefix)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("migrations: %s: bad version prefix", name)
		}
		if other, dup := seen[v]; dup {
			return nil, fmt.Errorf("migrations: %s and %s share version %d", other, name, v)
		}
		seen[v] = name
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("migrations: read %s: %w", name, err)
		}
		sum := sha256.Sum256(b)
		ms = append(ms, Migration{Version: v, Name: name, SQL: string(b), Checksum: hex.EncodeToString(sum[:])})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i, m := range ms {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migrations: versions must be contiguous from 1; %s is out of place", m.Name)
		}
	}
	return ms, nil
}

// All returns the embedded migrations in version order.
func All() []Migration { return append([]Migration(nil), loaded...) }

// Latest is the version a binary built from this tree expects.
func Latest() int {
	if len(loaded) == 0 {
		return 0
	}
	return loaded[len(loaded)-1].Version
}

const createTable = `CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`

// Apply brings the database up to Latest in the layout it was migrated with
// (plain for a new database) and returns the versions it applied (none when
// already current, or newer). It is safe to run from several processes at
// once.
func Apply(ctx context.Context, db *sql.DB) (applied []int, err error) {
	return ApplyLayout(ctx, db, "")
}

// ApplyLayout is Apply with the layout (layout.go) asked for: "" keeps the
// recorded one; another layout than the recorded one is refused
// (ErrLayoutChange) once any migration is applied.
func ApplyLayout(ctx context.Context, db *sql.DB, layout Layout) (applied []int, err error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrations: connect: %w", err)
	}
	defer conn.Close()

	// pg_advisory_lock blocks until granted; the driver cancels it with ctx.
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, LockKey); err != nil {
		return nil, fmt.Errorf("migrations: take advisory lock: %w", err)
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, uerr := conn.ExecContext(uctx, `SELECT pg_advisory_unlock($1)`, LockKey); uerr != nil {
			// Drop the session instead of pooling it: ending the session is what
			// releases a lock we could not release ourselves.
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}()

	if _, err := conn.ExecContext(ctx, createTable); err != nil {
		return nil, fmt.Errorf("migrations: create schema_migrations: %w", err)
	}
	done, err := appliedChecksums(ctx, conn)
	if err != nil {
		return nil, err
	}
	newer := false
	for v := range done {
		newer = newer || v > Latest()
	}
	if layout, err = recordLayout(ctx, conn, layout, len(done) > 0, newer); err != nil {
		return nil, err
	}
	for _, m := range loaded {
		if sum, ok := done[m.Version]; ok {
			if sum != m.Checksum {
				return applied, fmt.Errorf("%w: version %d (%s)", ErrChecksum, m.Version, m.Name)
			}
			continue
		}
		if err := applyOne(ctx, conn, m, layout); err != nil {
			return applied, err
		}
		applied = append(applied, m.Version)
	}
	return applied, nil
}

func appliedChecksums(ctx context.Context, conn *sql.Conn) (map[int]string, error) {
	rows, err := conn.QueryContext(ctx, `SELECT version, checksum FROM schema_migrations`)
	if err != nil {
		return nil, fmt.Errorf("migrations: read schema_migrations: %w", err)
	}
	defer rows.Close()
	done := map[int]string{}
	for rows.Next() {
		var v int
		var sum string
		if err := rows.Scan(&v, &sum); err != nil {
			return nil, fmt.Errorf("migrations: read schema_migrations: %w", err)
		}
		done[v] = sum
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("migrations: read schema_migrations: %w", err)
	}
	return done, nil
}

func applyOne(ctx context.Context, conn *sql.Conn, m Migration, layout Layout) (err error) {
	text, err := sqlFor(m, layout)
	if err != nil {
		return err
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrations: %s: begin: %w", m.Name, err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	// No arguments: the driver sends the file as one simple-protocol query, so
	// a file may hold many statements and DO blocks.
	if _, err := tx.ExecContext(ctx, text); err != nil {
		return fmt.Errorf("migrations: %s: %w", m.Name, err)
	}
	if layout == LayoutPartitioned {
		if _, err := tx.ExecContext(ctx, grantPartitionsSQL); err != nil {
			return fmt.Errorf("migrations: %s: partition privileges: %w", m.Name, err)
		}
	}
	if _, err := tx.ExecContext(ctx,
		`INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)`,
		m.Version, m.Name, m.Checksum); err != nil {
		return fmt.Errorf("migrations: %s: record: %w", m.Name, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migrations: %s: commit: %w", m.Name, err)
	}
	return nil
}

// Version reports the highest applied migration, or 0 when the database has
// never been migrated.
func Version(ctx context.Context, db *sql.DB) (int, error) {
	var exists bool
	if err := db.QueryRowContext(ctx,
		`SELECT to_regclass('schema_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return 0, fmt.Errorf("migrations: version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	if err := db.QueryRowContext(ctx,
		`SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&v); err != nil {
		return 0, fmt.Errorf("migrations: version: %w", err)
	}
	return v, nil
}

// State is how one migration stands between this build and a database.
type State string

const (
	StateApplied  State = "applied"  // applied, and the same text as the embedded file
	StatePending  State = "pending"  // embedded, not applied: Apply would run it
	StateModified State = "modified" // applied, but the embedded file differs: Apply refuses (ErrChecksum)
	StateNewer    State = "newer"    // applied by a later release; this build does not embed it
)

// StatusEntry is one migration in Status: Embedded* from this build's files,
// Applied* from schema_migrations (empty and nil when not applied).
type StatusEntry struct {
	Version          int
	Name             string
	State            State
	EmbeddedChecksum string
	AppliedChecksum  string
	AppliedAt        *time.Time
}

// Status compares the embedded migrations with what schema_migrations records,
// in version order, without changing anything: what Apply would run is the
// StatePending entries. A database never migrated has every file pending.
func Status(ctx context.Context, db *sql.DB) ([]StatusEntry, error) {
	var exists bool
	if err := db.QueryRowContext(ctx,
		`SELECT to_regclass('schema_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return nil, fmt.Errorf("migrations: status: %w", err)
	}
	type row struct {
		name, sum string
		at        time.Time
	}
	applied := map[int]row{}
	if exists {
		rows, err := db.QueryContext(ctx, `SELECT version, name, checksum, applied_at FROM schema_migrations`)
		if err != nil {
			return nil, fmt.Errorf("migrations: status: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var v int
			var r row
			if err := rows.Scan(&v, &r.name, &r.sum, &r.at); err != nil {
				return nil, fmt.Errorf("migrations: status: %w", err)
			}
			applied[v] = r
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("migrations: status: %w", err)
		}
	}
	var out []StatusEntry
	for _, m := range loaded {
		e := StatusEntry{Version: m.Version, Name: m.Name, State: StatePending, EmbeddedChecksum: m.Checksum}
		if r, ok := applied[m.Version]; ok {
			at := r.at
			e.AppliedChecksum, e.AppliedAt, e.State = r.sum, &at, StateApplied
			if r.sum != m.Checksum {
				e.State = StateModified
			}
			delete(applied, m.Version)
		}
		out = append(out, e)
	}
	var later []StatusEntry
	for v, r := range applied {
		at := r.at
		later = append(later, StatusEntry{Version: v, Name: r.name, State: StateNewer, AppliedChecksum: r.sum, AppliedAt: &at})
	}
	sort.Slice(later, func(i, j int) bool { return later[i].Version < later[j].Version })
	return append(out, later...), nil
}
