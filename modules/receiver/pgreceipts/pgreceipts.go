// Package pgreceipts is the PostgreSQL implementation of receiver.Receipts
// (pgx): a receipt row per webhook id, inserted in the transaction that runs
// the effect, so the effect and the memory of having done it commit or roll
// back together. It lives apart from package receiver so that a consumer
// without PostgreSQL builds no driver.
//
// Concurrent deliveries of one webhook id serialize on the primary key: the
// second insert waits for the first transaction and then either finds the
// row (duplicate, nothing runs) or, when the first rolled back, takes over.
//
// Receipts are kept for the replay window and then pruned (Prune). A
// delivery of an id whose receipt was pruned takes effect again, so the
// window must be longer than the sender may redeliver: its retry horizon,
// and the time within which an operator may replay a dead letter.
package pgreceipts

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultTable is the receipts table unless Options.Table names another.
const DefaultTable = "webhook_receipts"

// DefaultReplayWindow is how long receipts are kept unless
// Options.ReplayWindow says otherwise: the envelope retention of the
// sender (90 days), beyond which it cannot redeliver the body.
const DefaultReplayWindow = 90 * 24 * time.Hour

// PruneBatch bounds the rows one Prune statement deletes, so pruning never
// holds long locks or builds one huge transaction.
const PruneBatch = 1000

// DB is what Store needs: *pgxpool.Pool and *pgx.Conn both are one.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Options tune a Store; zero values take the defaults.
type Options struct {
	// Table is an unqualified lowercase SQL name, default DefaultTable.
	Table string
	// ReplayWindow is how long a receipt is kept, default
	// DefaultReplayWindow.
	ReplayWindow time.Duration
}

// Store is a receiver.Receipts[pgx.Tx] over PostgreSQL.
type Store struct {
	db     DB
	window time.Duration
	table  string // quoted
	insert string
	prune  string
	ddl    string
}

var tableName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// New returns a Store on db. Create its table with CreateTable or DDL.
func New(db DB, opts Options) (*Store, error) {
	if db == nil {
		return nil, errors.New("pgreceipts: db is required")
	}
	if opts.Table == "" {
		opts.Table = DefaultTable
	}
	if !tableName.MatchString(opts.Table) {
		return nil, errors.New("pgreceipts: Table must match [a-z_][a-z0-9_]{0,62}")
	}
	if opts.ReplayWindow < 0 {
		return nil, errors.New("pgreceipts: negative ReplayWindow")
	}
	if opts.ReplayWindow == 0 {
		opts.ReplayWindow = DefaultReplayWindow
	}
	t := pgx.Identifier{opts.Table}.Sanitize()
	idx := pgx.Identifier{opts.Table + "_received_at"}.Sanitize()
	return &Store{
		db:     db,
		window: opts.ReplayWindow,
		table:  t,
		insert: `INSERT INTO ` + t + ` (webhook_id) VALUES ($1) ON CONFLICT (webhook_id) DO NOTHING`,
		// received_at, not the primary key, leads the batch so that the
		// index on it serves the scan.
		prune: `DELETE FROM ` + t + ` WHERE webhook_id IN (SELECT webhook_id FROM ` + t +
			` WHERE received_at < now() - make_interval(secs => $1) ORDER BY received_at LIMIT $2)`,
		ddl: `CREATE TABLE IF NOT EXISTS ` + t + ` (
	webhook_id  text PRIMARY KEY,
	received_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS ` + idx + ` ON ` + t + ` (received_at);
`,
	}, nil
}

// DDL is the SQL that creates the table and its index, re-runnable, for
// consumers that apply schema changes with their own migration tool.
func (s *Store) DDL() string { return s.ddl }

// CreateTable runs DDL.
func (s *Store) CreateTable(ctx context.Context) error {
	if _, err := s.db.Exec(ctx, s.ddl); err != nil {
		return fmt.Errorf("pgreceipts: create table: %w", err)
	}
	return nil
}

// Handle implements receiver.Receipts.
func (s *Store) Handle(ctx context.Context, webhookID string, effect func(ctx context.Context, tx pgx.Tx) error) (duplicate bool, err error) {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("pgreceipts: begin: %w", err)
	}
	// Rollback after Commit is a no-op; on every other path it undoes
	// the receipt together with whatever the effect wrote.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	tag, err := tx.Exec(ctx, s.insert, webhookID)
	if err != nil {
		return false, fmt.Errorf("pgreceipts: insert receipt: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return true, nil
	}
	if err := effect(ctx, tx); err != nil {
		return false, fmt.Errorf("pgreceipts: effect: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("pgreceipts: commit: %w", err)
	}
	return false, nil
}

// Prune deletes receipts older than the replay window, by the database's
// clock, in statements of at most PruneBatch rows until none is left, and
// returns how many it deleted. Run it periodically.
func (s *Store) Prune(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := s.db.Exec(ctx, s.prune, s.window.Seconds(), PruneBatch)
		if err != nil {
			return total, fmt.Errorf("pgreceipts: prune: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < PruneBatch {
			return total, nil
		}
	}
}
