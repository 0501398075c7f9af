package envctl

import (
	"context"
	"database/sql"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// TestOutboxBackfillBodies: bodies an older release wrote into the old
// column move to outbound_bodies in batches, settled envelopes at once and
// in-flight ones on a later run; a second run moves nothing; the usage is
// checked before the database is touched.
func TestOutboxBackfillBodies(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	s := storetest.Open(t, dsn)
	ctx := context.Background()
	addEndpointCLI(t, dsn, "t1", "p1", "x", "https://hooks.example.test/x")
	var ids []string
	for _, k := range []string{"k1", "k2", "k3"} {
		r, _ := enqueue(t, s, "x", k, 3)
		ids = append(ids, r.MessageIDs[0])
	}
	claimOnly(t, s, ids...)
	must(t, s.Outbox().MarkDelivered(ctx, "t1", ids[0], 1))
	must(t, s.Outbox().MarkDead(ctx, "t1", ids[1], 1, store.CodeHTTP4xx, false))
	must(t, s.Outbox().MarkRetry(ctx, "t1", ids[2], 1, time.Now().Add(time.Hour), store.CodeHTTP5xx)) // still in flight
	admin, err := sql.Open("pgx", dsn)
	must(t, err)
	defer admin.Close()
	for _, q := range []string{
		`UPDATE outbound_envelopes o SET envelope = b.envelope FROM outbound_bodies b
		 WHERE b.tenant_id = o.tenant_id AND b.event_identity = o.event_identity`,
		`DELETE FROM outbound_bodies`,
	} {
		if _, err := admin.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	backfill := func(want string, args ...string) {
		t.Helper()
		r := run(t, dsn, append([]string{"outbox", "backfill-bodies"}, args...)...)
		r.expect(t, ExitOK, "")
		var got, exp map[string]int
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
			t.Fatalf("stdout %q: %v", r.stdout, err)
		}
		must(t, json.Unmarshal([]byte(want), &exp))
		for k, v := range exp {
			if got[k] != v {
				t.Fatalf("backfill %v: %s, want %s", args, r.stdout, want)
			}
		}
	}
	backfill(`{"moved":2,"left_in_flight":1,"transactions":3}`, "--batch", "1", "--retention", "720h")
	var expiry time.Time
	must(t, admin.QueryRow(`SELECT b.expires_at FROM outbound_bodies b JOIN outbox_messages m
		ON m.tenant_id = b.tenant_id AND m.event_identity = b.event_identity WHERE m.message_id = $1`, ids[0]).Scan(&expiry))
	var delivered time.Time
	must(t, admin.QueryRow(`SELECT delivered_at FROM outbox_messages WHERE message_id = $1`, ids[0]).Scan(&delivered))
	if !expiry.Equal(delivered.Add(720 * time.Hour)) {
		t.Fatalf("moved body expires %v, want its settle %v + 720h", expiry, delivered)
	}
	backfill(`{"moved":0,"left_in_flight":1}`)
	// The in-flight message is still sent from the old column.
	if _, err := admin.Exec(`UPDATE outbox_messages SET next_attempt_at = now() WHERE message_id = $1`, ids[2]); err != nil {
		t.Fatal(err)
	}
	cs, err := s.Outbox().Claim(ctx, "t1", 10, time.Minute)
	if err != nil || len(cs) != 1 || len(cs[0].Body) == 0 {
		t.Fatalf("claim of the unmoved body: %+v, %v", cs, err)
	}
	must(t, s.Outbox().MarkDelivered(ctx, "t1", ids[2], cs[0].Attempt))
	backfill(`{"moved":1,"left_in_flight":0}`)
	backfill(`{"moved":0,"left_in_flight":0}`)
	var inOld int
	must(t, admin.QueryRow(`SELECT count(*) FROM outbound_envelopes WHERE envelope IS NOT NULL`).Scan(&inOld))
	if inOld != 0 {
		t.Fatalf("%d bodies left in the old column", inOld)
	}

	for _, c := range []struct{ args []string }{
		{[]string{"--batch", "0"}}, {[]string{"--batch", "1001"}}, {[]string{"--pause", "-1s"}}, {[]string{"--retention", "0s"}},
	} {
		run(t, dsn, append([]string{"outbox", "backfill-bodies"}, c.args...)...).expect(t, ExitUsage, "")
	}
}

// TestDLQReplayOfAnExpiredBody: the operator is told the body expired.
func TestDLQReplayOfAnExpiredBody(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	s := storetest.Open(t, dsn)
	ctx := context.Background()
	addEndpointCLI(t, dsn, "t1", "p1", "x", "https://hooks.example.test/x")
	r, _ := enqueue(t, s, "x", "k1", 3)
	id := r.MessageIDs[0]
	claimOnly(t, s, id)
	must(t, s.Outbox().MarkDead(ctx, "t1", id, 1, store.CodeHTTP4xx, false))
	// The settle recorded an attempt row: the janitor deletes it first, then
	// the body.
	for {
		d, err := s.Retention().DeleteExpiredOutbound(ctx, time.Now().Add(store.DefaultOutboxPayloadRetention+time.Hour), 10)
		if err != nil {
			t.Fatal(err)
		}
		if d.Bodies == 0 && d.Attempts == 0 {
			break
		}
	}
	res := run(t, storetest.DSNForRole(dsn, "envelopeworker_operator"), "dlq", "replay", "--tenant", "t1", "--id", id)
	res.expect(t, ExitFailure, "has expired (OUTBOX_PAYLOAD_RETENTION)")
	if strings.Contains(res.stderr, "secret-payload-marker") {
		t.Fatal("the refusal shows the payload")
	}
	// A bulk replay skips it with the same reason: nothing to send, and a
	// second run would not change that.
	bulk := run(t, storetest.DSNForRole(dsn, "envelopeworker_operator"), "dlq", "replay", "--tenant", "t1", "--project", "p1", "--yes")
	bulk.expect(t, ExitOK, "skipped message "+id+": its envelope body expired")
	if !strings.Contains(bulk.stderr, "replayed 0, skipped 1, failed 0") || bulk.stdout != "" {
		t.Fatalf("bulk replay of an expired body: stdout %q, stderr %q", bulk.stdout, bulk.stderr)
	}
}
