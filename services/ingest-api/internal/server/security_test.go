package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/envelopeworker/envelopeworker/modules/limiter"
	"github.com/envelopeworker/envelopeworker/modules/store"
)

// counterValue reads one series of a counter or gauge (vector) from reg (0
// when the series does not exist yet).
func counterValue(t testing.TB, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue series
				}
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// randomToken is a well-formed credential nobody issued: it passes every
// format check, so only a database lookup could refuse it.
func randomToken(t testing.TB) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return store.TokenPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// TestBruteForceStoppedBeforeVerification: a client guessing tokens is
// stopped by the peer limiter before any credential is verified. The server
// runs over a database that cannot answer, so every request that reaches
// verification is a 503 counted in store_errors_total{operation=
// "verify_credential"}: that counter is the number of credential lookups.
// With a peer budget of 5, 1,000 guesses on every /v1/ route from one
// address (many ports) make exactly 5 lookups; the other 995 are 429 without
// one. Another address still reaches verification, so the counter is live.
func TestBruteForceStoppedBeforeVerification(t *testing.T) {
	const budget, attempts = 5, 1000
	f := newFixture(t)
	cfg := testConfig()
	cfg.PeerLimit = limiter.Policy{Tokens: budget, Interval: time.Hour}
	cfg.StoreTimeout = 5 * time.Second
	down, err := store.Open(context.Background(), "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2", store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { down.Close() })
	f.srv = f.newServer(cfg, down)

	routes := []struct{ method, path string }{
		{http.MethodPost, "/v1/envelopes"},
		{http.MethodPost, "/v1/envelopes/batch"},
		{http.MethodGet, "/v1/streams/proj-1/device-7"},
		{http.MethodGet, "/v1/streams/proj-1/device-7/envelopes"},
		{http.MethodPost, "/v1/outbox"},
		{http.MethodGet, "/v1/outbox/msg_000000000000000000000000"},
		{http.MethodGet, "/v1/dead-letters?project_id=proj-1"},
		{http.MethodPost, "/v1/dead-letters/msg_000000000000000000000000/replay"},
	}
	lookups := func() float64 {
		return counterValue(t, f.reg, "envelopeworker_ingest_store_errors_total", map[string]string{"operation": "verify_credential"})
	}
	statuses := map[int]int{}
	for i := range attempts {
		rt := routes[i%len(routes)]
		var body []byte
		if rt.method == http.MethodPost {
			body = []byte(`{}`)
		}
		r := f.do(req{method: rt.method, path: rt.path, token: randomToken(t), body: body,
			remote: fmt.Sprintf("198.51.100.7:%d", 1024+i)})
		statuses[r.status]++
		if i < budget && r.status != http.StatusServiceUnavailable {
			t.Fatalf("guess %d within the peer budget: %d %s, want 503 (it must reach verification)", i, r.status, r.body)
		}
		if i >= budget {
			wantRefusal(t, r, http.StatusTooManyRequests, string(reasonRateLimited))
			if r.header.Get("Retry-After") == "" {
				t.Fatal("429 without Retry-After")
			}
		}
	}
	if n := lookups(); n != budget {
		t.Fatalf("%v credential lookups for %d guesses, want %d (the peer budget)", n, attempts, budget)
	}
	if n := counterValue(t, f.reg, "envelopeworker_ingest_limiter_refusals_total", map[string]string{"policy": "peer"}); n != attempts-budget {
		t.Fatalf("%v peer refusals, want %d", n, attempts-budget)
	}
	// A different address is not affected and does reach verification.
	r := f.do(req{method: http.MethodGet, path: "/v1/streams/proj-1/device-7", token: randomToken(t), remote: "198.51.100.8:1"})
	if r.status != http.StatusServiceUnavailable || lookups() != budget+1 {
		t.Fatalf("other address: %d, %v lookups", r.status, lookups())
	}
	t.Logf("%d guesses from one address: %d reached verification, %d refused 429 before it", attempts, statuses[503], statuses[429])
}

// TestCredentialCacheHoldsNoToken: the cache in front of verification is
// keyed by SHA-256 of the token and holds the verified identity only, so the
// token is compared nowhere in ingest-api: the database finds the row by
// digest and the store compares digests in constant time (see the store's
// TestCredentialLookupDesign).
func TestCredentialCacheHoldsNoToken(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.CredentialCacheTTL = time.Second })
	if r := f.get(f.device, "/v1/streams/proj-1/device-7"); r.status != http.StatusOK {
		t.Fatalf("read: %d %s", r.status, r.body)
	}
	c := f.srv.creds
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) != 1 {
		t.Fatalf("%d cache entries, want 1", len(c.entries))
	}
	want := sha256.Sum256([]byte(f.device))
	for k, e := range c.entries {
		if k != want {
			t.Fatal("cache key is not SHA-256 of the token")
		}
		if s := fmt.Sprintf("%+v", e); strings.Contains(s, f.device) || strings.Contains(s, f.device[len(store.TokenPrefix):]) {
			t.Fatalf("cache entry holds the token: %s", s)
		}
	}
	// The entry type holds strings of the identity only: no field could
	// carry the token or its digest.
	for _, typ := range []reflect.Type{reflect.TypeFor[ttlEntry[store.Identity]](), reflect.TypeFor[store.Identity]()} {
		for i := range typ.NumField() {
			name := strings.ToLower(typ.Field(i).Name)
			if strings.Contains(name, "token") || strings.Contains(name, "digest") || strings.Contains(name, "secret") {
				t.Errorf("%s has a field %s", typ, typ.Field(i).Name)
			}
		}
	}
}

// TestRevocationWithinCacheTTL measures how long a revoked credential keeps
// working with the default cache TTL (1 s; CREDENTIAL_CACHE_TTL, at most 2 s)
// and holds the design's bound: every request that starts a full TTL after
// the revocation committed is 401, because the last cache entry was made
// before the revocation and lives exactly TTL.
func TestRevocationWithinCacheTTL(t *testing.T) {
	const ttl = time.Second
	f := newFixture(t, func(c *Config) { c.CredentialCacheTTL = ttl })
	tok, id, err := f.st.Credentials().IssueCredential(context.Background(), tenantA, "acct-1", "device-9", store.RoleDevice)
	if err != nil {
		t.Fatal(err)
	}
	const path = "/v1/streams/proj-1/device-9"
	if r := f.get(tok, path); r.status != http.StatusOK {
		t.Fatalf("before revocation: %d %s", r.status, r.body)
	}
	if err := f.st.Credentials().RevokeCredential(context.Background(), tenantA, id); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	var served int
	var delay time.Duration
	for {
		start := time.Now()
		r := f.get(tok, path)
		if r.status == http.StatusOK {
			if !start.Before(revoked.Add(ttl)) {
				t.Fatalf("revoked credential served %v after the revocation (TTL %v)", start.Sub(revoked), ttl)
			}
			served++
			time.Sleep(10 * time.Millisecond)
			continue
		}
		wantRefusal(t, r, http.StatusUnauthorized, string(reasonUnauthenticated))
		delay = time.Since(revoked)
		break
	}
	// Once refused, it stays refused: failures are never cached, and
	// nothing re-admits it.
	for range 5 {
		wantRefusal(t, f.get(tok, path), http.StatusUnauthorized, string(reasonUnauthenticated))
	}
	t.Logf("revoked credential served %d more times from the cache; first 401 after %v (TTL %v)", served, delay.Round(time.Millisecond), ttl)
}
