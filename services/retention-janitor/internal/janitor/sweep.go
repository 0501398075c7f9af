package janitor

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// StopReason says why a run ended; it is the summary's stopped_by.
type StopReason string

// Stop reasons.
const (
	StoppedDone     StopReason = "done"      // no expired payload left
	StoppedTimeout  StopReason = "timeout"   // JANITOR_TIMEOUT reached
	StoppedCanceled StopReason = "canceled"  // SIGTERM or caller cancelled
	StoppedLockHeld StopReason = "lock_held" // another run holds the lock
	StoppedError    StopReason = "error"     // the run failed
)

// ErrCycleTimeout is the cause of a cycle context that reached JANITOR_TIMEOUT.
var ErrCycleTimeout = errors.New("janitor cycle timeout reached")

// Deleter deletes up to batch payloads expired at now and reports how many
// went; *store.Store implements it.
type Deleter interface {
	DeleteExpiredPayloads(ctx context.Context, now time.Time, batch int) (int, error)
}

// Summary is the outcome of a run.
type Summary struct {
	RowsDeleted int64
	Batches     int // DELETE statements that removed at least one row
	Duration    time.Duration
	StoppedBy   StopReason
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
	clock, sleep := pace.now, pace.sleep
	if clock == nil {
		clock = time.Now
	}
	if sleep == nil {
		sleep = sleepCtx
	}
	began := clock()
	var s Summary
	for {
		if ctx.Err() != nil {
			s.StoppedBy = stopReason(ctx)
			return s, nil
		}
		n, err := d.DeleteExpiredPayloads(ctx, now, pace.Batch)
		if err != nil {
			// A statement cancelled by the end of ctx rolled back whole.
			if ctx.Err() != nil {
				s.StoppedBy = stopReason(ctx)
				return s, nil
			}
			s.StoppedBy = StoppedError
			return s, fmt.Errorf("delete expired payloads (after %d batches): %w", s.Batches, err)
		}
		if n == 0 {
			s.StoppedBy = StoppedDone
			return s, nil
		}
		s.RowsDeleted += int64(n)
		s.Batches++
		if n < pace.Batch {
			// A short batch took the last due rows; the next finds none and
			// need not wait for its turn.
			continue
		}
		if pace.RowsPerSecond > 0 {
			rate := int64(pace.RowsPerSecond)
			due := began.Add(time.Duration(s.RowsDeleted/rate)*time.Second +
				time.Duration(s.RowsDeleted%rate)*time.Second/time.Duration(rate))
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
