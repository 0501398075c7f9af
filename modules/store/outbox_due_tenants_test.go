package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// dueTenants is DueTenants(MaxDueTenants), sorted.
func (f *fixture) dueTenants() []string {
	f.t.Helper()
	ts, err := f.s.Outbox().DueTenants(context.Background(), store.MaxDueTenants)
	if err != nil {
		f.t.Fatalf("DueTenants: %v", err)
	}
	slices.Sort(ts)
	return ts
}

// claimableTenants is what the old round computed, from the messages
// themselves: the tenants with a claimable message (pending or delivering,
// due, on an active endpoint), sorted.
func (f *fixture) claimableTenants() []string {
	f.t.Helper()
	rows, err := f.admin.Query(`SELECT DISTINCT m.tenant_id FROM outbox_messages m
JOIN endpoints e ON e.tenant_id = m.tenant_id AND e.endpoint_id = m.endpoint_id
WHERE m.status IN ('pending', 'delivering') AND m.next_attempt_at <= now() AND e.state = 'active'
ORDER BY 1`)
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			f.t.Fatal(err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		f.t.Fatal(err)
	}
	return out
}

// wantDue checks the round lists exactly want, and (when exact) that it
// lists no tenant without claimable work.
func (f *fixture) wantDue(step string, want ...string) {
	f.t.Helper()
	slices.Sort(want)
	if got := f.dueTenants(); !slices.Equal(got, want) {
		f.t.Fatalf("%s: due tenants %v, want %v", step, got, want)
	}
}

// Each transition that makes a message due sooner puts its tenant on the
// round's list, and a claim takes a tenant whose due work ran out off it:
// enqueue, claim, retry, lease expiry, dead and replay, endpoint disabled
// and enabled. Tenants whose messages are due tomorrow are never listed.
func TestDueTenantsFollowTransitions(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.wantDue("empty")
	ep := f.addEndpoint("t1", "p1", "task.proposals")
	f.addEndpoint("t2", "p1", "task.proposals")
	f.addEndpoint("idle", "p1", "task.proposals")
	for i := range 3 {
		f.enqueue(actor("t1", "svc1"), out(fmt.Sprintf("k%d", i), `{}`))
	}
	f.enqueue(actor("t2", "svc1"), out("k", `{}`))
	f.enqueue(actor("idle", "svc1"), out("k", `{}`))
	if _, err := f.admin.Exec(`UPDATE outbox_messages SET next_attempt_at = now() + interval '1 day' WHERE tenant_id = 'idle'`); err != nil {
		t.Fatal(err)
	}
	// The raise sets the exact value: enqueue made idle's row "now".
	f.claim("idle", store.MaxClaim)
	f.wantDue("enqueued", "t1", "t2")

	cs := f.claim("t1", 2)
	f.wantDue("t1 partly claimed", "t1", "t2")
	cs = append(cs, f.claim("t1", store.MaxClaim)...)
	if len(cs) != 3 {
		t.Fatalf("claimed %d of t1's 3", len(cs))
	}
	f.wantDue("t1 all claimed", "t2")
	var dueAt, lease time.Time
	if err := f.admin.QueryRow(`SELECT d.due_at, (SELECT min(lease_expires_at) FROM outbox_messages WHERE tenant_id = 't1')
FROM outbox_due_tenants d WHERE d.tenant_id = 't1'`).Scan(&dueAt, &lease); err != nil || !dueAt.Equal(lease) {
		t.Fatalf("t1's due_at %v, want the earliest lease expiry %v (%v)", dueAt, lease, err)
	}

	if err := f.s.Outbox().MarkRetry(ctx, "t1", cs[0].MessageID, cs[0].Attempt, time.Now(), store.CodeTimeout); err != nil {
		t.Fatal(err)
	}
	f.wantDue("retry due now", "t1", "t2")
	if got := f.claim("t1", store.MaxClaim); len(got) != 1 || got[0].MessageID != cs[0].MessageID {
		t.Fatalf("claim after retry: %+v", got)
	}
	f.wantDue("retry claimed", "t2")

	f.expireLease("t1", cs[1].MessageID)
	f.wantDue("lease expired", "t1", "t2")
	again := f.claim("t1", store.MaxClaim)
	if len(again) != 1 || again[0].MessageID != cs[1].MessageID {
		t.Fatalf("claim after lease expiry: %+v", again)
	}
	if err := f.s.Outbox().MarkDead(ctx, "t1", again[0].MessageID, again[0].Attempt, store.CodeTimeout, false); err != nil {
		t.Fatal(err)
	}
	if err := f.s.Outbox().MarkDelivered(ctx, "t1", cs[2].MessageID, cs[2].Attempt); err != nil {
		t.Fatal(err)
	}
	f.claim("t1", store.MaxClaim) // the raise: t1's first message is still leased
	f.wantDue("dead and delivered", "t2")
	if _, err := f.s.Outbox().ReplayDeadLetter(ctx, actor("t1", "op1"), again[0].MessageID); err != nil {
		t.Fatal(err)
	}
	f.wantDue("replayed", "t1", "t2")

	if err := f.s.Outbox().SetEndpointState(ctx, "t1", ep, store.EndpointDisabled, "operator"); err != nil {
		t.Fatal(err)
	}
	if got := f.claim("t1", store.MaxClaim); len(got) != 0 {
		t.Fatalf("claimed %d of a disabled endpoint", len(got))
	}
	f.wantDue("endpoint disabled", "t2")
	if err := f.s.Outbox().SetEndpointState(ctx, "t1", ep, store.EndpointActive, ""); err != nil {
		t.Fatal(err)
	}
	f.wantDue("endpoint enabled", "t1", "t2")
	if got := f.claim("t1", store.MaxClaim); len(got) != 1 || got[0].MessageID != again[0].MessageID {
		t.Fatalf("claim after enable: %+v", got)
	}
	for _, tn := range []string{"t1", "t2", "idle"} {
		for _, c := range f.claim(tn, store.MaxClaim) {
			if err := f.s.Outbox().MarkDelivered(ctx, tn, c.MessageID, c.Attempt); err != nil {
				t.Fatal(err)
			}
		}
	}
	f.claim("t2", store.MaxClaim)
	f.wantDue("drained")
	var infinite int
	if err := f.admin.QueryRow(`SELECT count(*) FROM outbox_due_tenants WHERE due_at = 'infinity'`).Scan(&infinite); err != nil || infinite != 1 {
		t.Fatalf("%d tenants with nothing pending, want t2 (%v)", infinite, err)
	}
}

// Many goroutines enqueue, claim, settle (delivered, retry due now, dead),
// let leases expire, replay and disable and enable endpoints at once, on a
// few tenants, with the real locks. Nothing is claimed twice under a live
// lease, and when they stop every tenant with claimable work is on the
// round's list; then a worker loop (round, claim, settle) drains everything.
func TestDueTenantsConcurrentTransitions(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Few messages a tenant, so a claim often takes all of its due work and
	// raises it past now: the moment a later retry, expiry or replay must
	// lower it again.
	var tenants []string
	for i := range 12 {
		tenants = append(tenants, fmt.Sprintf("c%d", i))
	}
	endpoints := map[string]string{}
	for _, tn := range tenants {
		endpoints[tn] = f.addEndpoint(tn, "p1", "task.proposals") // toggled
		if _, err := f.s.Outbox().AddEndpoint(context.Background(), store.Endpoint{TenantID: tn, ProjectID: "p1",
			Topic: "task.proposals", URL: "https://hooks.example.test/b", SecretRef: "sec-" + tn + "-b"}); err != nil {
			t.Fatal(err) // always active, so every enqueue has one
		}
	}
	var mu sync.Mutex
	held := map[string]bool{} // message id -> claimed, lease live, not settled
	var deadIDs []struct{ tenant, id string }
	var expirable []struct{ tenant, id string }
	var claims, seq, enqueued atomic.Int64
	errs := make(chan error, 64)
	fail := func(err error) {
		select {
		case errs <- err:
		default:
		}
		cancel()
	}
	var wg sync.WaitGroup
	// The enqueuers and the toggler stop half-way: from then on only
	// retries, lease expiries and replays put tenants back on the list, so a
	// lost one is not rescued by a later enqueue or enable.
	enqCtx, enqStop := context.WithTimeout(ctx, 2*time.Second)
	defer enqStop()
	run := func(name string, fn func(r *rand.Rand) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(len(name)), uint64(seq.Add(1))))
			for ctx.Err() == nil {
				if (strings.HasPrefix(name, "enqueuer") || name == "toggler") && enqCtx.Err() != nil {
					return
				}
				if err := fn(r); err != nil && ctx.Err() == nil {
					fail(fmt.Errorf("%s: %w", name, err))
					return
				}
			}
		}()
	}
	for i := range 3 {
		run(fmt.Sprint("enqueuer", i), func(r *rand.Rand) error {
			if enqueued.Add(1) > 36 { // three envelopes a tenant
				time.Sleep(time.Millisecond)
				return nil
			}
			tn := tenants[r.IntN(len(tenants))]
			o := out(fmt.Sprintf("k-%d", seq.Add(1)), `{}`)
			_, err := f.s.Outbox().Enqueue(enqCtx, actor(tn, "svc1"), o.request())
			return ignoreStop(enqCtx, err)
		})
	}
	for i := range 4 {
		run(fmt.Sprint("claimer", i), func(r *rand.Rand) error {
			ts, err := f.s.Outbox().DueTenants(ctx, 10)
			if err != nil || len(ts) == 0 {
				return err
			}
			tn := ts[r.IntN(len(ts))]
			cs, err := f.s.Outbox().Claim(ctx, tn, 1+r.IntN(5), 10*time.Minute)
			if err != nil {
				return err
			}
			claims.Add(int64(len(cs)))
			mu.Lock()
			for _, c := range cs {
				if held[c.MessageID] {
					mu.Unlock()
					return fmt.Errorf("message %s claimed again under a live lease", c.MessageID)
				}
				held[c.MessageID] = true
			}
			mu.Unlock()
			for _, c := range cs {
				k := r.IntN(10)
				if k >= 8 { // abandoned: the expirer lets its lease run out
					mu.Lock()
					expirable = append(expirable, struct{ tenant, id string }{tn, c.MessageID})
					mu.Unlock()
					continue
				}
				// Released before the settle, so a claim right after the
				// settle's commit is not taken for one under the lease.
				mu.Lock()
				delete(held, c.MessageID)
				mu.Unlock()
				var err error
				switch { // mostly back to pending, so the work goes on to the end
				case k < 2:
					err = f.s.Outbox().MarkDelivered(ctx, tn, c.MessageID, c.Attempt)
				case k < 6:
					err = f.s.Outbox().MarkRetry(ctx, tn, c.MessageID, c.Attempt, time.Now(), store.CodeTimeout)
				default: // k 6 and 7
					if err = f.s.Outbox().MarkDead(ctx, tn, c.MessageID, c.Attempt, store.CodeTimeout, false); err == nil {
						mu.Lock()
						deadIDs = append(deadIDs, struct{ tenant, id string }{tn, c.MessageID})
						mu.Unlock()
					}
				}
				if err != nil {
					return err
				}
			}
			return nil
		})
	}
	run("expirer", func(r *rand.Rand) error {
		mu.Lock()
		if len(expirable) == 0 {
			mu.Unlock()
			time.Sleep(time.Millisecond)
			return nil
		}
		m := expirable[0]
		expirable = expirable[1:]
		delete(held, m.id) // before the lease runs out: a claim can follow at once
		mu.Unlock()
		_, err := f.admin.ExecContext(ctx, `UPDATE outbox_messages
SET next_attempt_at = now() - interval '1 second', lease_expires_at = now() - interval '1 second'
WHERE tenant_id = $1 AND message_id = $2 AND status = 'delivering'`, m.tenant, m.id)
		return err
	})
	run("replayer", func(r *rand.Rand) error {
		mu.Lock()
		if len(deadIDs) == 0 {
			mu.Unlock()
			time.Sleep(time.Millisecond)
			return nil
		}
		m := deadIDs[0]
		deadIDs = deadIDs[1:]
		mu.Unlock()
		_, err := f.s.Outbox().ReplayDeadLetter(ctx, actor(m.tenant, "op1"), m.id)
		return err
	})
	run("toggler", func(r *rand.Rand) error {
		tn := tenants[r.IntN(len(tenants))]
		if err := f.s.Outbox().SetEndpointState(enqCtx, tn, endpoints[tn], store.EndpointDisabled, "operator"); err != nil {
			return ignoreStop(enqCtx, err)
		}
		time.Sleep(time.Duration(r.IntN(3)) * time.Millisecond)
		return ignoreStop(enqCtx, f.s.Outbox().SetEndpointState(enqCtx, tn, endpoints[tn], store.EndpointActive, ""))
	})
	select {
	case <-time.After(8 * time.Second):
	case <-ctx.Done():
	}
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d messages claimed", claims.Load())
	if claims.Load() < 100 {
		t.Fatalf("only %d claims in the run; the test needs traffic", claims.Load())
	}
	// Every tenant with claimable work is listed (a listed tenant without
	// any is allowed: its next claim finds nothing and raises it).
	want := f.claimableTenants()
	got := f.dueTenants()
	for _, tn := range want {
		if !slices.Contains(got, tn) {
			t.Fatalf("tenant %s has claimable messages but is not due (due %v, claimable %v)", tn, got, want)
		}
	}
	// A toggle the end cut short leaves an endpoint disabled: enabling it
	// puts its tenant back (the enable trigger).
	for _, tn := range tenants {
		if err := f.s.Outbox().SetEndpointState(context.Background(), tn, endpoints[tn], store.EndpointActive, ""); err != nil {
			t.Fatal(err)
		}
	}
	// Leases still held by abandoned claims run out, then a worker loop
	// drains everything through the round alone.
	if _, err := f.admin.Exec(`UPDATE outbox_messages SET next_attempt_at = now() - interval '1 second',
lease_expires_at = now() - interval '1 second' WHERE status = 'delivering'`); err != nil {
		t.Fatal(err)
	}
	bg := context.Background()
	for round := 0; ; round++ {
		ts, err := f.s.Outbox().DueTenants(bg, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(ts) == 0 {
			break
		}
		if round > 10000 {
			t.Fatalf("still %v due after %d rounds", ts, round)
		}
		for _, tn := range ts {
			cs, err := f.s.Outbox().Claim(bg, tn, store.MaxClaim, 10*time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cs {
				if err := f.s.Outbox().MarkDelivered(bg, tn, c.MessageID, c.Attempt); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if left := f.claimableTenants(); len(left) != 0 {
		t.Fatalf("the round is empty but %v have claimable messages", left)
	}
	if n := f.count(`SELECT count(*) FROM outbox_messages WHERE status IN ('pending', 'delivering')`); n != 0 {
		t.Fatalf("%d messages left pending or delivering", n)
	}
}

// ignoreStop drops the error of a call that ctx's end cut short.
func ignoreStop(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}
