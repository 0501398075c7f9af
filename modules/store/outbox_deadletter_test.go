package store_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// pageAll walks every page of (tenant, project) at limit and returns the ids.
func (f *fixture) pageAll(tenant, project string, limit int) (ids []string, pages int) {
	f.t.Helper()
	after := ""
	for {
		dl, next, err := f.s.Outbox().ListDeadLetters(context.Background(), tenant, project, limit, after)
		if err != nil {
			f.t.Fatalf("ListDeadLetters: %v", err)
		}
		if len(dl) > limit {
			f.t.Fatalf("page of %d over limit %d", len(dl), limit)
		}
		pages++
		for _, d := range dl {
			ids = append(ids, d.MessageID)
		}
		if next == nil {
			return ids, pages
		}
		if len(dl) != limit {
			f.t.Fatalf("short page of %d with a next cursor", len(dl))
		}
		after = *next
	}
}

func TestDeadLettersPagingAndScoping(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.fanOut("t1", 7, 7)
	for i := 0; i < 2; i++ { // project p2 of t1
		f.addEndpoint("t1", "p2", "task.proposals")
	}
	o := out("k-p2", `{}`)
	o.project = "p2"
	f.enqueue(actor("t1", "svc1"), o)
	f.fanOut("t2", 3, 3)
	f.killAll("t1", store.CodeHTTP4xx)
	f.killAll("t2", store.CodeHTTP5xx)
	// Ties on dead_at are broken by message id.
	if _, err := f.admin.Exec(`UPDATE outbox_messages SET dead_at = '2026-01-01T00:00:00Z'
		WHERE tenant_id = 't1' AND project_id = 'p1' AND message_id IN (
			SELECT message_id FROM outbox_messages WHERE tenant_id = 't1' AND project_id = 'p1' ORDER BY message_id LIMIT 3)`); err != nil {
		t.Fatal(err)
	}
	var want []string
	rows, err := f.admin.Query(`SELECT message_id FROM outbox_messages WHERE tenant_id = 't1' AND project_id = 'p1'
		ORDER BY dead_at, message_id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		want = append(want, id)
	}
	if err := rows.Err(); err != nil || len(want) != 7 {
		t.Fatalf("%d expected ids, %v", len(want), err)
	}

	for _, c := range []struct{ limit, pages int }{{1, 7}, {3, 3}, {7, 1}, {100, 1}} {
		got, pages := f.pageAll("t1", "p1", c.limit)
		if !slices.Equal(got, want) || pages != c.pages {
			t.Fatalf("limit %d: %d pages %v, want %d pages %v", c.limit, pages, got, c.pages, want)
		}
	}
	if got, _ := f.pageAll("t1", "p2", 100); len(got) != 2 {
		t.Fatalf("project p2: %d dead letters, want 2", len(got))
	}
	if got, _ := f.pageAll("t2", "p1", 2); len(got) != 3 {
		t.Fatalf("tenant t2: %d dead letters, want its own 3", len(got))
	}
	if got, _ := f.pageAll("t3", "p1", 100); len(got) != 0 {
		t.Fatalf("tenant t3: %d dead letters, want none", len(got))
	}

	dl, _, err := f.s.Outbox().ListDeadLetters(ctx, "t1", "p1", 1, "")
	if err != nil || len(dl) != 1 {
		t.Fatal(err)
	}
	d := dl[0]
	if d.Topic != "task.proposals" || d.ErrorCode != store.CodeHTTP4xx || d.Attempts != 1 || d.EndpointID == "" ||
		d.CreatedAt.IsZero() || !d.DeadAt.Equal(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("dead letter %+v", d)
	}

	// A cursor from tenant t1 positions only; it never shows t1's rows to t2.
	_, next, err := f.s.Outbox().ListDeadLetters(ctx, "t1", "p1", 1, "")
	if err != nil || next == nil {
		t.Fatal(err)
	}
	if dl, _, err := f.s.Outbox().ListDeadLetters(ctx, "t2", "p1", 100, *next); err != nil {
		t.Fatal(err)
	} else {
		for _, d := range dl {
			if slices.Contains(want, d.MessageID) {
				t.Fatal("t2 saw a t1 dead letter through a cursor")
			}
		}
	}

	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for name, c := range map[string]struct {
		tenant, project string
		limit           int
		after           string
	}{
		"limit 0":          {"t1", "p1", 0, ""},
		"limit 101":        {"t1", "p1", 101, ""},
		"no project":       {"t1", "", 10, ""},
		"no tenant":        {"", "p1", 10, ""},
		"not base64":       {"t1", "p1", 10, "***"},
		"no separator":     {"t1", "p1", 10, enc("12345")},
		"bad id":           {"t1", "p1", 10, enc("12345.msg_zz")},
		"bad time":         {"t1", "p1", 10, enc("+1.msg_000000000000000000000000")},
		"padded base64":    {"t1", "p1", 10, enc("1.msg_000000000000000000000000") + "=="},
		"oversized cursor": {"t1", "p1", 10, strings.Repeat("A", 200)},
	} {
		_, _, err := f.s.Outbox().ListDeadLetters(ctx, c.tenant, c.project, c.limit, c.after)
		wantErr(t, name, err, store.ErrInvalid)
	}
}

func TestDeadLetterReplay(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.addEndpoint("t1", "p1", "task.proposals")
	o := out("k-1", `{}`)
	o.maxAttempts = 2
	r := f.enqueue(actor("t1", "svc1"), o)
	id := r.MessageIDs[0]
	var ident string
	if err := f.admin.QueryRow(`SELECT encode(event_identity, 'hex') FROM outbound_envelopes`).Scan(&ident); err != nil {
		t.Fatal(err)
	}
	op := actor("t1", "op1")

	_, err := f.s.Outbox().ReplayDeadLetter(ctx, op, id)
	wantErr(t, "replay pending", err, store.ErrNotDead)
	_, err = f.s.Outbox().ReplayDeadLetter(ctx, op, "msg_000000000000000000000000")
	wantErr(t, "replay unknown", err, store.ErrNotFound)
	_, err = f.s.Outbox().ReplayDeadLetter(ctx, op, "not-an-id")
	wantErr(t, "replay malformed id", err, store.ErrNotFound)
	_, err = f.s.Outbox().ReplayDeadLetter(ctx, store.Actor{TenantID: "t1", CorrelationID: "bad id!"}, id)
	wantErr(t, "replay bad actor", err, store.ErrInvalid)

	for attempt := 1; attempt <= 2; attempt++ {
		c := f.claim("t1", 1)[0]
		if err := f.s.Outbox().MarkRetry(ctx, "t1", id, c.Attempt, time.Now().Add(-time.Second), store.CodeHTTP5xx); err != nil {
			t.Fatal(err)
		}
	}
	if m := f.status("t1", id); m.Status != store.StatusDead {
		t.Fatalf("not dead after its budget: %+v", m)
	}
	_, err = f.s.Outbox().ReplayDeadLetter(ctx, actor("t2", "op1"), id)
	wantErr(t, "replay by other tenant", err, store.ErrNotFound)
	if n := f.count(`SELECT count(*) FROM audit_events`); n != 0 {
		t.Fatalf("refused replays wrote %d audit rows", n)
	}

	m, err := f.s.Outbox().ReplayDeadLetter(ctx, op, id)
	if err != nil {
		t.Fatal(err)
	}
	if m.MessageID != id || m.Status != store.StatusPending || m.Attempts != 2 || m.NextAttemptAt == nil ||
		m.LastErrorCode != store.CodeHTTP5xx {
		t.Fatalf("replayed status %+v", m)
	}
	if got := f.status("t1", id); got.Status != m.Status || got.Attempts != m.Attempts {
		t.Fatalf("stored status %+v differs from the answer %+v", got, m)
	}
	if n := f.count(`SELECT max_attempts FROM outbox_messages WHERE message_id = $1`, id); n != 4 {
		t.Fatalf("max_attempts after replay %d, want attempts + budget = 4", n)
	}
	if dl, _, err := f.s.Outbox().ListDeadLetters(ctx, "t1", "p1", 100, ""); err != nil || len(dl) != 0 {
		t.Fatalf("replayed message still listed: %+v, %v", dl, err)
	}
	audit := f.audit("t1")
	if len(audit) != 1 || audit[0].Outcome != store.OutcomeReplayed || audit[0].EventIdentity != ident ||
		audit[0].ProjectID != "p1" || audit[0].AccountID != op.AccountID || audit[0].DeviceID != "op1" ||
		audit[0].CorrelationID != op.CorrelationID || audit[0].Reason != "" {
		t.Fatalf("audit after replay %+v", audit)
	}

	c := f.claim("t1", 1)
	if len(c) != 1 || c[0].MessageID != id || c[0].Attempt != 3 || c[0].MaxAttempts != 4 || !bytes.Equal(c[0].Body, r.Envelope) {
		t.Fatalf("claim after replay %+v", c)
	}
	_, err = f.s.Outbox().ReplayDeadLetter(ctx, op, id)
	wantErr(t, "replay while delivering", err, store.ErrNotDead)
	if err := f.s.Outbox().MarkDelivered(ctx, "t1", id, 3); err != nil {
		t.Fatal(err)
	}
	_, err = f.s.Outbox().ReplayDeadLetter(ctx, op, id)
	wantErr(t, "replay delivered", err, store.ErrNotDead)
	if n := len(f.audit("t1")); n != 1 {
		t.Fatalf("%d audit rows, want only the one replay", n)
	}
}
