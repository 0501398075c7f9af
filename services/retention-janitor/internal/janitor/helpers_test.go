package janitor

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"log/slog"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/envelopeworker/envelopeworker/modules/envflag"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
	"github.com/envelopeworker/envelopeworker/services/retention-janitor/internal/config"
)

const janitorRole = "envelopeworker_janitor"

// fixture is one migrated test database with seeded rows.
type fixture struct {
	adminDSN   string
	janitorDSN string
	admin      *sql.DB
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	dsn := storetest.NewDatabase(t)
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	f := &fixture{adminDSN: dsn, janitorDSN: storetest.DSNForRole(dsn, janitorRole), admin: admin}
	// Rows of every table the janitor must never touch.
	f.exec(t, `INSERT INTO credentials (tenant_id, credential_id, token_digest, account_id, device_id, role)
		VALUES ('t1', 'c1', sha256('tok'::bytea), 'a1', 'd1', 'device')`)
	f.exec(t, `INSERT INTO producer_keys (tenant_id, key_id, public_key, state, retired_at)
		VALUES ('t1', 'k-old', sha256('pk'::bytea), 'retired', now() - interval '200 days')`)
	f.exec(t, `INSERT INTO streams (tenant_id, project_id, producer_id, cursor, replay_floor) VALUES ('t1', 'p1', 'd1', 5, 2)`)
	f.exec(t, `INSERT INTO audit_events (tenant_id, project_id, outcome, reason) VALUES ('t1', 'p1', 'refused', 'bad_signature')`)
	return f
}

func (f *fixture) exec(t testing.TB, q string, args ...any) {
	t.Helper()
	if _, err := f.admin.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func (f *fixture) count(t testing.TB, q string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := f.admin.QueryRow(q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// seed adds identities with sequences from..to of stream (t1, p1, d1) and a
// payload for each: the first expired ones expired a day ago, the rest
// expire in a day. Set-based SQL keeps 100,000 rows to seconds.
func (f *fixture) seed(t testing.TB, from, to, expired int64) {
	t.Helper()
	f.seedTenants(t, from, to, expired, 1)
}

// seedTenants is seed with row i under tenant "t" + i % tenants (t1 when
// tenants is 1), so that the partitioned layout spreads the rows over its
// partitions.
func (f *fixture) seedTenants(t testing.TB, from, to, expired, tenants int64) {
	t.Helper()
	f.exec(t, `INSERT INTO event_identities
		(tenant_id, event_identity, project_id, producer_id, sequence, idempotency_digest, content_digest, key_id, issued_at)
		SELECT `+seedTenant+`, sha256(('e' || i)::bytea), 'p1', 'd1', i, sha256(('i' || i)::bytea), sha256(('c' || i)::bytea), 'k-old', now()
		FROM generate_series($1::bigint, $2::bigint) AS i`, from, to, tenants)
	f.exec(t, `INSERT INTO inbound_payloads (tenant_id, event_identity, envelope, expires_at)
		SELECT `+seedTenant+`, sha256(('e' || i)::bytea), convert_to('{"sequence":' || i || '}', 'UTF8'),
		       CASE WHEN i < $1::bigint + $4::bigint THEN now() - interval '1 day' ELSE now() + interval '1 day' END
		FROM generate_series($1::bigint, $2::bigint) AS i`, from, to, tenants, expired)
}

// seedTenant is row i's tenant of seedTenants ($3: the number of tenants).
const seedTenant = `(CASE WHEN $3::bigint = 1 THEN 't1' ELSE 't' || (i % $3::bigint) END)`

// seedOutbound adds outbound envelopes from..to of tenant t1, each with one
// message of endpoint ep1 and two attempt rows, and a body: delivered a day
// ago past its expiry for the first expired ones, delivered and expiring in
// a day for the rest. held is one more envelope whose body expired but
// whose message was replayed and is pending: the janitor must keep it.
func (f *fixture) seedOutbound(t testing.TB, from, to, expired int64) {
	t.Helper()
	f.exec(t, `INSERT INTO endpoints (tenant_id, endpoint_id, project_id, topic, url, secret_ref)
		VALUES ('t1', 'ep1', 'p1', 'x', 'https://hooks.example.test/', 'sec-1') ON CONFLICT DO NOTHING`)
	f.exec(t, `INSERT INTO outbound_envelopes (tenant_id, event_identity, project_id, producer_id, sequence, topic,
			idempotency_digest, request_digest)
		SELECT 't1', sha256(('o' || i)::bytea), 'p1', 'svc', i, 'x', sha256(('oi' || i)::bytea), sha256(('or' || i)::bytea)
		FROM generate_series($1::bigint, $2::bigint) AS i`, from, to)
	f.exec(t, `INSERT INTO outbox_messages (tenant_id, message_id, project_id, topic, endpoint_id, event_identity, status,
			attempts, max_attempts, budget, next_attempt_at, delivered_at)
		SELECT 't1', 'msg_' || lpad(to_hex(i), 24, '0'), 'p1', 'x', 'ep1', sha256(('o' || i)::bytea),
		       CASE WHEN i = $2::bigint THEN 'pending' ELSE 'delivered' END, 2, 12, 12,
		       CASE WHEN i = $2::bigint THEN now() END, CASE WHEN i < $2::bigint THEN now() - interval '91 days' END
		FROM generate_series($1::bigint, $2::bigint) AS i`, from, to)
	f.exec(t, `INSERT INTO outbox_attempts (tenant_id, message_id, attempt, started_at, duration_ms, result)
		SELECT 't1', 'msg_' || lpad(to_hex(i), 24, '0'), a, now() - interval '91 days', 4, 'retry'
		FROM generate_series($1::bigint, $2::bigint) AS i, generate_series(1, 2) AS a`, from, to)
	f.exec(t, `INSERT INTO outbound_bodies (tenant_id, event_identity, envelope, expires_at)
		SELECT 't1', sha256(('o' || i)::bytea), convert_to('{"o":' || i || '}', 'UTF8'),
		       CASE WHEN i < $1::bigint + $3::bigint OR i = $2::bigint THEN now() - interval '1 day' ELSE now() + interval '1 day' END
		FROM generate_series($1::bigint, $2::bigint) AS i`, from, to, expired)
}

// snapshot fingerprints every table the janitor must leave alone.
func (f *fixture) snapshot(t testing.TB) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, table := range []string{"credentials", "producer_keys", "streams", "event_identities", "audit_events", "schema_migrations",
		"endpoints", "outbound_streams", "outbound_envelopes", "outbox_messages"} {
		var s sql.NullString
		q := `SELECT count(*)::text || ':' || coalesce(md5(string_agg(x::text, ',' ORDER BY x::text)), '') FROM ` + table + ` AS x`
		if err := f.admin.QueryRow(q).Scan(&s); err != nil {
			t.Fatalf("snapshot %s: %v", table, err)
		}
		out[table] = s.String
	}
	return out
}

func (f *fixture) assertUntouched(t testing.TB, before map[string]string) {
	t.Helper()
	after := f.snapshot(t)
	for table, v := range before {
		if after[table] != v {
			t.Errorf("table %s changed: %s -> %s", table, v, after[table])
		}
	}
}

func (f *fixture) payloads(t testing.TB) (expired, live int64) {
	t.Helper()
	return f.count(t, `SELECT count(*) FROM inbound_payloads WHERE expires_at <= now()`),
		f.count(t, `SELECT count(*) FROM inbound_payloads WHERE expires_at > now()`)
}

// grantable: the janitor's role may SET wal_compression, as migration 0004
// grants where the server can (PostgreSQL 15) and the migrator may.
func (f *fixture) grantable(t testing.TB) bool {
	if f.count(t, `SELECT (current_setting('server_version_num')::int >= 150000)::int`) == 0 {
		return false
	}
	return f.count(t, `SELECT has_parameter_privilege($1, 'wal_compression', 'SET')::int`, janitorRole) == 1
}

// serverWALCompression is the setting a session gets without setting it.
func (f *fixture) serverWALCompression(t testing.TB) string {
	t.Helper()
	var v string
	if err := f.admin.QueryRow(`SELECT reset_val FROM pg_settings WHERE name = 'wal_compression'`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// defaultWALCompression is what a janitor run with the default (lz4) uses
// as envelopeworker_janitor: lz4 where it may set it and the server has it.
func (f *fixture) defaultWALCompression(t testing.TB) string {
	t.Helper()
	if f.grantable(t) && f.count(t, `SELECT count(*) FROM pg_settings WHERE name = 'wal_compression' AND 'lz4' = ANY(enumvals)`) == 1 {
		return "lz4"
	}
	return f.serverWALCompression(t)
}

// recorder is the real store with a record of each batch's size.
type recorder struct {
	Deleter
	mu      sync.Mutex
	sizes   []int
	onBatch func(n int) // called after each successful DELETE
}

func (r *recorder) DeleteExpiredPayloads(ctx context.Context, now time.Time, batch int) (int, error) {
	n, err := r.Deleter.DeleteExpiredPayloads(ctx, now, batch)
	if err == nil {
		r.mu.Lock()
		r.sizes = append(r.sizes, n)
		r.mu.Unlock()
		if r.onBatch != nil {
			r.onBatch(n)
		}
	}
	return n, err
}

// summaryLine is the decoded summary log line.
type summaryLine struct {
	Level            string  `json:"level"`
	Msg              string  `json:"msg"`
	RowsDeleted      int64   `json:"rows_deleted"`
	Batches          int     `json:"batches"`
	DurationSeconds  float64 `json:"duration_seconds"`
	StoppedBy        string  `json:"stopped_by"`
	WALCompression   string  `json:"wal_compression"`
	SyncCommit       string  `json:"synchronous_commit"`
	Pushed           bool    `json:"pushed"`
	OutboundBodies   int64   `json:"outbound_bodies_deleted"`
	OutboundAttempts int64   `json:"outbound_attempts_deleted"`
	OutboundBatches  int     `json:"outbound_batches"`
	Error            string  `json:"error"`
}

// runJanitor runs the whole binary's logic and returns its one summary line.
func runJanitor(t testing.TB, ctx context.Context, env map[string]string, args ...string) (summaryLine, string, error) {
	t.Helper()
	var stdout bytes.Buffer
	cfg, err := config.Load(args, envOf(env), &stdout)
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	level, err := envflag.ParseLogLevel(cfg.LogLevel)
	if err != nil {
		t.Fatal(err)
	}
	err = Run(ctx, cfg, slog.New(slog.NewJSONHandler(&stdout, &slog.HandlerOptions{Level: level})))
	var found []summaryLine
	sc := bufio.NewScanner(&stdout)
	raw := stdout.String()
	for sc.Scan() {
		var l summaryLine
		if jerr := json.Unmarshal(sc.Bytes(), &l); jerr != nil {
			t.Fatalf("log line is not JSON: %q", sc.Text())
		}
		if l.Msg == SummaryMessage {
			found = append(found, l)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want exactly one summary line, got %d in:\n%s", len(found), raw)
	}
	return found[0], raw, err
}

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}
