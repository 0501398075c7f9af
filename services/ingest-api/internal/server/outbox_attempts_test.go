package server

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

type attemptsPage struct {
	Attempts []struct {
		Attempt    int     `json:"attempt"`
		StartedAt  string  `json:"started_at"`
		DurationMS int64   `json:"duration_ms"`
		HTTPStatus *int    `json:"http_status"`
		ErrorCode  *string `json:"error_code"`
		Result     string  `json:"result"`
	} `json:"attempts"`
}

func TestOutboxAttempts(t *testing.T) {
	o := newOutboxFixture(t)
	a, _ := o.enqueued(o.postOutbox(o.service, outboxBody("k-1", "")), http.StatusCreated, o.pub)
	id := a.MessageIDs[0]
	path := "/v1/outbox/" + id + "/attempts"
	for _, tok := range []string{o.service, o.operator} {
		if r := o.get(tok, path); r.status != 200 || string(r.body) != `{"attempts":[]}` {
			t.Fatalf("never attempted: %d %s", r.status, r.body)
		}
	}

	// Attempt 1 answered 503; attempt 2 had no answer and lost its lease
	// (recorded by the claim of attempt 3); attempt 3 was delivered.
	ctx := context.Background()
	started := time.Date(2026, 3, 1, 12, 0, 0, 123456000, time.UTC)
	settle := func(st store.Settlement) {
		t.Helper()
		claimed, err := o.st.Outbox().Claim(ctx, tenantA, store.MaxClaim, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range claimed {
			if c.MessageID != id {
				continue
			}
			if st.Outcome == "" {
				// Due again with its lease as it was: the worker is gone.
				if _, err := o.admin.Exec(`UPDATE outbox_messages SET next_attempt_at = now() WHERE message_id = $1`, id); err != nil {
					t.Fatal(err)
				}
				return
			}
			st.MessageID, st.Attempt = id, c.Attempt
			if rs, err := o.st.Outbox().SettleBatch(ctx, tenantA, []store.Settlement{st}); err != nil || rs[0] != nil {
				t.Fatalf("settle: %v %v", rs, err)
			}
			return
		}
		t.Fatal("message not claimed")
	}
	settle(store.Settlement{Outcome: store.SettleRetry, Next: time.Now().Add(-time.Second), Code: store.CodeHTTP5xx,
		StartedAt: started, Duration: 1500 * time.Millisecond, HTTPStatus: 503})
	settle(store.Settlement{})
	settle(store.Settlement{Outcome: store.SettleDelivered, StartedAt: started.Add(time.Hour), Duration: 42 * time.Millisecond, HTTPStatus: 200})

	for _, tok := range []string{o.service, o.operator} {
		r := o.get(tok, path)
		if r.status != 200 {
			t.Fatalf("attempts: %d %s", r.status, r.body)
		}
		var p attemptsPage
		decodeStrict(t, r.body, &p)
		if len(p.Attempts) != 3 {
			t.Fatalf("attempts %s", r.body)
		}
		first, expired, last := p.Attempts[0], p.Attempts[1], p.Attempts[2]
		if first.Attempt != 1 || first.StartedAt != "2026-03-01T12:00:00.123456Z" || first.DurationMS != 1500 ||
			first.HTTPStatus == nil || *first.HTTPStatus != 503 || first.ErrorCode == nil || *first.ErrorCode != "http_5xx" ||
			first.Result != "retry" {
			t.Errorf("first attempt %s", r.body)
		}
		if expired.Attempt != 2 || expired.DurationMS != time.Minute.Milliseconds() || expired.HTTPStatus != nil ||
			expired.ErrorCode == nil || *expired.ErrorCode != "timeout" || expired.Result != "lease_expired" {
			t.Errorf("lease expiry %s", r.body)
		}
		if last.Attempt != 3 || last.DurationMS != 42 || last.HTTPStatus == nil || *last.HTTPStatus != 200 ||
			last.ErrorCode != nil || last.Result != "delivered" {
			t.Errorf("last attempt %s", r.body)
		}
		for _, member := range []string{`"http_status":null`, `"error_code":null`} {
			if !bytes.Contains(r.body, []byte(member)) {
				t.Errorf("%s missing from %s", member, r.body)
			}
		}
	}

	// Refusals, as GET /v1/outbox/{id} answers them.
	svcB := o.issue("tenant-b", "acct-1", "svc-1", store.RoleService)
	wantRefusal(t, o.get(svcB, path), 404, "not_found")
	wantRefusal(t, o.get(o.device, path), 403, "forbidden")
	wantRefusal(t, o.get("", path), 401, "unauthenticated")
	wantRefusal(t, o.get(o.service, "/v1/outbox/msg_000000000000000000000000/attempts"), 404, "not_found")
	wantRefusal(t, o.get(o.service, "/v1/outbox/not-an-id/attempts"), 404, "not_found")
	wantRefusal(t, o.get(o.service, "/v1/outbox/"+strings.Repeat("x", 4000)+"/attempts"), 404, "not_found")
	wantRefusal(t, o.do(req{method: http.MethodPost, path: path, token: o.operator}), 405, "method_not_allowed")
	if m := o.metricsText(); strings.Contains(m, id) || !strings.Contains(m, `route="/v1/outbox/:id/attempts"`) {
		t.Fatalf("metrics must label the route template only:\n%s", m)
	}
}
