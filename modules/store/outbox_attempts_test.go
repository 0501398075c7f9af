package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

func (f *fixture) attempts(tenant, id string) []store.Attempt {
	f.t.Helper()
	as, err := f.s.Outbox().OutboxAttempts(context.Background(), tenant, id)
	if err != nil {
		f.t.Fatalf("OutboxAttempts: %v", err)
	}
	return as
}

// Each settle records its attempt in its own statement, with the worker's
// timing and status; the result is where the attempt left the message.
func TestSettlesRecordTheirAttempts(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.fanOut("t1", 4, 4)
	f.addEndpoint("t1", "p1", "task.last")
	o := out("k-last", `{}`)
	o.maxAttempts, o.topic = 1, "task.last"
	last := f.enqueue(actor("t1", "svc1"), o).MessageIDs
	cs := f.claim("t1", 10)
	if len(last) != 1 || len(cs) != 5 {
		t.Fatalf("claimed %d", len(cs))
	}
	if as := f.attempts("t1", cs[0].MessageID); len(as) != 0 || as == nil {
		t.Fatalf("claimed, unsettled message has attempts %#v; want an empty list", as)
	}
	started := time.Now().Add(-1500 * time.Millisecond).UTC().Truncate(time.Microsecond)
	later := time.Now().Add(time.Hour)
	var plain []string
	for _, c := range cs {
		if c.MessageID != last[0] {
			plain = append(plain, c.MessageID)
		}
	}
	batch := []store.Settlement{
		{MessageID: plain[0], Attempt: 1, Outcome: store.SettleDelivered, StartedAt: started, Duration: 1234567 * time.Microsecond, HTTPStatus: 204},
		{MessageID: plain[1], Attempt: 1, Outcome: store.SettleRetry, Next: later, Code: store.CodeTimeout, StartedAt: started, Duration: 10 * time.Second},
		{MessageID: plain[2], Attempt: 1, Outcome: store.SettleDead, Code: store.CodeHTTP410, DisableEndpoint: true, StartedAt: started, Duration: 3 * time.Millisecond, HTTPStatus: 410},
		{MessageID: last[0], Attempt: 1, Outcome: store.SettleRetry, Next: later, Code: store.CodeHTTP5xx, StartedAt: started, Duration: 0, HTTPStatus: 503},
		{MessageID: plain[3], Attempt: 2, Outcome: store.SettleDelivered, StartedAt: started, HTTPStatus: 200}, // fenced
	}
	rs, err := f.s.Outbox().SettleBatch(ctx, "t1", batch)
	if err != nil || rs[0] != nil || rs[1] != nil || rs[2] != nil || rs[3] != nil || !errors.Is(rs[4], store.ErrFenced) {
		t.Fatalf("SettleBatch: %v, %v", rs, err)
	}
	want := map[string]store.Attempt{
		plain[0]: {Attempt: 1, StartedAt: started, Duration: 1234 * time.Millisecond, HTTPStatus: 204, Result: store.AttemptDelivered},
		plain[1]: {Attempt: 1, StartedAt: started, Duration: 10 * time.Second, ErrorCode: store.CodeTimeout, Result: store.AttemptRetry},
		plain[2]: {Attempt: 1, StartedAt: started, Duration: 3 * time.Millisecond, HTTPStatus: 410, ErrorCode: store.CodeHTTP410, Result: store.AttemptDead},
		// A retry on the last attempt of the budget left the message dead.
		last[0]: {Attempt: 1, StartedAt: started, HTTPStatus: 503, ErrorCode: store.CodeHTTP5xx, Result: store.AttemptDead},
	}
	for id, w := range want {
		as := f.attempts("t1", id)
		if len(as) != 1 || !as[0].StartedAt.Equal(w.StartedAt) {
			t.Fatalf("%s: attempts %+v, want [%+v]", id, as, w)
		}
		as[0].StartedAt = w.StartedAt
		if as[0] != w {
			t.Errorf("%s: attempt %+v, want %+v", id, as[0], w)
		}
	}
	if n := f.count(`SELECT count(*) FROM outbox_attempts WHERE message_id = $1`, plain[3]); n != 0 {
		t.Fatalf("a fenced settle recorded %d attempt rows", n)
	}

	// The single Mark* calls record the attempt with the database's timing:
	// from the claim to the settle.
	before := time.Now()
	if err := f.s.Outbox().MarkDelivered(ctx, "t1", plain[3], 1); err != nil {
		t.Fatal(err)
	}
	as := f.attempts("t1", plain[3])
	if len(as) != 1 || as[0].Result != store.AttemptDelivered || as[0].HTTPStatus != 0 || as[0].ErrorCode != "" ||
		as[0].StartedAt.After(before) || as[0].Duration < 0 || as[0].Duration > time.Minute {
		t.Fatalf("MarkDelivered's attempt: %+v", as)
	}
	if err := f.s.Outbox().MarkDelivered(ctx, "t1", plain[3], 1); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("second settle: %v", err)
	}
	if n := f.count(`SELECT count(*) FROM outbox_attempts WHERE message_id = $1`, plain[3]); n != 1 {
		t.Fatalf("%d rows after a fenced second settle", n)
	}

	for name, st := range map[string]store.Settlement{
		"status 99":         {MessageID: plain[0], Attempt: 1, Outcome: store.SettleDelivered, StartedAt: started, HTTPStatus: 99},
		"status 600":        {MessageID: plain[0], Attempt: 1, Outcome: store.SettleDelivered, StartedAt: started, HTTPStatus: 600},
		"negative duration": {MessageID: plain[0], Attempt: 1, Outcome: store.SettleDelivered, StartedAt: started, Duration: -time.Millisecond},
	} {
		_, err := f.s.Outbox().SettleBatch(ctx, "t1", []store.Settlement{st})
		wantErr(t, name, err, store.ErrInvalid)
	}
}

// An attempt whose lease ran out is recorded by the claim that finds it:
// lease_expired, started at the claim that leased it, lasting the lease. On
// the last attempt of the budget the same claim kills the message and
// records it too.
func TestLeaseExpiriesAreRecordedAttempts(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.addEndpoint("t1", "p1", "task.proposals")
	o := out("k-1", `{}`)
	o.maxAttempts = 2
	id := f.enqueue(actor("t1", "svc1"), o).MessageIDs[0]
	const lease = 90 * time.Second
	first, err := f.s.Outbox().Claim(ctx, "t1", 10, lease)
	if err != nil || len(first) != 1 {
		t.Fatalf("claim: %+v, %v", first, err)
	}
	var claimedAt time.Time
	if err := f.admin.QueryRow(`SELECT updated_at FROM outbox_messages WHERE message_id = $1`, id).Scan(&claimedAt); err != nil {
		t.Fatal(err)
	}
	// Due again as if the lease had run out, the lease itself untouched.
	if _, err := f.admin.Exec(`UPDATE outbox_messages SET next_attempt_at = now() - interval '1 second' WHERE message_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	second, err := f.s.Outbox().Claim(ctx, "t1", 10, lease)
	if err != nil || len(second) != 1 || second[0].Attempt != 2 {
		t.Fatalf("re-claim: %+v, %v", second, err)
	}
	as := f.attempts("t1", id)
	if len(as) != 1 || as[0] != (store.Attempt{Attempt: 1, StartedAt: as[0].StartedAt, Duration: lease, ErrorCode: store.CodeTimeout,
		Result: store.AttemptLeaseExpired}) || !as[0].StartedAt.Equal(claimedAt) {
		t.Fatalf("after the re-claim: %+v; want attempt 1 lease_expired from %v for %v", as, claimedAt, lease)
	}
	// A stale settle of attempt 1 records nothing more.
	if err := f.s.Outbox().MarkDelivered(ctx, "t1", id, 1); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("stale settle: %v", err)
	}
	f.expireLease("t1", id) // a lease cut short: recorded as lasting 0, never negative
	if cs := f.claim("t1", 10); len(cs) != 0 {
		t.Fatalf("claimed past max_attempts: %+v", cs)
	}
	as = f.attempts("t1", id)
	if len(as) != 2 || as[1].Attempt != 2 || as[1].Result != store.AttemptLeaseExpired || as[1].Duration != 0 ||
		as[1].ErrorCode != store.CodeTimeout || f.status("t1", id).Status != store.StatusDead {
		t.Fatalf("after the last lease expired: %+v, %+v", as, f.status("t1", id))
	}
	// A replay keeps the history and adds to it.
	if _, err := f.s.Outbox().ReplayDeadLetter(ctx, actor("t1", "op1"), id); err != nil {
		t.Fatal(err)
	}
	c := f.claim("t1", 10)
	if len(c) != 1 || c[0].Attempt != 3 {
		t.Fatalf("claim after replay: %+v", c)
	}
	if err := f.s.Outbox().MarkDead(ctx, "t1", id, 3, store.CodeHTTP4xx, false); err != nil {
		t.Fatal(err)
	}
	as = f.attempts("t1", id)
	if len(as) != 3 || as[2].Attempt != 3 || as[2].Result != store.AttemptDead || as[2].ErrorCode != store.CodeHTTP4xx {
		t.Fatalf("after the replay: %+v", as)
	}
}

// The read answers the latest MaxAttemptHistory attempts, oldest first, and
// tells no one about another tenant's message.
func TestOutboxAttemptsReadAndIsolation(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.addEndpoint("t1", "p1", "task.proposals")
	id := f.enqueue(actor("t1", "svc1"), out("k-1", `{}`)).MessageIDs[0]
	if as := f.attempts("t1", id); as == nil || len(as) != 0 {
		t.Fatalf("never attempted: %#v", as)
	}
	const n = store.MaxAttemptHistory + 30
	if _, err := f.admin.Exec(`INSERT INTO outbox_attempts (tenant_id, message_id, attempt, started_at, duration_ms, http_status, error_code, result)
		SELECT 't1', $1, a, now() - (200 - a) * interval '1 minute', a, 503, 'http_5xx', 'retry' FROM generate_series(1, $2::int) a`, id, n); err != nil {
		t.Fatal(err)
	}
	as := f.attempts("t1", id)
	if len(as) != store.MaxAttemptHistory || as[0].Attempt != n-store.MaxAttemptHistory+1 || as[len(as)-1].Attempt != n {
		t.Fatalf("%d attempts, %d..%d; want the latest %d, oldest first", len(as), as[0].Attempt, as[len(as)-1].Attempt, store.MaxAttemptHistory)
	}
	for i := 1; i < len(as); i++ {
		if as[i].Attempt != as[i-1].Attempt+1 || !as[i].StartedAt.After(as[i-1].StartedAt) {
			t.Fatalf("out of order at %d: %+v, %+v", i, as[i-1], as[i])
		}
	}
	for name, c := range map[string]struct{ tenant, id string }{
		"unknown": {"t1", "msg_000000000000000000000000"}, "other tenant": {"t2", id}, "malformed": {"t1", "1; drop"},
	} {
		_, err := f.s.Outbox().OutboxAttempts(ctx, c.tenant, c.id)
		wantErr(t, name, err, store.ErrNotFound)
	}
	_, err := f.s.Outbox().OutboxAttempts(ctx, "", id)
	wantErr(t, "bad tenant", err, store.ErrInvalid)
}
