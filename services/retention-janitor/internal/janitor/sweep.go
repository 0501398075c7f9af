package janitor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// StopReason says why a run ended; it is the summary's stopped_by.
type StopReason string

// Stop reasons.
const (
	StoppedDone     StopReason = "done"      // no expired payload (inbound or outbound) left
	StoppedTimeout  StopReason = "timeout"   // JANITOR_TIMEOUT reached
	StoppedCanceled StopReason = "canceled"  // SIGTERM or caller cancelled
	StoppedLockHeld StopReason = "lock_held" // another run holds the lock
	StoppedError    StopReason = "error"     // the run failed
)

// ErrCycleTimeout is the cause of a cycle context that reached JANITOR_TIMEOUT.
var ErrCycleTimeout = errors.New("janitor cycle timeout reached")

// Deleter deletes up to batch payloads expired at now and reports how many
// went; *store.Retention implements it.
type Deleter interface {
	DeleteExpiredPayloads(ctx context.Context, now time.Time, batch int) (int, error)
}

// OutboundDeleter deletes expired outbound bodies and their attempt rows
// (contract §8.9), one DELETE of at most batch rows a call;
// *store.Retention implements it.
type OutboundDeleter interface {
	DeleteExpiredOutbound(ctx context.Context, now time.Time, batch int) (store.OutboundDeleted, error)
}

// Summary is the outcome of a run.
type Summary struct {
	RowsDeleted int64
	Batches     int // DELETE statements that removed at least one row
	Duration    time.Duration
	StoppedBy   StopReason
	// Outbound retention (§8.9): bodies and attempt rows deleted, and the
	// DELETE statements that removed at least one.
	OutboundBodiesDeleted   int64
	OutboundAttemptsDeleted int64
	OutboundBatches         int
}

// Pace is how fast a sweep may go.
type Pace struct {
	// Batch is the most rows one DELETE removes, 1..store.MaxDeleteBatch.
	Batch int
	// RowsPerSecond, when positive, spaces the batches so the sweep deletes
	// at most that many rows per second on average since it began. Every
	// deleted row of an envelope-sized payload costs about a kilobyte of WAL
	// uncompressed, half with lz4 (mostly full-page images: each heap page is
	// logged whole at its first change after a checkpoint), and concurrent
	// ingest commits wait behind that WAL; on a 2 vCPU server ingest p99
	// rose by -1% and +9% at 10,000 rows/s (docs/retention-janitor.md).
	// Zero deletes flat out.
	RowsPerSecond int

	// sleep waits d or until ctx ends; nil is a timer. now is the clock; nil
	// is time.Now. Tests replace both.
	sleep func(ctx context.Context, d time.Duration)
	now   func() time.Time
}

// Sweep deletes payloads expired at now in batches until a batch finds none
// or ctx ends. The end of ctx is a clean stop, not an error: StoppedTimeout
// when its cause is ErrCycleTimeout or a deadline, else StoppedCanceled. A
// store error ends the sweep with StoppedError and is returned. Duration is
// left to the caller, which times the whole run.
func Sweep(ctx context.Context, d Deleter, now time.Time, pace Pace) (Summary, error) {
	var s Summary
	rows, batches, stop, err := paced(ctx, pace, "delete expired payloads", func(ctx context.Context) (int, error) {
		return d.DeleteExpiredPayloads(ctx, now, pace.Batch)
	})
	s.RowsDeleted, s.Batches, s.StoppedBy = rows, batches, stop
	return s, err
}

// SweepOutbound deletes the outbound bodies expired at now, and their
// messages' attempt rows first, as Sweep does inbound payloads: batches of
// at most pace.Batch rows, the same pacing, the same stops. It fills the
// Outbound* fields and StoppedBy.
func SweepOutbound(ctx context.Context, d OutboundDeleter, now time.Time, pace Pace) (Summary, error) {
	var s Summary
	_, batches, stop, err := paced(ctx, pace, "delete expired outbound bodies", func(ctx context.Context) (int, error) {
		got, err := d.DeleteExpiredOutbound(ctx, now, pace.Batch)
		s.OutboundBodiesDeleted += int64(got.Bodies)
		s.OutboundAttemptsDeleted += int64(got.Attempts)
		return got.Bodies + got.Attempts, err
	})
	s.OutboundBatches, s.StoppedBy = batches, stop
	return s, err
}

// paced runs step (one DELETE of at most pace.Batch rows) until it deletes
// none or ctx ends, spacing full batches to pace.RowsPerSecond.
func paced(ctx context.Context, pace Pace, what string, step func(context.Context) (int, error)) (rows int64, batches int, stop StopReason, err error) {
	clock, sleep := pace.now, pace.sleep
	if clock == nil {
		clock = time.Now
	}
	if sleep == nil {
		sleep = sleepCtx
	}
	began := clock()
	for {
		if ctx.Err() != nil {
			return rows, batches, stopReason(ctx), nil
		}
		n, err := step(ctx)
		if err != nil {
			// A statement cancelled by the end of ctx rolled back whole.
			if ctx.Err() != nil {
				return rows, batches, stopReason(ctx), nil
			}
			return rows, batches, StoppedError, fmt.Errorf("%s (after %d batches): %w", what, batches, err)
		}
		if n == 0 {
			return rows, batches, StoppedDone, nil
		}
		rows += int64(n)
		batches++
		if n < pace.Batch {
			// A short batch took the last due rows; the next finds none and
			// need not wait for its turn.
			continue
		}
		if pace.RowsPerSecond > 0 {
			rate := int64(pace.RowsPerSecond)
			due := began.Add(time.Duration(rows/rate)*time.Second +
				time.Duration(rows%rate)*time.Second/time.Duration(rate))
			if wait := due.Sub(clock()); wait > 0 {
				sleep(ctx, wait)
			}
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func stopReason(ctx context.Context) StopReason {
	cause := context.Cause(ctx)
	if errors.Is(cause, ErrCycleTimeout) || errors.Is(cause, context.DeadlineExceeded) {
		return StoppedTimeout
	}
	return StoppedCanceled
}
