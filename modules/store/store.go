package store

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"time"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
)

// Options tunes the connection pool. Zero values take the defaults noted.
type Options struct {
	MaxOpenConns    int           // default 16
	MaxIdleConns    int           // default MaxOpenConns
	ConnMaxLifetime time.Duration // default 30m: lets connections follow failovers
	ConnMaxIdleTime time.Duration // default 5m
	// ApplicationName is shown in pg_stat_activity; default "envelopeworker".
	ApplicationName string
	// StatementTimeout bounds every statement on the server (0: server default).
	StatementTimeout time.Duration
	// MaxRetries bounds re-runs of an ingest transaction that lost a race
	// (unique violation across streams, deadlock); default 5.
	MaxRetries int
	// WALCompression, when set, is every session's wal_compression (off,
	// pglz, lz4, zstd): how the page images its writes log are compressed.
	// Only a superuser, or on PostgreSQL 15 a role granted SET on the
	// parameter, may set it; for any other role every connection fails.
	WALCompression string
	// AsyncCommit sets synchronous_commit=off for every session: commits
	// return before their WAL is flushed, and a server crash can undo the
	// last ones (up to three wal_writer_delay). Only for work that is safe
	// to lose and redo, never for anything acknowledged.
	AsyncCommit bool
	// OutboxPayloadRetention is how long an outbound envelope's body is kept
	// after its last message became delivered or dead (contract §8.9); the
	// settles of this store fix that time. Default DefaultOutboxPayloadRetention.
	OutboxPayloadRetention time.Duration
}

func (o Options) withDefaults() Options {
	if o.MaxOpenConns <= 0 {
		o.MaxOpenConns = 16
	}
	if o.MaxIdleConns <= 0 || o.MaxIdleConns > o.MaxOpenConns {
		o.MaxIdleConns = o.MaxOpenConns
	}
	if o.ConnMaxLifetime <= 0 {
		o.ConnMaxLifetime = 30 * time.Minute
	}
	if o.ConnMaxIdleTime <= 0 {
		o.ConnMaxIdleTime = 5 * time.Minute
	}
	if o.ApplicationName == "" {
		o.ApplicationName = "envelopeworker"
	}
	if o.MaxRetries <= 0 {
		o.MaxRetries = 5
	}
	if o.OutboxPayloadRetention <= 0 {
		o.OutboxPayloadRetention = DefaultOutboxPayloadRetention
	}
	return o
}

// Store is the PostgreSQL-backed state of controlplane/v1: one pool, and the
// concerns that share it. It opens and closes the pool and answers for the
// schema; the statements live on the concerns (Credentials, Inbound, Outbox,
// Retention), so a caller holds only the ones it uses. It is safe for
// concurrent use, as are the concerns.
type Store struct {
	*pool
	credentials *Credentials
	inbound     *Inbound
	outbox      *Outbox
	retention   *Retention
}

// pool is what the concerns share: the connection pool, the options and the
// partition cache. Each concern embeds the same one.
type pool struct {
	db    *bun.DB
	opts  Options
	parts partitionCache
}

// Credentials holds opaque credentials (their digests) and producer keys
// with their lifecycle (credentials.go, keys.go, and the listings in
// admin.go).
type Credentials struct{ *pool }

// Inbound is contract §2 and §3: ingest (one envelope or a batch), the
// audit trail, and the streams' state and pages (ingest.go, ingest_set.go,
// audit.go, streams.go).
type Inbound struct{ *pool }

// Outbox is contract §4: endpoints, enqueue, claims and settles, dead
// letters and replays, and delivery attempts (endpoints.go, outbox*.go, and
// the endpoint listing and update in admin.go).
type Outbox struct{ *pool }

// Retention deletes what has expired: inbound payloads (§5), outbound
// bodies and their attempt rows (§8.9), and backfills body expiry
// (retention.go, outbox_retention.go).
type Retention struct{ *pool }

// Credentials is the store's credentials and producer keys.
func (s *Store) Credentials() *Credentials { return s.credentials }

// Inbound is the store's ingest, audit and streams.
func (s *Store) Inbound() *Inbound { return s.inbound }

// Outbox is the store's endpoints and outbox.
func (s *Store) Outbox() *Outbox { return s.outbox }

// Retention is the store's expiry deletes.
func (s *Store) Retention() *Retention { return s.retention }

// Open prepares a pool for dsn. It does not connect: a binary can start while
// the database is still coming up and report not-ready (CheckSchema)
// until it is reachable. A malformed DSN is ErrInvalid; its text (which may
// hold a password) is never echoed.
func Open(ctx context.Context, dsn string, o Options) (*Store, error) {
	if err := ctx.Err(); err != nil {
		return nil, classify(ctx, "open", err)
	}
	o = o.withDefaults()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, newErr("open: parse DSN", ErrInvalid)
	}
	cfg.RuntimeParams["application_name"] = o.ApplicationName
	if o.StatementTimeout > 0 {
		// Milliseconds, the setting's base unit: Go's "1m30s" is not a
		// PostgreSQL interval literal.
		cfg.RuntimeParams["statement_timeout"] = strconv.FormatInt(max(o.StatementTimeout.Milliseconds(), 1), 10)
	}
	if o.WALCompression != "" {
		cfg.RuntimeParams["wal_compression"] = o.WALCompression
	}
	if o.AsyncCommit {
		cfg.RuntimeParams["synchronous_commit"] = "off"
	}
	// On a cancelled context, ask the server to cancel the running statement
	// so its backend stops waiting on locks at once and the connection stays
	// usable; close the socket only if the server does not answer in time.
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: 2 * time.Second}
	}
	sqldb := stdlib.OpenDB(*cfg)
	sqldb.SetMaxOpenConns(o.MaxOpenConns)
	sqldb.SetMaxIdleConns(o.MaxIdleConns)
	sqldb.SetConnMaxLifetime(o.ConnMaxLifetime)
	sqldb.SetConnMaxIdleTime(o.ConnMaxIdleTime)
	p := &pool{db: bun.NewDB(sqldb, pgdialect.New()), opts: o}
	return &Store{pool: p, credentials: &Credentials{p}, inbound: &Inbound{p}, outbox: &Outbox{p}, retention: &Retention{p}}, nil
}

// Close closes the pool; in-flight calls finish first.
func (s *Store) Close() error {
	if err := s.db.Close(); err != nil {
		return classify(context.Background(), "close", err)
	}
	return nil
}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error {
	return classify(ctx, "ping", s.db.PingContext(ctx))
}

// sqlDB is the database/sql pool under bun; queries use real bind parameters
// ($n, extended protocol) rather than bun's client-side formatting.
func (s *pool) sqlDB() *sql.DB { return s.db.DB }

// SchemaVersion is the applied migration version (0 on an empty database).
// CheckSchema compares it with the version a build needs.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	v, err := migrations.Version(ctx, s.sqlDB())
	if err != nil {
		return 0, classify(ctx, "schema version", errors.Unwrap(err))
	}
	return v, nil
}

// withPgx runs fn on one pooled connection as a *pgx.Conn, for pipelined
// batches that database/sql cannot express.
func (s *pool) withPgx(ctx context.Context, fn func(*pgx.Conn) error) error {
	conn, err := s.sqlDB().Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		return fn(dc.(*stdlib.Conn).Conn())
	})
}

// inTx runs fn in a READ COMMITTED transaction on database/sql. The level is
// asked for, not left to the server's default_transaction_isolation: the
// statements that follow a lock (the fan-out guard in endpoints.go) rely on
// each statement taking a fresh snapshot.
func (s *pool) inTx(ctx context.Context, fn func(*sql.Tx) error) (err error) {
	tx, err := s.sqlDB().BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if err = fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}
