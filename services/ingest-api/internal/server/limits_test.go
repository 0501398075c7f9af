package server

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/limiter"
	"github.com/envelopeworker/envelopeworker/modules/store"
)

func retryAfter(t testing.TB, r resp) int {
	t.Helper()
	n, err := strconv.Atoi(r.header.Get("Retry-After"))
	if err != nil || n < 1 {
		t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
	}
	return n
}

func TestSyncLimiter(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.SyncLimit = limiter.Policy{Tokens: 2, Interval: time.Hour} })
	other := f.issue(tenantA, "acct-1", "device-8", store.RoleDevice)
	wantAnswer(t, f.post(f.device, f.sign(draft(1))), 200, "accepted", "", 1)
	// A refusal after the limiter still spends a token.
	wantAnswer(t, f.post(f.device, []byte("{")), 400, "refused", "invalid_envelope", -1)
	r := f.post(f.device, f.sign(draft(2)))
	wantAnswer(t, r, 429, "refused", "rate_limited", -1)
	if n := retryAfter(t, r); n > 3600 {
		t.Fatalf("Retry-After %d beyond the interval", n)
	}
	// Another device of the same account is unaffected.
	d := draft(1)
	d.ProducerID, d.EventID, d.IdempotencyKey = "device-8", "evt-8-1", "idem-8-1"
	wantAnswer(t, f.post(other, f.sign(d)), 200, "accepted", "", 1)
	// The limiter runs before the role check and the body: a refused
	// request is not audited, whatever it carries.
	wantAnswer(t, f.post(f.device, []byte("{")), 429, "refused", "rate_limited", -1)
	if n := len(f.audit()); n != 3 {
		t.Fatalf("%d audit rows, want 3 (429 is not audited)", n)
	}
	// Stream reads are not sync-limited.
	if r := f.do(req{method: http.MethodGet, path: "/v1/streams/proj-1/device-7", token: f.device}); r.status != 200 {
		t.Fatalf("stream read while sync-limited: %d", r.status)
	}
}

func TestSyncLimiterBeforeForbidden(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.SyncLimit = limiter.Policy{Tokens: 1, Interval: time.Hour} })
	wantAnswer(t, f.post(f.service, f.sign(draft(1))), 403, "refused", "forbidden", -1)
	wantAnswer(t, f.post(f.service, f.sign(draft(1))), 429, "refused", "rate_limited", -1)
	if n := len(f.audit()); n != 1 {
		t.Fatalf("%d audit rows, want 1", n)
	}
}

func TestPeerLimiter(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.PeerLimit = limiter.Policy{Tokens: 2, Interval: time.Hour} })
	a1 := "198.51.100.1:1000"
	a2 := "198.51.100.1:2000" // same host, other port
	b := "198.51.100.2:1000"
	post := func(remote, token string) resp {
		return f.do(req{method: http.MethodPost, path: "/v1/envelopes", token: token, body: f.sign(draft(1)), remote: remote})
	}
	wantAnswer(t, post(a1, ""), 401, "refused", "unauthenticated", -1)
	wantAnswer(t, post(a2, f.device), 200, "accepted", "", 1)
	// Before authentication: a valid credential does not help.
	r := post(a1, f.device)
	wantAnswer(t, r, 429, "refused", "rate_limited", -1)
	retryAfter(t, r)
	wantAnswer(t, post(a2, ""), 429, "refused", "rate_limited", -1)
	// Read routes count too; health routes never.
	wantAnswer(t, f.do(req{method: http.MethodGet, path: "/v1/streams/proj-1/device-7", token: f.device, remote: a1}), 429, "refused", "rate_limited", -1)
	for _, p := range []string{"/healthz", "/readyz"} {
		for range 3 {
			if r := f.do(req{method: http.MethodGet, path: p, remote: a1}); r.status != 200 {
				t.Fatalf("%s from a limited peer: %d %s", p, r.status, r.body)
			}
		}
	}
	// Another address is unaffected.
	wantAnswer(t, post(b, f.device), 200, "duplicate", "", 1)
	// X-Forwarded-For cannot move a client to another bucket.
	r = f.do(req{method: http.MethodPost, path: "/v1/envelopes", token: f.device, body: f.sign(draft(1)), remote: a1,
		header: map[string]string{"X-Forwarded-For": "203.0.113.9", "X-Real-Ip": "203.0.113.9"}})
	wantAnswer(t, r, 429, "refused", "rate_limited", -1)
	if n := len(f.audit()); n != 2 {
		t.Fatalf("%d audit rows, want 2", n)
	}
}

func TestBatchLimiter(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.SyncLimit = limiter.Policy{Tokens: 3, Interval: time.Hour} })
	r := f.postBatch(f.device, f.sign(draft(1)), f.sign(draft(2)), f.sign(draft(3)), f.sign(draft(4)), f.sign(draft(5)))
	checkItems(t, decodeBatch(t, r), []itemWant{
		{200, "accepted", "", 1},
		{200, "accepted", "", 2},
		{200, "accepted", "", 3},
		{429, "refused", "rate_limited", 0},
		{429, "refused", "rate_limited", 0},
	})
	if n := len(f.audit()); n != 3 {
		t.Fatalf("%d audit rows, want 3 (rate-limited items are not audited)", n)
	}
	// The first item refused: the whole request is 429, nothing processed.
	r = f.postBatch(f.device, f.sign(draft(4)))
	wantAnswer(t, r, 429, "refused", "rate_limited", -1)
	retryAfter(t, r)
	r = f.do(req{method: http.MethodPost, path: "/v1/envelopes/batch", token: f.device, body: []byte("{")})
	wantAnswer(t, r, 429, "refused", "rate_limited", -1)
	if n := len(f.audit()); n != 3 {
		t.Fatalf("%d audit rows after whole-request 429s, want 3", n)
	}
}

func TestPeerLimiterBelievesOnlyTrustedProxies(t *testing.T) {
	proxies, err := limiter.ParseTrustedProxies("10.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, func(c *Config) {
		c.PeerLimit = limiter.Policy{Tokens: 1, Interval: time.Hour}
		c.TrustedProxies = proxies
	})
	read := func(remote, xff string) resp {
		r := req{method: http.MethodGet, path: "/v1/streams/proj-1/device-7", remote: remote}
		if xff != "" {
			r.header = map[string]string{"X-Forwarded-For": xff}
		}
		return f.do(r)
	}
	const proxy = "10.0.0.1:5000"
	// Through the trusted proxy, each client has its own bucket.
	wantAnswer(t, read(proxy, "203.0.113.1"), 401, "refused", "unauthenticated", -1)
	wantAnswer(t, read(proxy, "203.0.113.1"), 429, "refused", "rate_limited", -1)
	wantAnswer(t, read(proxy, "203.0.113.2"), 401, "refused", "unauthenticated", -1)
	// A chain through two trusted proxies; a client-written entry on the left changes nothing.
	wantAnswer(t, read("10.0.0.2:5000", "198.51.100.50, 203.0.113.2, 10.0.0.9"), 429, "refused", "rate_limited", -1)
	// IPv6 clients by /64.
	wantAnswer(t, read(proxy, "2001:db8:1:1::1"), 401, "refused", "unauthenticated", -1)
	wantAnswer(t, read(proxy, "2001:db8:1:1::ffff"), 429, "refused", "rate_limited", -1)
	wantAnswer(t, read(proxy, "2001:db8:1:2::1"), 401, "refused", "unauthenticated", -1)
	// Garbage from the proxy: the proxy's own bucket, never a new one per value.
	wantAnswer(t, read(proxy, "garbage-1"), 401, "refused", "unauthenticated", -1)
	wantAnswer(t, read(proxy, "garbage-2"), 429, "refused", "rate_limited", -1)
	wantAnswer(t, read(proxy, ""), 429, "refused", "rate_limited", -1)
	// From an untrusted peer the header is ignored: one bucket, whatever it claims.
	wantAnswer(t, read("198.51.100.9:1", "203.0.113.3"), 401, "refused", "unauthenticated", -1)
	wantAnswer(t, read("198.51.100.9:2", "203.0.113.4"), 429, "refused", "rate_limited", -1)
	// A client cannot borrow a trusted proxy's address either.
	wantAnswer(t, read("198.51.100.9:3", "203.0.113.5, 10.0.0.1"), 429, "refused", "rate_limited", -1)
}

func TestOutboxLimiter(t *testing.T) {
	o := newOutboxFixture(t, func(c *Config) { c.OutboxLimit = limiter.Policy{Tokens: 2, Interval: time.Hour} })
	o.enqueued(o.postOutbox(o.service, outboxBody("k-1", "")), http.StatusCreated, o.pub)
	// A refusal after the limiter still spends a token.
	wantRefusal(t, o.postOutbox(o.service, []byte("{")), 400, "invalid_request")
	r := o.postOutbox(o.service, outboxBody("k-2", ""))
	wantRefusal(t, r, 429, "rate_limited")
	// 2 an hour: the next token comes 30 minutes after the bucket emptied.
	if n := retryAfter(t, r); n != 1800 {
		t.Fatalf("Retry-After %d, want 1800", n)
	}
	// Nothing was stored for the refused request, and nothing is audited.
	if n := o.count(`SELECT count(*) FROM outbound_envelopes`); n != 1 {
		t.Fatalf("%d outbound envelopes, want 1", n)
	}
	if n := o.count(`SELECT count(*) FROM outbox_messages`); n != len(o.active) {
		t.Fatalf("%d outbox messages, want %d", n, len(o.active))
	}
	if n := len(o.audit()); n != 0 {
		t.Fatalf("%d audit rows, want none", n)
	}
	// Before the body: a repeat of a stored request is refused too.
	wantRefusal(t, o.postOutbox(o.service, outboxBody("k-1", "")), 429, "rate_limited")
	// Another service credential of the same account is unaffected, and so
	// is this credential's sync-ingest bucket (its envelope post reaches the
	// role check).
	svc2 := o.issue(tenantA, "acct-1", "svc-2", store.RoleService)
	o.enqueued(o.postOutbox(svc2, outboxBody("k-3", "")), http.StatusCreated, o.pub)
	wantAnswer(t, o.post(o.service, o.sign(draft(1))), 403, "refused", "forbidden", -1)
	if n := counterValue(t, o.reg, "envelopeworker_ingest_limiter_refusals_total", map[string]string{"policy": "outbox"}); n != 2 {
		t.Fatalf("limiter_refusals_total{policy=outbox} = %v, want 2", n)
	}
}

func TestOutboxLimiterBeforeForbidden(t *testing.T) {
	o := newOutboxFixture(t, func(c *Config) { c.OutboxLimit = limiter.Policy{Tokens: 1, Interval: time.Hour} })
	wantRefusal(t, o.postOutbox(o.device, outboxBody("k-1", "")), 403, "forbidden")
	wantRefusal(t, o.postOutbox(o.device, outboxBody("k-1", "")), 429, "rate_limited")
	if n := len(o.audit()); n != 0 {
		t.Fatalf("%d audit rows, want none", n)
	}
}

func TestOutboxLimiterDefaultsToTheSyncPolicyInItsOwnBuckets(t *testing.T) {
	o := newOutboxFixture(t, func(c *Config) { c.SyncLimit = limiter.Policy{Tokens: 1, Interval: time.Hour} })
	// The service credential spends its one sync-ingest token...
	wantAnswer(t, o.post(o.service, o.sign(draft(1))), 403, "refused", "forbidden", -1)
	wantAnswer(t, o.post(o.service, o.sign(draft(1))), 429, "refused", "rate_limited", -1)
	// ...and still has its one outbox-enqueue token, and no more.
	o.enqueued(o.postOutbox(o.service, outboxBody("k-1", "")), http.StatusCreated, o.pub)
	r := o.postOutbox(o.service, outboxBody("k-2", ""))
	wantRefusal(t, r, 429, "rate_limited")
	if n := retryAfter(t, r); n != 3600 {
		t.Fatalf("Retry-After %d, want 3600 (the sync policy, 1 an hour)", n)
	}
}

// TestLimiterFailureIsUnavailable: a limiter that cannot answer fails
// closed, 503 with nothing done, on each of the three policies.
func TestLimiterFailureIsUnavailable(t *testing.T) {
	o := newOutboxFixture(t)
	ctx := context.Background()
	if err := o.srv.outbox.Close(ctx); err != nil {
		t.Fatal(err)
	}
	wantRefusal(t, o.postOutbox(o.service, outboxBody("k-1", "")), 503, "unavailable")
	if n := o.count(`SELECT count(*) FROM outbound_envelopes`); n != 0 {
		t.Fatalf("%d outbound envelopes stored past a failed limiter", n)
	}
	if err := o.srv.sync.Close(ctx); err != nil {
		t.Fatal(err)
	}
	wantRefusal(t, o.post(o.device, o.sign(draft(1))), 503, "unavailable")
	if err := o.srv.peer.Close(ctx); err != nil {
		t.Fatal(err)
	}
	wantRefusal(t, o.get(o.device, "/v1/streams/proj-1/device-7"), 503, "unavailable")
	for _, op := range []string{"outbox_limiter", "sync_limiter", "peer_limiter"} {
		if n := counterValue(t, o.reg, "envelopeworker_ingest_store_errors_total", map[string]string{"operation": op}); n != 1 {
			t.Errorf("store_errors_total{operation=%q} = %v, want 1", op, n)
		}
	}
	if n := len(o.audit()); n != 0 {
		t.Fatalf("%d audit rows, want none", n)
	}
}
