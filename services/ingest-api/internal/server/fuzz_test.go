package server

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/limiter"
	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
)

// FuzzHTTP drives the API's handler in process, against a real database,
// with fuzzed bodies, headers, paths and queries on the envelope routes and
// the stream read routes, and checks what the contract promises of every
// answer: never a 5xx (nothing here makes the database fail), every answer
// JSON of the route's shape, every refusal a reason from the closed set with
// the status the contract gives it, and a repeated request answered the same
// way (a refusal again, an accept as a duplicate).
//
// mode picks the request:
//
//	bits 0-2  route: 0 POST /v1/envelopes, 1 POST /v1/envelopes/batch,
//	          2 the same two with body re-signed (see resign), 4 GET
//	          /v1/streams/{path}/envelopes?{query}, 5 GET /v1/streams/{path},
//	          6 any method on /v1/{path}, 7 POST /v1/envelopes with a made-up
//	          bearer token (idem)
//	bit 3     send Idempotency-Key: idem
//	bits 4-5  credential: the route's own, or device, service, operator
//	bit 6     hide the body length (chunked)
//	bit 7     send the request twice and compare the answers
//
// Per execution the database work is one credential lookup at most (the
// credential cache holds the fixture's tokens) and the audit or ingest
// transaction of the answer, so 30,000 executions take about a minute.
func FuzzHTTP(f *testing.F) {
	for _, s := range httpSeeds(f) {
		f.Add(s.mode, s.path, s.query, s.idem, s.body)
	}
	fx := newFixture(f)
	ctx := context.Background()
	// A retired and a revoked key with the fixture's public key, so re-signed
	// bodies reach steps 3's other branches too.
	pub := fx.priv.Public().(ed25519.PublicKey)
	for _, k := range []string{"k-retired", "k-revoked"} {
		if err := fx.st.Credentials().AddKey(ctx, tenantA, k, pub); err != nil {
			f.Fatal(err)
		}
	}
	if err := fx.st.Credentials().RetireKey(ctx, tenantA, "k-retired"); err != nil {
		f.Fatal(err)
	}
	if err := fx.st.Credentials().RevokeKey(ctx, tenantA, "k-revoked"); err != nil {
		f.Fatal(err)
	}
	// A server of its own over the fixture's database: the credential cache
	// on, the limiters out of the way, and logs discarded (the fixture keeps
	// every line in memory, which a ten-minute run would fill).
	cfg := testConfig()
	cfg.CredentialCacheTTL = 2 * time.Second
	cfg.SyncLimit = limiter.Policy{Tokens: limiter.MaxTokens, Interval: time.Second}
	cfg.PeerLimit = limiter.Policy{Tokens: limiter.MaxTokens, Interval: time.Second}
	srv, err := New(cfg, fx.st, slog.New(slog.DiscardHandler), NewRegistry())
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		if err := srv.Close(context.Background()); err != nil {
			f.Errorf("server Close: %v", err)
		}
	})
	h := srv.Handler()

	f.Fuzz(func(t *testing.T, mode uint8, path, query, idem string, body []byte) {
		route := mode & 7
		r := fuzzRequest{header: http.Header{}, chunked: mode&64 != 0}
		token := ""
		switch route {
		case 0, 1, 2, 3:
			r.method, r.path, r.kind = http.MethodPost, "/v1/envelopes", kindAnswer
			if route&1 == 1 {
				r.path, r.kind = "/v1/envelopes/batch", kindBatch
			}
			r.body, token = body, fx.device
			if route >= 2 {
				r.body = resign(fx.priv, body, route == 3)
			}
		case 4:
			r.method, r.path, r.query, r.kind = http.MethodGet, "/v1/streams/"+streamPath(path)+"/envelopes", query, kindPage
			token = fx.service
		case 5:
			r.method, r.path, r.kind = http.MethodGet, "/v1/streams/"+streamPath(path), kindState
			token = fx.device
		case 6:
			m, p, _ := strings.Cut(path, " ")
			r.method, r.path, r.query, r.body, r.kind = httpMethod(m), "/v1/"+p, query, body, kindAny
			token = fx.operator
		case 7:
			r.method, r.path, r.body, r.kind = http.MethodPost, "/v1/envelopes", body, kindAnswer
			token = idem
		}
		switch (mode >> 4) & 3 {
		case 1:
			token = fx.device
		case 2:
			token = fx.service
		case 3:
			token = fx.operator
		}
		if token != "" {
			r.header.Set("Authorization", "Bearer "+token)
		}
		if mode&8 != 0 && route != 7 {
			r.header.Set("Idempotency-Key", idem)
		}

		first := r.serve(h)
		first.check(t, r.kind, fx.device, fx.service, fx.operator)
		if mode&128 == 0 || r.method != http.MethodPost {
			return
		}
		second := r.serve(h)
		second.check(t, r.kind, fx.device, fx.service, fx.operator)
		sameAnswer(t, r.kind, first, second)
	})
}

type answerKind int

const (
	kindAnswer answerKind = iota // the envelope answer (or a refusal)
	kindBatch                    // 200 {"results":[...]} or a refusal
	kindPage                     // 200 stream page or a refusal
	kindState                    // 200 stream state or a refusal
	kindAny                      // whatever route it matched: one of the above shapes
)

type fuzzRequest struct {
	method, path, query string
	header              http.Header
	body                []byte
	chunked             bool
	kind                answerKind
}

type fuzzAnswer struct {
	status int
	header http.Header
	body   []byte
}

// serve runs r through h without httptest.NewRequest, which panics on a
// target it cannot parse: the fuzzed path and query go into the URL as they
// are, as a client that sends raw bytes would have them.
func (r fuzzRequest) serve(h http.Handler) fuzzAnswer {
	hr := httptest.NewRequest(http.MethodGet, "/", nil)
	hr.Method = r.method
	hr.URL.Path, hr.URL.RawPath, hr.URL.RawQuery = r.path, "", r.query
	hr.RequestURI = r.path
	hr.RemoteAddr = clientIP + ":40000"
	hr.Header = r.header.Clone()
	if r.body != nil {
		hr.Header.Set("Content-Type", "application/json")
		if r.chunked {
			hr.Body, hr.ContentLength = io.NopCloser(io.MultiReader(bytes.NewReader(r.body))), -1
		} else {
			hr.Body, hr.ContentLength = io.NopCloser(bytes.NewReader(r.body)), int64(len(r.body))
		}
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, hr)
	return fuzzAnswer{status: w.Code, header: w.Header(), body: w.Body.Bytes()}
}

// contractStatus is contract §2's table plus the reasons of the other routes
// this target reaches (§2 stream reads, §7.12, the API's 404 and 405); a
// reason not listed here is a failure. unavailable is not listed: nothing in
// this target makes the database fail.
var contractStatus = map[string]int{
	"invalid_envelope": 400, "invalid_metadata": 400, "unsupported_schema": 400,
	"idempotency_key_mismatch": 400, "issued_in_future": 400, "expired": 400,
	"invalid_request": 400, "invalid_page": 400,
	"unauthenticated": 401,
	"route_mismatch":  403, "unknown_key": 403, "key_retired": 403, "key_revoked": 403, "bad_signature": 403,
	"forbidden":      403,
	"event_conflict": 409, "sequence_conflict": 409, "below_replay_floor": 409, "sequence_too_far_ahead": 409,
	"not_dead": 409, "payload_expired": 409,
	"idempotency_conflict": 422, "no_signing_key": 422, "no_endpoint": 422,
	"body_too_large": 413,
	"rate_limited":   429,
	"not_found":      404, "method_not_allowed": 405,
}

// strict decodes body into v, refusing unknown members and trailing data.
func strict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return io.ErrUnexpectedEOF
	}
	return nil
}

func (a fuzzAnswer) check(t *testing.T, kind answerKind, secrets ...string) {
	t.Helper()
	if a.status >= 500 {
		t.Fatalf("status %d: %s", a.status, a.body)
	}
	if ct := a.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("status %d, Content-Type %q: %q", a.status, ct, a.body)
	}
	corr := a.header.Get("X-Correlation-Id")
	if len(corr) != 32 || strings.Trim(corr, "0123456789abcdef") != "" {
		t.Fatalf("X-Correlation-Id %q", corr)
	}
	for _, s := range secrets {
		if bytes.Contains(a.body, []byte(s)) {
			t.Fatalf("answer carries a credential: %s", a.body)
		}
	}
	if a.status == http.StatusTooManyRequests {
		if n, err := strconv.Atoi(a.header.Get("Retry-After")); err != nil || n < 1 {
			t.Fatalf("429 with Retry-After %q", a.header.Get("Retry-After"))
		}
	}
	if a.status != http.StatusOK || kind == kindAnswer {
		var ans answer
		if err := strict(a.body, &ans); err != nil {
			t.Fatalf("status %d, body %q is not an answer: %v", a.status, a.body, err)
		}
		if ans.CorrelationID != corr {
			t.Fatalf("correlation id %q in the body, %q in the header", ans.CorrelationID, corr)
		}
		checkOutcome(t, a.status, ans, a.body)
		return
	}
	switch kind {
	case kindBatch:
		var b batchAnswer
		if err := strict(a.body, &b); err != nil {
			t.Fatalf("batch body %q: %v", a.body, err)
		}
		if len(b.Results) < 1 || len(b.Results) > envelope.MaxBatch {
			t.Fatalf("%d batch results", len(b.Results))
		}
		for _, r := range b.Results {
			if r.CorrelationID != corr {
				t.Fatalf("item correlation id %q, header %q", r.CorrelationID, corr)
			}
			checkOutcome(t, r.Status, r.Answer, a.body)
		}
	case kindPage:
		var p streamPage
		if err := strict(a.body, &p); err != nil {
			t.Fatalf("stream page %q: %v", a.body, err)
		}
		last := int64(-1)
		for _, e := range p.Envelopes {
			if e.Sequence <= last || e.Sequence > p.Cursor || e.Sequence < 1 {
				t.Fatalf("page sequences out of order or past the cursor: %s", a.body)
			}
			last = e.Sequence
			if e.PayloadExpired != (string(e.Envelope) == "null") {
				t.Fatalf("payload_expired and envelope disagree: %s", a.body)
			}
		}
	case kindState:
		var s wire.StreamState
		if err := strict(a.body, &s); err != nil || s.Cursor < 0 || s.ReplayFloor < 0 {
			t.Fatalf("stream state %q: %v", a.body, err)
		}
	case kindAny:
		// Whichever route matched: one of the 200 shapes of the routes above,
		// or of the outbox and dead-letter routes, which the operator's
		// credential reaches with GETs; all are JSON objects.
		var m map[string]json.RawMessage
		if err := json.Unmarshal(a.body, &m); err != nil {
			t.Fatalf("200 body %q is not a JSON object: %v", a.body, err)
		}
	}
}

// checkOutcome checks one envelope answer (or refusal) against its status.
func checkOutcome(t *testing.T, status int, a answer, body []byte) {
	t.Helper()
	switch a.Outcome {
	case outcomeAccepted, outcomeDuplicate:
		if status != http.StatusOK || a.Reason != "" || a.Cursor == nil || *a.Cursor < 0 || len(a.EventIdentity) != 64 {
			t.Fatalf("status %d with %s: %s", status, a.Outcome, body)
		}
	case outcomeRefused:
		want, ok := contractStatus[string(a.Reason)]
		if !ok || want != status || a.Cursor != nil {
			t.Fatalf("status %d refused/%q (contract: %d, known %v): %s", status, a.Reason, want, ok, body)
		}
		// Contract §8.11: a fixed sentence, whatever the fuzzed request held.
		checkDetail(t, status, a.Detail, body)
	default:
		t.Fatalf("status %d, outcome %q: %s", status, a.Outcome, body)
	}
}

// sameAnswer checks a repeated POST: a refusal is refused again for the same
// reason, an accept or duplicate is a duplicate of the same event. In a
// batch, an item refused sequence_too_far_ahead may be accepted the second
// time: an earlier item of the first send can have filled a gap and moved
// the cursor (as if sent one by one, in order).
func sameAnswer(t *testing.T, kind answerKind, a, b fuzzAnswer) {
	t.Helper()
	items := func(x fuzzAnswer) []batchResult {
		if kind == kindBatch && x.status == http.StatusOK {
			var ba batchAnswer
			_ = strict(x.body, &ba)
			return ba.Results
		}
		var ans answer
		_ = strict(x.body, &ans)
		return []batchResult{{Answer: ans, Status: x.status}}
	}
	if a.status != b.status && !(kind == kindBatch && a.status == http.StatusOK) {
		t.Fatalf("repeat answered %d, first %d:\n%s\n%s", b.status, a.status, a.body, b.body)
	}
	ra, rb := items(a), items(b)
	if len(ra) != len(rb) {
		t.Fatalf("repeat has %d results, first %d", len(rb), len(ra))
	}
	for i := range ra {
		x, y := ra[i], rb[i]
		switch {
		case x.Outcome == outcomeRefused && x.Reason == "sequence_too_far_ahead" && kind == kindBatch:
		case x.Outcome == outcomeRefused:
			if y.Outcome != outcomeRefused || y.Reason != x.Reason || y.EventIdentity != x.EventIdentity {
				t.Fatalf("item %d: refused %s, then %s/%s:\n%s\n%s", i, x.Reason, y.Outcome, y.Reason, a.body, b.body)
			}
		default:
			if y.Outcome != outcomeDuplicate || y.EventIdentity != x.EventIdentity || *y.Cursor < *x.Cursor {
				t.Fatalf("item %d: %s, then %s/%s:\n%s\n%s", i, x.Outcome, y.Outcome, y.Reason, a.body, b.body)
			}
		}
	}
}

// resign makes the fuzzer's body carry a valid signature by the fixture's
// key, so mutations of the members reach steps 3-6: a JSON object has its
// signature member replaced by one over its canonical form; in a batch
// (batch true) every item that is an object is re-signed. Anything that does
// not read as JSON is sent as it is.
func resign(priv ed25519.PrivateKey, body []byte, batch bool) []byte {
	if !batch {
		return resignOne(priv, body)
	}
	items, err := envelope.SplitBatch(body)
	if err != nil {
		return body
	}
	out := make([][]byte, len(items))
	for i, it := range items {
		out[i] = resignOne(priv, it)
	}
	return batchBody(out...)
}

func resignOne(priv ed25519.PrivateKey, raw []byte) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || m == nil {
		return raw
	}
	delete(m, "signature")
	unsigned, err := json.Marshal(m)
	if err != nil {
		return raw
	}
	jcs, err := envelope.Canonicalize(unsigned)
	if err != nil {
		return raw
	}
	sig, _ := json.Marshal(b64url(ed25519.Sign(priv, append([]byte(envelope.SigningPrefix), jcs...))))
	m["signature"] = sig
	signed, err := json.Marshal(m)
	if err != nil {
		return raw
	}
	return signed
}

// streamPath is "project/producer"; a path without a slash is the project
// of device-7's own stream.
func streamPath(p string) string {
	if strings.Contains(p, "/") {
		return p
	}
	return p + "/" + deviceA
}

func httpMethod(m string) string {
	switch strings.ToUpper(m) {
	case "POST":
		return http.MethodPost
	case "PUT":
		return http.MethodPut
	case "DELETE":
		return http.MethodDelete
	case "HEAD":
		return http.MethodHead
	}
	return http.MethodGet
}

type httpSeed struct {
	mode              uint8
	path, query, idem string
	body              []byte
}

// httpSeeds are signed envelopes and batches of the fixture's stream (the
// shared vectors' key), plus one of every route; the hand-made ones are in
// testdata/fuzz/FuzzHTTP.
func httpSeeds(t testing.TB) []httpSeed {
	priv, _ := vectorKey(t)
	one := signWith(t, priv, draft(1))
	two := signWith(t, priv, draft(2))
	far := draft(3000)
	retired := draft(4)
	retired.KeyID = "k-retired"
	seeds := []httpSeed{
		{mode: 0 | 128, body: one},
		{mode: 8 | 128, idem: "idem-1", body: one},
		{mode: 8, idem: "other", body: one},
		{mode: 1 | 128, body: batchBody(one, two, one)},
		{mode: 2 | 128, body: signWith(t, priv, far)},
		{mode: 2 | 128, body: signWith(t, priv, retired)},
		{mode: 3 | 128, body: batchBody(signWith(t, priv, draft(7)), signWith(t, priv, draft(5)), signWith(t, priv, draft(6)))},
		{mode: 4, path: projectA + "/" + deviceA, query: "after=0&limit=10"},
		{mode: 4, path: projectA, query: "limit=101"},
		{mode: 5, path: projectA},
		{mode: 6, path: "GET dead-letters", query: "project_id=" + projectA},
		{mode: 7, idem: "not-a-token", body: one},
		{mode: 16 | 1, body: batchBody(one)},
		{mode: 32 | 64, body: one},
	}
	v := loadVectors(t)
	for _, vec := range v.Vectors {
		seeds = append(seeds, httpSeed{mode: 0, body: []byte(vec.Body)})
	}
	return seeds
}
