package store_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
	"github.com/jackc/pgx/v5/pgconn"
)

const (
	roleIngest   = "envelopeworker_ingest"
	roleDelivery = "envelopeworker_delivery"
	roleJanitor  = "envelopeworker_janitor"
	roleOperator = "envelopeworker_operator"
)

// refusedStatements must each fail with insufficient_privilege (42501).
var refusedStatements = map[string][]string{
	roleJanitor: {
		`UPDATE inbound_payloads SET expires_at = now()`,
		`INSERT INTO inbound_payloads (tenant_id, event_identity, envelope, expires_at) VALUES ('t', '\x00', '\x00', now())`,
		`SELECT FROM inbound_payloads FOR UPDATE`,
		`TRUNCATE inbound_payloads`,
		`SELECT FROM event_identities`,
		`DELETE FROM event_identities`,
		`SELECT FROM streams`,
		`UPDATE streams SET cursor = 0`,
		`SELECT FROM audit_events`,
		`DELETE FROM audit_events`,
		`SELECT FROM credentials`,
		`SELECT FROM producer_keys`,
		`CREATE TABLE janitor_owned (i int)`,
	},
	roleIngest: {
		`DELETE FROM event_identities`,
		`UPDATE event_identities SET key_id = 'x'`,
		`DELETE FROM audit_events`,
		`UPDATE audit_events SET reason = ''`,
		`SELECT FROM audit_events`,
		`DELETE FROM inbound_payloads`,
		`UPDATE inbound_payloads SET expires_at = now()`,
		`DELETE FROM streams`,
		`INSERT INTO producer_keys (tenant_id, key_id, public_key) VALUES ('t', 'k', '\x00')`,
		`UPDATE producer_keys SET state = 'active'`,
		`DELETE FROM producer_keys`,
		`INSERT INTO credentials (tenant_id, credential_id, token_digest, account_id, device_id, role) VALUES ('t','c','\x00','a','d','device')`,
		`UPDATE credentials SET status = 'active'`,
		`TRUNCATE event_identities`,
		`CREATE TABLE ingest_owned (i int)`,
		`SET wal_compression = pglz`,
	},
	roleOperator: {
		`DELETE FROM event_identities`,
		`UPDATE event_identities SET key_id = 'x'`,
		`INSERT INTO event_identities (tenant_id, event_identity, project_id, producer_id, sequence, idempotency_digest, content_digest, key_id, issued_at) VALUES ('t','\x00','p','d',1,'\x00','\x00','k',now())`,
		`DELETE FROM audit_events`,
		`UPDATE audit_events SET reason = ''`,
		`SELECT FROM inbound_payloads`,
		`DELETE FROM inbound_payloads`,
		`DELETE FROM streams`,
		`DELETE FROM credentials`,
		`TRUNCATE audit_events`,
		// a key's state and times only (0005); the trigger guards the rest for every role
		`UPDATE producer_keys SET public_key = '\x00'`,
		`UPDATE producer_keys SET key_id = 'x'`,
		`UPDATE producer_keys SET tenant_id = 'x'`,
		`UPDATE producer_keys SET created_at = now()`,
		`CREATE TABLE operator_owned (i int)`,
		`SET wal_compression = pglz`,
	},
	roleDelivery: {
		`SELECT FROM credentials`,
		`SELECT FROM producer_keys`,
		`SELECT FROM streams`,
		`SELECT FROM event_identities`,
		`SELECT FROM inbound_payloads`,
		`SELECT FROM audit_events`,
		`INSERT INTO audit_events (tenant_id, outcome) VALUES ('t', 'x')`,
		`CREATE TABLE delivery_owned (i int)`,
		`SET wal_compression = pglz`,
	},
}

func openRole(t *testing.T, dsn, role string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", storetest.DSNForRole(dsn, role))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(2)
	t.Cleanup(func() { db.Close() })
	return db
}

func TestRolesAreRefusedWhatTheyMustNotDo(t *testing.T) {
	f := newFixture(t)
	for role, stmts := range refusedStatements {
		db := openRole(t, f.dsn, role)
		assertRefused(t, db, role, stmts)
		// Readiness needs the schema version, which every role may read.
		var v int
		if err := db.QueryRow(`SELECT max(version) FROM schema_migrations`).Scan(&v); err != nil || v != migrations.Latest() {
			t.Errorf("%s reads schema version %d, %v", role, v, err)
		}
	}
	var publicCreate, publicSelect bool
	if err := f.admin.QueryRow(`SELECT has_schema_privilege('public', 'public', 'CREATE'),
		has_table_privilege('public', 'audit_events', 'SELECT')`).Scan(&publicCreate, &publicSelect); err != nil {
		t.Fatal(err)
	}
	if publicCreate || publicSelect {
		t.Fatalf("PUBLIC keeps privileges: create %v, select %v", publicCreate, publicSelect)
	}
}

// Each binary's role can do its whole job through the store.
func TestRolesCanDoTheirJob(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	operator := storetest.Open(t, storetest.DSNForRole(f.dsn, roleOperator))
	ingest := storetest.Open(t, storetest.DSNForRole(f.dsn, roleIngest))
	janitor := storetest.Open(t, storetest.DSNForRole(f.dsn, roleJanitor))

	token, credID, err := operator.Credentials().IssueCredential(ctx, "t1", "a1", "d1", store.RoleDevice)
	if err != nil {
		t.Fatalf("operator issue: %v", err)
	}
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if err := operator.Credentials().AddKey(ctx, "t1", "k1", pub); err != nil {
		t.Fatalf("operator add key: %v", err)
	}
	if _, err := operator.Inbound().SetReplayFloor(ctx, "t1", "p1", "d1", 0); err != nil {
		t.Fatalf("operator floor: %v", err)
	}

	if v, err := ingest.SchemaVersion(ctx); err != nil || v != migrations.Latest() {
		t.Fatalf("ingest schema version %d, %v", v, err)
	}
	if _, err := ingest.Credentials().VerifyCredential(ctx, token); err != nil {
		t.Fatalf("ingest verify: %v", err)
	}
	if _, err := ingest.Credentials().LookupKey(ctx, "t1", "k1"); err != nil {
		t.Fatalf("ingest lookup key: %v", err)
	}
	in := ev("e1", 1).input()
	in.ExpiresAt = time.Now().Add(-time.Second)
	if r, err := ingest.Inbound().Ingest(ctx, actor("t1", "d1"), in); err != nil || r.Outcome != store.OutcomeAccepted {
		t.Fatalf("ingest: %+v, %v", r, err)
	}
	batchIn := ev("e2", 2).input()
	if _, err := ingest.Inbound().IngestBatch(ctx, []store.BatchItem{{Actor: actor("t1", "d1"), Ingest: &batchIn},
		{Actor: actor("t1", "d1"), Refusal: &store.AuditEntry{Outcome: "refused", Reason: "forbidden"}}}); err != nil {
		t.Fatalf("ingest batch: %v", err)
	}
	if err := ingest.Inbound().Audit(ctx, actor("t1", "d1"), store.AuditEntry{Outcome: "refused", Reason: "route_mismatch"}); err != nil {
		t.Fatalf("ingest audit: %v", err)
	}
	if _, _, err := ingest.Inbound().ReadStream(ctx, "t1", "p1", "d1", 0, 10, 1<<20); err != nil {
		t.Fatalf("ingest read stream: %v", err)
	}
	if _, err := ingest.Inbound().Stream(ctx, "t1", "p1", "d1"); err != nil {
		t.Fatalf("ingest stream: %v", err)
	}
	if _, err := ingest.Credentials().SignedBy(ctx, "t1", in.EventIdentity, in.ContentDigest, "k1"); err != nil {
		t.Fatalf("ingest signed by: %v", err)
	}

	if n, err := janitor.Retention().DeleteExpiredPayloads(ctx, time.Now(), 100); err != nil || n != 1 {
		t.Fatalf("janitor delete: %d, %v", n, err)
	}

	if err := operator.Credentials().RetireKey(ctx, "t1", "k1"); err != nil {
		t.Fatalf("operator retire: %v", err)
	}
	if err := operator.Credentials().RevokeKey(ctx, "t1", "k1"); err != nil {
		t.Fatalf("operator revoke: %v", err)
	}
	if _, err := operator.Credentials().PruneKeys(ctx, time.Hour); err != nil {
		t.Fatalf("operator prune: %v", err)
	}
	if err := operator.Credentials().RevokeCredential(ctx, "t1", credID); err != nil {
		t.Fatalf("operator revoke credential: %v", err)
	}
	if rows, err := operator.Inbound().ListAudit(ctx, store.AuditFilter{TenantID: "t1"}); err != nil || len(rows) != 4 {
		t.Fatalf("operator audit list: %d rows, %v", len(rows), err)
	}
}

// Options.WALCompression is each session's wal_compression. Only the
// janitor's role may set it (migration 0004 grants SET on it, PostgreSQL 15
// on); for any other role every connection fails, with insufficient_privilege.
func TestWALCompressionOption(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	grantable := f.parameterACLs()
	for _, role := range []string{roleJanitor, roleIngest, roleDelivery, roleOperator} {
		s, err := store.Open(ctx, storetest.DSNForRole(f.dsn, role), store.Options{MaxOpenConns: 1, WALCompression: "pglz"})
		if err != nil {
			t.Fatal(err)
		}
		session, err := s.SessionSettings(ctx)
		got := session.WALCompression
		_ = s.Close()
		var pg *pgconn.PgError
		switch {
		case role == roleJanitor && grantable:
			if err != nil || got != "pglz" {
				t.Errorf("%s: wal_compression %q, %v; want pglz", role, got, err)
			}
		case !errors.As(err, &pg) || pg.Code != "42501":
			t.Errorf("%s: wal_compression %q, %v; want insufficient_privilege", role, got, err)
		}
	}
}

// Options.AsyncCommit is a session setting every role may make.
func TestAsyncCommitOption(t *testing.T) {
	f := newFixture(t)
	storetest.Durable(t, f.dsn) // test databases commit asynchronously by default
	ctx := context.Background()
	for _, async := range []bool{false, true} {
		s, err := store.Open(ctx, storetest.DSNForRole(f.dsn, roleJanitor), store.Options{MaxOpenConns: 1, AsyncCommit: async})
		if err != nil {
			t.Fatal(err)
		}
		session, err := s.SessionSettings(ctx)
		got := session.SynchronousCommit
		_ = s.Close()
		if want := map[bool]string{false: "on", true: "off"}[async]; err != nil || got != want {
			t.Errorf("AsyncCommit %v: synchronous_commit %q, %v; want %q", async, got, err, want)
		}
	}
}

// assertRefused runs each statement as role and wants insufficient_privilege
// (42501): refused by a grant, not failing for some other reason.
func assertRefused(t *testing.T, db *sql.DB, role string, stmts []string) {
	t.Helper()
	for _, stmt := range stmts {
		_, err := db.Exec(stmt)
		var pg *pgconn.PgError
		if err == nil {
			t.Errorf("%s may run %q", role, stmt)
		} else if !errors.As(err, &pg) || pg.Code != "42501" {
			t.Errorf("%s: %q failed with %v, want insufficient_privilege", role, stmt, err)
		}
	}
}
