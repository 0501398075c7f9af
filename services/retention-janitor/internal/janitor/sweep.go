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

// Sweep deletes payloads expired at now in batches until a batch finds none
// or ctx ends. The end of ctx is a clean stop, not an error: StoppedTimeout
// when its cause is ErrCycleTimeout or a deadline, else StoppedCanceled. A
// store error ends the sweep with StoppedError and is returned. Duration is
// left to the caller, which times the whole run.
func Sweep(ctx context.Context, d Deleter, now time.Time, batch int) (Summary, error) {
	var s Summary
	for {
		if ctx.Err() != nil {
			s.StoppedBy = stopReason(ctx)
			return s, nil
		}
		n, err := d.DeleteExpiredPayloads(ctx, now, batch)
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
	}
}

func stopReason(ctx context.Context) StopReason {
	cause := context.Cause(ctx)
	if errors.Is(cause, ErrCycleTimeout) || errors.Is(cause, context.DeadlineExceeded) {
		return StoppedTimeout
	}
	return StoppedCanceled
}
