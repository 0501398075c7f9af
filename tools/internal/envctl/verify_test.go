package envctl

import (
	"context"
	"database/sql"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// populated is a database in every state the services can leave behind: a stream with a gap and an
// envelope ahead of its cursor, a raised floor, an expired payload, and outbox messages pending
// (fresh and retried), delivering, delivered, dead at once, dead after its last attempt, and dead
// again after a replay on an endpoint a 410 disabled.
type populated struct {
	dsn                        string
	epX, epY                   string
	identX, identLast          string // outbound envelopes: topic x (two messages), the last enqueue
	delivered, deadReplayed    string
	deadBudget, retried, held  string
	fresh                      string
	inboundIdentitySeq2        string
	inboundIdentityAheadOfGap5 string
}

func populate(t *testing.T) populated {
	t.Helper()
	ctx := context.Background()
	p := populated{dsn: storetest.NewDatabase(t)}
	s := storetest.Open(t, p.dsn)

	// Inbound (t1, p1, d1): 1, 2, 3 and 5 retained, so the cursor is 3; a floor of 10 on d2.
	priv := addKey(t, p.dsn, "t1", "k1")
	for _, seq := range []int64{1, 2, 3, 5} {
		res := ingest(t, s, priv, "k1", seq, time.Now())
		switch seq {
		case 2:
			p.inboundIdentitySeq2 = res.EventIdentity
		case 5:
			p.inboundIdentityAheadOfGap5 = res.EventIdentity
		}
	}
	if _, err := s.Inbound().SetReplayFloor(ctx, "t1", "p1", "d2", 10); err != nil {
		t.Fatal(err)
	}
	// One payload expires (the janitor's batch of one); its identity stays.
	if n, err := s.Retention().DeleteExpiredPayloads(ctx, time.Now().Add(2*time.Hour), 1); err != nil || n != 1 {
		t.Fatalf("DeleteExpiredPayloads: %d, %v", n, err)
	}

	// Outbound.
	p.epX = addEndpointCLI(t, p.dsn, "t1", "p1", "x", "https://hooks.example.test/x")
	addEndpointCLI(t, p.dsn, "t1", "p1", "x", "https://hooks.example.test/x2")
	p.epY = addEndpointCLI(t, p.dsn, "t1", "p1", "y", "https://hooks.example.test/y")
	rx, identX := enqueue(t, s, "x", "k1", 12)
	ry, _ := enqueue(t, s, "y", "k2", 1)
	p.identX = identX
	p.delivered, p.deadReplayed, p.deadBudget = rx.MessageIDs[0], rx.MessageIDs[1], ry.MessageIDs[0]
	claimOnly(t, s, p.delivered, p.deadReplayed, p.deadBudget)
	must(t, s.Outbox().MarkDelivered(ctx, "t1", p.delivered, 1))
	must(t, s.Outbox().MarkDead(ctx, "t1", p.deadReplayed, 1, store.CodeHTTP4xx, false))
	must(t, s.Outbox().MarkRetry(ctx, "t1", p.deadBudget, 1, time.Now().Add(time.Hour), store.CodeTimeout))
	run(t, p.dsn, "dlq", "replay", "--tenant", "t1", "--id", p.deadReplayed).expect(t, ExitOK, "")
	claimOnly(t, s, p.deadReplayed)
	must(t, s.Outbox().MarkDead(ctx, "t1", p.deadReplayed, 2, store.CodeHTTP410, true))

	r, _ := enqueue(t, s, "y", "k3", 12)
	p.retried = r.MessageIDs[0]
	claimOnly(t, s, p.retried)
	must(t, s.Outbox().MarkRetry(ctx, "t1", p.retried, 1, time.Now().Add(time.Hour), store.CodeHTTP5xx))
	r, _ = enqueue(t, s, "y", "k4", 12)
	p.held = r.MessageIDs[0]
	claimOnly(t, s, p.held)
	r, p.identLast = enqueue(t, s, "y", "k5", 12)
	p.fresh = r.MessageIDs[0]
	return p
}

// breakAsAdmin runs statements in one transaction as the database owner with triggers (and so foreign
// keys) off, the way a careless restore or a hand edit would.
func breakAsAdmin(t *testing.T, dsn string, stmts ...string) {
	t.Helper()
	ctx := context.Background()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	if _, err := tx.ExecContext(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
		t.Fatal(err)
	}
	for _, q := range stmts {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	must(t, tx.Commit())
}

// verifyCounts runs envctl verify and returns its counts, checking the output shape: every invariant
// once, in order, "<name> <count>".
func verifyCounts(t *testing.T, dsn string) (map[string]int64, result) {
	t.Helper()
	r := run(t, dsn, "verify")
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	invs := invariants()
	if len(lines) != len(invs) {
		t.Fatalf("verify printed %d lines, want %d: %q (stderr %q)", len(lines), len(invs), r.stdout, r.stderr)
	}
	counts := map[string]int64{}
	for i, l := range lines {
		var name string
		var n int64
		if _, err := fmt.Sscanf(l, "%s %d", &name, &n); err != nil || name != invs[i].name || l != fmt.Sprintf("%s %d", name, n) {
			t.Fatalf("line %d %q, want %q <count>", i, l, invs[i].name)
		}
		counts[name] = n
	}
	return counts, r
}

func TestVerifyClean(t *testing.T) {
	empty := storetest.NewDatabase(t)
	counts, r := verifyCounts(t, empty)
	r.expect(t, ExitOK, "")
	for name, n := range counts {
		if n != 0 {
			t.Errorf("fresh database: %s %d", name, n)
		}
	}

	p := populate(t)
	counts, r = verifyCounts(t, p.dsn)
	r.expect(t, ExitOK, "")
	if r.stderr != "" {
		t.Errorf("clean verify wrote stderr %q", r.stderr)
	}
	for name, n := range counts {
		if n != 0 {
			t.Errorf("populated database: %s %d", name, n)
		}
	}
	// The population really has the states it claims, so a clean answer means something.
	var states string
	if err := storetest.AdminDB(t, p.dsn).QueryRowContext(context.Background(),
		`SELECT string_agg(status || ':' || attempts || ':' || replays, ',' ORDER BY status, attempts, replays) FROM outbox_messages`).
		Scan(&states); err != nil {
		t.Fatal(err)
	}
	if states != "dead:1:0,dead:2:1,delivered:1:0,delivering:1:0,pending:0:0,pending:1:0" {
		t.Errorf("outbox states %s", states)
	}
}

func TestVerifyBroken(t *testing.T) {
	cases := []struct {
		name  string
		stmts func(p populated) []string
		want  map[string]int64
	}{
		{
			name: "identity deleted under a payload, inside the cursor",
			stmts: func(p populated) []string {
				return []string{`DELETE FROM event_identities WHERE event_identity = decode('` + p.inboundIdentitySeq2 + `', 'hex')`}
			},
			// Sequence 2 is gone, so the cursor (3) is no longer a contiguous run either.
			want: map[string]int64{"payload_without_identity": 1, "cursor_not_contiguous": 1},
		},
		{
			name: "identity deleted under a payload, ahead of the cursor",
			stmts: func(p populated) []string {
				return []string{`DELETE FROM event_identities WHERE event_identity = decode('` + p.inboundIdentityAheadOfGap5 + `', 'hex')`}
			},
			want: map[string]int64{"payload_without_identity": 1},
		},
		{
			name: "cursor bumped",
			stmts: func(populated) []string {
				return []string{`UPDATE streams SET cursor = cursor + 1 WHERE producer_id = 'd1'`}
			},
			want: map[string]int64{"cursor_not_contiguous": 1},
		},
		{
			name: "cursors from an older backup",
			stmts: func(populated) []string {
				return []string{`UPDATE streams SET cursor = 1 WHERE producer_id = 'd1'`, `UPDATE streams SET cursor = 11, replay_floor = 9 WHERE producer_id = 'd2'`}
			},
			want: map[string]int64{"cursor_not_contiguous": 2},
		},
		{
			name:  "stream rows lost",
			stmts: func(populated) []string { return []string{`DELETE FROM streams WHERE producer_id = 'd1'`} },
			want:  map[string]int64{"identity_without_stream": 4},
		},
		{
			name: "outbound envelope dropped",
			stmts: func(p populated) []string {
				return []string{`DELETE FROM outbound_envelopes WHERE event_identity = decode('` + p.identX + `', 'hex')`}
			},
			want: map[string]int64{"message_without_envelope": 2},
		},
		{
			name: "outbound body lost while its messages wait",
			stmts: func(p populated) []string {
				return []string{`DELETE FROM outbound_bodies WHERE event_identity = decode('` + p.identLast + `', 'hex')`}
			},
			want: map[string]int64{"message_in_flight_without_body": 1},
		},
		{
			name: "outbox messages lost",
			stmts: func(p populated) []string {
				return []string{`DELETE FROM outbox_messages WHERE event_identity = decode('` + p.identLast + `', 'hex')`}
			},
			want: map[string]int64{"envelope_without_messages": 1},
		},
		{
			name: "endpoint dropped",
			stmts: func(p populated) []string {
				return []string{`DELETE FROM endpoints WHERE endpoint_id = '` + p.epY + `'`}
			},
			want: map[string]int64{"message_without_endpoint": 4},
		},
		{
			name:  "outbound stream rewound",
			stmts: func(populated) []string { return []string{`UPDATE outbound_streams SET last_sequence = 1`} },
			want:  map[string]int64{"outbound_stream_behind": 4},
		},
		{
			name:  "outbound stream lost",
			stmts: func(populated) []string { return []string{`DELETE FROM outbound_streams`} },
			want:  map[string]int64{"outbound_stream_behind": 5},
		},
		{
			// Settled and delivering messages have been claimed; the fresh and the retried pending
			// ones cannot tell.
			name:  "attempts reset",
			stmts: func(populated) []string { return []string{`UPDATE outbox_messages SET attempts = 0`} },
			// and every recorded attempt is now past its message's counter.
			want: map[string]int64{"attempts_inconsistent": 4, "attempt_without_message": 5},
		},
		{
			// The history restored from a later backup than the messages.
			name: "attempt history ahead of its message",
			stmts: func(p populated) []string {
				return []string{`INSERT INTO outbox_attempts (tenant_id, message_id, attempt, started_at, duration_ms, result)
					 VALUES ('t1', '` + p.delivered + `', 9, now(), 1, 'retry'), ('t1', 'msg_000000000000000000000000', 1, now(), 1, 'retry')`}
			},
			want: map[string]int64{"attempt_without_message": 2},
		},
		{
			name: "budget rewritten",
			stmts: func(p populated) []string {
				return []string{`UPDATE outbox_messages SET max_attempts = 50 WHERE message_id IN ('` + p.fresh + `', '` + p.deadReplayed + `')`}
			},
			want: map[string]int64{"attempts_inconsistent": 2},
		},
		{
			name: "pending without budget",
			stmts: func(p populated) []string {
				return []string{`UPDATE outbox_messages SET attempts = max_attempts WHERE message_id = '` + p.retried + `'`}
			},
			want: map[string]int64{"attempts_inconsistent": 1},
		},
		{
			name: "dead letters without a code, delivered with one",
			stmts: func(p populated) []string {
				return []string{
					`UPDATE outbox_messages SET last_error_code = '' WHERE status = 'dead'`,
					`UPDATE outbox_messages SET last_error_code = 'http_5xx' WHERE message_id = '` + p.delivered + `'`,
				}
			},
			want: map[string]int64{"settlement_inconsistent": 3},
		},
		{
			name: "secret refs past the ownership trigger",
			stmts: func(populated) []string {
				return []string{
					`DELETE FROM secret_ref_owners WHERE secret_ref = 'hooks-y'`,
					`INSERT INTO endpoints (tenant_id, endpoint_id, project_id, topic, url, secret_ref)
					 VALUES ('t2', 'ep_0123456789abcdef01234567', 'p1', 'x', 'https://hooks.example.test/t2', 'hooks-x')`,
				}
			},
			want: map[string]int64{"secret_ref_not_owned": 2},
		},
		{
			// Topic x has one active endpoint (the other was disabled by a 410); 65 more by hand make
			// 66, two past the bound. The ref is t1's already, so only the bound is broken.
			name: "a topic past the fan-out bound",
			stmts: func(populated) []string {
				return []string{`INSERT INTO endpoints (tenant_id, endpoint_id, project_id, topic, url, secret_ref)
					 SELECT 't1', 'ep_' || lpad(to_hex(g), 24, '0'), 'p1', 'x', 'https://hooks.example.test/x', 'hooks-x'
					 FROM generate_series(1, 65) g`}
			},
			want: map[string]int64{"topic_over_endpoint_limit": 2},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p := populate(t)
			breakAsAdmin(t, p.dsn, c.stmts(p)...)
			counts, r := verifyCounts(t, p.dsn)
			r.expect(t, ExitFailure, fmt.Sprintf("%d of %d invariants violated", len(c.want), len(invariants())))
			for _, inv := range invariants() {
				if counts[inv.name] != c.want[inv.name] {
					t.Errorf("%s = %d, want %d", inv.name, counts[inv.name], c.want[inv.name])
				}
			}
		})
	}
}

func TestVerifyRefusals(t *testing.T) {
	// The operator role cannot read payloads: verify says how to run it instead of guessing.
	dsn := storetest.NewDatabase(t)
	r := run(t, storetest.DSNForRole(dsn, "envelopeworker_operator"), "verify")
	r.expect(t, ExitFailure, "permission denied: run verify as the database owner")
	if r.stdout != "" {
		t.Errorf("a failed verify printed counts: %q", r.stdout)
	}
	// An unmigrated database is not "clean".
	r = run(t, storetest.NewEmptyDatabase(t), "verify")
	r.expect(t, ExitFailure, "a table is missing: is the schema migrated")
	r = run(t, "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=5", "verify")
	r.expect(t, ExitFailure, "database unavailable")
}

// The backup procedure of docs/operations.md, end to end: pg_dump (one snapshot of every table) into a
// custom-format file, pg_restore into an empty database in one transaction, then verify. A restore of
// some tables only, with triggers off, is what verify must catch. Needs pg_dump and pg_restore on PATH.
func TestVerifyAfterDumpAndRestore(t *testing.T) {
	p := populate(t)
	dump := filepath.Join(t.TempDir(), "envelopeworker.dump")
	pg := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, out)
		}
	}
	pg("pg_dump", "--format=custom", "--file="+dump, p.dsn)

	restored := storetest.NewEmptyDatabase(t)
	pg("pg_restore", "--exit-on-error", "--single-transaction", "--dbname="+restored, dump)
	counts, r := verifyCounts(t, restored)
	r.expect(t, ExitOK, "")
	for name, n := range counts {
		if n != 0 {
			t.Errorf("restored database: %s %d", name, n)
		}
	}
	// Grants come back with the schema: the operator role reads the restored dead letters.
	r = run(t, storetest.DSNForRole(restored, "envelopeworker_operator"), "dlq", "list", "--tenant", "t1", "--project", "p1")
	r.expect(t, ExitOK, "")
	if strings.Count(r.stdout, "\n") != 2 || !strings.Contains(r.stdout, p.deadReplayed) || !strings.Contains(r.stdout, p.deadBudget) {
		t.Errorf("dead letters after restore: %q", r.stdout)
	}

	// Payloads alone into a migrated database, foreign keys bypassed: three payloads, no identities.
	partial := storetest.NewDatabase(t)
	pg("pg_restore", "--exit-on-error", "--data-only", "--disable-triggers", "--table=inbound_payloads", "--dbname="+partial, dump)
	counts, r = verifyCounts(t, partial)
	r.expect(t, ExitFailure, fmt.Sprintf("1 of %d invariants violated", len(invariants())))
	if counts["payload_without_identity"] != 3 {
		t.Errorf("payload_without_identity %d, want 3", counts["payload_without_identity"])
	}
}
