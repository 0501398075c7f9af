package janitor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/services/retention-janitor/internal/config"
)

// LockKey is the advisory lock key one janitor run holds. Advisory locks are
// per database, so janitors of different databases never exclude each other.
const LockKey int64 = 0x6a616e69746f72 // "janitor"

// SummaryMessage is the msg of the one summary log line of a run.
const SummaryMessage = "retention summary"

// unlockTimeout bounds the cleanup statements run after ctx may have ended.
const unlockTimeout = 5 * time.Second

// setupTimeout bounds connecting, locking and the schema check, which
// JANITOR_TIMEOUT (the delete cycle's budget) does not cover: an unreachable
// database fails the run instead of hanging until the Job's deadline.
const setupTimeout = time.Minute

// Run is one cycle under cfg: lock, schema check, deletes, the summary
// line on log and the optional push. It returns nil for a clean stop
// (including timeout, SIGTERM on ctx and a lock held by another run), and
// an error when the run failed.
func Run(ctx context.Context, cfg config.Config, log *slog.Logger) (err error) {
	start := time.Now()
	var sum Summary
	var session store.SessionSettings // the delete session's settings; unknown until it is open
	defer func() {
		end := time.Now()
		sum.Duration = end.Sub(start)
		if err != nil {
			sum.StoppedBy = StoppedError
		}
		pushed := false
		if cfg.PushgatewayURL != "" && sum.StoppedBy != StoppedLockHeld {
			// The push runs even after SIGTERM: it is short and bounded, and
			// the figures of an interrupted run are worth having.
			if perr := pushMetrics(context.WithoutCancel(ctx), cfg.PushgatewayURL, cfg.PushTimeout, sum, err != nil, end); perr != nil {
				err = errors.Join(err, perr)
				sum.StoppedBy = StoppedError
			} else {
				pushed = true
			}
		}
		attrs := []any{
			slog.Int64("rows_deleted", sum.RowsDeleted),
			slog.Int("batches", sum.Batches),
			slog.Int64("outbound_bodies_deleted", sum.OutboundBodiesDeleted),
			slog.Int64("outbound_attempts_deleted", sum.OutboundAttemptsDeleted),
			slog.Int("outbound_batches", sum.OutboundBatches),
			slog.Float64("duration_seconds", sum.Duration.Seconds()),
			slog.String("stopped_by", string(sum.StoppedBy)),
			slog.Int("batch_size", cfg.BatchSize),
			slog.Int("max_rows_per_second", cfg.MaxRowsPerSecond),
			slog.String("wal_compression", session.WALCompression),
			slog.String("synchronous_commit", session.SynchronousCommit),
			slog.Bool("pushed", pushed),
		}
		if err != nil {
			attrs = append(attrs, slog.String("error", err.Error()))
			log.Error(SummaryMessage, attrs...)
			return
		}
		log.Info(SummaryMessage, attrs...)
	}()

	// SIGTERM before the first delete is a clean stop too.
	canceled := func(err error) error {
		if ctx.Err() != nil {
			sum.StoppedBy = StoppedCanceled
			return nil
		}
		return err
	}
	setupCtx, cancelSetup := context.WithTimeout(ctx, setupTimeout)
	defer cancelSetup()
	lock, err := tryLock(setupCtx, cfg.DatabaseURL)
	if err != nil {
		return canceled(err)
	}
	cutoff := lock.At()
	defer func() {
		if uerr := unlock(ctx, lock); uerr != nil && err == nil {
			// The run's work is committed; a failed unlock only means the
			// session ends (and releases the lock) when the process exits.
			log.Warn("advisory unlock failed", slog.String("error", uerr.Error()))
		}
	}()
	if !lock.Held() {
		log.Info("another retention-janitor run holds the advisory lock; exiting")
		sum.StoppedBy = StoppedLockHeld
		return nil
	}

	set, refused, err := trySetWALCompression(setupCtx, lock, cfg.WALCompression)
	if err != nil {
		return canceled(err)
	}
	// One connection, so the settings read below are the deletes' own.
	// Commits need not wait for their WAL flush: a delete lost with a server
	// crash leaves a row that is still expired, and the next run deletes it.
	// Not flushing takes the janitor's own fsyncs (one per batch) out of the
	// queue concurrent ingest commits wait in (docs/retention-janitor.md).
	st, err := store.Open(setupCtx, cfg.DatabaseURL, store.Options{MaxOpenConns: 1, ApplicationName: "retention-janitor",
		WALCompression: set, AsyncCommit: true})
	if err != nil {
		return canceled(fmt.Errorf("open store: %w", err))
	}
	defer st.Close()
	if session, err = st.SessionSettings(setupCtx); err != nil {
		return canceled(err)
	}
	if refused != "" {
		log.Warn("wal_compression stays at the server's setting", slog.String("wanted", cfg.WALCompression),
			slog.String("server", session.WALCompression), slog.String("reason", refused))
	}
	// The same check as the services' readiness: a schema at or above this
	// build's works (migrations are additive), an older one fails the run.
	if err := st.CheckSchema(setupCtx, migrations.Latest()); err != nil {
		return canceled(fmt.Errorf("schema check: %w", err))
	}

	cycleCtx, cancel := context.WithTimeoutCause(ctx, cfg.Timeout, ErrCycleTimeout)
	defer cancel()
	pace := Pace{Batch: cfg.BatchSize, RowsPerSecond: cfg.MaxRowsPerSecond}
	if sum, err = Sweep(cycleCtx, st.Retention(), cutoff, pace); err != nil || sum.StoppedBy != StoppedDone {
		return err
	}
	// Outbound bodies after inbound payloads, in the same cycle budget and
	// at the same pace (§8.9).
	out, err := SweepOutbound(cycleCtx, st.Retention(), cutoff, pace)
	sum.OutboundBodiesDeleted, sum.OutboundAttemptsDeleted = out.OutboundBodiesDeleted, out.OutboundAttemptsDeleted
	sum.OutboundBatches, sum.StoppedBy = out.OutboundBatches, out.StoppedBy
	return err
}

// tryLock takes the run's advisory lock on a connection of its own (the
// lock belongs to that session, so the process dying releases it) and reads
// the database's clock as the cycle's cutoff: the one clock every janitor
// pod shares, so a pod whose own clock runs ahead does not delete payloads
// early.
func tryLock(ctx context.Context, dsn string) (*store.SessionLock, error) {
	lock, err := store.TryLock(ctx, dsn, "retention-janitor-lock", LockKey)
	if errors.Is(err, store.ErrInvalid) {
		// The DSN may hold a password; its text is never echoed.
		return nil, fmt.Errorf("%w: DATABASE_URL is not a valid PostgreSQL URL", config.ErrInvalid)
	}
	if err != nil {
		return nil, fmt.Errorf("advisory lock: %w", err)
	}
	return lock, nil
}

// trySetWALCompression tries want as the lock session's wal_compression, so
// the server decides whether the role may set it (superuser, or SET granted
// on PostgreSQL 15) and whether it knows the method. It returns what the
// store's sessions should set ("" for the server's setting) and why want is
// not used ("" when it is).
func trySetWALCompression(ctx context.Context, lock *store.SessionLock, want string) (set, refused string, err error) {
	if want == config.WALCompressionServer {
		return "", "", nil
	}
	err = lock.TryWALCompression(ctx, want)
	switch {
	case err == nil:
		return want, "", nil
	case errors.Is(err, store.ErrNotPermitted):
		return "", "this role may not set it", nil
	case errors.Is(err, store.ErrInvalid):
		return "", "this server does not support it", nil
	default:
		return "", "", fmt.Errorf("set wal_compression: %w", err)
	}
}

func unlock(ctx context.Context, lock *store.SessionLock) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
	defer cancel()
	return lock.Release(ctx)
}
