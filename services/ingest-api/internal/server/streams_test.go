package server

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

func (f *fixture) get(token, path string) resp {
	return f.do(req{method: http.MethodGet, path: path, token: token})
}

func TestStreamStateRoute(t *testing.T) {
	f := newFixture(t)
	// Never written: zeros.
	r := f.get(f.device, "/v1/streams/proj-1/device-7")
	if r.status != 200 || string(r.body) != `{"cursor":0,"replay_floor":0}` {
		t.Fatalf("fresh stream: %d %s", r.status, r.body)
	}
	wantAnswer(t, f.post(f.device, f.sign(draft(1))), 200, "accepted", "", 1)
	wantAnswer(t, f.post(f.device, f.sign(draft(3))), 200, "accepted", "", 1)
	if _, err := f.st.Inbound().SetReplayFloor(context.Background(), tenantA, "proj-2", deviceA, 7); err != nil {
		t.Fatal(err)
	}
	r = f.get(f.device, "/v1/streams/proj-1/device-7")
	if r.status != 200 || string(r.body) != `{"cursor":1,"replay_floor":0}` {
		t.Fatalf("stream: %d %s", r.status, r.body)
	}
	r = f.get(f.device, "/v1/streams/proj-2/device-7")
	if r.status != 200 || string(r.body) != `{"cursor":7,"replay_floor":7}` {
		t.Fatalf("floored stream: %d %s", r.status, r.body)
	}
	// Refusals.
	wantAnswer(t, f.get(f.device, "/v1/streams/proj-1/device-8"), 403, "refused", "forbidden", -1)
	wantAnswer(t, f.get(f.service, "/v1/streams/proj-1/device-7"), 403, "refused", "forbidden", -1)
	wantAnswer(t, f.get(f.operator, "/v1/streams/proj-1/device-7"), 403, "refused", "forbidden", -1)
	wantAnswer(t, f.get("", "/v1/streams/proj-1/device-7"), 401, "refused", "unauthenticated", -1)
	wantAnswer(t, f.get(f.device, "/v1/streams/-bad/device-7"), 400, "refused", "invalid_request", -1)
	// Another tenant's device with the same ids sees its own (empty) stream.
	other := f.issue("tenant-b", "acct-1", deviceA, store.RoleDevice)
	r = f.get(other, "/v1/streams/proj-1/device-7")
	if r.status != 200 || string(r.body) != `{"cursor":0,"replay_floor":0}` {
		t.Fatalf("other tenant: %d %s", r.status, r.body)
	}
	// Reads are not audited.
	if n := len(f.audit()); n != 2 {
		t.Fatalf("%d audit rows, want 2", n)
	}
}

func TestStreamEnvelopesRoute(t *testing.T) {
	f := newFixture(t)
	for seq := int64(1); seq <= 5; seq++ {
		if seq == 4 {
			continue // a gap: 5 is retained but not served until 4 arrives
		}
		wantAnswer(t, f.post(f.device, f.sign(draft(seq))), 200, "accepted", "", -1)
	}
	p := f.readStream(t, f.service, projectA, deviceA, "")
	if p.Cursor != 3 || len(p.Envelopes) != 3 {
		t.Fatalf("page %+v", p)
	}
	for i, e := range p.Envelopes {
		if e.Sequence != int64(i+1) || e.PayloadExpired || e.EventIdentity == "" || string(e.Envelope) != string(f.sign(draft(e.Sequence))) {
			t.Fatalf("entry %d: %+v", i, e)
		}
	}
	p = f.readStream(t, f.service, projectA, deviceA, "?after=1&limit=1")
	if p.Cursor != 3 || len(p.Envelopes) != 1 || p.Envelopes[0].Sequence != 2 {
		t.Fatalf("page after=1 limit=1: %+v", p)
	}
	p = f.readStream(t, f.service, projectA, deviceA, "?after=3&limit=100")
	if p.Cursor != 3 || len(p.Envelopes) != 0 {
		t.Fatalf("page after cursor: %+v", p)
	}
	r := f.get(f.service, "/v1/streams/proj-1/device-7/envelopes?after=3")
	if string(r.body) != `{"envelopes":[],"cursor":3}` {
		t.Fatalf("empty page body %s", r.body)
	}
	p = f.readStream(t, f.service, "proj-9", deviceA, "")
	if p.Cursor != 0 || len(p.Envelopes) != 0 {
		t.Fatalf("never written: %+v", p)
	}
	// Another tenant's service credential sees nothing of tenant-a.
	otherSvc := f.issue("tenant-b", "acct-1", "svc-1", store.RoleService)
	p = f.readStream(t, otherSvc, projectA, deviceA, "")
	if p.Cursor != 0 || len(p.Envelopes) != 0 {
		t.Fatalf("cross-tenant read: %+v", p)
	}

	for _, q := range []string{"?limit=0", "?limit=101", "?limit=abc", "?limit=", "?after=-1", "?after=x", "?limit=1&limit=2"} {
		wantAnswer(t, f.get(f.service, "/v1/streams/proj-1/device-7/envelopes"+q), 400, "refused", "invalid_page", -1)
	}
	wantAnswer(t, f.get(f.device, "/v1/streams/proj-1/device-7/envelopes"), 403, "refused", "forbidden", -1)
	wantAnswer(t, f.get(f.operator, "/v1/streams/proj-1/device-7/envelopes"), 403, "refused", "forbidden", -1)
	wantAnswer(t, f.get(f.service, "/v1/streams/proj-1/bad!/envelopes"), 400, "refused", "invalid_request", -1)
	wantAnswer(t, f.get("nope", "/v1/streams/proj-1/device-7/envelopes"), 401, "refused", "unauthenticated", -1)
}

func TestStreamExpiredPayloads(t *testing.T) {
	// Payloads expire one nanosecond after the (fixed, past) test clock, so
	// the database already considers them expired.
	f := newFixture(t, func(c *Config) { c.PayloadRetention = time.Nanosecond })
	wantAnswer(t, f.post(f.device, f.sign(draft(1))), 200, "accepted", "", 1)
	wantAnswer(t, f.post(f.device, f.sign(draft(2))), 200, "accepted", "", 2)
	if _, err := f.st.Retention().DeleteExpiredPayloads(context.Background(), time.Now(), 1); err != nil {
		t.Fatal(err)
	}
	r := f.get(f.service, "/v1/streams/proj-1/device-7/envelopes")
	var raw struct {
		Envelopes []map[string]json.RawMessage `json:"envelopes"`
	}
	if err := json.Unmarshal(r.body, &raw); err != nil || len(raw.Envelopes) != 2 {
		t.Fatalf("body %s: %v", r.body, err)
	}
	for _, e := range raw.Envelopes {
		if string(e["envelope"]) != "null" || string(e["payload_expired"]) != "true" || len(e["event_identity"]) < 66 {
			t.Fatalf("expired entry %v", e)
		}
	}
	// The identity stays: sending it again is still a duplicate.
	wantAnswer(t, f.post(f.device, f.sign(draft(1))), 200, "duplicate", "", 2)
}

// TestStreamEnvelopesByteIdentical: the read API serves the stored
// canonical envelope byte for byte, even where a JSON encoder would escape
// (<, >, &, U+2028): consumers re-verify the signature over these bytes.
func TestStreamEnvelopesByteIdentical(t *testing.T) {
	f := newFixture(t)
	d := draft(1)
	d.Payload = []byte(`{"html":"<b> & </b>","ls":"\u2028"}`)
	body := f.sign(d)
	wantAnswer(t, f.post(f.device, body), 200, "accepted", "", 1)
	r := f.get(f.service, "/v1/streams/proj-1/device-7/envelopes")
	var page struct {
		Envelopes []struct {
			Envelope json.RawMessage `json:"envelope"`
		} `json:"envelopes"`
	}
	if err := json.Unmarshal(r.body, &page); err != nil || len(page.Envelopes) != 1 {
		t.Fatalf("%d %s: %v", r.status, r.body, err)
	}
	if !bytes.Contains(r.body, body) || !bytes.Equal(page.Envelopes[0].Envelope, body) {
		t.Fatalf("served\n%s\nsigned\n%s", r.body, body)
	}
}
