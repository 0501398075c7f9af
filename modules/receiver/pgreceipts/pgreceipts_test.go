package pgreceipts

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/envelopeworker/envelopeworker/modules/receiver"
)

// The Store is a receiver.Receipts over pgx transactions.
var _ receiver.Receipts[pgx.Tx] = (*Store)(nil)

const defaultAdminDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// testPool creates a database of its own on TEST_DATABASE_URL's server
// (this module does not depend on the project's store module and its
// template) and drops it after the test.
func testPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	admin := os.Getenv("TEST_DATABASE_URL")
	if admin == "" {
		admin = defaultAdminDSN
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("connect to the test server: %v", err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "receipts_" + hex.EncodeToString(b)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(admin)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Database = name
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		_, _ = conn.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)")
		_ = conn.Close(ctx)
	})
	return pool
}

func newStore(t *testing.T, pool *pgxpool.Pool, opts Options) *Store {
	t.Helper()
	s, err := New(pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	// Twice: the DDL must be re-runnable.
	for i := 0; i < 2; i++ {
		if err := s.CreateTable(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(context.Background(), `CREATE TABLE IF NOT EXISTS effects (webhook_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return s
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func insertEffect(ctx context.Context, tx pgx.Tx, id string) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, id)
	return err
}

// TestConcurrentDeliveriesTakeEffectOnce delivers each webhook id from many
// goroutines at once, with some effects failing: every id's effect is in
// the database exactly once, and its receipt with it.
func TestConcurrentDeliveriesTakeEffectOnce(t *testing.T) {
	pool := testPool(t)
	s := newStore(t, pool, Options{})
	ctx := context.Background()
	const ids, senders = 20, 16
	var failures atomic.Int32
	var wg sync.WaitGroup
	for g := 0; g < senders; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < ids; i++ {
				id := fmt.Sprintf("msg_%d", i)
				for {
					_, err := s.Handle(ctx, id, func(ctx context.Context, tx pgx.Tx) error {
						if err := insertEffect(ctx, tx, id); err != nil {
							return err
						}
						// The first attempts fail after writing: the
						// rollback must take the effect and the receipt.
						if failures.Add(1) <= senders {
							return errors.New("effect failed")
						}
						return nil
					})
					if err == nil {
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	if n := count(t, pool, `SELECT count(*) FROM effects`); n != ids {
		t.Fatalf("%d effects for %d webhook ids", n, ids)
	}
	if n := count(t, pool, `SELECT count(DISTINCT webhook_id) FROM effects`); n != ids {
		t.Fatalf("%d distinct effects", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM webhook_receipts`); n != ids {
		t.Fatalf("%d receipts", n)
	}
}

func TestDuplicateAndRollback(t *testing.T) {
	pool := testPool(t)
	s := newStore(t, pool, Options{Table: "my_receipts"})
	ctx := context.Background()
	boom := errors.New("boom")
	dup, err := s.Handle(ctx, "m1", func(ctx context.Context, tx pgx.Tx) error {
		_ = insertEffect(ctx, tx, "m1")
		return boom
	})
	if !errors.Is(err, boom) || dup {
		t.Fatalf("failing effect: %v %v", dup, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM my_receipts`) + count(t, pool, `SELECT count(*) FROM effects`); n != 0 {
		t.Fatalf("%d rows after a failed effect", n)
	}
	for i, want := range []bool{false, true, true} {
		dup, err := s.Handle(ctx, "m1", func(ctx context.Context, tx pgx.Tx) error { return insertEffect(ctx, tx, "m1") })
		if err != nil || dup != want {
			t.Fatalf("delivery %d: duplicate %v, %v", i, dup, err)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM effects`); n != 1 {
		t.Fatalf("%d effects", n)
	}
	// A cancelled context commits nothing.
	cctx, cancel := context.WithCancel(ctx)
	_, err = s.Handle(cctx, "m2", func(ctx context.Context, tx pgx.Tx) error {
		_ = insertEffect(ctx, tx, "m2")
		cancel()
		return nil
	})
	if err == nil || count(t, pool, `SELECT count(*) FROM effects WHERE webhook_id = 'm2'`) != 0 {
		t.Fatalf("cancelled delivery: %v", err)
	}
}

func TestPruneAfterReplayWindow(t *testing.T) {
	pool := testPool(t)
	s := newStore(t, pool, Options{ReplayWindow: time.Hour})
	ctx := context.Background()
	// 2,500 old receipts (more than two batches) and 3 fresh ones.
	if _, err := pool.Exec(ctx, `INSERT INTO webhook_receipts SELECT 'old_' || g, now() - interval '2 hours' FROM generate_series(1, 2500) g`); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c"} {
		if _, err := s.Handle(ctx, id, func(context.Context, pgx.Tx) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	n, err := s.Prune(ctx)
	if err != nil || n != 2500 {
		t.Fatalf("pruned %d, %v", n, err)
	}
	if left := count(t, pool, `SELECT count(*) FROM webhook_receipts`); left != 3 {
		t.Fatalf("%d receipts left", left)
	}
	// A pruned id takes effect again: that is what the window bounds.
	dup, err := s.Handle(ctx, "old_1", func(context.Context, pgx.Tx) error { return nil })
	if err != nil || dup {
		t.Fatalf("pruned id: %v %v", dup, err)
	}
}

// TestPrunePlanUsesIndex checks that one prune batch reads received_at's
// index, not the whole table.
func TestPrunePlanUsesIndex(t *testing.T) {
	pool := testPool(t)
	s := newStore(t, pool, Options{})
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO webhook_receipts SELECT 'm_' || g, now() - g * interval '1 second' FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE webhook_receipts`); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `EXPLAIN `+strings.Replace(strings.Replace(s.prune, "$1", "3600", 1), "$2", "1000", 1))
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	text := strings.Join(plan, "\n")
	if !strings.Contains(text, "webhook_receipts_received_at") {
		t.Fatalf("prune does not use the received_at index:\n%s", text)
	}
}

func TestNewRefuses(t *testing.T) {
	for _, o := range []Options{{Table: "Bad"}, {Table: "a;drop"}, {ReplayWindow: -1}} {
		if _, err := New(&pgxpool.Pool{}, o); err == nil {
			t.Fatalf("accepted %+v", o)
		}
	}
	if _, err := New(nil, Options{}); err == nil {
		t.Fatal("accepted a nil db")
	}
}
