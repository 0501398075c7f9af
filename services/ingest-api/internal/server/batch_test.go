package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

func decodeBatch(t testing.TB, r resp) []batchResult {
	t.Helper()
	if r.status != 200 {
		t.Fatalf("batch status %d: %s", r.status, r.body)
	}
	var b batchAnswer
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		t.Fatalf("batch body %s: %v", r.body, err)
	}
	return b.Results
}

type itemWant struct {
	status          int
	outcome, reason string
	cursor          int64
}

func checkItems(t testing.TB, got []batchResult, want []itemWant) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d results, want %d", len(got), len(want))
	}
	for i, w := range want {
		g := got[i]
		if g.Status != w.status || string(g.Outcome) != w.outcome || string(g.Reason) != w.reason || g.CorrelationID == "" {
			t.Errorf("item %d: %d %s/%s, want %d %s/%s", i, g.Status, g.Outcome, g.Reason, w.status, w.outcome, w.reason)
			continue
		}
		if w.outcome == "refused" {
			if g.Cursor != nil {
				t.Errorf("item %d: refusal with cursor", i)
			}
		} else if g.Cursor == nil || *g.Cursor != w.cursor {
			t.Errorf("item %d: cursor %v, want %d", i, g.Cursor, w.cursor)
		}
	}
}

func TestBatchMixedResults(t *testing.T) {
	f := newFixture(t)
	otherProducer := draft(9)
	otherProducer.ProducerID = "device-8"
	tampered := bytes.Replace(f.sign(draft(5)), []byte(`"n":5`), []byte(`"n":6`), 1)
	r := f.postBatch(f.device,
		f.sign(draft(1)),
		f.sign(draft(2)),
		f.sign(draft(1)), // duplicate of item 0, as if sent one by one
		[]byte(`"not an object"`),
		f.sign(otherProducer),
		tampered,
		f.sign(draft(4)), // gap: retained, cursor stays
		f.sign(draft(3)), // fills it
		[]byte(`{"schema_version":1}`),
	)
	checkItems(t, decodeBatch(t, r), []itemWant{
		{200, "accepted", "", 2 - 1},
		{200, "accepted", "", 2},
		{200, "duplicate", "", 2},
		{400, "refused", "invalid_envelope", 0},
		{403, "refused", "route_mismatch", 0},
		{403, "refused", "bad_signature", 0},
		{200, "accepted", "", 2},
		{200, "accepted", "", 4},
		{400, "refused", "invalid_envelope", 0},
	})
	if n := len(f.audit()); n != 9 {
		t.Fatalf("%d audit rows, want one per item (9)", n)
	}
	// Items carry the request's correlation id, as do their audit rows.
	for _, row := range f.audit() {
		if row.CorrelationID != r.header.Get("X-Correlation-Id") {
			t.Fatalf("audit correlation %q, header %q", row.CorrelationID, r.header.Get("X-Correlation-Id"))
		}
	}
}

func TestBatchWrapperRefusals(t *testing.T) {
	f := newFixture(t)
	items := make([][]byte, 101)
	for i := range items {
		items[i] = f.sign(draft(int64(i + 1)))
	}
	cases := []struct {
		name string
		body []byte
	}{
		{"101 items", batchBody(items...)},
		{"no items", []byte(`{"envelopes":[]}`)},
		{"extra member", []byte(`{"envelopes":[` + string(items[0]) + `],"x":1}`)},
		{"not an array", []byte(`{"envelopes":{}}`)},
		{"not json", []byte(`{"envelopes":[`)},
		{"array wrapper", []byte(`[` + string(items[0]) + `]`)},
		{"case of member", []byte(`{"Envelopes":[` + string(items[0]) + `]}`)},
		{"duplicate member", []byte(`{"envelopes":[],"envelopes":[` + string(items[0]) + `]}`)},
	}
	for _, tc := range cases {
		before := len(f.audit())
		r := f.do(req{method: http.MethodPost, path: "/v1/envelopes/batch", token: f.device, body: tc.body})
		a := r.answer(t)
		if r.status != 400 || a.Outcome != "refused" || a.Reason != "invalid_envelope" {
			t.Errorf("%s: %d %s", tc.name, r.status, r.body)
		}
		if n := len(f.audit()) - before; n != 1 {
			t.Errorf("%s: %d audit rows, want 1", tc.name, n)
		}
	}
	// 100 items are fine.
	checkItems(t, decodeBatch(t, f.postBatch(f.device, items[:100]...)), func() []itemWant {
		w := make([]itemWant, 100)
		for i := range w {
			w[i] = itemWant{200, "accepted", "", int64(i + 1)}
		}
		return w
	}())
}

func TestBatchRoleAndAuth(t *testing.T) {
	f := newFixture(t)
	body := batchBody(f.sign(draft(1)))
	r := f.do(req{method: http.MethodPost, path: "/v1/envelopes/batch", token: f.service, body: body})
	wantAnswer(t, r, 403, "refused", "forbidden", -1)
	r = f.do(req{method: http.MethodPost, path: "/v1/envelopes/batch", body: body})
	wantAnswer(t, r, 401, "refused", "unauthenticated", -1)
	if n := len(f.audit()); n != 1 {
		t.Fatalf("%d audit rows, want 1 (forbidden)", n)
	}
}

// TestBatchItemLimitsAreOwn: each item has its own depth limit; the wrapper
// does not count.
func TestBatchItemLimitsAreOwn(t *testing.T) {
	f := newFixture(t)
	d := draft(1)
	d.Payload = []byte(strings.Repeat("[", 63) + strings.Repeat("]", 63)) // depth 64 with the envelope object
	deep := draft(2)
	deep.Payload = []byte(strings.Repeat("[", 64) + strings.Repeat("]", 64))
	deepBody := bytes.Replace(f.sign(draft(2)), []byte(`{"n":2}`), deep.Payload, 1)
	checkItems(t, decodeBatch(t, f.postBatch(f.device, f.sign(d), deepBody)), []itemWant{
		{200, "accepted", "", 1},
		{400, "refused", "invalid_envelope", 0},
	})
}
