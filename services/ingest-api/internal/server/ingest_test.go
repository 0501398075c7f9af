package server

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/store"
)

func b64url(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// TestSharedVectorsOverHTTP posts every contract vector, in file order, to
// POST /v1/envelopes.
func TestSharedVectorsOverHTTP(t *testing.T) {
	f := newFixture(t)
	v := loadVectors(t)
	want := map[string]struct {
		status          int
		outcome, reason string
		cursor          int64
	}{
		"basic":            {200, "accepted", "", 1},
		"numbers":          {200, "accepted", "", 2},
		"unicode":          {200, "accepted", "", 3},
		"reordered":        {200, "duplicate", "", 3}, // same event and content as basic
		"tampered":         {403, "refused", "bad_signature", -1},
		"big-integer":      {200, "accepted", "", 3}, // sequence 6: retained ahead of the cursor
		"unknown-metadata": {400, "refused", "invalid_metadata", -1},
	}
	if len(v.Vectors) != len(want) {
		t.Fatalf("vector file has %d vectors, test knows %d", len(v.Vectors), len(want))
	}
	for _, vec := range v.Vectors {
		w, ok := want[vec.Name]
		if !ok {
			t.Fatalf("unknown vector %q", vec.Name)
		}
		if vec.ExpectReason != "" && vec.ExpectReason != w.reason {
			t.Fatalf("vector %s expects %s, test expects %s", vec.Name, vec.ExpectReason, w.reason)
		}
		a := wantAnswer(t, f.post(f.device, []byte(vec.Body)), w.status, w.outcome, w.reason, w.cursor)
		if vec.EventIdentity != "" && a.EventIdentity != vec.EventIdentity {
			t.Errorf("%s: event_identity %s, want %s", vec.Name, a.EventIdentity, vec.EventIdentity)
		}
	}
	// Fill the gap (4, 5) so the big integer vector (6) is served, and check
	// that what is served is the canonical form that was signed, not the raw
	// request bytes.
	wantAnswer(t, f.post(f.device, f.sign(draft(4))), 200, "accepted", "", 4)
	wantAnswer(t, f.post(f.device, f.sign(draft(5))), 200, "accepted", "", 6)
	page := f.readStream(t, f.service, projectA, deviceA, "?after=5")
	if len(page.Envelopes) != 1 || page.Envelopes[0].Sequence != 6 || page.Cursor != 6 {
		t.Fatalf("page = %+v", page)
	}
	served := []byte(page.Envelopes[0].Envelope)
	if !bytes.Contains(served, []byte("9007199254740992")) || bytes.Contains(served, []byte("9007199254740993")) {
		t.Fatalf("served envelope is not the canonical form: %s", served)
	}
	env, err := envelope.Parse(served)
	if err != nil {
		t.Fatal(err)
	}
	_, pub := vectorKey(t)
	if err := env.Verify(pub); err != nil {
		t.Fatalf("served envelope does not verify: %v", err)
	}
	// One audit row per answer: 7 vectors + 2 fills.
	if n := len(f.audit()); n != 9 {
		t.Fatalf("%d audit rows, want 9", n)
	}
}

func TestAcceptedAnswerShape(t *testing.T) {
	f := newFixture(t)
	r := f.post(f.device, f.sign(draft(1)))
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatal(err)
	}
	if len(m) != 4 || m["outcome"] != "accepted" || m["cursor"] != float64(1) || m["event_identity"] != envelope.EventIdentity(tenantA, projectA, "evt-1") || m["correlation_id"] == "" {
		t.Fatalf("accepted body = %s", r.body)
	}
	if _, ok := m["reason"]; ok {
		t.Fatal("accepted answer carries a reason")
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("content type %q", ct)
	}
	// A gap: sequence 3 is retained and accepted, the cursor stays at 1.
	wantAnswer(t, f.post(f.device, f.sign(draft(3))), 200, "accepted", "", 1)
	// Filling it advances through every contiguous sequence.
	wantAnswer(t, f.post(f.device, f.sign(draft(2))), 200, "accepted", "", 3)
}

type auditWant struct {
	outcome, reason string
	project         string
	eventIdentity   bool
}

// TestRefusalsAndPrecedence covers every reason code a single post can get
// before and at step 5, and the contract's precedence between them.
func TestRefusalsAndPrecedence(t *testing.T) {
	f := newFixture(t)
	tamper := func(b []byte) []byte {
		return bytes.Replace(b, []byte(`"n":`), []byte(`"n":1`), 1)
	}
	wantAnswer(t, f.post(f.device, f.sign(draft(1))), 200, "accepted", "", 1)
	wantAnswer(t, f.post(f.device, f.sign(draft(2))), 200, "accepted", "", 2)

	otherTenant := draft(10)
	otherTenant.TenantID = "tenant-b"
	otherProducer := draft(10)
	otherProducer.ProducerID = "device-8"
	unknownKey := draft(10)
	unknownKey.KeyID = "k-none"
	future := draft(10)
	future.IssuedAt = testNow.Add(5*time.Minute + time.Second)
	nearFuture := draft(11)
	nearFuture.IssuedAt = testNow.Add(5 * time.Minute)
	old := draft(12)
	old.IssuedAt = testNow.Add(-2160*time.Hour - time.Second)
	eventConflict := draft(1)
	eventConflict.Payload = []byte(`{"other":true}`)
	eventConflict.IdempotencyKey = "idem-other"
	idemConflict := draft(20)
	idemConflict.IdempotencyKey = "idem-1"
	seqConflict := draft(2)
	seqConflict.EventID, seqConflict.IdempotencyKey = "evt-x", "idem-x"
	tooFar := draft(2 + 1024 + 1)
	atLimit := draft(2 + 1024)
	schema2 := draftMap(30)
	schema2["schema_version"] = 2
	schemaString := draftMap(31)
	schemaString["schema_version"] = "1"
	badMeta := draft(32)
	badMeta.Metadata.Kind = "Not-Valid"

	cases := []struct {
		name    string
		token   string
		body    []byte
		header  map[string]string
		status  int
		outcome string
		reason  string
		audit   *auditWant
	}{
		{"no credential", "", f.sign(draft(3)), nil, 401, "refused", "unauthenticated", nil},
		{"unknown credential", "ewk_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", f.sign(draft(3)), nil, 401, "refused", "unauthenticated", nil},
		{"basic scheme", "", f.sign(draft(3)), map[string]string{"Authorization": "Basic " + f.device}, 401, "refused", "unauthenticated", nil},
		{"service may not post", f.service, f.sign(draft(3)), nil, 403, "refused", "forbidden", &auditWant{"refused", "forbidden", "", false}},
		{"operator may not post, even garbage", f.operator, []byte("{"), nil, 403, "refused", "forbidden", &auditWant{"refused", "forbidden", "", false}},
		{"not json", f.device, []byte("{"), nil, 400, "refused", "invalid_envelope", &auditWant{"refused", "invalid_envelope", "", false}},
		{"schema_version as string", f.device, signMap(t, f.priv, schemaString), nil, 400, "refused", "invalid_envelope", &auditWant{"refused", "invalid_envelope", "", false}},
		{"other tenant", f.device, f.sign(otherTenant), nil, 403, "refused", "route_mismatch", &auditWant{"refused", "route_mismatch", projectA, true}},
		{"other producer", f.device, f.sign(otherProducer), nil, 403, "refused", "route_mismatch", &auditWant{"refused", "route_mismatch", projectA, true}},
		{"route mismatch beats bad signature", f.device, tamper(f.sign(otherProducer)), nil, 403, "refused", "route_mismatch", &auditWant{"refused", "route_mismatch", projectA, true}},
		{"route mismatch beats header mismatch", f.device, f.sign(otherProducer), map[string]string{"Idempotency-Key": "nope"}, 403, "refused", "route_mismatch", &auditWant{"refused", "route_mismatch", projectA, true}},
		{"header mismatch", f.device, f.sign(draft(3)), map[string]string{"Idempotency-Key": "idem-x"}, 400, "refused", "idempotency_key_mismatch", &auditWant{"refused", "idempotency_key_mismatch", projectA, true}},
		{"header mismatch beats bad signature", f.device, tamper(f.sign(draft(3))), map[string]string{"Idempotency-Key": "idem-x"}, 400, "refused", "idempotency_key_mismatch", &auditWant{"refused", "idempotency_key_mismatch", projectA, true}},
		{"header mismatch beats unknown key", f.device, f.sign(unknownKey), map[string]string{"Idempotency-Key": ""}, 400, "refused", "idempotency_key_mismatch", &auditWant{"refused", "idempotency_key_mismatch", projectA, true}},
		{"unknown key", f.device, f.sign(unknownKey), nil, 403, "refused", "unknown_key", &auditWant{"refused", "unknown_key", projectA, true}},
		{"bad signature", f.device, tamper(f.sign(draft(3))), nil, 403, "refused", "bad_signature", &auditWant{"refused", "bad_signature", projectA, true}},
		{"bad signature beats step 4", f.device, tamper(f.sign(future)), nil, 403, "refused", "bad_signature", &auditWant{"refused", "bad_signature", projectA, true}},
		{"unsupported schema", f.device, signMap(t, f.priv, schema2), nil, 400, "refused", "unsupported_schema", &auditWant{"refused", "unsupported_schema", projectA, true}},
		{"invalid metadata", f.device, f.sign(badMeta), nil, 400, "refused", "invalid_metadata", &auditWant{"refused", "invalid_metadata", projectA, true}},
		{"issued in future", f.device, f.sign(future), nil, 400, "refused", "issued_in_future", &auditWant{"refused", "issued_in_future", projectA, true}},
		{"expired", f.device, f.sign(old), nil, 400, "refused", "expired", &auditWant{"refused", "expired", projectA, true}},
		{"event conflict", f.device, f.sign(eventConflict), nil, 409, "refused", "event_conflict", &auditWant{"refused", "event_conflict", projectA, true}},
		{"idempotency conflict", f.device, f.sign(idemConflict), nil, 422, "refused", "idempotency_conflict", &auditWant{"refused", "idempotency_conflict", projectA, true}},
		{"sequence conflict", f.device, f.sign(seqConflict), nil, 409, "refused", "sequence_conflict", &auditWant{"refused", "sequence_conflict", projectA, true}},
		{"too far ahead", f.device, f.sign(tooFar), nil, 409, "refused", "sequence_too_far_ahead", &auditWant{"refused", "sequence_too_far_ahead", projectA, true}},
		{"exactly max ahead", f.device, f.sign(atLimit), nil, 200, "accepted", "", &auditWant{"accepted", "", projectA, true}},
		{"5 minutes ahead is fine", f.device, f.sign(nearFuture), nil, 200, "accepted", "", &auditWant{"accepted", "", projectA, true}},
		{"duplicate with matching header", f.device, f.sign(draft(1)), map[string]string{"Idempotency-Key": "idem-1"}, 200, "duplicate", "", &auditWant{"duplicate", "", projectA, true}},
	}
	for _, tc := range cases {
		before := len(f.audit())
		r := f.do(req{method: http.MethodPost, path: "/v1/envelopes", token: tc.token, body: tc.body, header: tc.header})
		a := r.answer(t)
		if r.status != tc.status || string(a.Outcome) != tc.outcome || string(a.Reason) != tc.reason {
			t.Errorf("%s: got %d %s/%s, want %d %s/%s", tc.name, r.status, a.Outcome, a.Reason, tc.status, tc.outcome, tc.reason)
			continue
		}
		rows := f.audit()
		if tc.audit == nil {
			if len(rows) != before {
				t.Errorf("%s: wrote %d audit rows, want none", tc.name, len(rows)-before)
			}
			continue
		}
		if len(rows) != before+1 {
			t.Errorf("%s: wrote %d audit rows, want 1", tc.name, len(rows)-before)
			continue
		}
		row := rows[len(rows)-1]
		if row.Outcome != tc.audit.outcome || row.Reason != tc.audit.reason || row.ProjectID != tc.audit.project ||
			(row.EventIdentity != "") != tc.audit.eventIdentity || row.CorrelationID != a.CorrelationID ||
			row.AccountID != "acct-1" || row.TenantID != tenantA {
			t.Errorf("%s: audit row %+v, want %+v and correlation %s", tc.name, row, *tc.audit, a.CorrelationID)
		}
		if tc.audit.eventIdentity && a.EventIdentity != row.EventIdentity {
			t.Errorf("%s: answer event_identity %q, audit %q", tc.name, a.EventIdentity, row.EventIdentity)
		}
	}
}

func TestBelowReplayFloor(t *testing.T) {
	f := newFixture(t)
	if _, err := f.st.Inbound().SetReplayFloor(context.Background(), tenantA, projectA, deviceA, 5); err != nil {
		t.Fatal(err)
	}
	wantAnswer(t, f.post(f.device, f.sign(draft(5))), 409, "refused", "below_replay_floor", -1)
	wantAnswer(t, f.post(f.device, f.sign(draft(6))), 200, "accepted", "", 6)
}

func TestKeyStates(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	wantAnswer(t, f.post(f.device, f.sign(draft(1))), 200, "accepted", "", 1)

	// Retired: envelopes issued up to the retirement verify; later ones are
	// key_retired (decided at step 3, so even a future issued_at says so).
	if err := f.st.Credentials().RetireKey(ctx, tenantA, keyA); err != nil {
		t.Fatal(err)
	}
	k, err := f.st.Credentials().LookupKey(ctx, tenantA, keyA)
	if err != nil || k.RetiredAt == nil {
		t.Fatalf("lookup: %+v, %v", k, err)
	}
	wantAnswer(t, f.post(f.device, f.sign(draft(2))), 200, "accepted", "", 2)
	late := draft(3)
	late.IssuedAt = k.RetiredAt.Add(time.Second)
	wantAnswer(t, f.post(f.device, f.sign(late)), 403, "refused", "key_retired", -1)
	badLate := f.sign(late)
	badLate = bytes.Replace(badLate, []byte(`"n":3`), []byte(`"n":4`), 1)
	wantAnswer(t, f.post(f.device, badLate), 403, "refused", "bad_signature", -1)

	// Revoked: only exact duplicates of what it signed pass (as duplicate).
	if err := f.st.Credentials().RevokeKey(ctx, tenantA, keyA); err != nil {
		t.Fatal(err)
	}
	wantAnswer(t, f.post(f.device, f.sign(draft(1))), 200, "duplicate", "", 2)
	wantAnswer(t, f.post(f.device, f.sign(draft(2))), 200, "duplicate", "", 2)
	wantAnswer(t, f.post(f.device, f.sign(draft(3))), 403, "refused", "key_revoked", -1)
	changed := draft(1)
	changed.Payload = []byte(`{"n":"changed"}`)
	wantAnswer(t, f.post(f.device, f.sign(changed)), 403, "refused", "key_revoked", -1)
	// Same content, forged signature: not a valid duplicate.
	forged := f.sign(draft(1))
	var m map[string]any
	if err := json.Unmarshal(forged, &m); err != nil {
		t.Fatal(err)
	}
	m["signature"] = b64url(make([]byte, ed25519.SignatureSize))
	forged, _ = json.Marshal(m)
	wantAnswer(t, f.post(f.device, forged), 403, "refused", "bad_signature", -1)
}

func TestBodyLimit(t *testing.T) {
	f := newFixture(t)
	big := bytes.Repeat([]byte("x"), 1<<20+1)
	exact := make([]byte, 1<<20)
	copy(exact, f.sign(draft(1)))
	for i := len(f.sign(draft(1))); i < len(exact); i++ {
		exact[i] = ' ' // trailing white space is allowed JSON
	}
	for _, path := range []string{"/v1/envelopes", "/v1/envelopes/batch"} {
		for _, chunked := range []bool{false, true} {
			// Over the limit: 413 even without a credential (step 0 first).
			r := f.do(req{method: http.MethodPost, path: path, body: big, chunked: chunked})
			wantAnswer(t, r, 413, "refused", "body_too_large", -1)
			r = f.do(req{method: http.MethodPost, path: path, token: f.device, body: big, chunked: chunked})
			wantAnswer(t, r, 413, "refused", "body_too_large", -1)
		}
	}
	// Exactly 1 MiB is read and processed.
	for _, chunked := range []bool{false, true} {
		r := f.do(req{method: http.MethodPost, path: "/v1/envelopes", token: f.device, body: exact, chunked: chunked})
		if r.status != 200 {
			t.Fatalf("1 MiB body (chunked=%v): %d %s", chunked, r.status, r.body)
		}
	}
	if n := len(f.audit()); n != 2 {
		t.Fatalf("%d audit rows; 413s must not be audited", n)
	}
}

func TestDuplicateHeaderValuesMismatch(t *testing.T) {
	f := newFixture(t)
	hr := req{method: http.MethodPost, path: "/v1/envelopes", token: f.device, body: f.sign(draft(1))}
	r := f.doMulti(hr, "Idempotency-Key", "idem-1", "idem-1")
	wantAnswer(t, r, 400, "refused", "idempotency_key_mismatch", -1)
}

// TestConcurrentDuplicates sends one envelope from many goroutines at once:
// exactly one is accepted, every other answer is duplicate, every answer is
// audited.
func TestConcurrentDuplicates(t *testing.T) {
	f := newFixture(t)
	body := f.sign(draft(1))
	const n = 24
	results := make(chan resp, n)
	start := make(chan struct{})
	for range n {
		go func() {
			<-start
			results <- f.post(f.device, body)
		}()
	}
	close(start)
	counts := map[string]int{}
	for range n {
		r := <-results
		a := wantAnswer(t, r, 200, string(r.answer(t).Outcome), "", 1)
		counts[string(a.Outcome)]++
	}
	if counts["accepted"] != 1 || counts["duplicate"] != n-1 {
		t.Fatalf("outcomes %v", counts)
	}
	if rows := len(f.audit()); rows != n {
		t.Fatalf("%d audit rows, want %d", rows, n)
	}
}

// TestGroupCommitManyStreams posts single envelopes of many devices at once;
// all are accepted with their own stream's cursor.
func TestGroupCommitManyStreams(t *testing.T) {
	f := newFixture(t)
	const devices = 16
	type result struct {
		dev int
		r   resp
	}
	tokens := make([]string, devices)
	for i := range devices {
		tokens[i] = f.issue(tenantA, "acct-2", "dev-"+itoa(i), store.RoleDevice)
	}
	out := make(chan result, devices*3)
	for i := range devices {
		go func() {
			for seq := int64(1); seq <= 3; seq++ {
				d := draft(seq)
				d.ProducerID = "dev-" + itoa(i)
				// Event ids and idempotency keys are unique per project.
				d.EventID, d.IdempotencyKey = d.EventID+"-"+d.ProducerID, d.IdempotencyKey+"-"+d.ProducerID
				out <- result{i, f.post(tokens[i], f.sign(d))}
			}
		}()
	}
	cursors := make([]int64, devices)
	for range devices * 3 {
		res := <-out
		a := wantAnswer(t, res.r, 200, "accepted", "", -1)
		if *a.Cursor != cursors[res.dev]+1 {
			t.Fatalf("device %d cursor %d after %d", res.dev, *a.Cursor, cursors[res.dev])
		}
		cursors[res.dev] = *a.Cursor
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// streamPage is the answer of GET /v1/streams/{project}/{producer}/envelopes.
type streamPage struct {
	Envelopes []struct {
		Sequence       int64           `json:"sequence"`
		EventIdentity  string          `json:"event_identity"`
		Envelope       json.RawMessage `json:"envelope"`
		PayloadExpired bool            `json:"payload_expired"`
	} `json:"envelopes"`
	Cursor int64 `json:"cursor"`
}

func (f *fixture) readStream(t testing.TB, token, project, producer, query string) streamPage {
	t.Helper()
	r := f.do(req{method: http.MethodGet, path: "/v1/streams/" + project + "/" + producer + "/envelopes" + query, token: token})
	if r.status != 200 {
		t.Fatalf("read stream: %d %s", r.status, r.body)
	}
	var p streamPage
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestChunkedOverRealConnection sends an oversized body without a length
// over a real connection: the server stops reading at the limit.
func TestChunkedOverRealConnection(t *testing.T) {
	f := newFixture(t)
	ts := httptest.NewServer(f.srv.Handler())
	defer ts.Close()
	pr, pw := io.Pipe()
	go func() {
		chunk := bytes.Repeat([]byte(" "), 64<<10)
		for range 20 { // 1.25 MiB in total
			if _, err := pw.Write(chunk); err != nil {
				return // the server hung up once it had enough
			}
		}
		pw.Close()
	}()
	hr, err := http.NewRequest(http.MethodPost, ts.URL+"/v1/envelopes", pr)
	if err != nil {
		t.Fatal(err)
	}
	hr.Header.Set("Authorization", "Bearer "+f.device)
	res, err := ts.Client().Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	pr.CloseWithError(io.ErrClosedPipe)
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != 413 || !strings.Contains(string(body), `"reason":"body_too_large"`) {
		t.Fatalf("%d %s", res.StatusCode, body)
	}
	if res.Header.Get("X-Correlation-Id") == "" {
		t.Fatal("no correlation id header")
	}
}
