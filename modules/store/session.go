package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// SessionLock is a session-level advisory lock on a connection of its own,
// outside any pool: the lock belongs to that session, so closing it (Release,
// or the process dying) releases the lock, and no pooled statement can hold
// or drop it by accident. A run that must not overlap another of its kind
// (the retention-janitor's) holds one for its whole duration.
type SessionLock struct {
	conn *pgx.Conn
	key  int64
	held bool
	at   time.Time
}

// TryLock connects to dsn, naming the session application, and tries the
// advisory lock key without waiting. Held reports whether it was granted;
// either way the caller must Release. A malformed DSN is ErrInvalid (its
// text, which may hold a password, is never echoed); a database that cannot
// be reached is ErrUnavailable.
func TryLock(ctx context.Context, dsn, application string, key int64) (*SessionLock, error) {
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, newErr("lock: parse DSN", ErrInvalid)
	}
	cc.RuntimeParams["application_name"] = application
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, &Error{Op: "lock: connect", Kind: ErrUnavailable, cause: err}
	}
	l := &SessionLock{conn: conn, key: key}
	// The database's clock, read with the lock: the one clock every client
	// shares, so a caller whose own clock runs ahead does not act early.
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1), now()`, key).Scan(&l.held, &l.at); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, &Error{Op: "lock", Kind: ErrUnavailable, cause: err}
	}
	return l, nil
}

// Held reports whether TryLock was granted the lock.
func (l *SessionLock) Held() bool { return l.held }

// At is the database's clock when the lock was tried.
func (l *SessionLock) At() time.Time { return l.at }

// TryWALCompression tries method as the lock session's wal_compression, so
// the server, before any pool opens, decides whether the role may set it
// (superuser, or SET granted on PostgreSQL 15) and whether it knows the
// method; the caller then sets it for its pool with Options.WALCompression.
// A role that may not set it is ErrNotPermitted, a method the server does
// not know is ErrInvalid; any other failure is ErrUnavailable.
func (l *SessionLock) TryWALCompression(ctx context.Context, method string) error {
	_, err := l.conn.Exec(ctx, `SELECT set_config('wal_compression', $1, false)`, method)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &pgErr) && pgErr.Code == "42501": // insufficient_privilege
		return &Error{Op: "set wal_compression", Kind: ErrNotPermitted, cause: err}
	case errors.As(err, &pgErr) && pgErr.Code == "22023": // invalid_parameter_value
		return &Error{Op: "set wal_compression", Kind: ErrInvalid, cause: err}
	default:
		return &Error{Op: "set wal_compression", Kind: ErrUnavailable, cause: err}
	}
}

// Release unlocks (when held) and closes the lock's connection.
func (l *SessionLock) Release(ctx context.Context) error {
	var err error
	if l.held {
		_, err = l.conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, l.key)
	}
	if cerr := l.conn.Close(ctx); err == nil {
		err = cerr
	}
	if err != nil {
		return &Error{Op: "unlock", Kind: ErrUnavailable, cause: err}
	}
	return nil
}

// SessionSettings are settings of a pooled session that callers report.
type SessionSettings struct {
	WALCompression    string
	SynchronousCommit string
}

// SessionSettings reads the settings of one pooled session: with a pool of
// one connection (Options.MaxOpenConns 1), the session every call runs in.
func (s *Store) SessionSettings(ctx context.Context) (SessionSettings, error) {
	var d SessionSettings
	err := s.sqlDB().QueryRowContext(ctx, `SELECT current_setting('wal_compression'), current_setting('synchronous_commit')`).
		Scan(&d.WALCompression, &d.SynchronousCommit)
	if err != nil {
		return SessionSettings{}, &Error{Op: "read session settings", Kind: ErrUnavailable, cause: err}
	}
	return d, nil
}
