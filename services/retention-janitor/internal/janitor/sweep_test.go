package janitor

import (
	"context"
	"testing"
	"time"
)

// backlog is a Deleter over n due rows that advances a fake clock by cost
// per DELETE.
type backlog struct {
	left  int
	calls int
	clock *time.Time
	cost  time.Duration
}

func (b *backlog) DeleteExpiredPayloads(_ context.Context, _ time.Time, batch int) (int, error) {
	b.calls++
	*b.clock = b.clock.Add(b.cost)
	n := min(batch, b.left)
	b.left -= n
	return n, nil
}

// fakeClock is a Pace's clock and sleep over a fake time: a wait advances it
// and is recorded.
type fakeClock struct {
	now    time.Time
	sleeps []time.Duration
}

func (c *fakeClock) pace(batch, rate int) Pace {
	return Pace{Batch: batch, RowsPerSecond: rate,
		now: func() time.Time { return c.now },
		sleep: func(_ context.Context, d time.Duration) {
			c.sleeps = append(c.sleeps, d)
			c.now = c.now.Add(d)
		}}
}

func TestSweepPacesToTheRowRate(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	fc := &fakeClock{now: start}
	b := &backlog{left: 10_050, clock: &fc.now, cost: 2 * time.Millisecond}
	sum, err := Sweep(context.Background(), b, start, fc.pace(100, 1_000))
	if err != nil {
		t.Fatal(err)
	}
	if sum.RowsDeleted != 10_050 || sum.Batches != 101 || sum.StoppedBy != StoppedDone {
		t.Fatalf("summary = %+v", sum)
	}
	// 100 full batches, the short one and the probe that found nothing.
	if b.calls != 102 {
		t.Fatalf("%d DELETEs, want 102", b.calls)
	}
	// Each full batch waits for its turn: 100 rows at 1,000 rows/s is 100 ms,
	// of which the DELETE itself took 2 ms. Neither the short batch nor the
	// probe waits.
	if len(fc.sleeps) != 100 {
		t.Fatalf("%d waits, want 100 (one per full batch)", len(fc.sleeps))
	}
	for i, d := range fc.sleeps {
		if d != 98*time.Millisecond {
			t.Fatalf("wait %d = %v, want 98ms", i, d)
		}
	}
	// 10,000 rows at 1,000/s: the last full batch ends at 10 s, then two
	// DELETEs of 2 ms each.
	if got, want := fc.now.Sub(start), 10*time.Second+4*time.Millisecond; got != want {
		t.Fatalf("sweep took %v of the fake clock, want %v", got, want)
	}
}

func TestSweepPaceCatchesUpAfterASlowBatch(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	fc := &fakeClock{now: start}
	b := &backlog{left: 300, clock: &fc.now, cost: 250 * time.Millisecond}
	if _, err := Sweep(context.Background(), b, start, fc.pace(100, 1_000)); err != nil {
		t.Fatal(err)
	}
	// Every DELETE takes longer than its 100 ms share: the sweep is behind
	// its pace all along and never waits; the average, not each batch, is capped.
	if len(fc.sleeps) != 0 {
		t.Fatalf("waits %v, want none", fc.sleeps)
	}
}

func TestSweepUnpacedNeverWaits(t *testing.T) {
	t.Parallel()
	clock := time.Now()
	b := &backlog{left: 1_000, clock: &clock}
	pace := Pace{Batch: 100, sleep: func(context.Context, time.Duration) { t.Fatal("an unpaced sweep waited") }}
	sum, err := Sweep(context.Background(), b, clock, pace)
	if err != nil || sum.RowsDeleted != 1_000 || sum.StoppedBy != StoppedDone {
		t.Fatalf("sum %+v, err %v", sum, err)
	}
}

func TestSweepStopsWhileWaiting(t *testing.T) {
	t.Parallel()
	clock := time.Now()
	b := &backlog{left: 1_000_000, clock: &clock}
	ctx, cancel := context.WithCancel(context.Background())
	// The real timer: a cancel during the wait must end it at once (a wait of
	// an hour per batch would otherwise hold the test).
	pace := Pace{Batch: 1_000, RowsPerSecond: 1, sleep: func(ctx context.Context, d time.Duration) {
		cancel()
		sleepCtx(ctx, d)
	}}
	sum, err := Sweep(ctx, b, clock, pace)
	if err != nil {
		t.Fatal(err)
	}
	if sum.StoppedBy != StoppedCanceled || sum.RowsDeleted != 1_000 || b.calls != 1 {
		t.Fatalf("summary %+v after %d DELETEs; want canceled after one batch", sum, b.calls)
	}
}
