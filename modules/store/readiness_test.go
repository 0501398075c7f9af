package store_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// addLaterMigration records a migration this build does not embed, as a
// later release's migrate Job would.
func (f *fixture) addLaterMigration() {
	f.t.Helper()
	if _, err := f.admin.Exec(`INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, 'from_a_later_release.sql', 'not-a-checksum-of-ours')`,
		migrations.Latest()+1); err != nil {
		f.t.Fatal(err)
	}
}

// TestCheckSchema: ready at or above the version a build needs, never below;
// an older schema and an unreachable database are told apart.
func TestCheckSchema(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	latest := migrations.Latest()
	for _, need := range []int{latest, latest - 1, 1} {
		if err := f.s.CheckSchema(ctx, need); err != nil {
			t.Fatalf("need %d on a schema at %d: %v", need, latest, err)
		}
	}
	err := f.s.CheckSchema(ctx, latest+1)
	if !errors.Is(err, store.ErrSchemaBehind) || errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("need %d on a schema at %d: %v, want ErrSchemaBehind", latest+1, latest, err)
	}

	// A newer schema never stops an older binary.
	f.addLaterMigration()
	for _, need := range []int{latest, latest + 1} {
		if err := f.s.CheckSchema(ctx, need); err != nil {
			t.Fatalf("need %d on a schema at %d: %v", need, latest+1, err)
		}
	}

	empty := storetest.Open(t, storetest.NewEmptyDatabase(t))
	if err := empty.CheckSchema(ctx, 1); !errors.Is(err, store.ErrSchemaBehind) {
		t.Fatalf("unmigrated database: %v, want ErrSchemaBehind", err)
	}

	down, err := store.Open(ctx, "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2", store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	err = down.CheckSchema(ctx, 1)
	if !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrSchemaBehind) {
		t.Fatalf("unreachable database: %v, want ErrUnavailable", err)
	}
}

// clock is a settable test clock.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *clock) add(d time.Duration) { c.ns.Add(int64(d)) }
func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *clock) config(need int) store.ReadinessConfig {
	return store.ReadinessConfig{Need: need, MaxAge: time.Second, Timeout: 10 * time.Second, Now: c.now}
}

// TestReadinessSharesOneProbe: 200 concurrent checks cost one probe.
func TestReadinessSharesOneProbe(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	r := store.NewReadiness(f.s, newClock().config(migrations.Latest()))
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Check(context.Background()); err != nil {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d of 200 checks failed", n)
	}
	if n := r.Probes(); n != 1 {
		t.Fatalf("%d probes for 200 concurrent checks within MaxAge, want 1", n)
	}
}

// TestReadinessAge: a result answers for MaxAge from its probe's start, a
// failure no longer than a success, and the next check after that probes
// again and sees the change.
func TestReadinessAge(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := newClock()
	r := store.NewReadiness(f.s, c.config(migrations.Latest()+1))
	ctx := context.Background()
	want := func(step string, behind bool, probes uint64) {
		t.Helper()
		err := r.Check(ctx)
		if behind != errors.Is(err, store.ErrSchemaBehind) || (!behind && err != nil) {
			t.Fatalf("%s: %v, want behind=%v", step, err, behind)
		}
		if n := r.Probes(); n != probes {
			t.Fatalf("%s: %d probes, want %d", step, n, probes)
		}
	}
	want("first", true, 1)
	f.addLaterMigration()
	c.add(999 * time.Millisecond)
	want("failure within MaxAge", true, 1)
	c.add(time.Millisecond)
	want("failure at MaxAge", false, 2)
	if _, err := f.admin.Exec(`DELETE FROM schema_migrations WHERE version = $1`, migrations.Latest()+1); err != nil {
		t.Fatal(err)
	}
	c.add(999 * time.Millisecond)
	want("success within MaxAge", false, 2)
	c.add(time.Millisecond)
	want("success at MaxAge", true, 3)
}

// TestReadinessCancelledCaller: a caller that hangs up neither poisons the
// shared result nor holds up callers that wait for it; a probe that outlives
// Timeout fails as unavailable, and only for MaxAge.
func TestReadinessCancelledCaller(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := newClock()
	r := store.NewReadiness(f.s, c.config(migrations.Latest()))

	// The first caller is gone before the probe starts; its probe still
	// completes and the next caller gets that result without a second probe.
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Check(gone); err != nil {
		t.Fatalf("cancelled leader: %v, want the probe's result (ready)", err)
	}
	if err := r.Check(context.Background()); err != nil || r.Probes() != 1 {
		t.Fatalf("after a cancelled leader: %v, %d probes; want ready from the same probe", err, r.Probes())
	}

	// A probe blocked behind a lock: a waiter that gives up returns at once.
	tx, err := f.admin.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec(`LOCK TABLE schema_migrations IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	c.add(time.Second)
	leader := make(chan error, 1)
	go func() { leader <- r.Check(context.Background()) }()
	for r.Probes() != 2 {
		time.Sleep(time.Millisecond)
	}
	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelShort()
	if err := r.Check(short); !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiter past its deadline: %v, want ErrUnavailable", err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := <-leader; err != nil {
		t.Fatalf("leader after the lock was released: %v", err)
	}
	if n := r.Probes(); n != 2 {
		t.Fatalf("%d probes, want 2: the waiter that gave up must not start one", n)
	}

	// A probe that outlives Timeout is unavailable, cached for MaxAge only.
	cfg := c.config(migrations.Latest())
	cfg.Timeout = 100 * time.Millisecond
	r = store.NewReadiness(f.s, cfg)
	tx2, err := f.admin.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback()
	if _, err := tx2.Exec(`LOCK TABLE schema_migrations IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	if err := r.Check(context.Background()); !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrSchemaBehind) {
		t.Fatalf("probe past its timeout: %v, want ErrUnavailable", err)
	}
	if err := tx2.Rollback(); err != nil {
		t.Fatal(err)
	}
	// Each MaxAge later the same Readiness probes again. The first probe
	// after the lock may itself run out of its 100 ms on a loaded machine
	// (the cancelled probe's connection is replaced first), so allow a few.
	for tries := 1; ; tries++ {
		c.add(time.Second)
		err := r.Check(context.Background())
		if n := r.Probes(); n != 1+uint64(tries) {
			t.Fatalf("after %d MaxAges: %d probes, want one per MaxAge", tries, n)
		}
		if err == nil {
			break
		}
		if tries == 20 {
			t.Fatalf("after %d MaxAges still %v; want ready from a later probe", tries, err)
		}
	}
}

// BenchmarkReadiness: a readiness check as one probe per call (what /readyz
// did before) and from the shared probe, with parallel callers.
func BenchmarkReadiness(b *testing.B) {
	f := newFixture(b)
	ctx := context.Background()
	b.Run("probe-per-call", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := f.s.CheckSchema(ctx, migrations.Latest()); err != nil {
					b.Error(err)
				}
			}
		})
		b.ReportMetric(1, "probes/op")
	})
	b.Run("shared", func(b *testing.B) {
		r := store.NewReadiness(f.s, store.ReadinessConfig{Need: migrations.Latest()})
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := r.Check(ctx); err != nil {
					b.Error(err)
				}
			}
		})
		b.ReportMetric(float64(r.Probes())/float64(b.N), "probes/op")
	})
}
