package store_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// blocker holds an uncommitted row on the admin connection that the store's
// transaction will have to wait for.
type blocker struct {
	tx *sql.Tx
}

func (f *fixture) block(stmt string, args ...any) *blocker {
	f.t.Helper()
	tx, err := f.admin.Begin()
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := tx.Exec(stmt, args...); err != nil {
		f.t.Fatal(err)
	}
	return &blocker{tx: tx}
}

// waitingPid polls (bounded, by condition not by time) until a backend of this
// database waits for a lock, and returns its pid.
func (f *fixture) waitingPid() int {
	f.t.Helper()
	for i := 0; i < 2000; i++ {
		var pid int
		err := f.admin.QueryRow(`
			SELECT a.pid FROM pg_stat_activity a
			WHERE a.datname = current_database() AND a.wait_event_type = 'Lock'
			LIMIT 1`).Scan(&pid)
		if err == nil {
			return pid
		}
		if !errors.Is(err, sql.ErrNoRows) {
			f.t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	f.t.Fatal("no backend ever waited for the lock")
	return 0
}

// The batch writes item 1 (identity, payload, cursor, audit) and then blocks
// inserting item 2, whose event identity an uncommitted transaction of another
// stream holds: the transaction is killed between statements.
func crashSetup(t *testing.T) (*fixture, []store.BatchItem, *blocker) {
	f := newFixture(t)
	a := actor("t1", "d1")
	first := ev("e1", 1).input()
	second := ev("contested", 2).input()
	b := f.block(`INSERT INTO event_identities (tenant_id, event_identity, project_id, producer_id, sequence,
		idempotency_digest, content_digest, key_id, issued_at)
		VALUES ('t1', decode($1, 'hex'), 'p1', 'other', 1, '\x00000000000000000000000000000000000000000000000000000000000000ff',
		        '\x00000000000000000000000000000000000000000000000000000000000000ff', 'k1', now())`, second.EventIdentity)
	return f, []store.BatchItem{{Actor: a, Ingest: &first}, {Actor: a, Ingest: &second}}, b
}

func assertNothingCommitted(t *testing.T, f *fixture) {
	t.Helper()
	if c := f.tableCounts(); c != [4]int{} {
		t.Fatalf("partial commit: (identities, payloads, audit, cursor sum) = %v", c)
	}
}

func assertSafeError(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable", err)
	}
	msg := strings.ToLower(err.Error())
	for _, leak := range []string{"select", "insert", "sqlstate", "terminat", "cancel", "event_identities", "127.0.0.1"} {
		if strings.Contains(msg, leak) {
			t.Fatalf("error message %q leaks %q", err.Error(), leak)
		}
	}
}

func TestCrashCancelledContext(t *testing.T) {
	f, items, b := crashSetup(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := f.s.Inbound().IngestBatch(ctx, items)
		done <- err
	}()
	f.waitingPid()
	cancel()
	err := <-done
	assertSafeError(t, err)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want it to match context.Canceled too", err)
	}
	// Release the contested row: a transaction that survived the cancel
	// would now go on and commit.
	if err := b.tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	assertNothingCommitted(t, f)
	// The pool still works.
	if r := mustIngest(t, f.s, items[0].Actor, *items[0].Ingest); r.Outcome != store.OutcomeAccepted {
		t.Fatalf("after cancel: %+v", r)
	}
}

func TestCrashTerminatedBackend(t *testing.T) {
	f, items, b := crashSetup(t)
	done := make(chan error, 1)
	go func() {
		_, err := f.s.Inbound().IngestBatch(context.Background(), items)
		done <- err
	}()
	pid := f.waitingPid()
	var ok bool
	if err := f.admin.QueryRow(`SELECT pg_terminate_backend($1)`, pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend: %v, %v", ok, err)
	}
	assertSafeError(t, <-done)
	if err := b.tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	assertNothingCommitted(t, f)
	if r := mustIngest(t, f.s, items[0].Actor, *items[0].Ingest); r.Outcome != store.OutcomeAccepted {
		t.Fatalf("after terminate: %+v", r)
	}
}

// A single ingest waiting for its stream lock, cancelled by its caller.
func TestCrashCancelWhileLocked(t *testing.T) {
	f := newFixture(t)
	a := actor("t1", "d1")
	mustIngest(t, f.s, a, ev("e1", 1).input())
	before := f.tableCounts()
	b := f.block(`SELECT FROM streams WHERE tenant_id = 't1' AND project_id = 'p1' AND producer_id = 'd1' FOR UPDATE`)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := f.s.Inbound().Ingest(ctx, a, ev("e2", 2).input())
		done <- err
	}()
	f.waitingPid()
	cancel()
	assertSafeError(t, <-done)
	if err := b.tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if after := f.tableCounts(); after != before {
		t.Fatalf("rows %v -> %v after a cancelled ingest", before, after)
	}
}

func TestUnavailableDatabase(t *testing.T) {
	ctx := context.Background()
	// Nothing listens on port 1.
	s, err := store.Open(ctx, "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2", store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checks := map[string]error{}
	checks["ping"] = s.Ping(ctx)
	_, checks["ingest"] = s.Inbound().Ingest(ctx, actor("t1", "d1"), ev("e1", 1).input())
	_, checks["verify"] = s.Credentials().VerifyCredential(ctx, store.TokenPrefix+strings.Repeat("A", 43))
	_, checks["lookup key"] = s.Credentials().LookupKey(ctx, "t1", "k1")
	_, checks["schema version"] = s.SchemaVersion(ctx)
	_, checks["stream"] = s.Inbound().Stream(ctx, "t1", "p1", "d1")
	for name, err := range checks {
		if !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s: %v, want ErrUnavailable", name, err)
			continue
		}
		if strings.Contains(err.Error(), "127.0.0.1") || strings.Contains(err.Error(), "dial") {
			t.Errorf("%s: message %q leaks connection detail", name, err)
		}
	}

	if _, err := store.Open(ctx, "postgres://%zz", store.Options{}); !errors.Is(err, store.ErrInvalid) || strings.Contains(err.Error(), "%zz") {
		t.Fatalf("bad DSN: %v", err)
	}
}

func TestClosedStoreIsUnavailable(t *testing.T) {
	f := newFixture(t)
	s, err := store.Open(context.Background(), f.dsn, store.Options{MaxOpenConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Inbound().Ingest(context.Background(), actor("t1", "d1"), ev("e1", 1).input()); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("closed store: %v", err)
	}
}

func TestSchemaMismatchIsInternalAndQuiet(t *testing.T) {
	f := newFixture(t)
	if _, err := f.admin.Exec(`ALTER TABLE audit_events RENAME TO audit_events_old`); err != nil {
		t.Fatal(err)
	}
	_, err := f.s.Inbound().Ingest(context.Background(), actor("t1", "d1"), ev("e1", 1).input())
	if !errors.Is(err, store.ErrInternal) || errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("err = %v, want ErrInternal", err)
	}
	if strings.Contains(err.Error(), "audit") || strings.Contains(err.Error(), "relation") {
		t.Fatalf("message %q leaks SQL detail", err)
	}
	if store.SQLState(err) != "42P01" {
		t.Fatalf("SQLState = %q, want the cause's 42P01 reachable", store.SQLState(err))
	}
}

func TestStatementTimeout(t *testing.T) {
	f := newFixture(t)
	s, err := store.Open(context.Background(), f.dsn, store.Options{MaxOpenConns: 2, StatementTimeout: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if setting, err := store.SessionSetting(context.Background(), s, "statement_timeout"); err != nil || setting != "1500ms" {
		t.Fatalf("statement_timeout = %q, %v", setting, err)
	}
	// A statement stuck behind the stream lock is cut off by the server and
	// reported as unavailable, with nothing written.
	mustIngest(t, f.s, actor("t1", "d1"), ev("e1", 1).input())
	before := f.tableCounts()
	b := f.block(`SELECT FROM streams WHERE producer_id = 'd1' FOR UPDATE`)
	defer b.tx.Rollback()
	_, err = s.Inbound().Ingest(context.Background(), actor("t1", "d1"), ev("e2", 2).input())
	assertSafeError(t, err)
	if store.SQLState(err) != "57014" {
		t.Fatalf("SQLState = %q, want query_canceled", store.SQLState(err))
	}
	if after := f.tableCounts(); after != before {
		t.Fatalf("rows %v -> %v", before, after)
	}
}
