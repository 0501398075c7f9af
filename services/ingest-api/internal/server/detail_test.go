package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/limiter"
	"github.com/envelopeworker/envelopeworker/modules/store"
)

// knownDetails is every sentence a refusal of this service may carry
// (contract §8.11): the envelope module's and detail.go's.
var knownDetails = func() map[string]bool {
	m := map[string]bool{}
	for _, d := range envelope.KnownDetails(envelope.Limits{}) {
		m[d] = true
	}
	for _, d := range ownDetails {
		m[d] = true
	}
	return m
}()

// checkDetail holds a refusal's detail to the contract: absent on a 5xx,
// otherwise one of the known sentences.
func checkDetail(t testing.TB, status int, detail string, body []byte) {
	t.Helper()
	if status >= 500 {
		if detail != "" {
			t.Fatalf("a %d carries a detail: %s", status, body)
		}
		return
	}
	if !knownDetails[detail] {
		t.Fatalf("status %d: detail %q is not a known sentence: %s", status, detail, body)
	}
}

// wantDetail checks a whole-request refusal: status, the exact body
// {"outcome","reason","correlation_id","detail"} (with "event_identity"
// once the envelope is known), and the access-log line
// of the request carrying the same detail.
func wantDetail(t testing.TB, f *fixture, r resp, status int, reason, detail string) {
	t.Helper()
	var m map[string]string
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("refusal body %s: %v", r.body, err)
	}
	members := 4
	if _, ok := m["event_identity"]; ok {
		// Refusals from step 2 on name the envelope they refuse.
		members++
	}
	if r.status != status || len(m) != members || m["outcome"] != "refused" || m["reason"] != reason || m["detail"] != detail ||
		m["correlation_id"] == "" || m["correlation_id"] != r.header.Get("X-Correlation-Id") {
		t.Fatalf("got %d %s, want %d refused/%s %q", r.status, r.body, status, reason, detail)
	}
	checkDetail(t, status, detail, r.body)
	if got := f.loggedDetail(m["correlation_id"]); got != detail {
		t.Fatalf("access log detail %q, want %q", got, detail)
	}
}

// loggedDetail is the detail attribute of the access-log line of the
// request with correlation id cid.
func (f *fixture) loggedDetail(cid string) string {
	f.t.Helper()
	sc := bufio.NewScanner(strings.NewReader(f.logs.String()))
	sc.Buffer(make([]byte, 0, 1<<16), 1<<22)
	for sc.Scan() {
		var line struct {
			Msg           string `json:"msg"`
			CorrelationID string `json:"correlation_id"`
			Detail        string `json:"detail"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "request" && line.CorrelationID == cid {
			return line.Detail
		}
	}
	f.t.Fatalf("no access-log line for %s", cid)
	return ""
}

// wantItems checks a batch answer's per-item reasons and details ("" for
// an item that is not refused).
func wantItems(t testing.TB, r resp, want ...[2]string) {
	t.Helper()
	var ba struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal(r.body, &ba); err != nil || r.status != http.StatusOK || len(ba.Results) != len(want) {
		t.Fatalf("batch answer %d %s (%v), want %d results", r.status, r.body, err, len(want))
	}
	for i, w := range want {
		reason, _ := ba.Results[i]["reason"].(string)
		detail, _ := ba.Results[i]["detail"].(string)
		if reason != w[0] || detail != w[1] {
			t.Fatalf("item %d: %s %q, want %s %q (%s)", i, reason, detail, w[0], w[1], r.body)
		}
		if w[0] == "" {
			if _, has := ba.Results[i]["detail"]; has {
				t.Fatalf("item %d is no refusal but has a detail: %s", i, r.body)
			}
			continue
		}
		status, _ := ba.Results[i]["status"].(float64)
		checkDetail(t, int(status), detail, r.body)
	}
}

type failingBody struct{}

func (failingBody) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

// refusalCase is one refusal path: a request and the answer it must get.
type refusalCase struct {
	name   string
	do     func() resp
	status int
	reason string
	detail string
}

// refusalScenario prepares o for every refusal path of every route (a
// stored envelope, a retired and a revoked key, a replay floor, a dead
// letter whose body expired and a live message) and returns the cases.
func refusalScenario(t *testing.T, o *outboxFixture) []refusalCase {
	t.Helper()
	f := o.fixture
	ctx := context.Background()
	pub := f.priv.Public().(ed25519.PublicKey)
	for _, k := range []string{"k-ret", "k-rev"} {
		if err := f.st.Credentials().AddKey(ctx, tenantA, k, pub); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.st.Credentials().RetireKey(ctx, tenantA, "k-ret"); err != nil {
		t.Fatal(err)
	}
	if err := f.st.Credentials().RevokeKey(ctx, tenantA, "k-rev"); err != nil {
		t.Fatal(err)
	}
	retired, err := f.st.Credentials().LookupKey(ctx, tenantA, "k-ret")
	if err != nil || retired.RetiredAt == nil {
		t.Fatalf("retired key: %+v %v", retired, err)
	}
	if _, err := f.st.Inbound().SetReplayFloor(ctx, tenantA, "proj-floor", deviceA, 5); err != nil {
		t.Fatal(err)
	}
	wantAnswer(t, f.post(f.device, f.sign(draft(1))), 200, "accepted", "", 1)

	// A dead letter whose body expired, and a live message.
	expired, _ := o.enqueued(o.postOutbox(o.service, outboxBody("k-expired", "")), http.StatusCreated, o.pub)
	kill(t, f, tenantA, expired.MessageIDs...)
	for {
		d, err := f.st.Retention().DeleteExpiredOutbound(ctx, time.Now().Add(2200*time.Hour), store.MaxDeleteBatch)
		if err != nil {
			t.Fatal(err)
		}
		if d.Bodies == 0 && d.Attempts == 0 {
			break
		}
	}
	live, _ := o.enqueued(o.postOutbox(o.service, outboxBody("k-live", "")), http.StatusCreated, o.pub)

	with := func(edit func(*envelope.Draft)) []byte {
		d := draft(3)
		edit(&d)
		return f.sign(d)
	}
	badEventID := draftMap(3)
	badEventID["event_id"] = "-Zq7"
	schema2 := draftMap(3)
	schema2["schema_version"] = 2
	unknownMember := draftMap(3)
	unknownMember["Zq7-secret-name"] = "Zq7-secret-value"
	get := func(token, path string) func() resp { return func() resp { return f.get(token, path) } }
	post := func(token, path string, body []byte) func() resp {
		return func() resp { return f.do(req{method: http.MethodPost, path: path, token: token, body: body}) }
	}
	env := func(token string, body []byte) func() resp { return post(token, "/v1/envelopes", body) }
	outbox := func(token string, body string) func() resp { return post(token, "/v1/outbox", []byte(body)) }
	replay := func(token, id string) func() resp { return post(token, "/v1/dead-letters/"+id+"/replay", nil) }
	tooLarge := append([]byte(`{"payload":"`), bytes.Repeat([]byte("x"), envelope.MaxDocumentBytes)...)

	return []refusalCase{
		// Admission.
		{"no credential", env("", f.sign(draft(3))), 401, "unauthenticated", detailNoCredential},
		{"unknown credential", env("ewk_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", f.sign(draft(3))), 401, "unauthenticated", detailBadCredential},
		{"body too large", env(f.device, tooLarge), 413, "body_too_large", "body larger than 1048576 bytes"},
		{"unknown route", get(f.device, "/v1/nothing"), 404, "not_found", detailNoRoute},
		{"wrong method", func() resp { return f.do(req{method: http.MethodDelete, path: "/v1/envelopes", token: f.device}) }, 405, "method_not_allowed", detailNoMethod},

		// POST /v1/envelopes, in the contract's order of steps.
		{"role", env(f.service, f.sign(draft(3))), 403, "forbidden", detailRoleDevice},
		{"not json", env(f.device, []byte(`{"a":`)), 400, "invalid_envelope", "json: unexpected end of input"},
		{"unknown member", env(f.device, signMap(t, f.priv, unknownMember)), 400, "invalid_envelope", "unknown member"},
		{"missing member", env(f.device, []byte(`{"schema_version":1}`)), 400, "invalid_envelope", "missing member event_id"},
		{"bad identity", env(f.device, signMap(t, f.priv, badEventID)), 400, "invalid_envelope", "event_id: must match ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"},
		{"other tenant", env(f.device, with(func(d *envelope.Draft) { d.TenantID = "tenant-b" })), 403, "route_mismatch", detailTenantMismatch},
		{"other producer", env(f.device, with(func(d *envelope.Draft) { d.ProducerID = "device-8" })), 403, "route_mismatch", detailProducerMismatch},
		{"header", func() resp {
			return f.do(req{method: http.MethodPost, path: "/v1/envelopes", token: f.device, body: f.sign(draft(3)),
				header: map[string]string{"Idempotency-Key": "Zq7"}})
		}, 400, "idempotency_key_mismatch", detailIdempotencyHeader},
		{"unknown key", env(f.device, with(func(d *envelope.Draft) { d.KeyID = "k-none" })), 403, "unknown_key", detailUnknownKey},
		{"bad signature", env(f.device, tampered(f)), 403, "bad_signature", detailBadSignature},
		{"retired key", env(f.device, with(func(d *envelope.Draft) {
			d.KeyID, d.IssuedAt = "k-ret", retired.RetiredAt.Add(time.Second)
		})), 403, "key_retired", detailKeyRetired},
		{"revoked key", env(f.device, with(func(d *envelope.Draft) { d.KeyID = "k-rev" })), 403, "key_revoked", detailKeyRevoked},
		{"schema", env(f.device, signMap(t, f.priv, schema2)), 400, "unsupported_schema", "schema_version: only 1 is supported"},
		{"metadata", env(f.device, with(func(d *envelope.Draft) { d.Metadata.Kind = "Zq7" })), 400, "invalid_metadata", "metadata.kind: must match ^[a-z][a-z0-9_.-]{0,63}$"},
		{"future", env(f.device, with(func(d *envelope.Draft) { d.IssuedAt = testNow.Add(time.Hour) })), 400, "issued_in_future", "issued_at: more than 5m ahead of the receiver's clock"},
		{"expired", env(f.device, with(func(d *envelope.Draft) { d.IssuedAt = testNow.Add(-100 * 24 * time.Hour) })), 400, "expired", "issued_at: older than the replay window"},
		{"event conflict", env(f.device, with(func(d *envelope.Draft) { d.EventID, d.Sequence = "evt-1", 1 })), 409, "event_conflict", detailEventConflict},
		{"idempotency conflict", env(f.device, with(func(d *envelope.Draft) { d.IdempotencyKey = "idem-1" })), 422, "idempotency_conflict", detailIdempotencyUsed},
		{"sequence conflict", env(f.device, with(func(d *envelope.Draft) { d.Sequence = 1 })), 409, "sequence_conflict", detailSequenceTaken},
		{"below floor", env(f.device, with(func(d *envelope.Draft) { d.ProjectID = "proj-floor" })), 409, "below_replay_floor", detailBelowFloor},
		{"too far ahead", env(f.device, with(func(d *envelope.Draft) { d.Sequence = 5000 })), 409, "sequence_too_far_ahead", detailTooFarAhead},

		// POST /v1/envelopes/batch, whole-request refusals.
		{"batch role", post(f.service, "/v1/envelopes/batch", batchBody(f.sign(draft(3)))), 403, "forbidden", detailRoleDevice},
		{"batch wrapper member", post(f.device, "/v1/envelopes/batch", []byte(`{"Zq7":[]}`)), 400, "invalid_envelope", "batch: unknown member"},
		{"batch empty", post(f.device, "/v1/envelopes/batch", []byte(`{"envelopes":[]}`)), 400, "invalid_envelope", "batch: envelopes: must hold 1..100 items"},

		// Streams.
		{"stream of another producer", get(f.device, "/v1/streams/proj-1/device-8"), 403, "forbidden", detailOwnStream},
		{"stream project", get(f.device, "/v1/streams/-Zq7/device-7"), 400, "invalid_request", detailPathProject},
		{"page role", get(f.device, "/v1/streams/proj-1/device-7/envelopes"), 403, "forbidden", detailRoleService},
		{"page project", get(f.service, "/v1/streams/-Zq7/device-7/envelopes"), 400, "invalid_request", detailPathProject},
		{"page producer", get(f.service, "/v1/streams/proj-1/-Zq7/envelopes"), 400, "invalid_request", detailPathProducer},
		{"page limit", get(f.service, "/v1/streams/proj-1/device-7/envelopes?limit=101"), 400, "invalid_page", detailPageLimit},
		{"page after", get(f.service, "/v1/streams/proj-1/device-7/envelopes?after=-1"), 400, "invalid_page", detailPageAfter},

		// POST /v1/outbox.
		{"outbox role", outbox(f.device, `{`+okOutbox+`}`), 403, "forbidden", detailRoleService},
		{"outbox not json", outbox(f.service, `{"project_id":`), 400, "invalid_request", "json: unexpected end of input"},
		{"outbox duplicate member", outbox(f.service, `{"topic":"a","topic":"b"}`), 400, "invalid_request", "json: duplicate member name in object"},
		{"outbox not object", outbox(f.service, `["Zq7"]`), 400, "invalid_request", detailOutboxNotObject},
		{"outbox unknown member", outbox(f.service, `{`+okOutbox+`,"Zq7":1}`), 400, "invalid_request", detailOutboxUnknown},
		{"outbox project", outbox(f.service, strings.Replace(`{`+okOutbox+`}`, `"proj-1"`, `"-Zq7"`, 1)), 400, "invalid_request", detailOutboxProject},
		{"outbox topic", outbox(f.service, strings.Replace(`{`+okOutbox+`}`, `"task.proposals"`, `7`, 1)), 400, "invalid_request", detailOutboxTopic},
		{"outbox key", outbox(f.service, strings.Replace(`{`+okOutbox+`}`, `"k-9"`, `"Zq7 x"`, 1)), 400, "invalid_request", detailOutboxKey},
		{"outbox kind", outbox(f.service, strings.Replace(`{`+okOutbox+`}`, `"proposal"`, `"Zq7"`, 1)), 400, "invalid_request", detailOutboxKind},
		{"outbox payload", outbox(f.service, strings.Replace(`{`+okOutbox+`}`, `,"payload":{}`, ``, 1)), 400, "invalid_request", detailOutboxPayload},
		{"outbox max_attempts", outbox(f.service, `{`+okOutbox+`,"max_attempts":8.0}`), 400, "invalid_request", detailOutboxMaxAttempts},
		{"outbox no endpoint", outbox(f.service, strings.Replace(`{`+okOutbox+`}`, `"task.proposals"`, `"task.none"`, 1)), 422, "no_endpoint", detailNoEndpoint},
		{"outbox conflict", outbox(f.service, strings.Replace(string(outboxBody("k-live", "")), `"note":""`, `"note":"other"`, 1)), 422, "idempotency_conflict", detailIdempotencyUsed},

		// POST /v1/outbox/batch, whole-request refusals.
		{"outbox batch role", post(f.device, "/v1/outbox/batch", []byte(`{"messages":[{}]}`)), 403, "forbidden", detailRoleService},
		{"outbox batch wrapper", post(f.service, "/v1/outbox/batch", []byte(`{}`)), 400, "invalid_request", "batch: messages: missing"},
		{"outbox batch not array", post(f.service, "/v1/outbox/batch", []byte(`{"messages":{}}`)), 400, "invalid_request", "batch: messages: must be an array"},

		// Status, attempts, dead letters, replay, outbound keys.
		{"status role", get(f.device, "/v1/outbox/"+live.MessageIDs[0]), 403, "forbidden", detailRoleServiceOrOps},
		{"status unknown", get(f.service, "/v1/outbox/Zq7"), 404, "not_found", detailNoMessage},
		{"attempts unknown", get(f.operator, "/v1/outbox/Zq7/attempts"), 404, "not_found", detailNoMessage},
		{"attempts role", get(f.device, "/v1/outbox/Zq7/attempts"), 403, "forbidden", detailRoleServiceOrOps},
		{"outbound keys role", get(f.device, "/v1/outbound-keys"), 403, "forbidden", detailRoleServiceOrOps},
		{"dead letters role", get(f.service, "/v1/dead-letters?project_id=proj-1"), 403, "forbidden", detailRoleOperator},
		{"dead letters project", get(f.operator, "/v1/dead-letters?project_id=-Zq7"), 400, "invalid_request", detailQueryProject},
		{"dead letters limit", get(f.operator, "/v1/dead-letters?project_id=proj-1&limit=0"), 400, "invalid_page", detailPageLimit},
		{"dead letters cursor", get(f.operator, "/v1/dead-letters?project_id=proj-1&after=Zq7"), 400, "invalid_page", detailPageCursor},
		{"replay role", replay(f.service, expired.MessageIDs[0]), 403, "forbidden", detailRoleOperator},
		{"replay unknown", replay(f.operator, "Zq7"), 404, "not_found", detailNoMessage},
		{"replay not dead", replay(f.operator, live.MessageIDs[0]), 409, "not_dead", detailNotDead},
		{"replay expired", replay(f.operator, expired.MessageIDs[0]), 409, "payload_expired", detailBodyExpired},
	}
}

// okOutbox is the members of a valid POST /v1/outbox body.
const okOutbox = `"project_id":"proj-1","topic":"task.proposals","idempotency_key":"k-9","kind":"proposal","payload":{}`

// tampered is draft 3, signed, with its payload changed afterwards.
func tampered(f *fixture) []byte {
	return bytes.Replace(f.sign(draft(3)), []byte(`"n":3`), []byte(`"n":4`), 1)
}

// checkBatchItemDetails checks that both batch routes answer each refused
// item with its own detail (o prepared by refusalScenario).
func checkBatchItemDetails(t *testing.T, o *outboxFixture) {
	t.Helper()
	f := o.fixture
	seqOne := draft(3)
	seqOne.Sequence = 1
	wantItems(t, f.postBatch(f.device, f.sign(draft(2)), []byte(`"Zq7"`), tampered(f), f.sign(seqOne)),
		[2]string{"", ""}, [2]string{"invalid_envelope", "envelope must be a JSON object"},
		[2]string{"bad_signature", detailBadSignature}, [2]string{"sequence_conflict", detailSequenceTaken})
	wantItems(t, f.postOutboxBatch(f.service, outboxBatchBody(outboxBody("k-b1", ""), []byte(`{`+okOutbox+`,"Zq7":1}`),
		[]byte(strings.Replace(`{`+okOutbox+`}`, `"task.proposals"`, `"task.none"`, 1)))),
		[2]string{"", ""}, [2]string{"invalid_request", detailOutboxUnknown}, [2]string{"no_endpoint", detailNoEndpoint})
}

// newLimitedFixture is a fixture without outbound keys whose limiters run
// out within a few requests.
func newLimitedFixture(t *testing.T) *fixture {
	return newFixture(t, func(c *Config) {
		c.PeerLimit = limiter.Policy{Tokens: 3, Interval: time.Hour}
		c.SyncLimit = limiter.Policy{Tokens: 2, Interval: time.Hour}
		c.OutboxLimit = limiter.Policy{Tokens: 3, Interval: time.Hour}
	})
}

// checkLimiterDetails runs lim (newLimitedFixture) out of each limiter: a
// 429 names the limiter, and so do a batch's late items. It returns the
// details it saw.
func checkLimiterDetails(t *testing.T, lim *fixture) []string {
	t.Helper()
	at := func(r req, host string) resp {
		r.remote = host + ":1"
		return lim.do(r)
	}
	wantDetail(t, lim, at(req{method: http.MethodPost, path: "/v1/outbox", token: lim.service, body: outboxBody("k-0", "")}, "192.0.2.20"),
		422, "no_signing_key", detailNoSigningKey)
	wantItems(t, at(req{method: http.MethodPost, path: "/v1/envelopes/batch", token: lim.device,
		body: batchBody(lim.sign(draft(1)), lim.sign(draft(2)), lim.sign(draft(3)))}, "192.0.2.21"),
		[2]string{"", ""}, [2]string{"", ""}, [2]string{"rate_limited", detailSyncLimited})
	wantDetail(t, lim, at(req{method: http.MethodPost, path: "/v1/envelopes", token: lim.device, body: lim.sign(draft(4))}, "192.0.2.22"),
		429, "rate_limited", detailSyncLimited)
	wantItems(t, at(req{method: http.MethodPost, path: "/v1/outbox/batch", token: lim.service,
		body: outboxBatchBody(outboxBody("k-1", ""), outboxBody("k-2", ""), outboxBody("k-3", ""))}, "192.0.2.23"),
		[2]string{"no_signing_key", detailNoSigningKey}, [2]string{"no_signing_key", detailNoSigningKey},
		[2]string{"rate_limited", detailOutboxLimited})
	wantDetail(t, lim, at(req{method: http.MethodPost, path: "/v1/outbox", token: lim.service, body: outboxBody("k-4", "")}, "192.0.2.24"),
		429, "rate_limited", detailOutboxLimited)
	for range 3 {
		at(req{method: http.MethodGet, path: "/v1/outbound-keys", token: lim.service}, "192.0.2.25")
	}
	wantDetail(t, lim, at(req{method: http.MethodGet, path: "/v1/outbound-keys", token: lim.service}, "192.0.2.25"),
		429, "rate_limited", detailPeerLimited)
	return []string{detailNoSigningKey, detailSyncLimited, detailOutboxLimited, detailPeerLimited}
}

// TestRefusalDetails walks every refusal path of every route and checks
// the exact reason and detail of each, in the answer and in the log line.
func TestRefusalDetails(t *testing.T) {
	o := newOutboxFixture(t)
	f := o.fixture
	seen := map[string]bool{}
	for _, c := range refusalScenario(t, o) {
		t.Run(c.name, func(t *testing.T) {
			wantDetail(t, f, c.do(), c.status, c.reason, c.detail)
			seen[c.detail] = true
		})
	}
	// A body that breaks off is the route's bad-body refusal.
	hr := httptest.NewRequest(http.MethodPost, "/v1/envelopes", failingBody{})
	hr.ContentLength = -1
	hr.RemoteAddr = clientIP + ":40000"
	hr.Header.Set("Authorization", "Bearer "+f.device)
	w := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(w, hr)
	wantDetail(t, f, resp{status: w.Code, header: w.Header(), body: w.Body.Bytes()}, 400, "invalid_envelope", detailUnreadableBody)
	seen[detailUnreadableBody] = true

	checkBatchItemDetails(t, o)
	for _, d := range checkLimiterDetails(t, newLimitedFixture(t)) {
		seen[d] = true
	}

	// Every sentence of detail.go is reached by some case above, but for
	// the two that only a store or envelope-builder fault behind checks that
	// already passed can give.
	for _, d := range ownDetails {
		if !seen[d] && d != detailOutboxEnvelope && d != detailOutboxProducer {
			t.Errorf("no case answers %q", d)
		}
	}
}

// TestDetailsNeverQuoteTheRequest: whatever member names and values a
// request carries, on the envelope, batch and outbox routes, a refusal's
// detail is one of the fixed sentences and never holds request content.
func TestDetailsNeverQuoteTheRequest(t *testing.T) {
	o := newOutboxFixture(t)
	f := o.fixture
	rng := rand.New(rand.NewPCG(8, 11))
	const marker = "Zq7mark"
	token := func() string {
		parts := []string{marker, "a", "-", ".", ":", "/", " ", "é", "\\u00e9", "0", "Z"}
		var b strings.Builder
		for range 1 + rng.IntN(5) {
			b.WriteString(parts[rng.IntN(len(parts))])
		}
		return b.String()
	}
	value := func() any {
		switch rng.IntN(6) {
		case 0:
			return token()
		case 1:
			return map[string]any{token(): token()}
		case 2:
			return []any{token(), rng.IntN(100)}
		case 3:
			return rng.IntN(1000) - 500
		case 4:
			return nil
		default:
			return map[string]any{"kind": token()}
		}
	}
	envMembers := []string{"schema_version", "tenant_id", "project_id", "producer_id", "event_id", "idempotency_key",
		"key_id", "sequence", "issued_at", "metadata", "payload"}
	outMembers := []string{"project_id", "topic", "idempotency_key", "kind", "payload", "max_attempts"}
	mutate := func(m map[string]any, names []string) {
		for range 1 + rng.IntN(3) {
			name := names[rng.IntN(len(names))]
			if rng.IntN(3) == 0 {
				name = token()
			}
			m[name] = value()
		}
	}
	// Accepted content may come back (an outbox answer holds the envelope
	// built from the request); refusals must not quote any of it.
	check := func(r resp, items bool) {
		t.Helper()
		if items && r.status == http.StatusOK {
			var ba batchAnswer
			if err := json.Unmarshal(r.body, &ba); err != nil {
				t.Fatalf("batch answer %s: %v", r.body, err)
			}
			for _, it := range ba.Results {
				if it.Outcome == outcomeRefused {
					checkDetail(t, it.Status, it.Detail, r.body)
					if strings.Contains(it.Detail, marker) {
						t.Fatalf("item detail quotes the request: %s", r.body)
					}
				}
			}
			return
		}
		if r.status >= 300 {
			if bytes.Contains(r.body, []byte(marker)) {
				t.Fatalf("refusal quotes the request: %s", r.body)
			}
			a := r.answer(t)
			checkDetail(t, r.status, a.Detail, r.body)
		}
	}
	for i := range 150 {
		m := draftMap(int64(10 + i))
		mutate(m, envMembers)
		body := signMap(t, f.priv, m)
		check(f.post(f.device, body), false)
		check(f.postBatch(f.device, body, []byte(fmt.Sprintf("%q", token()))), true)

		om := map[string]any{"project_id": projectA, "topic": topicA, "idempotency_key": fmt.Sprintf("k-%d", i),
			"kind": "proposal", "payload": map[string]any{}}
		mutate(om, outMembers)
		ob, err := json.Marshal(om)
		if err != nil {
			t.Fatal(err)
		}
		check(f.postOutbox(f.service, ob), false)
		check(f.postOutboxBatch(f.service, outboxBatchBody(ob)), true)
	}
	if strings.Contains(f.logs.String(), marker) {
		t.Fatal("a log line quotes the request")
	}
}
