package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// fanOut registers n endpoints on (tenant, p1, task.proposals) and enqueues
// envelopes of them until there are at least total messages. Past
// MaxTopicEndpoints the endpoints go to further topics (task.proposals-1, …),
// which the enqueues take in turn.
func (f *fixture) fanOut(tenant string, endpoints, total int) []string {
	f.t.Helper()
	topics := []string{"task.proposals"}
	for i := 0; i < endpoints; i++ {
		if i > 0 && i%store.MaxTopicEndpoints == 0 {
			topics = append(topics, fmt.Sprintf("task.proposals-%d", len(topics)))
		}
		f.addEndpoint(tenant, "p1", topics[len(topics)-1])
	}
	var ids []string
	for k := 0; len(ids) < total; k++ {
		o := out(fmt.Sprintf("k-%d", k), `{}`)
		o.topic = topics[k%len(topics)]
		ids = append(ids, f.enqueue(actor(tenant, "svc1"), o).MessageIDs...)
	}
	return ids
}

func TestClaimBoundAndLease(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	ids := f.fanOut("t1", 150, 150)
	before := time.Now()
	first, err := f.s.Outbox().Claim(ctx, "t1", store.MaxClaim, 30*time.Second)
	if err != nil || len(first) != store.MaxClaim {
		t.Fatalf("first claim: %d messages, %v; want %d", len(first), err, store.MaxClaim)
	}
	for _, c := range first {
		if c.Attempt != 1 || c.MaxAttempts != 12 || c.TenantID != "t1" || c.URL == "" || c.SecretRef == "" ||
			len(c.EventIdentity) != 64 || len(c.Body) == 0 ||
			c.LeaseExpiresAt.Before(before.Add(20*time.Second)) || c.LeaseExpiresAt.After(before.Add(time.Minute)) {
			t.Fatalf("claimed %+v", c)
		}
		if m := f.status("t1", c.MessageID); m.Status != store.StatusDelivering || m.Attempts != 1 {
			t.Fatalf("claimed message reads %+v", m)
		}
	}
	if rest := f.claim("t1", store.MaxClaim); len(rest) != 50 {
		t.Fatalf("second claim: %d, want the remaining 50", len(rest))
	}
	if none := f.claim("t1", store.MaxClaim); len(none) != 0 {
		t.Fatalf("third claim: %d, want none while leased", len(none))
	}
	if n := f.count(`SELECT count(*) FROM outbox_messages WHERE attempts = 1 AND status = 'delivering'`); n != len(ids) {
		t.Fatalf("%d of %d messages claimed once", n, len(ids))
	}
	for name, c := range map[string]struct {
		tenant string
		max    int
		lease  time.Duration
	}{
		"max 0": {"t1", 0, time.Second}, "max 101": {"t1", 101, time.Second},
		"lease 0": {"t1", 1, 0}, "lease past bound": {"t1", 1, store.MaxLease + time.Second},
		"bad tenant": {"", 1, time.Second},
	} {
		_, err := f.s.Outbox().Claim(ctx, c.tenant, c.max, c.lease)
		wantErr(t, name, err, store.ErrInvalid)
	}
}

// Several claimers drain thousands of messages at once: SKIP LOCKED hands
// every message to exactly one of them for the lease.
func TestClaimSkipLockedConcurrentClaimers(t *testing.T) {
	f := newFixture(t)
	ids := f.fanOut("t1", 100, 3000)
	const claimers = 6
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	errs := make(chan error, claimers)
	for w := 0; w < claimers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				cs, err := f.s.Outbox().Claim(context.Background(), "t1", 37, 10*time.Minute)
				if err != nil {
					errs <- err
					return
				}
				if len(cs) == 0 {
					return
				}
				mu.Lock()
				for _, c := range cs {
					seen[c.MessageID]++
				}
				mu.Unlock()
				// Half the claimers settle as they go, like a worker.
				if w%2 == 0 {
					for _, c := range cs {
						if err := f.s.Outbox().MarkDelivered(context.Background(), "t1", c.MessageID, c.Attempt); err != nil {
							errs <- err
							return
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("claimer: %v", err)
	}
	if len(seen) != len(ids) {
		t.Fatalf("%d distinct messages claimed, want %d", len(seen), len(ids))
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("message %s claimed %d times in one lease", id, n)
		}
	}
	if n := f.count(`SELECT count(*) FROM outbox_messages WHERE attempts <> 1`); n != 0 {
		t.Fatalf("%d messages with an attempt counter other than 1", n)
	}
}

func TestClaimExpiredLeaseFencesStaleAttempt(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	ep := f.addEndpoint("t1", "p1", "task.proposals")
	id := f.enqueue(actor("t1", "svc1"), out("k-1", `{}`)).MessageIDs[0]
	stale := f.claim("t1", 10)
	if len(stale) != 1 || stale[0].Attempt != 1 {
		t.Fatalf("first claim %+v", stale)
	}
	f.expireLease("t1", id)
	fresh := f.claim("t1", 10)
	if len(fresh) != 1 || fresh[0].Attempt != 2 || !bytes.Equal(fresh[0].Body, stale[0].Body) {
		t.Fatalf("re-claim after expiry: %+v", fresh)
	}
	if n := f.count(`SELECT lease_expiries FROM outbox_messages WHERE message_id = $1`, id); n != 1 {
		t.Fatalf("lease expiries %d, want 1", n)
	}

	row := f.messageRow("t1", id)
	wantErr(t, "stale delivered", f.s.Outbox().MarkDelivered(ctx, "t1", id, 1), store.ErrFenced)
	wantErr(t, "stale retry", f.s.Outbox().MarkRetry(ctx, "t1", id, 1, time.Now(), store.CodeHTTP5xx), store.ErrFenced)
	wantErr(t, "stale dead", f.s.Outbox().MarkDead(ctx, "t1", id, 1, store.CodeHTTP410, true), store.ErrFenced)
	wantErr(t, "future attempt", f.s.Outbox().MarkDelivered(ctx, "t1", id, 3), store.ErrFenced)
	if got := f.messageRow("t1", id); got != row {
		t.Fatalf("fenced settles changed the row:\n%s\n%s", row, got)
	}
	if e, err := f.s.Outbox().GetEndpoint(ctx, "t1", ep); err != nil || e.State != store.EndpointActive {
		t.Fatalf("fenced 410 touched the endpoint: %+v, %v", e, err)
	}

	if err := f.s.Outbox().MarkDelivered(ctx, "t1", id, 2); err != nil {
		t.Fatalf("current attempt: %v", err)
	}
	m := f.status("t1", id)
	if m.Status != store.StatusDelivered || m.DeliveredAt == nil || m.NextAttemptAt != nil || m.Attempts != 2 {
		t.Fatalf("delivered: %+v", m)
	}
	wantErr(t, "settle twice", f.s.Outbox().MarkDelivered(ctx, "t1", id, 2), store.ErrFenced)
	wantErr(t, "unknown id", f.s.Outbox().MarkDelivered(ctx, "t1", "msg_000000000000000000000000", 1), store.ErrNotFound)
	wantErr(t, "other tenant", f.s.Outbox().MarkDelivered(ctx, "t2", id, 2), store.ErrNotFound)
	wantErr(t, "attempt 0", f.s.Outbox().MarkDelivered(ctx, "t1", id, 0), store.ErrInvalid)
	wantErr(t, "malformed id", f.s.Outbox().MarkDelivered(ctx, "t1", "1; drop", 1), store.ErrInvalid)
	wantErr(t, "free-text code", f.s.Outbox().MarkDead(ctx, "t1", id, 2, "HTTP 500: secret body", false), store.ErrInvalid)
	wantErr(t, "zero next", f.s.Outbox().MarkRetry(ctx, "t1", id, 2, time.Time{}, store.CodeTimeout), store.ErrInvalid)
}

func TestClaimRetryUntilDead(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.addEndpoint("t1", "p1", "task.proposals")
	o := out("k-1", `{}`)
	o.maxAttempts = 2
	id := f.enqueue(actor("t1", "svc1"), o).MessageIDs[0]

	c := f.claim("t1", 1)[0]
	later := time.Now().Add(time.Hour)
	if err := f.s.Outbox().MarkRetry(ctx, "t1", id, c.Attempt, later, store.CodeHTTP5xx); err != nil {
		t.Fatal(err)
	}
	m := f.status("t1", id)
	if m.Status != store.StatusPending || m.LastErrorCode != store.CodeHTTP5xx || m.NextAttemptAt == nil ||
		m.NextAttemptAt.Sub(later).Abs() > time.Millisecond {
		t.Fatalf("after retry: %+v", m)
	}
	if cs := f.claim("t1", 10); len(cs) != 0 {
		t.Fatalf("claimed %d messages before their retry time", len(cs))
	}
	if tenants, err := f.s.Outbox().DueTenants(ctx, 10); err != nil || len(tenants) != 0 {
		t.Fatalf("due tenants before the retry time: %v, %v", tenants, err)
	}
	if _, err := f.admin.Exec(`UPDATE outbox_messages SET next_attempt_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	c = f.claim("t1", 1)[0]
	if c.Attempt != 2 {
		t.Fatalf("second attempt %d", c.Attempt)
	}
	if err := f.s.Outbox().MarkRetry(ctx, "t1", id, c.Attempt, time.Now(), store.CodeTimeout); err != nil {
		t.Fatal(err)
	}
	m = f.status("t1", id)
	if m.Status != store.StatusDead || m.LastErrorCode != store.CodeTimeout || m.NextAttemptAt != nil || m.Attempts != 2 {
		t.Fatalf("retry past max: %+v, want dead", m)
	}
	if cs := f.claim("t1", 10); len(cs) != 0 {
		t.Fatal("a dead message was claimed")
	}
	dl, _, err := f.s.Outbox().ListDeadLetters(ctx, "t1", "p1", 10, "")
	if err != nil || len(dl) != 1 || dl[0].MessageID != id || dl[0].ErrorCode != store.CodeTimeout || dl[0].Attempts != 2 {
		t.Fatalf("dead letters %+v, %v", dl, err)
	}
}

func TestClaimGoneDisablesEndpoint(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	gone := f.addEndpoint("t1", "p1", "task.proposals")
	r1 := f.enqueue(actor("t1", "svc1"), out("k-1", `{}`))
	r2 := f.enqueue(actor("t1", "svc1"), out("k-2", `{}`))
	cs := f.claim("t1", 1)
	if len(cs) != 1 {
		t.Fatalf("claimed %d", len(cs))
	}
	if err := f.s.Outbox().MarkDead(ctx, "t1", cs[0].MessageID, cs[0].Attempt, store.CodeHTTP410, true); err != nil {
		t.Fatal(err)
	}
	e, err := f.s.Outbox().GetEndpoint(ctx, "t1", gone)
	if err != nil || e.State != store.EndpointDisabled || e.DisabledReason != store.CodeHTTP410 {
		t.Fatalf("endpoint after 410: %+v, %v", e, err)
	}
	if m := f.status("t1", cs[0].MessageID); m.Status != store.StatusDead || m.LastErrorCode != store.CodeHTTP410 {
		t.Fatalf("message after 410: %+v", m)
	}
	// The other message waits, and the topic has no active endpoint left.
	if more := f.claim("t1", 10); len(more) != 0 {
		t.Fatalf("claimed %d messages of a disabled endpoint", len(more))
	}
	if st, err := f.s.Outbox().OutboxStats(ctx); err != nil || st.Due != 0 {
		t.Fatalf("stats count a disabled endpoint's messages: %+v, %v", st, err)
	}
	_, err = f.s.Outbox().Enqueue(ctx, actor("t1", "svc1"), out("k-3", `{}`).request())
	wantErr(t, "enqueue to gone endpoint", err, store.ErrNoEndpoint)
	other := f.addEndpoint("t1", "p1", "task.proposals")
	r3 := f.enqueue(actor("t1", "svc1"), out("k-3", `{}`))
	if len(r3.MessageIDs) != 1 || f.status("t1", r3.MessageIDs[0]).EndpointID != other {
		t.Fatalf("enqueue after 410 went to %v", r3.MessageIDs)
	}

	if err := f.s.Outbox().SetEndpointState(ctx, "t1", gone, store.EndpointActive, ""); err != nil {
		t.Fatal(err)
	}
	if e, _ := f.s.Outbox().GetEndpoint(ctx, "t1", gone); e.State != store.EndpointActive || e.DisabledReason != "" {
		t.Fatalf("enabled endpoint: %+v", e)
	}
	pending := map[string]bool{r1.MessageIDs[0]: true, r2.MessageIDs[0]: true, r3.MessageIDs[0]: true}
	delete(pending, cs[0].MessageID)
	got := f.claim("t1", 10)
	if len(got) != 2 || !pending[got[0].MessageID] || !pending[got[1].MessageID] {
		t.Fatalf("after enabling claimed %+v, want %v", got, pending)
	}
}

func TestClaimDueTenantsAndStats(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if st, err := f.s.Outbox().OutboxStats(ctx); err != nil || st.Due != 0 || st.OldestDueAge != 0 {
		t.Fatalf("empty stats %+v, %v", st, err)
	}
	f.fanOut("t1", 2, 4)
	f.fanOut("t2", 1, 1)
	f.fanOut("t3", 1, 1)
	// t2 has waited longest, then t3, then t1.
	if _, err := f.admin.Exec(`UPDATE outbox_messages SET next_attempt_at = now() - CASE tenant_id
		WHEN 't2' THEN interval '3 minutes' WHEN 't3' THEN interval '2 minutes' ELSE interval '1 minute' END`); err != nil {
		t.Fatal(err)
	}
	got, err := f.s.Outbox().DueTenants(ctx, 10)
	if err != nil || fmt.Sprint(got) != "[t2 t3 t1]" {
		t.Fatalf("due tenants %v, %v; want [t2 t3 t1]", got, err)
	}
	if got, err := f.s.Outbox().DueTenants(ctx, 1); err != nil || fmt.Sprint(got) != "[t2]" {
		t.Fatalf("due tenants limit 1: %v, %v", got, err)
	}
	for _, bad := range []int{0, -1, store.MaxDueTenants + 1} {
		_, err := f.s.Outbox().DueTenants(ctx, bad)
		wantErr(t, fmt.Sprint("limit ", bad), err, store.ErrInvalid)
	}
	st, err := f.s.Outbox().OutboxStats(ctx)
	if err != nil || st.Due != 6 || st.OldestDueAge < 3*time.Minute || st.OldestDueAge > 4*time.Minute {
		t.Fatalf("stats %+v, %v; want 6 due, oldest about 3m", st, err)
	}
	f.claim("t2", 10)
	if st, err := f.s.Outbox().OutboxStats(ctx); err != nil || st.Due != 5 {
		t.Fatalf("stats after claim %+v, %v; want 5 due", st, err)
	}
}

func TestOutboxMessageStatusAndIsolation(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	ep := f.addEndpoint("t1", "p1", "task.proposals")
	id := f.enqueue(actor("t1", "svc1"), out("k-1", `{}`)).MessageIDs[0]
	m := f.status("t1", id)
	if m.MessageID != id || m.EndpointID != ep || m.Status != store.StatusPending {
		t.Fatalf("status %+v", m)
	}
	for name, err := range map[string]error{
		"status":              second(f.s.Outbox().OutboxMessage(ctx, "t2", id)),
		"endpoint":            second(f.s.Outbox().GetEndpoint(ctx, "t2", ep)),
		"state":               f.s.Outbox().SetEndpointState(ctx, "t2", ep, store.EndpointDisabled, "operator"),
		"replay":              second(f.s.Outbox().ReplayDeadLetter(ctx, actor("t2", "op"), id)),
		"settle":              f.s.Outbox().MarkDead(ctx, "t2", id, 1, store.CodeHTTP4xx, true),
		"malformed status id": second(f.s.Outbox().OutboxMessage(ctx, "t1", "../x")),
		"unknown status id":   second(f.s.Outbox().OutboxMessage(ctx, "t1", "msg_ffffffffffffffffffffffff")),
	} {
		wantErr(t, "other tenant "+name, err, store.ErrNotFound)
	}
	if cs := f.claim("t2", 10); len(cs) != 0 {
		t.Fatalf("t2 claimed t1's messages: %+v", cs)
	}
	f.killAll("t1", store.CodeHTTP4xx)
	if dl, next, err := f.s.Outbox().ListDeadLetters(ctx, "t2", "p1", 10, ""); err != nil || len(dl) != 0 || next != nil {
		t.Fatalf("t2 dead letters %+v, %v", dl, err)
	}
	if e, _ := f.s.Outbox().GetEndpoint(ctx, "t1", ep); e.State != store.EndpointActive {
		t.Fatal("another tenant disabled the endpoint")
	}
	_, err := f.s.Outbox().OutboxMessage(ctx, "", id)
	wantErr(t, "empty tenant", err, store.ErrInvalid)
}

func second[T any](_ T, err error) error { return err }

func TestClaimSettleBatch(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.fanOut("t1", 4, 4)
	cs := f.claim("t1", 10)
	if len(cs) != 4 {
		t.Fatalf("claimed %d", len(cs))
	}
	later := time.Now().Add(time.Hour)
	batch := []store.Settlement{
		{MessageID: cs[0].MessageID, Attempt: cs[0].Attempt, Outcome: store.SettleDelivered},
		{MessageID: cs[1].MessageID, Attempt: cs[1].Attempt, Outcome: store.SettleRetry, Next: later, Code: store.CodeHTTP429},
		{MessageID: cs[2].MessageID, Attempt: cs[2].Attempt, Outcome: store.SettleDead, Code: store.CodeHTTP410, DisableEndpoint: true},
		{MessageID: cs[3].MessageID, Attempt: cs[3].Attempt + 1, Outcome: store.SettleDelivered},
		{MessageID: "msg_000000000000000000000000", Attempt: 1, Outcome: store.SettleDelivered},
		{MessageID: cs[0].MessageID, Attempt: cs[0].Attempt, Outcome: store.SettleDelivered},
	}

	invalid := map[string]func(*store.Settlement){
		"attempt 0":          func(s *store.Settlement) { s.Attempt = 0 },
		"bad id":             func(s *store.Settlement) { s.MessageID = "m1" },
		"unknown outcome":    func(s *store.Settlement) { s.Outcome = "gone" },
		"retry without next": func(s *store.Settlement) { s.Outcome, s.Code = store.SettleRetry, store.CodeTimeout },
		"retry with disable": func(s *store.Settlement) {
			s.Outcome, s.Code, s.Next, s.DisableEndpoint = store.SettleRetry, store.CodeTimeout, later, true
		},
		"dead free text":   func(s *store.Settlement) { s.Outcome, s.Code = store.SettleDead, "500 Internal" },
		"delivered + code": func(s *store.Settlement) { s.Code = store.CodeTimeout },
		"dead with next":   func(s *store.Settlement) { s.Outcome, s.Code, s.Next = store.SettleDead, store.CodeHTTP4xx, later },
	}
	before := f.messageRow("t1", cs[0].MessageID)
	for name, mutate := range invalid {
		bad := append([]store.Settlement(nil), batch...)
		mutate(&bad[0])
		_, err := f.s.Outbox().SettleBatch(ctx, "t1", bad)
		wantErr(t, name, err, store.ErrInvalid)
	}
	_, err := f.s.Outbox().SettleBatch(ctx, "t1", make([]store.Settlement, store.MaxSettleBatch+1))
	wantErr(t, "oversized batch", err, store.ErrInvalid)
	if f.messageRow("t1", cs[0].MessageID) != before {
		t.Fatal("a refused batch was applied")
	}

	results, err := f.s.Outbox().SettleBatch(ctx, "t1", batch)
	if err != nil || len(results) != len(batch) {
		t.Fatalf("SettleBatch: %v, %v", results, err)
	}
	for i, want := range []error{nil, nil, nil, store.ErrFenced, store.ErrNotFound, store.ErrFenced} {
		if (want == nil && results[i] != nil) || (want != nil && !errors.Is(results[i], want)) {
			t.Fatalf("settlement %d: %v, want %v", i, results[i], want)
		}
	}
	if m := f.status("t1", cs[0].MessageID); m.Status != store.StatusDelivered {
		t.Fatalf("delivered: %+v", m)
	}
	if m := f.status("t1", cs[1].MessageID); m.Status != store.StatusPending || m.LastErrorCode != store.CodeHTTP429 {
		t.Fatalf("retry: %+v", m)
	}
	if m := f.status("t1", cs[2].MessageID); m.Status != store.StatusDead || m.LastErrorCode != store.CodeHTTP410 {
		t.Fatalf("dead: %+v", m)
	}
	if e, _ := f.s.Outbox().GetEndpoint(ctx, "t1", f.status("t1", cs[2].MessageID).EndpointID); e.State != store.EndpointDisabled {
		t.Fatalf("410 in a batch did not disable the endpoint: %+v", e)
	}
	if m := f.status("t1", cs[3].MessageID); m.Status != store.StatusDelivering {
		t.Fatalf("fenced settlement changed the message: %+v", m)
	}
	if rs, err := f.s.Outbox().SettleBatch(ctx, "t2", batch[:1]); err != nil || !errors.Is(rs[0], store.ErrNotFound) {
		t.Fatalf("other tenant's settle: %v, %v", rs, err)
	}
	if rs, err := f.s.Outbox().SettleBatch(ctx, "t1", nil); err != nil || len(rs) != 0 {
		t.Fatalf("empty batch: %v, %v", rs, err)
	}
}

// A worker killed on a message's last allowed attempt must not make it run
// past max_attempts: when that lease expires the message is dead (timeout),
// listed as a dead letter, and a replay gives it a fresh budget.
func TestLeaseExpiredOnLastAttemptGoesDead(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.addEndpoint("t1", "p1", "task.proposals")
	o := out("k-last", `{}`)
	o.maxAttempts = 2
	id := f.enqueue(actor("t1", "svc1"), o).MessageIDs[0]
	for attempt := 1; attempt <= 2; attempt++ {
		c := f.claim("t1", 10)
		if len(c) != 1 || c[0].Attempt != attempt {
			t.Fatalf("claim %d: %+v", attempt, c)
		}
		f.expireLease("t1", id) // the worker died mid-attempt
	}
	if c := f.claim("t1", 10); len(c) != 0 {
		t.Fatalf("claimed past max_attempts: %+v", c)
	}
	m := f.status("t1", id)
	if m.Status != store.StatusDead || m.Attempts != 2 || m.LastErrorCode != "timeout" || m.NextAttemptAt != nil {
		t.Fatalf("status %+v, want dead after 2 attempts with timeout", m)
	}
	if n := f.count(`SELECT lease_expiries FROM outbox_messages WHERE message_id = $1`, id); n != 2 {
		t.Fatalf("lease expiries %d, want 2", n)
	}
	dl, _, err := f.s.Outbox().ListDeadLetters(ctx, "t1", "p1", 10, "")
	if err != nil || len(dl) != 1 || dl[0].MessageID != id || dl[0].ErrorCode != "timeout" {
		t.Fatalf("dead letters %+v, %v", dl, err)
	}
	if _, err := f.s.Outbox().ReplayDeadLetter(ctx, actor("t1", "op1"), id); err != nil {
		t.Fatal(err)
	}
	if c := f.claim("t1", 10); len(c) != 1 || c[0].Attempt != 3 {
		t.Fatalf("claim after replay: %+v", c)
	}
}

// A set-based settle fences each row on its own: in one batch of live and
// fenced settles (their leases expired and the messages were claimed again)
// exactly the live ones change their message, write their attempt row and
// raise their body's expiry; the fenced ones change nothing, not even the
// endpoint a fenced 410 names. Sent again, the whole batch is fenced.
func TestSettleBatchSettlesExactlyTheLiveRows(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	ids := f.fanOut("t1", 1, 8)
	if cs := f.claim("t1", 10); len(cs) != 8 {
		t.Fatalf("claimed %d of 8", len(cs))
	}
	live, fenced := []string{ids[0], ids[2], ids[4], ids[6]}, []string{ids[1], ids[3], ids[5], ids[7]}
	for _, id := range fenced {
		f.expireLease("t1", id)
	}
	if cs := f.claim("t1", 10); len(cs) != 4 || cs[0].Attempt != 2 {
		t.Fatalf("re-claim of the expired four: %+v", cs)
	}
	before := map[string]string{}
	for _, id := range fenced {
		before[id] = f.messageRow("t1", id)
	}
	started := time.Now().Add(-time.Second).UTC().Truncate(time.Microsecond)
	later := time.Now().Add(time.Hour)
	settle := func(id string, o store.SettleOutcome) store.Settlement {
		st := store.Settlement{MessageID: id, Attempt: 1, Outcome: o, StartedAt: started, Duration: 5 * time.Millisecond,
			HTTPStatus: 204}
		switch o {
		case store.SettleRetry:
			st.Next, st.Code, st.HTTPStatus = later, store.CodeHTTP5xx, 503
		case store.SettleDead:
			st.Code, st.HTTPStatus = store.CodeHTTP4xx, 404
		}
		return st
	}
	gone := settle(fenced[1], store.SettleDead)
	gone.Code, gone.HTTPStatus, gone.DisableEndpoint = store.CodeHTTP410, 410, true
	batch := []store.Settlement{
		settle(live[0], store.SettleDelivered), settle(fenced[0], store.SettleDelivered),
		settle(live[1], store.SettleRetry), gone,
		settle(live[2], store.SettleDead), settle(fenced[2], store.SettleRetry),
		settle(live[3], store.SettleDelivered), settle(fenced[3], store.SettleDelivered),
	}
	rs, err := f.s.Outbox().SettleBatch(ctx, "t1", batch)
	if err != nil || len(rs) != len(batch) {
		t.Fatalf("SettleBatch: %v, %v", rs, err)
	}
	for i, r := range rs {
		if i%2 == 0 && r != nil {
			t.Errorf("live settle %d: %v", i, r)
		}
		if i%2 == 1 && !errors.Is(r, store.ErrFenced) {
			t.Errorf("fenced settle %d: %v, want ErrFenced", i, r)
		}
	}
	for id, want := range map[string]struct {
		status, code string
		result       store.AttemptResult
		expiry       bool
	}{
		live[0]: {store.StatusDelivered, "", store.AttemptDelivered, true},
		live[1]: {store.StatusPending, store.CodeHTTP5xx, store.AttemptRetry, false},
		live[2]: {store.StatusDead, store.CodeHTTP4xx, store.AttemptDead, true},
		live[3]: {store.StatusDelivered, "", store.AttemptDelivered, true},
	} {
		m := f.status("t1", id)
		if m.Status != want.status || m.LastErrorCode != want.code || m.Attempts != 1 {
			t.Errorf("live %s: %+v, want %s %q", id, m, want.status, want.code)
		}
		if as := f.attempts("t1", id); len(as) != 1 || as[0].Attempt != 1 || as[0].Result != want.result ||
			!as[0].StartedAt.Equal(started) || as[0].Duration != 5*time.Millisecond {
			t.Errorf("live %s attempts: %+v, want one %s", id, as, want.result)
		}
		if at, ok := f.bodyExpiry("t1", id); !ok || (at != nil) != want.expiry {
			t.Errorf("live %s body expiry %v (body there: %v), want set: %v", id, at, ok, want.expiry)
		}
	}
	for _, id := range fenced {
		if got := f.messageRow("t1", id); got != before[id] {
			t.Errorf("fenced %s changed:\n%s\n%s", id, before[id], got)
		}
		if as := f.attempts("t1", id); len(as) != 1 || as[0].Result != store.AttemptLeaseExpired {
			t.Errorf("fenced %s attempts: %+v, want only the expired lease", id, as)
		}
		if at, _ := f.bodyExpiry("t1", id); at != nil {
			t.Errorf("fenced %s raised its body's expiry to %v", id, at)
		}
	}
	if e, err := f.s.Outbox().GetEndpoint(ctx, "t1", f.status("t1", fenced[1]).EndpointID); err != nil ||
		e.State != store.EndpointActive {
		t.Fatalf("a fenced 410 disabled the endpoint: %+v, %v", e, err)
	}
	history := f.count(`SELECT count(*) FROM outbox_attempts WHERE tenant_id = 't1'`)
	rs, err = f.s.Outbox().SettleBatch(ctx, "t1", batch)
	if err != nil {
		t.Fatalf("SettleBatch again: %v", err)
	}
	for i, r := range rs {
		if !errors.Is(r, store.ErrFenced) {
			t.Errorf("settle %d sent again: %v, want ErrFenced", i, r)
		}
	}
	if n := f.count(`SELECT count(*) FROM outbox_attempts WHERE tenant_id = 't1'`); n != history {
		t.Fatalf("a fenced batch wrote %d attempt rows", n-history)
	}
}

// The claim's transaction runs on generic plans only while outbox_messages
// has statistics of store.ClaimGenericMinRows rows (claimPlanModeSQL):
// before, a generic plan made for a table the planner takes for empty
// would be kept as it grows; after the table is emptied and vacuumed, the
// same again. The statistics are what pg_class says; here they are written
// there as an ANALYZE of that many rows would, on the partitions too on the
// partitioned layout.
func TestClaimRunsOnGenericPlansWithStatistics(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	mode := func() string {
		t.Helper()
		m, err := store.ClaimPlanMode(ctx, f.admin)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	setRows := func(n int) {
		t.Helper()
		if _, err := f.admin.Exec(`UPDATE pg_class SET reltuples = $1 WHERE oid = 'outbox_messages'::regclass
   OR oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'outbox_messages'::regclass)`, n); err != nil {
			t.Fatal(err)
		}
	}
	f.fanOut("t1", 1, 6)
	if got := mode(); got != "auto" {
		t.Fatalf("never analyzed: %s, want auto", got)
	}
	if _, err := f.admin.Exec(`ANALYZE outbox_messages`); err != nil {
		t.Fatal(err)
	}
	if got := mode(); got != "auto" {
		t.Fatalf("6 rows analyzed: %s, want auto", got)
	}
	setRows(store.ClaimGenericMinRows)
	if got := mode(); got != "force_generic_plan" {
		t.Fatalf("statistics of %d rows: %s, want force_generic_plan", store.ClaimGenericMinRows, got)
	}
	// On generic plans the claim still takes exactly what is due.
	if got := f.claim("t1", 4); len(got) != 4 {
		t.Fatalf("claimed %d on generic plans, want 4", len(got))
	}
	if got := f.claim("t1", store.MaxClaim); len(got) != 2 {
		t.Fatalf("claimed %d on generic plans, want the 2 left", len(got))
	}
	if n := f.count(`SELECT count(*) FROM outbox_messages WHERE status = 'delivering' AND attempts = 1`); n != 6 {
		t.Fatalf("%d of 6 messages claimed once", n)
	}
	setRows(0)
	if got := mode(); got != "auto" {
		t.Fatalf("emptied and vacuumed: %s, want auto", got)
	}
	// The mode is the claim transaction's own: the session keeps its own.
	var session string
	if err := f.admin.QueryRow(`SELECT current_setting('plan_cache_mode')`).Scan(&session); err != nil || session != "auto" {
		t.Fatalf("session plan_cache_mode %q, %v; want auto", session, err)
	}
}

// A settle waiting for a message that another transaction is changing
// without touching its fence (here a hand edit of max_attempts) applies once
// that transaction commits: the batch's own statement cannot see the new
// version (it committed after the statement's snapshot), so settleSet
// sends the settle again, and it is neither lost nor reported fenced.
func TestSettleAppliesAfterAConcurrentEditOfTheMessage(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.fanOut("t1", 1, 2)
	claimed := f.claim("t1", 2)
	if len(claimed) != 2 {
		t.Fatalf("claimed %d, want 2", len(claimed))
	}
	edited, other := claimed[0], claimed[1]
	tx, err := f.admin.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // committed below
	if _, err := tx.Exec(`UPDATE outbox_messages SET max_attempts = max_attempts + 1 WHERE tenant_id = 't1' AND message_id = $1`,
		edited.MessageID); err != nil {
		t.Fatal(err)
	}
	done := make(chan []error, 1)
	go func() {
		rs, err := f.s.Outbox().SettleBatch(ctx, "t1", []store.Settlement{
			{MessageID: edited.MessageID, Attempt: edited.Attempt, Outcome: store.SettleDelivered},
			{MessageID: other.MessageID, Attempt: other.Attempt, Outcome: store.SettleDelivered},
		})
		done <- append(rs, err)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for f.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the settle never waited for the edited message")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for i, err := range <-done {
		if err != nil {
			t.Errorf("result %d: %v", i, err)
		}
	}
	for _, c := range claimed {
		if st := f.status("t1", c.MessageID); st.Status != store.StatusDelivered {
			t.Errorf("%s: %s, want delivered", c.MessageID, st.Status)
		}
	}
	if n := f.count(`SELECT count(*) FROM outbox_attempts WHERE tenant_id = 't1' AND result = 'delivered'`); n != 2 {
		t.Errorf("%d delivered attempt rows, want 2", n)
	}
}
