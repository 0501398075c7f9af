package chaos

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/buildinfo/buildtest"
)

// TestJanitorAcrossPostgresCrash crashes PostgreSQL (immediate stop, crash recovery on start) while a
// retention-janitor run is deleting. The janitor commits without waiting for its WAL flush, so the
// crash may undo its last deletes: the rows they took must come back still expired, the next run must
// delete exactly what is left, and nothing else may change: live payloads, identities, streams.
func TestJanitorAcrossPostgresCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and crashes a PostgreSQL cluster of its own; skipped in -short mode")
	}
	const expired, live = 40_000, 1_000
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cluster := startCluster(ctx, t)
	bin := buildtest.Binary(t, "services/retention-janitor", t.TempDir())
	dsn, err := createDatabase(ctx, cluster, "janitor_crash")
	if err != nil {
		t.Fatal(err)
	}
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	exec1 := func(q string, args ...any) {
		t.Helper()
		if _, err := admin.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec1(`INSERT INTO streams (tenant_id, project_id, producer_id, cursor) VALUES ('t1', 'p1', 'd1', $1)`, expired+live)
	exec1(`INSERT INTO event_identities
		(tenant_id, event_identity, project_id, producer_id, sequence, idempotency_digest, content_digest, key_id, issued_at)
		SELECT 't1', sha256(('e' || i)::bytea), 'p1', 'd1', i, sha256(('i' || i)::bytea), sha256(('c' || i)::bytea), 'k1', now()
		FROM generate_series(1, $1::bigint) AS i`, expired+live)
	exec1(`INSERT INTO inbound_payloads (tenant_id, event_identity, envelope, expires_at)
		SELECT 't1', sha256(('e' || i)::bytea), convert_to(repeat('x', 900) || i, 'UTF8'),
		       CASE WHEN i <= $1::bigint THEN now() - interval '1 day' ELSE now() + interval '1 day' END
		FROM generate_series(1, $2::bigint) AS i`, expired, expired+live)
	exec1(`CHECKPOINT`) // the seed is durable; only the janitor's deletes are at stake
	fingerprint := func() string {
		t.Helper()
		var s string
		if err := admin.QueryRowContext(ctx, `SELECT
			(SELECT count(*) || ':' || md5(string_agg(event_identity::text || sequence, ',' ORDER BY sequence)) FROM event_identities) || '/' ||
			(SELECT count(*) || ':' || md5(string_agg(event_identity::text || envelope::text, ',' ORDER BY event_identity))
			   FROM inbound_payloads WHERE expires_at > now()) || '/' ||
			(SELECT string_agg(tenant_id || project_id || producer_id || cursor || replay_floor, ',') FROM streams)`).Scan(&s); err != nil {
			t.Fatalf("fingerprint: %v", err)
		}
		return s
	}
	left := func() int64 {
		t.Helper()
		var n int64
		if err := admin.QueryRowContext(ctx, `SELECT count(*) FROM inbound_payloads WHERE expires_at <= now()`).Scan(&n); err != nil {
			t.Fatalf("count expired: %v", err)
		}
		return n
	}
	before := fingerprint()
	janitorDSN := roleDSN(cluster.Addr(), "envelopeworker_janitor", "janitor_crash")

	// 5,000 rows/s: the run lasts about 8 s.
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = []string{"DATABASE_URL=" + janitorDSN, "JANITOR_MAX_ROWS_PER_SECOND=5000"}
	var out1 bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out1, &out1
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Crash once a few batches are in: at that pace some 7 s of the run are left.
	if err := waitFor(ctx, func() error {
		if n := left(); n > expired-5_000 {
			return errors.New("janitor has not deleted 5,000 rows yet")
		}
		return nil
	}); err != nil {
		t.Fatalf("janitor run: %v", err) // its output is read only after Wait
	}
	if err := cluster.Restart(ctx, "immediate"); err != nil {
		t.Fatalf("crash and restart PostgreSQL: %v", err)
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	first := janitorSummary(t, out1.String())
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || first.StoppedBy != "error" || first.SyncCommit != "off" {
		t.Fatalf("run during the crash: %v, summary %+v; want exit 1, stopped_by error, synchronous_commit off\n%s", err, first, out1.String())
	}
	// Reconnect after recovery.
	if err := waitFor(ctx, func() error { return admin.PingContext(ctx) }); err != nil {
		t.Fatalf("PostgreSQL after restart: %v", err)
	}
	remaining := left()
	deleted := expired - remaining
	if remaining == 0 || remaining == expired {
		t.Fatalf("%d of %d expired rows left after the crash: the crash did not land mid-run", remaining, expired)
	}
	if got := fingerprint(); got != before {
		t.Fatalf("the crash changed what the janitor must not touch:\n before %s\n after  %s", before, got)
	}

	cmd = exec.CommandContext(ctx, bin)
	cmd.Env = []string{"DATABASE_URL=" + janitorDSN, "JANITOR_MAX_ROWS_PER_SECOND=0"}
	out2, err := cmd.CombinedOutput()
	second := janitorSummary(t, string(out2))
	if err != nil || second.StoppedBy != "done" || second.RowsDeleted != remaining {
		t.Fatalf("run after the crash: %v, summary %+v; want done with %d rows\n%s", err, second, remaining, out2)
	}
	if n := left(); n != 0 {
		t.Fatalf("%d expired rows left after the second run", n)
	}
	if got := fingerprint(); got != before {
		t.Fatalf("the janitor changed what it must not touch:\n before %s\n after  %s", before, got)
	}
	t.Logf("crash mid-run: the first run reported %d rows deleted, %d stayed deleted (%d undone by the crash or never acknowledged); the second run deleted the other %d; %d live payloads and %d identities unchanged",
		first.RowsDeleted, deleted, first.RowsDeleted-deleted, remaining, live, expired+live)
}

type janitorLine struct {
	Msg         string `json:"msg"`
	RowsDeleted int64  `json:"rows_deleted"`
	StoppedBy   string `json:"stopped_by"`
	SyncCommit  string `json:"synchronous_commit"`
}

// janitorSummary is the one "retention summary" line of a run's output.
func janitorSummary(t *testing.T, out string) janitorLine {
	t.Helper()
	var found []janitorLine
	for _, line := range strings.Split(out, "\n") {
		var l janitorLine
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "retention summary" {
			found = append(found, l)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one summary line, got %d in:\n%s", len(found), out)
	}
	return found[0]
}

// waitFor retries f every 100 ms until it succeeds or ctx ends.
func waitFor(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
