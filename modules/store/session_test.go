package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

const testLockKey int64 = 0x7465_7374 // "test"

// One holder at a time; a release lets the next one in, and the lock reads
// the database's clock.
func TestSessionLockExcludes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	first, err := store.TryLock(ctx, f.dsn, "store-test", testLockKey)
	if err != nil || !first.Held() {
		t.Fatalf("first lock: held %v, %v", first != nil && first.Held(), err)
	}
	var dbNow time.Time
	if err := f.admin.QueryRow(`SELECT now()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	if d := dbNow.Sub(first.At()); d < 0 || d > time.Minute {
		t.Errorf("lock clock %v, database now %v", first.At(), dbNow)
	}
	second, err := store.TryLock(ctx, f.dsn, "store-test", testLockKey)
	if err != nil || second.Held() {
		t.Fatalf("second lock while held: held %v, %v", second != nil && second.Held(), err)
	}
	if err := second.Release(ctx); err != nil {
		t.Fatalf("release of a lock not held: %v", err)
	}
	if n := f.count(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`); n != 1 {
		t.Fatalf("advisory locks granted = %d, want 1", n)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	third, err := store.TryLock(ctx, f.dsn, "store-test", testLockKey)
	if err != nil || !third.Held() {
		t.Fatalf("lock after release: held %v, %v", third != nil && third.Held(), err)
	}
	if err := third.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestSessionLockBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const secret = "hunter2-not-echoed"
	_, err := store.TryLock(ctx, "postgres://u:"+secret+"@127.0.0.1:5432/db?sslmode=bogus", "store-test", testLockKey)
	if !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("malformed DSN: %v, want ErrInvalid", err)
	}
	if strings.Contains(err.Error(), secret) {
		t.Fatalf("error echoes the DSN: %v", err)
	}
	// Port 1 on loopback: nothing listens there.
	_, err = store.TryLock(ctx, "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=5", "store-test", testLockKey)
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("unreachable database: %v, want ErrUnavailable", err)
	}
}

// The server judges each trial SET: taken, refused for the role, unknown
// method; a closed session is a failure, not a refusal.
func TestSessionLockTryWALCompression(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	admin, err := store.TryLock(ctx, f.dsn, "store-test", testLockKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.TryWALCompression(ctx, "pglz"); err != nil {
		t.Errorf("pglz as superuser: %v", err)
	}
	if err := admin.TryWALCompression(ctx, "no-such-method"); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("unknown method: %v, want ErrInvalid", err)
	}
	if err := admin.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := admin.TryWALCompression(ctx, "pglz"); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("released session: %v, want ErrUnavailable", err)
	}
	if f.parameterACLs() {
		// The operator role holds no SET on wal_compression (only the
		// janitor's does, migration 0004).
		op, err := store.TryLock(ctx, storetest.DSNForRole(f.dsn, "envelopeworker_operator"), "store-test", testLockKey+1)
		if err != nil {
			t.Fatal(err)
		}
		defer op.Release(ctx)
		if err := op.TryWALCompression(ctx, "pglz"); !errors.Is(err, store.ErrNotPermitted) {
			t.Errorf("pglz as operator: %v, want ErrNotPermitted", err)
		}
	}
}

// With a pool of one, SessionSettings is the session every call runs in.
func TestSessionSettings(t *testing.T) {
	t.Parallel()
	dsn := storetest.NewDatabase(t)
	st, err := store.Open(context.Background(), dsn, store.Options{MaxOpenConns: 1, WALCompression: "pglz", AsyncCommit: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	got, err := st.SessionSettings(context.Background())
	if err != nil || got != (store.SessionSettings{WALCompression: "pglz", SynchronousCommit: "off"}) {
		t.Fatalf("settings = %+v, %v", got, err)
	}
}
