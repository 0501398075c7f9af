package envctl

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// outbox show and outbox attempts, as an operator-role connection runs them.
func TestOutboxShowAndAttempts(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	s := storetest.Open(t, dsn)
	ctx := context.Background()
	ep := addEndpointCLI(t, dsn, "t1", "p1", "x", "https://hooks.example.test/x")
	r1, _ := enqueue(t, s, "x", "k1", 3)
	id := r1.MessageIDs[0]
	ops := storetest.DSNForRole(dsn, "envelopeworker_operator")

	r := run(t, ops, "outbox", "attempts", "--tenant", "t1", "--id", id)
	r.expect(t, ExitOK, "has no recorded attempt yet")
	if r.stdout != "" {
		t.Fatalf("no attempts, but stdout %q", r.stdout)
	}

	claimOnly(t, s, id)
	started := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	if rs, err := s.Outbox().SettleBatch(ctx, "t1", []store.Settlement{{MessageID: id, Attempt: 1, Outcome: store.SettleRetry,
		Next: time.Now().Add(-time.Second), Code: store.CodeHTTP5xx, StartedAt: started, Duration: 250 * time.Millisecond,
		HTTPStatus: 502}}); err != nil || rs[0] != nil {
		t.Fatalf("settle: %v %v", rs, err)
	}
	claimOnly(t, s, id)
	must(t, s.Outbox().MarkRetry(ctx, "t1", id, 2, time.Now().Add(time.Hour), store.CodeConnectFailed))

	r = run(t, ops, "outbox", "show", "--tenant", "t1", "--id", id)
	r.expect(t, ExitOK, "")
	var st map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || strings.Count(r.stdout, "\n") != 1 {
		t.Fatalf("outbox show: %q: %v", r.stdout, err)
	}
	if st["message_id"] != id || st["endpoint_id"] != ep || st["status"] != "pending" || st["attempts"] != 2.0 ||
		st["last_error_code"] != "connect_failed" || st["delivered_at"] != nil || len(st) != 8 {
		t.Fatalf("outbox show: %v", st)
	}

	r = run(t, ops, "outbox", "attempts", "--tenant", "t1", "--id", id)
	r.expect(t, ExitOK, "")
	if r.stderr != "" {
		t.Fatalf("stderr %q", r.stderr)
	}
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if len(lines) != 2 || lines[0] != `{"attempt":1,"started_at":"2026-03-01T12:00:00Z","duration_ms":250,"http_status":502,"error_code":"http_5xx","result":"retry"}` {
		t.Fatalf("outbox attempts: %q", r.stdout)
	}
	var second map[string]any
	if err := json.Unmarshal([]byte(lines[1]), &second); err != nil || second["attempt"] != 2.0 ||
		second["http_status"] != nil || second["error_code"] != "connect_failed" || second["result"] != "retry" || len(second) != 6 {
		t.Fatalf("second attempt %q: %v", lines[1], err)
	}

	for _, cmd := range []string{"show", "attempts"} {
		run(t, ops, "outbox", cmd, "--tenant", "t2", "--id", id).expect(t, ExitFailure, "no message")
		run(t, ops, "outbox", cmd, "--tenant", "t1", "--id", "msg_000000000000000000000000").expect(t, ExitFailure, "no message")
		run(t, ops, "outbox", cmd, "--tenant", "t1").expect(t, ExitUsage, "--id is required")
		run(t, ops, "outbox", cmd, "--id", id).expect(t, ExitUsage, "--tenant is required")
		run(t, ops, "outbox", cmd, "--tenant", "t1", "--id", strings.Repeat("x", 65)).expect(t, ExitUsage, "not a message id")
		run(t, ops, "outbox", cmd, "--tenant", "t1", "--id", id, "extra").expect(t, ExitUsage, "unexpected argument")
		run(t, "", "outbox", cmd, "--tenant", "t1", "--id", id).expect(t, ExitUsage, "DATABASE_URL is not set")
		if r := run(t, "", "outbox", cmd, "-h"); r.code != ExitOK || !strings.Contains(r.stdout, "--tenant T --id M") {
			t.Fatalf("outbox %s -h: %+v", cmd, r)
		}
	}
	if r := run(t, "", "outbox", "-h"); r.code != ExitOK || !strings.Contains(r.stdout, "attempts") || !strings.Contains(r.stdout, "show") {
		t.Fatalf("outbox -h: %+v", r)
	}
}
