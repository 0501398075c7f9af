package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Errors the caller can act on. Test with errors.Is. A conflict is an answer,
// not a failure: it says the request contradicts what is already stored.
var (
	ErrNotFound = errors.New("store: not found")
	ErrConflict = errors.New("store: conflict")
	ErrInvalid  = errors.New("store: invalid argument")
	// ErrUnavailable covers connection failures, timeouts, PostgreSQL restarts
	// and exhausted retries: nothing was committed by this call, or the call
	// cannot tell (see Ingest), and retrying is safe. HTTP maps it to 503.
	ErrUnavailable = errors.New("store: unavailable")
	// ErrInternal is anything else (a bug or a schema that does not match).
	ErrInternal = errors.New("store: internal error")
	// ErrSecretRefForeign: the secret ref belongs to another tenant (or, used
	// by several before migration 0005, to none). Its message never names the
	// owner.
	ErrSecretRefForeign = errors.New("store: secret ref belongs to another tenant")
	// ErrTopicFull: the (tenant, project, topic) has MaxTopicEndpoints active
	// endpoints already, so adding or enabling one more is refused (contract
	// §8.12). Nothing was written.
	ErrTopicFull = errors.New("store: topic has the most active endpoints allowed")
	// ErrNotPermitted: the database role may not do this (insufficient
	// privilege), where the caller can go on without it, as with
	// SessionLock.TryWALCompression.
	ErrNotPermitted = errors.New("store: not permitted for this role")
)

// Outbox answers the caller acts on (errors.Is). Like ErrConflict they are
// answers, not failures.
var (
	// ErrIdempotencyConflict: the idempotency key was used with other
	// request content (HTTP 422 idempotency_conflict).
	ErrIdempotencyConflict = errors.New("store: idempotency conflict")
	// ErrNoEndpoint: no active endpoint subscribes to the topic (HTTP 422
	// no_endpoint). Nothing was stored and no sequence was taken.
	ErrNoEndpoint = errors.New("store: no active endpoint")
	// ErrNotDead: a replay of a message that is not dead (HTTP 409 not_dead).
	ErrNotDead = errors.New("store: message is not dead")
	// ErrFenced: a settle for an attempt that no longer owns the message
	// (its lease expired and it was claimed again, or it was settled already).
	// The row is unchanged; the worker drops its result.
	ErrFenced = errors.New("store: attempt fenced")
	// ErrPayloadExpired: a replay of a dead letter whose envelope body the
	// retention-janitor deleted (HTTP 409 payload_expired, §8.9). Nothing
	// was changed.
	ErrPayloadExpired = errors.New("store: payload expired")
)

// ErrSchemaBehind reports a database whose schema is older than the version
// the caller was built for: `envctl migrate` has not run yet. A newer schema
// is not an error: migrations are additive (contract §8.1), so a binary keeps
// working while a later release's migrate Job has already run.
var ErrSchemaBehind = errors.New("store: schema older than this build")

// errRolledBack: the server answered COMMIT with ROLLBACK (the transaction
// had failed); it is never expected after every statement succeeded.
var errRolledBack = errors.New("transaction rolled back at commit")

// errMissingStream: a locked stream was not there to read; never expected,
// since the lock statement creates it.
var errMissingStream = errors.New("locked stream not found")

// errLayoutUnsupported is a table that is neither one plain heap nor
// hash-partitioned into plain heaps like its fellows: a delete by ctid
// there could name rows nobody meant.
var errLayoutUnsupported = errors.New("store: tables neither plain nor partitioned alike")

// errProbeUnfinished is a readiness probe's result until its check returns:
// what waiters see if the check panics.
var errProbeUnfinished = errors.New("store: readiness probe did not finish")

// sqlStateSecretRefForeign is what migration 0005's trigger on endpoints
// raises for a secret ref another tenant owns. (Its other code, EW001, guards
// producer_keys against updates no store statement makes.)
const sqlStateSecretRefForeign = "EW002"

// Error is what every store method returns on failure. Its message is fixed
// text chosen by the store (operation and kind) and never contains driver
// messages, SQL, or values. The driver cause stays reachable through
// errors.As / errors.Is for diagnostics (for example SQLState); callers must
// not render a cause into responses — log SQLState(err) instead.
type Error struct {
	Op    string // e.g. "ingest"
	Kind  error  // one of the Err* sentinels
	cause error
}

func (e *Error) Error() string {
	if e.Op == "" {
		return e.Kind.Error()
	}
	return e.Kind.Error() + " (" + e.Op + ")"
}

// Unwrap exposes the kind and, when there is one, the driver or context cause.
func (e *Error) Unwrap() []error {
	if e.cause == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.cause}
}

// SQLState returns the PostgreSQL error code behind err ("" when there is
// none). Codes are safe to log; messages and details are not.
func SQLState(err error) string {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code
	}
	return ""
}

func newErr(op string, kind error) error { return &Error{Op: op, Kind: kind} }

// classify turns a driver error into a store Error with a fixed message.
// When ctx is done the error also matches ctx.Err(): the server may have
// answered the cancel request with its own error code.
func classify(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	var se *Error
	if errors.As(err, &se) {
		return err
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return &Error{Op: op, Kind: ErrUnavailable, cause: errors.Join(cerr, err)}
	}
	return &Error{Op: op, Kind: kindOf(err), cause: err}
}

func kindOf(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return ErrUnavailable
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		switch {
		case strings.HasPrefix(pg.Code, "08"), // connection exception
			strings.HasPrefix(pg.Code, "53"), // insufficient resources (too many connections, disk full)
			pg.Code == "57P01",               // admin_shutdown (restart, pg_terminate_backend)
			pg.Code == "57P02",               // crash_shutdown
			pg.Code == "57P03",               // cannot_connect_now (starting up, recovery)
			pg.Code == "57014",               // query_canceled (statement_timeout, cancel request)
			pg.Code == "55P03",               // lock_not_available (lock_timeout)
			pg.Code == "40001",               // serialization_failure, retries exhausted
			pg.Code == "40P01",               // deadlock_detected, retries exhausted
			pg.Code == "23505":               // unique race with another stream, retries exhausted
			return ErrUnavailable
		case pg.Code == sqlStateSecretRefForeign:
			return ErrSecretRefForeign
		}
		return ErrInternal
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, driver.ErrBadConn) || pgconn.Timeout(err) || pgconn.SafeToRetry(err) {
		return ErrUnavailable
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return ErrUnavailable
	}
	// pgx reports a connection that died mid-query as a plain error from a
	// closed conn; database/sql reports a pool that was closed the same way.
	if isClosedConn(err) {
		return ErrUnavailable
	}
	return ErrInternal
}

// retryable reports errors after which re-running the whole transaction is
// both safe (nothing committed) and likely to succeed.
func retryable(err error) bool {
	switch SQLState(err) {
	case "40001", "40P01", "23505":
		return true
	}
	return false
}

func isClosedConn(err error) bool {
	if errors.Is(err, sql.ErrConnDone) {
		return true
	}
	// database/sql does not export its "database is closed" error.
	return err.Error() == "sql: database is closed"
}
