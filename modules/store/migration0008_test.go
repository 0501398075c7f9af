package store_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// legacyEnqueueSQL is the enqueue of the release before migration 0008: the
// body in outbound_envelopes.envelope, one pending message. $1 is a number
// that makes the row's keys.
const legacyEnqueueSQL = `
WITH n AS (SELECT $1::int AS n),
env AS (
    INSERT INTO outbound_envelopes (tenant_id, event_identity, project_id, producer_id, sequence, topic,
                                    idempotency_digest, request_digest, envelope)
    SELECT 't1', sha256(('o' || n)::bytea), 'p1', 'svc1', n, 'task.proposals',
           sha256(('k' || n)::bytea), sha256(('r' || n)::bytea), convert_to('{"n":' || n || '}', 'UTF8')
    FROM n
    RETURNING tenant_id, event_identity
)
INSERT INTO outbox_messages (tenant_id, message_id, project_id, topic, endpoint_id, event_identity,
                             max_attempts, budget, next_attempt_at)
SELECT env.tenant_id, 'msg_' || lpad(to_hex(n.n), 24, '0'), 'p1', 'task.proposals', 'ep_000000000000000000000001',
       env.event_identity, 12, 12, now()
FROM env, n`

// legacyClaimBodySQL is how the previous release's worker read a body.
const legacyClaimBodySQL = `SELECT envelope FROM outbound_envelopes WHERE tenant_id = 't1' AND event_identity = sha256(('o' || $1::int)::bytea)`

// TestMigration0008OnAPopulatedDatabase applies 0008 to a database the
// previous release populated, while that release keeps enqueueing and
// reading bodies as it did (the expand step must not stop it); then, with
// the previous release gone, the backfill moves every body while this
// release delivers; every claim gets the body that was stored.
func TestMigration0008OnAPopulatedDatabase(t *testing.T) {
	ctx := context.Background()
	dsn := storetest.NewEmptyDatabase(t)
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	// The schema of the previous release: migrations 1..7, recorded as the
	// migrator records them.
	if _, err := admin.Exec(`CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,
		checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	for _, m := range migrations.All() {
		if m.Version >= 8 {
			break
		}
		if _, err := admin.Exec(m.SQL); err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		if _, err := admin.Exec(`INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)`,
			m.Version, m.Name, m.Checksum); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.Exec(`INSERT INTO endpoints (tenant_id, endpoint_id, project_id, topic, url, secret_ref)
		VALUES ('t1', 'ep_000000000000000000000001', 'p1', 'task.proposals', 'https://hooks.example.test/', 'sec-1')`); err != nil {
		t.Fatal(err)
	}
	const populated = 5000
	for i := 1; i <= populated; i += 500 {
		tx, err := admin.Begin()
		if err != nil {
			t.Fatal(err)
		}
		for j := i; j < i+500; j++ {
			if _, err := tx.Exec(legacyEnqueueSQL, j); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	// Half of them delivered before the upgrade.
	if _, err := admin.Exec(`UPDATE outbox_messages SET status = 'delivered', delivered_at = now() - interval '1 day',
		next_attempt_at = NULL WHERE ('x' || right(message_id, 8))::bit(32)::int % 2 = 0`); err != nil {
		t.Fatal(err)
	}

	// The previous release keeps working while 0008 is applied.
	var next atomic.Int64
	next.Store(populated)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var oldWrites, oldReads atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			n := next.Add(1)
			if _, err := admin.Exec(legacyEnqueueSQL, n); err != nil {
				t.Errorf("previous release's enqueue during the migration: %v", err)
				return
			}
			oldWrites.Add(1)
			var body []byte
			if err := admin.QueryRow(legacyClaimBodySQL, n-populated/2).Scan(&body); err != nil || len(body) == 0 {
				t.Errorf("previous release's body read during the migration: %q, %v", body, err)
				return
			}
			oldReads.Add(1)
		}
	}()
	time.Sleep(50 * time.Millisecond)
	applied, err := migrations.Apply(ctx, admin)
	time.Sleep(50 * time.Millisecond)
	close(stop)
	wg.Wait()
	// 0008 and whatever later migrations this release carries.
	var want []int
	for _, m := range migrations.All() {
		if m.Version >= 8 {
			want = append(want, m.Version)
		}
	}
	if err != nil || fmt.Sprint(applied) != fmt.Sprint(want) {
		t.Fatalf("Apply: %v, %v; want %v", applied, err, want)
	}
	total := int(next.Load())
	if oldWrites.Load() == 0 || oldReads.Load() == 0 {
		t.Fatalf("the previous release did nothing during the migration (%d writes, %d reads)", oldWrites.Load(), oldReads.Load())
	}

	// This release: deliveries and the backfill at once.
	s, err := store.Open(ctx, dsn, store.Options{MaxOpenConns: 6, OutboxPayloadRetention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	done := make(chan struct{})
	var delivered atomic.Int64
	go func() {
		defer close(done)
		for {
			cs, err := s.Outbox().Claim(ctx, "t1", store.MaxClaim, time.Minute)
			if err != nil {
				t.Errorf("claim: %v", err)
				return
			}
			if len(cs) == 0 {
				return
			}
			var ss []store.Settlement
			for _, c := range cs {
				var n int
				if _, err := fmt.Sscanf(c.MessageID, "msg_%x", &n); err != nil || !bytes.Equal(c.Body, []byte(fmt.Sprintf(`{"n":%d}`, n))) {
					t.Errorf("claim of %s got body %q", c.MessageID, c.Body)
					return
				}
				ss = append(ss, store.Settlement{MessageID: c.MessageID, Attempt: c.Attempt, Outcome: store.SettleDelivered})
			}
			if _, err := s.Outbox().SettleBatch(ctx, "t1", ss); err != nil {
				t.Errorf("deliver: %v", err)
				return
			}
			delivered.Add(int64(len(ss)))
		}
	}()
	moved := 0
	for round := 0; ; round++ {
		var cur store.BackfillCursor
		left := 0
		for {
			st, err := s.Retention().BackfillBodies(ctx, cur, store.MaxBackfillBatch, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if st.Done {
				break
			}
			moved, left, cur = moved+st.Moved, left+st.Left, st.Next
		}
		if left == 0 {
			break
		}
		if round > 100 {
			t.Fatalf("%d bodies still in flight after 100 rounds", left)
		}
		<-done // the rest moves once delivered
	}
	<-done
	if moved != total {
		t.Fatalf("moved %d bodies, want %d", moved, total)
	}
	var inOld, bodies, noExpiry int
	if err := admin.QueryRow(`SELECT (SELECT count(*) FROM outbound_envelopes WHERE envelope IS NOT NULL),
		(SELECT count(*) FROM outbound_bodies), (SELECT count(*) FROM outbound_bodies WHERE expires_at IS NULL)`).
		Scan(&inOld, &bodies, &noExpiry); err != nil {
		t.Fatal(err)
	}
	if inOld != 0 || bodies != total || noExpiry != 0 {
		t.Fatalf("after the backfill: %d in the old column, %d bodies (want %d), %d without expiry", inOld, bodies, total, noExpiry)
	}
	t.Logf("%d populated, %d enqueued by the previous release during the migration, %d delivered during the backfill",
		populated, oldWrites.Load(), delivered.Load())
}
