package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

const testRetention = time.Hour

// retentionStore is a store of f's database whose settles use testRetention.
func (f *fixture) retentionStore(dsn string, conns int) *store.Store {
	f.t.Helper()
	s, err := store.Open(context.Background(), dsn, store.Options{MaxOpenConns: conns, OutboxPayloadRetention: testRetention})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = s.Close() })
	return s
}

// bodyExpiry is the body's expires_at (nil: none) and whether the body exists.
func (f *fixture) bodyExpiry(tenant string, messageID string) (*time.Time, bool) {
	f.t.Helper()
	rows, err := f.admin.Query(`SELECT b.expires_at FROM outbound_bodies b JOIN outbox_messages m
		ON m.tenant_id = b.tenant_id AND m.event_identity = b.event_identity
		WHERE m.tenant_id = $1 AND m.message_id = $2`, tenant, messageID)
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	if !rows.Next() {
		return nil, false
	}
	var at *time.Time
	if err := rows.Scan(&at); err != nil {
		f.t.Fatal(err)
	}
	return at, true
}

// addAttempts writes n attempt rows for a message, as the worker records them.
func (f *fixture) addAttempts(tenant, id string, n int) {
	f.t.Helper()
	if _, err := f.admin.Exec(`INSERT INTO outbox_attempts (tenant_id, message_id, attempt, started_at, duration_ms, result)
		SELECT $1, $2, a, now(), 3, 'retry' FROM generate_series(1, $3::int) a`, tenant, id, n); err != nil {
		f.t.Fatal(err)
	}
}

// sweepOutbound runs the janitor's outbound deletes at now until none is due.
func sweepOutbound(t testing.TB, s *store.Store, now time.Time, batch int) (attempts, bodies int) {
	t.Helper()
	for {
		d, err := s.Retention().DeleteExpiredOutbound(context.Background(), now, batch)
		if err != nil {
			t.Fatalf("DeleteExpiredOutbound: %v", err)
		}
		if d.Attempts > batch || d.Bodies > batch || d.Attempts > 0 && d.Bodies > 0 {
			t.Fatalf("one call deleted %+v, batch %d", d, batch)
		}
		if d.Attempts == 0 && d.Bodies == 0 {
			return attempts, bodies
		}
		attempts += d.Attempts
		bodies += d.Bodies
	}
}

// TestOutboundRetentionLifecycle follows one envelope of two messages
// through §8.9: the body lives in outbound_bodies, the expiry is fixed by
// the last settle, the janitor deletes body and attempt rows once expired
// and never while a message is in flight, and afterwards status, a repeated
// enqueue and a replay answer as the contract says while ids, statuses,
// idempotency keys and sequences stay.
func TestOutboundRetentionLifecycle(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s := f.retentionStore(f.dsn, 4)
	f.addEndpoint("t1", "p1", "task.proposals")
	f.addEndpoint("t1", "p1", "task.proposals")
	o := out("k-ret", `{"x":1}`)
	res, err := s.Outbox().Enqueue(ctx, actor("t1", "svc1"), o.request())
	if err != nil || len(res.MessageIDs) != 2 {
		t.Fatalf("Enqueue: %+v, %v", res, err)
	}
	if n := f.count(`SELECT count(*) FROM outbound_envelopes WHERE envelope IS NOT NULL`); n != 0 {
		t.Fatalf("%d envelopes hold a body in the old column; new enqueues write outbound_bodies only", n)
	}
	if at, ok := f.bodyExpiry("t1", res.MessageIDs[0]); !ok || at != nil {
		t.Fatalf("new body: present %v, expiry %v; want present, none", ok, at)
	}
	cs, err := s.Outbox().Claim(ctx, "t1", 10, time.Minute)
	if err != nil || len(cs) != 2 {
		t.Fatalf("Claim: %d, %v", len(cs), err)
	}
	for _, c := range cs {
		if !bytes.Equal(c.Body, res.Envelope) {
			t.Fatalf("claimed body %q, want %q", c.Body, res.Envelope)
		}
		f.addAttempts("t1", c.MessageID, 3)
	}
	byID := map[string]store.Claimed{cs[0].MessageID: cs[0], cs[1].MessageID: cs[1]}
	first, last := byID[res.MessageIDs[0]], byID[res.MessageIDs[1]]

	if err := s.Outbox().MarkDelivered(ctx, "t1", first.MessageID, first.Attempt); err != nil {
		t.Fatal(err)
	}
	// One message still delivering: the janitor leaves the body, whatever
	// the expiry says and however late it runs.
	if a, b := sweepOutbound(t, s, time.Now().Add(100*testRetention), 10); a != 0 || b != 0 {
		t.Fatalf("janitor deleted %d attempts, %d bodies of an envelope with a message in flight", a, b)
	}
	time.Sleep(20 * time.Millisecond)
	settled := time.Now()
	if err := s.Outbox().MarkRetry(ctx, "t1", last.MessageID, last.Attempt, time.Now().Add(time.Minute), store.CodeHTTP5xx); err != nil {
		t.Fatal(err)
	}
	// A retry is no settle: the last message is pending again.
	cs, err = s.Outbox().Claim(ctx, "t1", 10, time.Minute)
	if err != nil || len(cs) != 0 {
		t.Fatalf("Claim before the retry is due: %d, %v", len(cs), err)
	}
	if _, err := f.admin.Exec(`UPDATE outbox_messages SET next_attempt_at = now() WHERE message_id = $1`, last.MessageID); err != nil {
		t.Fatal(err)
	}
	cs, err = s.Outbox().Claim(ctx, "t1", 10, time.Minute)
	if err != nil || len(cs) != 1 {
		t.Fatalf("Claim of the retry: %d, %v", len(cs), err)
	}
	settled = time.Now()
	if err := s.Outbox().MarkDead(ctx, "t1", cs[0].MessageID, cs[0].Attempt, store.CodeHTTP4xx, false); err != nil {
		t.Fatal(err)
	}
	at, _ := f.bodyExpiry("t1", last.MessageID)
	if at == nil || at.Before(settled.Add(testRetention).Add(-5*time.Second)) || at.After(time.Now().Add(testRetention).Add(5*time.Second)) {
		t.Fatalf("expiry after the last settle = %v, want about %v", at, settled.Add(testRetention))
	}

	// Not yet expired: nothing goes.
	if a, b := sweepOutbound(t, s, at.Add(-time.Second), 10); a != 0 || b != 0 {
		t.Fatalf("janitor deleted %d attempts, %d bodies before the expiry", a, b)
	}
	counts := func() string {
		return fmt.Sprint(f.count(`SELECT count(*) FROM outbound_envelopes`), f.count(`SELECT count(*) FROM outbox_messages`),
			f.count(`SELECT coalesce(sum(last_sequence), 0) FROM outbound_streams`), f.count(`SELECT count(*) FROM audit_events`))
	}
	before := counts()
	// Batches of 4: six attempt rows take two, then the body.
	a, b := sweepOutbound(t, s, at.Add(time.Second), 4)
	if a != 6 || b != 1 {
		t.Fatalf("janitor deleted %d attempts, %d bodies; want 6, 1", a, b)
	}
	if after := counts(); after != before {
		t.Fatalf("identities, messages, sequences, audit changed: %s -> %s", before, after)
	}

	for _, id := range res.MessageIDs {
		st, err := s.Outbox().OutboxMessage(ctx, "t1", id)
		if err != nil || !st.PayloadExpired {
			t.Fatalf("status of %s: %+v, %v; want payload_expired", id, st, err)
		}
	}
	rep, err := s.Outbox().Enqueue(ctx, actor("t1", "svc1"), o.request())
	if err != nil || rep.Created || !rep.PayloadExpired || rep.Envelope != nil ||
		fmt.Sprint(rep.MessageIDs) != fmt.Sprint(res.MessageIDs) {
		t.Fatalf("repeat after expiry: %+v, %v; want payload expired, the original ids", rep, err)
	}
	// POST /v1/outbox/batch answers each such item the same way.
	as, err := s.Outbox().EnqueueBatch(ctx, []store.EnqueueItem{{actor("t1", "svc1"), o.request()}, {actor("t1", "svc1"), o.request()}})
	if err != nil || len(as) != 2 {
		t.Fatalf("batch of repeats after expiry: %+v, %v", as, err)
	}
	for i, a := range as {
		if a.Err != nil || a.Result.Created || !a.Result.PayloadExpired || a.Result.Envelope != nil ||
			fmt.Sprint(a.Result.MessageIDs) != fmt.Sprint(res.MessageIDs) {
			t.Fatalf("batch item %d after expiry: %+v, %v; want payload expired, the original ids", i, a.Result, a.Err)
		}
	}
	other := o
	other.body = `{"x":2}`
	_, err = s.Outbox().Enqueue(ctx, actor("t1", "svc1"), other.request())
	wantErr(t, "same key, other content, after expiry", err, store.ErrIdempotencyConflict)
	_, err = s.Outbox().ReplayDeadLetter(ctx, actor("t1", "op1"), last.MessageID)
	wantErr(t, "replay of an expired dead letter", err, store.ErrPayloadExpired)
	_, err = s.Outbox().ReplayDeadLetter(ctx, actor("t1", "op1"), first.MessageID)
	wantErr(t, "replay of a delivered message", err, store.ErrNotDead)
	if st := f.status("t1", last.MessageID); st.Status != store.StatusDead {
		t.Fatalf("refused replay changed the message: %+v", st)
	}
	if after := counts(); after != before {
		t.Fatalf("answers after expiry changed rows: %s -> %s", before, after)
	}
}

// A replay clears the expiry until the message settles again, and the
// janitor never takes the body of a replayed message.
func TestReplayClearsOutboundExpiry(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s := f.retentionStore(f.dsn, 4)
	f.addEndpoint("t1", "p1", "task.proposals")
	res, err := s.Outbox().Enqueue(ctx, actor("t1", "svc1"), out("k-1", `{}`).request())
	if err != nil {
		t.Fatal(err)
	}
	id := res.MessageIDs[0]
	cs, _ := s.Outbox().Claim(ctx, "t1", 1, time.Minute)
	if err := s.Outbox().MarkDead(ctx, "t1", id, cs[0].Attempt, store.CodeHTTP4xx, false); err != nil {
		t.Fatal(err)
	}
	if at, _ := f.bodyExpiry("t1", id); at == nil {
		t.Fatal("no expiry after the only message died")
	}
	if _, err := s.Outbox().ReplayDeadLetter(ctx, actor("t1", "op1"), id); err != nil {
		t.Fatal(err)
	}
	if at, ok := f.bodyExpiry("t1", id); !ok || at != nil {
		t.Fatalf("after replay: body %v, expiry %v; want kept, cleared", ok, at)
	}
	if a, b := sweepOutbound(t, s, time.Now().Add(100*testRetention), 10); a != 0 || b != 0 {
		t.Fatalf("janitor deleted %d attempts, %d bodies of a replayed message", a, b)
	}
	cs, _ = s.Outbox().Claim(ctx, "t1", 1, time.Minute)
	if len(cs) != 1 || !bytes.Equal(cs[0].Body, res.Envelope) {
		t.Fatalf("replayed claim: %+v", cs)
	}
	if err := s.Outbox().MarkDelivered(ctx, "t1", id, cs[0].Attempt); err != nil {
		t.Fatal(err)
	}
	if at, _ := f.bodyExpiry("t1", id); at == nil {
		t.Fatal("no expiry after the replayed message settled")
	}
}

// TestOutboundExpiryUnderConcurrentSettles settles the messages of many
// fanned-out envelopes from many goroutines on many connections at once,
// through SettleBatch and the single Mark* calls, in random order, each
// envelope's messages in different transactions at the same moment. Every
// envelope must end with an expiry no earlier than its last settle began
// plus the retention (less the time one transaction takes), and the janitor
// must then take every body. Then replays race the janitor: no message may
// ever be in flight without its body.
func TestOutboundExpiryUnderConcurrentSettles(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s := f.retentionStore(f.dsn, 16)
	const endpoints, envelopes = 8, 60
	for i := 0; i < endpoints; i++ {
		f.addEndpoint("t1", "p1", "task.proposals")
	}
	for k := 0; k < envelopes; k++ {
		if _, err := s.Outbox().Enqueue(ctx, actor("t1", "svc1"), out(fmt.Sprintf("k-%d", k), `{}`).request()); err != nil {
			t.Fatal(err)
		}
	}
	var claimed []store.Claimed
	for {
		cs, err := s.Outbox().Claim(ctx, "t1", store.MaxClaim, 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(cs) == 0 {
			break
		}
		claimed = append(claimed, cs...)
	}
	if len(claimed) != endpoints*envelopes {
		t.Fatalf("claimed %d, want %d", len(claimed), endpoints*envelopes)
	}
	// Interleave siblings so each batch mixes envelopes and every envelope
	// is spread over batches settled at the same time.
	rand.Shuffle(len(claimed), func(i, j int) { claimed[i], claimed[j] = claimed[j], claimed[i] })
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, len(claimed))
	const workers = 16
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			var batch []store.Settlement
			for i := w; i < len(claimed); i += workers {
				c := claimed[i]
				st := store.Settlement{MessageID: c.MessageID, Attempt: c.Attempt, Outcome: store.SettleDelivered}
				switch i % 3 {
				case 1:
					st = store.Settlement{MessageID: c.MessageID, Attempt: c.Attempt, Outcome: store.SettleDead, Code: store.CodeHTTP4xx}
				case 2: // single calls, one transaction each
					if err := s.Outbox().MarkDelivered(ctx, "t1", c.MessageID, c.Attempt); err != nil {
						errs <- err
					}
					continue
				}
				batch = append(batch, st)
				if len(batch) == 4 {
					res, err := s.Outbox().SettleBatch(ctx, "t1", batch)
					if err != nil {
						errs <- err
					}
					for _, e := range res {
						if e != nil {
							errs <- e
						}
					}
					batch = batch[:0]
				}
			}
			if len(batch) > 0 {
				if _, err := s.Outbox().SettleBatch(ctx, "t1", batch); err != nil {
					errs <- err
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("settle: %v", err)
	}
	end := time.Now()
	if n := f.count(`SELECT count(*) FROM outbox_messages WHERE status NOT IN ('delivered', 'dead')`); n != 0 {
		t.Fatalf("%d messages unsettled", n)
	}
	// The settles' now() is their transaction's start, at or after start.
	if n := f.count(`SELECT count(*) FROM outbound_bodies WHERE expires_at IS NULL
		OR expires_at < $1::timestamptz + $3::bigint * interval '1 microsecond'
		OR expires_at > $2::timestamptz + $3::bigint * interval '1 microsecond'`,
		start, end.Add(time.Second), testRetention.Microseconds()); n != 0 {
		t.Fatalf("%d of %d bodies without an expiry in [start, end] + retention", n, envelopes)
	}
	// Each expiry is its envelope's last settle: no message settled later.
	if n := f.count(`SELECT count(*) FROM outbound_bodies b WHERE EXISTS (
		SELECT FROM outbox_messages m WHERE m.tenant_id = b.tenant_id AND m.event_identity = b.event_identity
		  AND coalesce(m.delivered_at, m.dead_at) + $1::bigint * interval '1 microsecond' > b.expires_at + interval '1 second')`,
		testRetention.Microseconds()); n != 0 {
		t.Fatalf("%d bodies expire before their last settle plus the retention", n)
	}

	// Replays race the janitor over every dead letter, all past expiry.
	var dead []string
	rows, err := f.admin.Query(`SELECT message_id FROM outbox_messages WHERE status = 'dead'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		dead = append(dead, id)
	}
	rows.Close()
	later := end.Add(2 * testRetention)
	var replayed, expired int
	var mu sync.Mutex
	var rg sync.WaitGroup
	for w := 0; w < 8; w++ {
		rg.Add(1)
		go func(w int) {
			defer rg.Done()
			for i := w; i < len(dead); i += 8 {
				_, err := s.Outbox().ReplayDeadLetter(ctx, actor("t1", "op1"), dead[i])
				mu.Lock()
				switch {
				case err == nil:
					replayed++
				case errors.Is(err, store.ErrPayloadExpired):
					expired++
				default:
					t.Errorf("replay: %v", err)
				}
				mu.Unlock()
			}
		}(w)
	}
	rg.Add(1)
	go func() {
		defer rg.Done()
		for {
			d, err := s.Retention().DeleteExpiredOutbound(ctx, later, 3)
			if err != nil {
				t.Errorf("janitor: %v", err)
				return
			}
			if d.Attempts == 0 && d.Bodies == 0 {
				return
			}
		}
	}()
	rg.Wait()
	if replayed+expired != len(dead) {
		t.Fatalf("replayed %d + expired %d != %d dead letters", replayed, expired, len(dead))
	}
	if n := f.count(`SELECT count(*) FROM outbox_messages m WHERE m.status IN ('pending', 'delivering')
		AND NOT EXISTS (SELECT FROM outbound_bodies b WHERE b.tenant_id = m.tenant_id AND b.event_identity = m.event_identity)`); n != 0 {
		t.Fatalf("%d messages in flight without a body", n)
	}
	if n := f.count(`SELECT count(*) FROM outbox_messages WHERE status = 'pending'`); n != replayed {
		t.Fatalf("%d pending, %d replays succeeded", n, replayed)
	}
	t.Logf("%d settles in %v; %d dead letters: %d replayed, %d found expired", len(claimed), end.Sub(start), len(dead), replayed, expired)
}

// legacyBodies moves every body back to the old column, as a release
// before 0008 wrote it.
func (f *fixture) legacyBodies() {
	f.t.Helper()
	if _, err := f.admin.Exec(`UPDATE outbound_envelopes o SET envelope = b.envelope FROM outbound_bodies b
		WHERE b.tenant_id = o.tenant_id AND b.event_identity = o.event_identity`); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.admin.Exec(`DELETE FROM outbound_bodies`); err != nil {
		f.t.Fatal(err)
	}
}

// TestBackfillBodiesOnAPopulatedDatabase moves old-column bodies while a
// worker keeps claiming and delivering: every claim gets its exact body
// whichever table holds it at that moment; settled envelopes move with the
// expiry their last settle fixes, in-flight ones stay until a later run; the
// backfill is resumable and idempotent.
func TestBackfillBodiesOnAPopulatedDatabase(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s := f.retentionStore(f.dsn, 8)
	f.addEndpoint("t1", "p1", "task.proposals")
	f.addEndpoint("t2", "p1", "task.proposals")
	const perTenant = 1500
	bodies := map[string][]byte{}
	for _, tenant := range []string{"t1", "t2"} {
		for k := 0; k < perTenant; k++ {
			res, err := s.Outbox().Enqueue(ctx, actor(tenant, "svc1"), out(fmt.Sprintf("k-%d", k), fmt.Sprintf(`{"k":%d}`, k)).request())
			if err != nil {
				t.Fatal(err)
			}
			bodies[res.MessageIDs[0]] = res.Envelope
		}
	}
	// Half of t1 settled before the upgrade.
	settle := func(tenant string, n int) {
		for n > 0 {
			cs, err := s.Outbox().Claim(ctx, tenant, min(n, store.MaxClaim), time.Minute)
			if err != nil {
				t.Error(err)
				return
			}
			if len(cs) == 0 {
				return
			}
			for _, c := range cs {
				if !bytes.Equal(c.Body, bodies[c.MessageID]) {
					t.Errorf("claim of %s got body %q, want %q", c.MessageID, c.Body, bodies[c.MessageID])
				}
				if err := s.Outbox().MarkDelivered(ctx, tenant, c.MessageID, c.Attempt); err != nil {
					t.Error(err)
				}
			}
			n -= len(cs)
		}
	}
	settle("t1", perTenant/2)
	f.legacyBodies()
	if n := f.count(`SELECT count(*) FROM outbound_envelopes WHERE envelope IS NULL`); n != 0 {
		t.Fatalf("%d envelopes without an old-column body", n)
	}

	// Deliveries continue (t2, then the rest of t1) while the backfill runs.
	done := make(chan struct{})
	go func() {
		defer close(done)
		settle("t2", perTenant)
		settle("t1", perTenant)
	}()
	run := func() (moved, left, steps int) {
		var cur store.BackfillCursor
		for {
			st, err := s.Retention().BackfillBodies(ctx, cur, 100, testRetention)
			if err != nil {
				t.Fatalf("BackfillBodies: %v", err)
			}
			if st.Done {
				return moved, left, steps
			}
			moved, left, steps = moved+st.Moved, left+st.Left, steps+1
			cur = st.Next
		}
	}
	moved1, left1, steps := run()
	<-done
	if steps != 2*perTenant/100 || moved1+left1 != 2*perTenant || moved1 < perTenant/2 {
		t.Fatalf("first run: %d steps, %d moved, %d left; want %d steps over %d envelopes, at least %d moved",
			steps, moved1, left1, 2*perTenant/100, 2*perTenant, perTenant/2)
	}
	moved2, left2, _ := run()
	if moved2 != left1 || left2 != 0 {
		t.Fatalf("second run: %d moved, %d left; want %d, 0", moved2, left2, left1)
	}
	if moved3, left3, _ := run(); moved3 != 0 || left3 != 0 {
		t.Fatalf("third run moved %d, left %d; want nothing", moved3, left3)
	}
	if n := f.count(`SELECT count(*) FROM outbound_envelopes WHERE envelope IS NOT NULL`); n != 0 {
		t.Fatalf("%d bodies left in the old column", n)
	}
	if n := f.count(`SELECT count(*) FROM outbound_bodies b JOIN outbox_messages m
		ON m.tenant_id = b.tenant_id AND m.event_identity = b.event_identity
		WHERE b.expires_at IS DISTINCT FROM m.delivered_at + $1::bigint * interval '1 microsecond'`,
		testRetention.Microseconds()); n != 0 {
		t.Fatalf("%d moved bodies do not expire at their settle plus the retention", n)
	}
	// The moved bodies are the ones the messages were sent with.
	for id, want := range bodies {
		var got []byte
		if err := f.admin.QueryRow(`SELECT b.envelope FROM outbound_bodies b JOIN outbox_messages m
			ON m.tenant_id = b.tenant_id AND m.event_identity = b.event_identity WHERE m.message_id = $1`, id).Scan(&got); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("body of %s after the move: %q, %v", id, got, err)
		}
	}
}

// Each role does its part of §8.9 through the store: the worker's settle
// fixes the expiry, the operator replays (an unmoved body counts as
// present; an expired one is refused), the janitor deletes.
func TestOutboundRetentionRolesCanDoTheirJob(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	open := func(role string) *store.Store { return f.retentionStore(storetest.DSNForRole(f.dsn, role), 2) }
	ingest, delivery, operator, janitor := open(roleIngest), open(roleDelivery), open(roleOperator), open(roleJanitor)
	f.addEndpoint("t1", "p1", "task.proposals")
	var ids []string
	for k := 0; k < 2; k++ {
		res, err := ingest.Outbox().Enqueue(ctx, actor("t1", "svc1"), out(fmt.Sprintf("k-%d", k), `{}`).request())
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.MessageIDs[0])
	}
	cs, err := delivery.Outbox().Claim(ctx, "t1", 10, time.Minute)
	if err != nil || len(cs) != 2 {
		t.Fatalf("claim: %d, %v", len(cs), err)
	}
	for _, c := range cs {
		// The settle records attempt 1, the row the janitor may delete.
		if err := delivery.Outbox().MarkDead(ctx, "t1", c.MessageID, c.Attempt, store.CodeHTTP4xx, false); err != nil {
			t.Fatal(err)
		}
	}
	// ids[0]'s body back in the old column: not moved yet.
	if _, err := f.admin.Exec(`UPDATE outbound_envelopes o SET envelope = b.envelope FROM outbound_bodies b, outbox_messages m
		WHERE m.message_id = $1 AND b.tenant_id = m.tenant_id AND b.event_identity = m.event_identity
		  AND o.tenant_id = b.tenant_id AND o.event_identity = b.event_identity`, ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := f.admin.Exec(`DELETE FROM outbound_bodies b USING outbox_messages m
		WHERE m.message_id = $1 AND b.tenant_id = m.tenant_id AND b.event_identity = m.event_identity`, ids[0]); err != nil {
		t.Fatal(err)
	}
	a, b := sweepOutbound(t, janitor, time.Now().Add(2*testRetention), 10)
	if a != 1 || b != 1 {
		t.Fatalf("janitor role deleted %d attempts, %d bodies; want 1, 1 (the unmoved body is not its to delete)", a, b)
	}
	if _, err := operator.Outbox().ReplayDeadLetter(ctx, actor("t1", "op1"), ids[0]); err != nil {
		t.Fatalf("operator replay of an unmoved body: %v", err)
	}
	_, err = operator.Outbox().ReplayDeadLetter(ctx, actor("t1", "op1"), ids[1])
	wantErr(t, "operator replay of an expired body", err, store.ErrPayloadExpired)
	_, err = ingest.Outbox().ReplayDeadLetter(ctx, actor("t1", "op1"), ids[1])
	wantErr(t, "ingest replay of an expired body", err, store.ErrPayloadExpired)
	if st, err := ingest.Outbox().OutboxMessage(ctx, "t1", ids[1]); err != nil || !st.PayloadExpired {
		t.Fatalf("ingest status: %+v, %v", st, err)
	}
	if st, err := ingest.Outbox().OutboxMessage(ctx, "t1", ids[0]); err != nil || st.PayloadExpired {
		t.Fatalf("ingest status of the unmoved body: %+v, %v", st, err)
	}
}
