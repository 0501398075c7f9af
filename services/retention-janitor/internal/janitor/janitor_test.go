package janitor

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

func TestSweepDeletesExactlyTheExpiredInBoundedBatches(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seed(t, 1, 30_000, 25_000)
	before := f.snapshot(t)
	st := storetest.Open(t, f.janitorDSN)

	rec := &recorder{Deleter: st.Retention()}
	sum, err := Sweep(context.Background(), rec, time.Now(), Pace{Batch: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if sum.RowsDeleted != 25_000 || sum.Batches != 25 || sum.StoppedBy != StoppedDone {
		t.Fatalf("summary = %+v, want 25000 rows in 25 batches, done", sum)
	}
	// 25 full batches, then the DELETE that found nothing due.
	if len(rec.sizes) != 26 || rec.sizes[25] != 0 {
		t.Fatalf("batch sizes = %v", rec.sizes)
	}
	for i, n := range rec.sizes {
		if n > 1000 {
			t.Errorf("batch %d deleted %d rows, more than 1000", i, n)
		}
	}
	expired, live := f.payloads(t)
	if expired != 0 || live != 5_000 {
		t.Fatalf("after sweep: %d expired, %d live payloads; want 0, 5000", expired, live)
	}
	// Survivors are exactly the live sequences.
	if n := f.count(t, `SELECT count(*) FROM inbound_payloads p JOIN event_identities e USING (tenant_id, event_identity) WHERE e.sequence <= 25000`); n != 0 {
		t.Fatalf("%d payloads of expired sequences survived", n)
	}
	f.assertUntouched(t, before)
	if n := f.count(t, `SELECT count(*) FROM event_identities`); n != 30_000 {
		t.Fatalf("identities = %d, want 30000", n)
	}
}

func TestSweepSmallBatchesAndNothingDue(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	st := storetest.Open(t, f.janitorDSN)

	// An empty table: one probe, nothing deleted.
	sum, err := Sweep(context.Background(), st.Retention(), time.Now(), Pace{Batch: 1000})
	if err != nil || sum != (Summary{StoppedBy: StoppedDone}) {
		t.Fatalf("empty sweep = %+v, %v", sum, err)
	}

	f.seed(t, 1, 1_050, 1_000)
	rec := &recorder{Deleter: st.Retention()}
	sum, err = Sweep(context.Background(), rec, time.Now(), Pace{Batch: 300})
	if err != nil {
		t.Fatal(err)
	}
	if sum.RowsDeleted != 1_000 || sum.Batches != 4 || sum.StoppedBy != StoppedDone {
		t.Fatalf("summary = %+v", sum)
	}
	if want := []int{300, 300, 300, 100, 0}; !equalInts(rec.sizes, want) {
		t.Fatalf("batch sizes = %v, want %v", rec.sizes, want)
	}
	// The cutoff is the run's start: payloads still live at that instant stay.
	sum, err = Sweep(context.Background(), st.Retention(), time.Now().Add(-48*time.Hour), Pace{Batch: 1000})
	if err != nil || sum.RowsDeleted != 0 {
		t.Fatalf("sweep with an old cutoff = %+v, %v", sum, err)
	}
	if _, live := f.payloads(t); live != 50 {
		t.Fatalf("live payloads = %d, want 50", live)
	}
}

func TestSweepRefusesBatchOutsideContract(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seed(t, 1, 10, 10)
	st := storetest.Open(t, f.janitorDSN)
	for _, batch := range []int{0, -1, 1001} {
		sum, err := Sweep(context.Background(), st.Retention(), time.Now(), Pace{Batch: batch})
		if err == nil || sum.StoppedBy != StoppedError || sum.RowsDeleted != 0 {
			t.Fatalf("batch %d: summary %+v, err %v; want an error", batch, sum, err)
		}
	}
	if expired, _ := f.payloads(t); expired != 10 {
		t.Fatalf("expired payloads = %d, want 10 untouched", expired)
	}
}

func TestTwoSweepsAtOnceDeleteEachRowOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seed(t, 1, 30_000, 25_000)
	before := f.snapshot(t)
	// Each sweep has its own pool, as two pods would; no advisory lock here:
	// this is the store-level guarantee the lock is backed by.
	stores := []Deleter{storetest.Open(t, f.janitorDSN).Retention(), storetest.Open(t, f.janitorDSN).Retention()}
	sums := make([]Summary, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			sums[i], errs[i] = Sweep(context.Background(), stores[i], time.Now(), Pace{Batch: 1000})
		}()
	}
	close(start)
	wg.Wait()
	for i := range 2 {
		if errs[i] != nil {
			t.Fatalf("sweep %d: %v", i, errs[i])
		}
		if sums[i].StoppedBy != StoppedDone {
			t.Fatalf("sweep %d stopped by %s", i, sums[i].StoppedBy)
		}
	}
	if total := sums[0].RowsDeleted + sums[1].RowsDeleted; total != 25_000 {
		t.Fatalf("rows deleted %d + %d = %d, want 25000", sums[0].RowsDeleted, sums[1].RowsDeleted, total)
	}
	// A sweep may stop on an empty batch while the other still deletes;
	// what matters is that together they leave nothing due.
	if expired, live := f.payloads(t); expired != 0 || live != 5_000 {
		t.Fatalf("after sweeps: %d expired, %d live", expired, live)
	}
	f.assertUntouched(t, before)
}

// The store deletes by ctid (a row's physical slot). VACUUM frees the slots of
// deleted rows and an insert may take one at once, so this runs sweeps in
// small batches beside a VACUUM loop and a writer of new live payloads whose
// rows must land in freed slots: every live row, old or new, must survive,
// and every expired row go exactly once. Within one statement a slot cannot
// change hands; this guards the store against a delete that would pick its
// batch and delete it in two statements, where one can. The rows belong to
// 16 tenants: in the partitioned layout (storetest.Layout) they spread over
// the partitions, where one ctid names a row in each, and the store must
// delete partition by partition.
func TestSweepsBesideVacuumAndInsertsKeepEveryLiveRow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const tenants = 16
	f.seedTenants(t, 1, 20_000, 15_000, tenants)
	if heaps := f.count(t, `SELECT count(DISTINCT tableoid) FROM inbound_payloads`); (storetest.Layout() == migrations.LayoutPartitioned) != (heaps > 1) {
		t.Fatalf("payloads in %d heaps in the %s layout", heaps, storetest.Layout())
	}
	// The expired rows' slots, to tell afterwards which new rows took one.
	f.exec(t, `CREATE TABLE expired_slots AS SELECT tableoid AS heap, ctid AS slot FROM inbound_payloads WHERE expires_at <= now()`)
	stores := []Deleter{storetest.Open(t, f.janitorDSN).Retention(), storetest.Open(t, f.janitorDSN).Retention(), storetest.Open(t, f.janitorDSN).Retention()}
	// The helpers stop between statements, never by cancelling one: a
	// cancelled statement can still commit on the server after the client
	// gave up on it, and the counts below must see every row written.
	stop := make(chan struct{})
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	var halt sync.Once
	ctx := context.Background()
	var bg sync.WaitGroup
	defer func() { halt.Do(func() { close(stop) }); bg.Wait() }()
	var vacuums int64
	bgErr := make(chan error, 2)
	bg.Add(2)
	go func() {
		defer bg.Done()
		for !stopped() {
			if _, err := f.admin.ExecContext(ctx, `VACUUM inbound_payloads`); err != nil {
				bgErr <- fmt.Errorf("vacuum: %w", err)
				return
			}
			vacuums++
		}
	}()
	go func() {
		defer bg.Done()
		for next := int64(20_001); !stopped(); next += 20 {
			// One small transaction of 20 new live payloads, as ingest writes them.
			_, err := f.admin.ExecContext(ctx, `WITH ids AS (
				INSERT INTO event_identities
					(tenant_id, event_identity, project_id, producer_id, sequence, idempotency_digest, content_digest, key_id, issued_at)
				SELECT 't' || (i % $2::bigint), sha256(('e' || i)::bytea), 'p1', 'd1', i, sha256(('i' || i)::bytea), sha256(('c' || i)::bytea), 'k-old', now()
				FROM generate_series($1::bigint, $1::bigint + 19) AS i
				RETURNING tenant_id, event_identity, sequence)
				INSERT INTO inbound_payloads (tenant_id, event_identity, envelope, expires_at)
				SELECT tenant_id, event_identity, convert_to('{"sequence":' || sequence || '}', 'UTF8'), now() + interval '1 day' FROM ids`, next, tenants)
			if err != nil {
				bgErr <- fmt.Errorf("insert live payloads: %w", err)
				return
			}
		}
	}()
	sums := make([]Summary, len(stores))
	errs := make([]error, len(stores))
	var wg sync.WaitGroup
	for i := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Paced (three sweeps at 2,500 rows/s: 2 s for the 15,000) so
			// VACUUM frees slots and the inserts take some of them while
			// the sweeps still run; flat out, on a quiet machine the sweeps
			// could finish beside a single VACUUM, before any slot was taken.
			sums[i], errs[i] = Sweep(context.Background(), stores[i], time.Now(), Pace{Batch: 50, RowsPerSecond: 2500})
		}()
	}
	wg.Wait()
	halt.Do(func() { close(stop) })
	bg.Wait()
	close(bgErr)
	for err := range bgErr {
		t.Fatal(err)
	}
	var total int64
	for i := range stores {
		if errs[i] != nil || sums[i].StoppedBy != StoppedDone {
			t.Fatalf("sweep %d: %v, stopped by %s", i, errs[i], sums[i].StoppedBy)
		}
		total += sums[i].RowsDeleted
	}
	if total != 15_000 {
		t.Fatalf("rows deleted %d, want 15000", total)
	}
	inserted := f.count(t, `SELECT count(*) FROM event_identities WHERE sequence > 20000`)
	// New rows at an expired row's address took a slot VACUUM freed.
	reused := f.count(t, `SELECT count(*) FROM inbound_payloads p JOIN event_identities e USING (tenant_id, event_identity)
		WHERE e.sequence > 20000 AND (p.tableoid, p.ctid) IN (SELECT heap, slot FROM expired_slots)`)
	if vacuums == 0 || reused == 0 {
		t.Fatalf("the sweeps ran beside %d VACUUMs and %d new rows, %d of them in freed slots; the test needs both", vacuums, inserted, reused)
	}
	expired, live := f.payloads(t)
	if expired != 0 || live != 5_000+inserted {
		t.Fatalf("after sweeps: %d expired, %d live, want 0 and %d (5000 seeded + %d inserted)", expired, live, 5_000+inserted, inserted)
	}
	// The survivors are exactly the live rows, by identity: each seeded live
	// one and each new one still has its payload (a total alone would let a
	// lost row hide behind a kept expired one).
	if seeded, added := f.count(t, `SELECT count(*) FROM inbound_payloads p JOIN event_identities e USING (tenant_id, event_identity)
		WHERE e.sequence BETWEEN 15001 AND 20000`), f.count(t, `SELECT count(*) FROM inbound_payloads p JOIN event_identities e USING (tenant_id, event_identity)
		WHERE e.sequence > 20000`); seeded != 5_000 || added != inserted {
		t.Fatalf("payloads kept: %d of the 5000 seeded live, %d of the %d new", seeded, added, inserted)
	}
	t.Logf("15000 rows deleted in batches of 50 by %d sweeps beside %d VACUUMs and %d new live rows (%d in freed slots)", len(stores), vacuums, inserted, reused)
}

func TestSweepStopsCleanlyOnTimeoutAndCancel(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seed(t, 1, 6_000, 5_000)
	st := storetest.Open(t, f.janitorDSN)

	// The cycle deadline arrives after the third batch: the sweep reports
	// what it did and stops without error.
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	batches := 0
	rec := &recorder{Deleter: st.Retention(), onBatch: func(int) {
		batches++
		if batches == 3 {
			cancel(ErrCycleTimeout)
		}
	}}
	sum, err := Sweep(ctx, rec, time.Now(), Pace{Batch: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if sum != (Summary{RowsDeleted: 3000, Batches: 3, StoppedBy: StoppedTimeout}) {
		t.Fatalf("summary = %+v", sum)
	}
	if expired, _ := f.payloads(t); expired != 2000 {
		t.Fatalf("expired left = %d, want 2000", expired)
	}

	// SIGTERM (a plain cancel) after one more batch.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	rec2 := &recorder{Deleter: st.Retention(), onBatch: func(int) { cancel2() }}
	sum, err = Sweep(ctx2, rec2, time.Now(), Pace{Batch: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if sum != (Summary{RowsDeleted: 1000, Batches: 1, StoppedBy: StoppedCanceled}) {
		t.Fatalf("summary after cancel = %+v", sum)
	}

	// A context already past its deadline deletes nothing.
	ctx3, cancel3 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel3()
	sum, err = Sweep(ctx3, st.Retention(), time.Now(), Pace{Batch: 1000})
	if err != nil || sum != (Summary{StoppedBy: StoppedTimeout}) {
		t.Fatalf("expired deadline: %+v, %v", sum, err)
	}
	if expired, _ := f.payloads(t); expired != 1000 {
		t.Fatalf("expired left = %d, want 1000", expired)
	}
}

// TestJanitorRoleRefusals checks the database itself stops the janitor's role
// from doing anything but reading and deleting payloads.
func TestJanitorRoleRefusals(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seed(t, 1, 10, 5)
	before := f.snapshot(t)
	db, err := sql.Open("pgx", f.janitorDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })

	refused := []string{
		`UPDATE inbound_payloads SET expires_at = now() + interval '1 year'`,
		`UPDATE inbound_payloads SET envelope = '\x00'`,
		`INSERT INTO inbound_payloads (tenant_id, event_identity, envelope, expires_at) SELECT tenant_id, event_identity, '\x00', now() FROM event_identities LIMIT 1`,
		`TRUNCATE inbound_payloads`,
		`SELECT tenant_id FROM inbound_payloads LIMIT 1 FOR UPDATE SKIP LOCKED`,
		`SELECT count(*) FROM event_identities`,
		`DELETE FROM event_identities`,
		`UPDATE event_identities SET key_id = 'x'`,
		`INSERT INTO event_identities (tenant_id, event_identity, project_id, producer_id, sequence, idempotency_digest, content_digest, key_id, issued_at) VALUES ('t1', sha256('z'::bytea), 'p1', 'd1', 99, sha256('z'::bytea), sha256('z'::bytea), 'k', now())`,
		`SELECT count(*) FROM streams`,
		`UPDATE streams SET cursor = 0, replay_floor = 0`,
		`DELETE FROM streams`,
		`SELECT count(*) FROM audit_events`,
		`DELETE FROM audit_events`,
		`INSERT INTO audit_events (tenant_id, outcome) VALUES ('t1', 'accepted')`,
		`SELECT count(*) FROM producer_keys`,
		`DELETE FROM producer_keys`,
		`UPDATE producer_keys SET state = 'active'`,
		`SELECT count(*) FROM credentials`,
		`DELETE FROM credentials`,
		`DELETE FROM schema_migrations`,
		`CREATE TABLE janitor_owned (x int)`,
	}
	for _, q := range refused {
		_, err := db.Exec(q)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("%s: err = %v, want insufficient_privilege (42501)", q, err)
		}
	}
	f.assertUntouched(t, before)
	if expired, live := f.payloads(t); expired != 5 || live != 5 {
		t.Fatalf("payloads changed: %d expired, %d live", expired, live)
	}

	// What the role may do: read and delete payloads, take advisory locks,
	// read the schema version.
	var held bool
	if err := db.QueryRow(`SELECT pg_try_advisory_lock($1)`, LockKey).Scan(&held); err != nil || !held {
		t.Fatalf("advisory lock as janitor: %v, %v", held, err)
	}
	if _, err := db.Exec(`SELECT pg_advisory_unlock_all()`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`SELECT max(version) FROM schema_migrations`); err != nil {
		t.Fatalf("schema version as janitor: %v", err)
	}
	res, err := db.Exec(`DELETE FROM inbound_payloads WHERE expires_at <= now()`)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n != 5 {
		t.Fatalf("janitor deleted %d, want 5", n)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
