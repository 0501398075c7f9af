package envctl

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

func TestMigrate(t *testing.T) {
	dsn := storetest.NewEmptyDatabase(t)
	r := run(t, dsn, "migrate")
	r.expect(t, ExitOK, "")
	want := fmt.Sprintf("schema is at version %d", migrations.Latest())
	if !strings.HasPrefix(r.stdout, "applied migration(s) 1") || !strings.Contains(r.stdout, want) {
		t.Errorf("first migrate: %q", r.stdout)
	}
	s := storetest.Open(t, dsn)
	if v, err := s.SchemaVersion(context.Background()); err != nil || v != migrations.Latest() {
		t.Fatalf("SchemaVersion = %d, %v; want %d", v, err, migrations.Latest())
	}

	// Idempotent, and --database-url wins over the environment.
	r = run(t, "postgres://nobody@127.0.0.1:1/none?sslmode=disable", "migrate", "--database-url", dsn)
	r.expect(t, ExitOK, "")
	if r.stdout != want+"; nothing to apply\n" {
		t.Errorf("second migrate: %q", r.stdout)
	}
}

// TestMigrateOnNewerSchema: an envctl older than the schema (a later release's migrate Job ran, and
// this one runs again, as in a rollback) applies nothing, says so and succeeds; the later release's
// row and the tables stay as they were.
func TestMigrateOnNewerSchema(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	admin := storetest.AdminDB(t, dsn)
	later := migrations.Latest() + 1
	if _, err := admin.Exec(`INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, 'from_a_later_release.sql', 'not-ours')`, later); err != nil {
		t.Fatal(err)
	}
	snapshot := func() string {
		t.Helper()
		var s string
		if err := admin.QueryRow(`SELECT (SELECT string_agg(version || ' ' || name || ' ' || checksum, ',' ORDER BY version) FROM schema_migrations)
			|| ' / ' || (SELECT string_agg(table_name || '.' || column_name, ',' ORDER BY table_name, column_name)
			FROM information_schema.columns WHERE table_schema = 'public')`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := snapshot()
	r := run(t, dsn, "migrate")
	r.expect(t, ExitOK, "")
	if want := fmt.Sprintf("schema is at version %d, newer than this envctl's %d; nothing to apply\n", later, migrations.Latest()); r.stdout != want {
		t.Errorf("migrate on a newer schema: %q, want %q", r.stdout, want)
	}
	if after := snapshot(); after != before {
		t.Fatalf("migrate changed a newer schema:\n%s\n%s", before, after)
	}
}

// migrate tells the operator when the janitor's role lacks SET on wal_compression (migration 0004
// grants it only where the migrator is a superuser, and its notice never reaches the terminal).
func TestWALCompressionGrantNote(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	db := storetest.AdminDB(t, dsn)
	ctx := context.Background()
	var v15 bool
	if err := db.QueryRow(`SELECT current_setting('server_version_num')::int >= 150000`).Scan(&v15); err != nil {
		t.Fatal(err)
	}
	// The test cluster's migrator is a superuser: the janitor has the grant, and migrate says nothing.
	if note, err := walCompressionGrantNote(ctx, db, "envelopeworker_janitor"); err != nil || note != "" {
		t.Fatalf("janitor role: note %q, %v; want none", note, err)
	}
	r := run(t, dsn, "migrate")
	r.expect(t, ExitOK, "")
	if strings.Contains(r.stderr, "wal_compression") {
		t.Errorf("migrate with the grant in place: stderr %q", r.stderr)
	}
	// A role without it gets the GRANT to run.
	role := fmt.Sprintf("envelopeworker_test_nogrant_%x", time.Now().UnixNano())
	if _, err := db.Exec(`CREATE ROLE ` + role); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec(`DROP ROLE IF EXISTS ` + role) })
	note, err := walCompressionGrantNote(ctx, db, role)
	want := "GRANT SET ON PARAMETER wal_compression TO " + role
	if err != nil || (v15 && !strings.Contains(note, want)) || (!v15 && note != "") {
		t.Fatalf("role without the grant: note %q, %v; want it to say %q on PostgreSQL 15 and later", note, err, want)
	}
}

// migrate names the secret refs that belong to no tenant (several tenants shared them before
// migration 0005, whose notice never reaches the terminal), never the tenants.
func TestMigrateNotesSharedSecretRefs(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	db := storetest.AdminDB(t, dsn)
	r := run(t, dsn, "migrate")
	r.expect(t, ExitOK, "")
	if strings.Contains(r.stderr, "secret ref") {
		t.Fatalf("migrate without shared refs: stderr %q", r.stderr)
	}
	// As the backfill of 0005 leaves them.
	if _, err := db.Exec(`INSERT INTO secret_ref_owners (secret_ref, tenant_id) VALUES ('legacy/b', NULL), ('legacy/a', NULL), ('own', 'tenant-one')`); err != nil {
		t.Fatal(err)
	}
	r = run(t, dsn, "migrate")
	r.expect(t, ExitOK, "note: 2 secret ref(s) were named by endpoints of several tenants and belong to none: legacy/a, legacy/b;")
	if strings.Contains(r.stderr, "own") || strings.Contains(r.stderr, "tenant-one") {
		t.Fatalf("the note names more than the shared refs: %q", r.stderr)
	}
	for i := range maxSharedRefsListed {
		if _, err := db.Exec(`INSERT INTO secret_ref_owners (secret_ref, tenant_id) VALUES ($1, NULL)`, fmt.Sprintf("more/%02d", i)); err != nil {
			t.Fatal(err)
		}
	}
	note, err := sharedSecretRefsNote(context.Background(), db)
	if err != nil || !strings.Contains(note, "note: 22 secret ref(s)") || !strings.Contains(note, "more/17, and 2 more;") {
		t.Fatalf("note with more refs than listed: %q, %v", note, err)
	}
}

func TestUnreachableDatabase(t *testing.T) {
	// Port 1 on loopback refuses at once: a failure after reaching for the database is exit 1.
	dead := "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=5"
	for _, args := range [][]string{
		{"migrate"},
		{"audit", "list", "--tenant", "t1"},
		{"key", "retire", "--tenant", "t1", "--key-id", "k1"},
	} {
		r := run(t, dead, args...)
		if r.code != ExitFailure || r.stdout != "" || !strings.Contains(r.stderr, "envctl "+args[0]) {
			t.Errorf("envctl %s on a dead database: code %d stdout %q stderr %q", strings.Join(args, " "), r.code, r.stdout, r.stderr)
		}
	}
}

// A DSN the driver cannot parse is refused without being echoed: pgx's
// parse error quotes it, masking the user info's password but not the query.
func TestMalformedDatabaseURLIsNotEchoed(t *testing.T) {
	for _, dsn := range []string{
		"postgres://u-1:pw-1@127.0.0.1:1/none?sslmode=bogus&password=pw-2",
		"host=127.0.0.1 port=1 user=u-1 password=pw-1 sslmode=bogus",
	} {
		for _, args := range [][]string{{"migrate"}, {"verify"}, {"audit", "list", "--tenant", "t1"}} {
			r := run(t, dsn, args...)
			if r.code != ExitUsage || !strings.Contains(r.stderr, "not a valid PostgreSQL connection string") {
				t.Errorf("envctl %s: code %d stderr %q", strings.Join(args, " "), r.code, r.stderr)
			}
			if strings.Contains(r.stdout+r.stderr, "pw-") {
				t.Errorf("envctl %s echoed a password: %q", strings.Join(args, " "), r.stderr)
			}
		}
	}
}

func TestCredentialIssueAndRevoke(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	s := storetest.Open(t, dsn)
	ctx := context.Background()

	for _, role := range []string{"device", "service", "operator"} {
		r := run(t, dsn, "credential", "issue", "--tenant", "t1", "--account", "acct-1", "--device", "dev-"+role, "--role", role)
		r.expect(t, ExitOK, "issued credential id ")
		lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
		if len(lines) != 1 || lines[0] == "" || strings.ContainsAny(lines[0], " \t") {
			t.Fatalf("stdout must be the token alone on one line: %q", r.stdout)
		}
		token := lines[0]
		if strings.Contains(r.stderr, token) {
			t.Error("the token leaked to stderr")
		}
		id, err := s.Credentials().VerifyCredential(ctx, token)
		if err != nil {
			t.Fatal(err)
		}
		if id.TenantID != "t1" || id.AccountID != "acct-1" || id.DeviceID != "dev-"+role || string(id.Role) != role {
			t.Errorf("identity %+v", id)
		}
		if !strings.Contains(r.stderr, id.CredentialID) {
			t.Errorf("stderr %q does not name the credential id %s", r.stderr, id.CredentialID)
		}

		// Revocation needs the right tenant.
		run(t, dsn, "credential", "revoke", "--tenant", "t2", "--id", id.CredentialID).expect(t, ExitFailure, "no credential")
		if _, err := s.Credentials().VerifyCredential(ctx, token); err != nil {
			t.Fatalf("revoking in another tenant touched the credential: %v", err)
		}
		r = run(t, dsn, "credential", "revoke", "--tenant", "t1", "--id", id.CredentialID)
		r.expect(t, ExitOK, "")
		if r.stdout != "revoked credential "+id.CredentialID+"\n" {
			t.Errorf("revoke stdout %q", r.stdout)
		}
		if _, err := s.Credentials().VerifyCredential(ctx, token); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("revoked credential verifies: %v", err)
		}
	}
	run(t, dsn, "credential", "revoke", "--tenant", "t1", "--id", "cred_000000000000000000000000").
		expect(t, ExitFailure, `no credential "cred_000000000000000000000000" in tenant t1`)
}

// smallOrderIdentity is the encoding of the neutral point (0, 1): order 1.
var smallOrderIdentity = append([]byte{1}, make([]byte, 31)...)

// nonCanonicalY is y = p = 2^255 - 19, which decodes as y = 0 but is not the canonical encoding.
var nonCanonicalY = append([]byte{0xed}, append(bytes.Repeat([]byte{0xff}, 30), 0x7f)...)

func TestKeyAdd(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	s := storetest.Open(t, dsn)
	ctx := context.Background()
	pub, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}

	unpadded := base64.RawURLEncoding.EncodeToString(pub)
	padded := base64.URLEncoding.EncodeToString(pub)
	for keyID, text := range map[string]string{"k-unpadded": unpadded, "k-padded": padded} {
		r := run(t, dsn, "key", "add", "--tenant", "t1", "--key-id", keyID, "--public-key", text)
		r.expect(t, ExitOK, "")
		if r.stdout != "added key "+keyID+" to tenant t1 (active)\n" {
			t.Errorf("stdout %q", r.stdout)
		}
		k, err := s.Credentials().LookupKey(ctx, "t1", keyID)
		if err != nil {
			t.Fatal(err)
		}
		if !k.PublicKey.Equal(pub) || k.State != store.KeyState("active") {
			t.Errorf("stored key %+v", k)
		}
	}

	// An existing key id is refused, even with the same key; another tenant may use the id.
	run(t, dsn, "key", "add", "--tenant", "t1", "--key-id", "k-padded", "--public-key", unpadded).
		expect(t, ExitFailure, "key id k-padded already exists in tenant t1")
	run(t, dsn, "key", "add", "--tenant", "t2", "--key-id", "k-padded", "--public-key", unpadded).expect(t, ExitOK, "")

	weak := map[string]string{
		"small order":     base64.RawURLEncoding.EncodeToString(smallOrderIdentity),
		"non-canonical":   base64.RawURLEncoding.EncodeToString(nonCanonicalY),
		"31 bytes":        base64.RawURLEncoding.EncodeToString(pub[:31]),
		"33 bytes":        base64.RawURLEncoding.EncodeToString(append(append([]byte(nil), pub...), 0)),
		"standard base64": base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xfb}, 32)),
		"not base64":      "this is not a key",
		"hex":             fmt.Sprintf("%x", []byte(pub)),
	}
	for name, text := range weak {
		r := run(t, dsn, "key", "add", "--tenant", "t1", "--key-id", "k-weak", "--public-key", text)
		if r.code != ExitUsage || !strings.Contains(r.stderr, "public key refused") {
			t.Errorf("%s key: code %d stderr %q", name, r.code, r.stderr)
		}
	}
	if _, err := s.Credentials().LookupKey(ctx, "t1", "k-weak"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a refused key was stored: %v", err)
	}
}

func addKey(t *testing.T, dsn, tenant, keyID string) ed25519.PrivateKey {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	run(t, dsn, "key", "add", "--tenant", tenant, "--key-id", keyID, "--public-key",
		base64.RawURLEncoding.EncodeToString(pub)).expect(t, ExitOK, "")
	return priv
}

func TestKeyLifecycle(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	s := storetest.Open(t, dsn)
	ctx := context.Background()
	addKey(t, dsn, "t1", "k-retire")
	addKey(t, dsn, "t1", "k-revoke")
	addKey(t, dsn, "t1", "k-active")

	r := run(t, dsn, "key", "retire", "--tenant", "t1", "--key-id", "k-retire")
	r.expect(t, ExitOK, "")
	if r.stdout != "key k-retire in tenant t1 is retired\n" {
		t.Errorf("retire stdout %q", r.stdout)
	}
	r = run(t, dsn, "key", "revoke", "--tenant", "t1", "--key-id", "k-revoke")
	r.expect(t, ExitOK, "")
	if r.stdout != "key k-revoke in tenant t1 is revoked\n" {
		t.Errorf("revoke stdout %q", r.stdout)
	}
	for id, state := range map[string]string{"k-retire": "retired", "k-revoke": "revoked", "k-active": "active"} {
		k, err := s.Credentials().LookupKey(ctx, "t1", id)
		if err != nil || string(k.State) != state {
			t.Errorf("%s: state %q, %v; want %s", id, k.State, err, state)
		}
	}
	// Revocation is final: a revoked key cannot be retired.
	run(t, dsn, "key", "retire", "--tenant", "t1", "--key-id", "k-revoke").expect(t, ExitFailure, "cannot be retired")
	run(t, dsn, "key", "retire", "--tenant", "t1", "--key-id", "k-none").expect(t, ExitFailure, "no key k-none in tenant t1")
	run(t, dsn, "key", "revoke", "--tenant", "t2", "--key-id", "k-active").expect(t, ExitFailure, "no key k-active in tenant t2")

	// Keys that signed nothing go at once; the active key stays.
	r = run(t, dsn, "key", "prune")
	r.expect(t, ExitOK, "")
	if r.stdout != "pruned 2 key(s)\n" {
		t.Errorf("prune stdout %q", r.stdout)
	}
	for _, id := range []string{"k-retire", "k-revoke"} {
		if _, err := s.Credentials().LookupKey(ctx, "t1", id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s survived prune: %v", id, err)
		}
	}
	if _, err := s.Credentials().LookupKey(ctx, "t1", "k-active"); err != nil {
		t.Errorf("prune removed an active key: %v", err)
	}
	r = run(t, dsn, "key", "prune", "--replay-window", "1h")
	r.expect(t, ExitOK, "")
	if r.stdout != "pruned 0 key(s)\n" {
		t.Errorf("second prune stdout %q", r.stdout)
	}
}

// A retired key that signed an envelope inside the replay window stays until the window has passed.
func TestKeyPruneKeepsRecentSigners(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	s := storetest.Open(t, dsn)
	priv := addKey(t, dsn, "t1", "k-signer")
	ingest(t, s, priv, "k-signer", 1, time.Now().Add(-48*time.Hour))
	run(t, dsn, "key", "retire", "--tenant", "t1", "--key-id", "k-signer").expect(t, ExitOK, "")

	r := runEnv(t, Env{Getenv: envOf(map[string]string{"DATABASE_URL": dsn, "REPLAY_WINDOW": "72h"})}, "key", "prune")
	r.expect(t, ExitOK, "")
	if r.stdout != "pruned 0 key(s)\n" {
		t.Errorf("prune inside the window (REPLAY_WINDOW=72h): %q", r.stdout)
	}
	// The flag wins over the environment.
	r = runEnv(t, Env{Getenv: envOf(map[string]string{"DATABASE_URL": dsn, "REPLAY_WINDOW": "72h"})}, "key", "prune", "--replay-window", "24h")
	r.expect(t, ExitOK, "")
	if r.stdout != "pruned 1 key(s)\n" {
		t.Errorf("prune after the window (--replay-window 24h): %q", r.stdout)
	}
}

// ingest commits one accepted envelope of stream (t1, p1, d1) through the store, as ingest-api would.
func ingest(t *testing.T, s *store.Store, priv ed25519.PrivateKey, keyID string, seq int64, issued time.Time) store.Result {
	t.Helper()
	e, err := envelope.Sign(envelope.Draft{
		TenantID: "t1", ProjectID: "p1", ProducerID: "d1", EventID: fmt.Sprintf("e-%d", seq),
		IdempotencyKey: fmt.Sprintf("k-%d", seq), KeyID: keyID, Sequence: seq, IssuedAt: issued,
		Metadata: envelope.Metadata{Kind: "test"}, Payload: []byte(`{"secret-payload-marker":1}`),
	}, priv)
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Inbound().Ingest(context.Background(), store.Actor{TenantID: "t1", AccountID: "a1", DeviceID: "d1", CorrelationID: "corr-" + fmt.Sprint(seq)},
		store.IngestInput{
			ProjectID: "p1", ProducerID: "d1", EventIdentity: e.EventIdentity(), KeyID: keyID,
			IdempotencyDigest: e.IdempotencyDigest(), ContentDigest: sha256.Sum256(e.SigningInput()),
			Sequence: seq, IssuedAt: issued, Canonical: e.Canonical(), ExpiresAt: time.Now().Add(time.Hour),
		})
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != "accepted" {
		t.Fatalf("ingest sequence %d: %+v", seq, res)
	}
	return res
}

func TestStreamSetFloorAndShow(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	s := storetest.Open(t, dsn)
	priv := addKey(t, dsn, "t1", "k1")
	stream := []string{"--tenant", "t1", "--project", "p1", "--producer", "d1"}

	r := run(t, dsn, append([]string{"stream", "show"}, stream...)...)
	r.expect(t, ExitOK, "")
	if r.stdout != `{"cursor":0,"replay_floor":0}`+"\n" {
		t.Errorf("a stream never written: %q", r.stdout)
	}

	// Sequences 1 and 7 retained; raising the floor to 5 settles 1..5, so the cursor is 5.
	ingest(t, s, priv, "k1", 1, time.Now())
	ingest(t, s, priv, "k1", 7, time.Now())
	r = run(t, dsn, append([]string{"stream", "set-floor", "--floor", "5"}, stream...)...)
	r.expect(t, ExitOK, "")
	if r.stdout != `{"cursor":5,"replay_floor":5}`+"\n" {
		t.Errorf("set-floor 5: %q", r.stdout)
	}
	// Raising to 6 makes 7 contiguous: the cursor advances through it.
	r = run(t, dsn, append([]string{"stream", "set-floor", "--floor", "6"}, stream...)...)
	r.expect(t, ExitOK, "")
	if r.stdout != `{"cursor":7,"replay_floor":6}`+"\n" {
		t.Errorf("set-floor 6: %q", r.stdout)
	}
	// The same floor again is not lowering.
	run(t, dsn, append([]string{"stream", "set-floor", "--floor", "6"}, stream...)...).expect(t, ExitOK, "")

	r = run(t, dsn, append([]string{"stream", "set-floor", "--floor", "3"}, stream...)...)
	r.expect(t, ExitFailure, "refused: floor 3 is lower than the stream's replay floor 6")
	if r.stdout != "" {
		t.Errorf("a refused set-floor printed %q", r.stdout)
	}
	st, err := s.Inbound().Stream(context.Background(), "t1", "p1", "d1")
	if err != nil || st.ReplayFloor != 6 || st.Cursor != 7 {
		t.Errorf("after a refused lowering: %+v, %v", st, err)
	}
	r = run(t, dsn, append([]string{"stream", "show"}, stream...)...)
	r.expect(t, ExitOK, "")
	if r.stdout != `{"cursor":7,"replay_floor":6}`+"\n" {
		t.Errorf("show: %q", r.stdout)
	}
}

func TestAuditList(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	s := storetest.Open(t, dsn)
	ctx := context.Background()
	priv := addKey(t, dsn, "t1", "k1")
	issued := time.Now()
	accepted := ingest(t, s, priv, "k1", 1, issued)
	if err := s.Inbound().Audit(ctx, store.Actor{TenantID: "t1", AccountID: "a2", DeviceID: "d2", CorrelationID: "corr-x"},
		store.AuditEntry{Outcome: "refused", Reason: "forbidden"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Inbound().Audit(ctx, store.Actor{TenantID: "t1", AccountID: "a3", DeviceID: "d3", CorrelationID: "corr-y"},
		store.AuditEntry{ProjectID: "p2", Outcome: "refused", Reason: "route_mismatch"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Inbound().Audit(ctx, store.Actor{TenantID: "t2", AccountID: "a9", DeviceID: "d9", CorrelationID: "corr-z"},
		store.AuditEntry{ProjectID: "p1", Outcome: "refused", Reason: "forbidden"}); err != nil {
		t.Fatal(err)
	}

	r := run(t, dsn, "audit", "list", "--tenant", "t1")
	r.expect(t, ExitOK, "")
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("want 3 lines for tenant t1, got %q", r.stdout)
	}
	members := []string{"tenant_id", "project_id", "account_id", "device_id", "event_identity", "outcome", "reason", "at", "correlation_id"}
	var rows []map[string]any
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		if len(m) != len(members) {
			t.Errorf("line has members %v, want exactly %v", m, members)
		}
		for _, k := range members {
			if _, ok := m[k]; !ok {
				t.Errorf("line %q lacks %q", l, k)
			}
		}
		at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(m["at"]))
		if err != nil || at.Before(issued.Add(-time.Minute)) || at.After(time.Now().Add(time.Minute)) {
			t.Errorf("at %v: %v", m["at"], err)
		}
		delete(m, "at")
		rows = append(rows, m)
	}
	want := []map[string]any{
		{"tenant_id": "t1", "project_id": "p2", "account_id": "a3", "device_id": "d3", "event_identity": nil,
			"outcome": "refused", "reason": "route_mismatch", "correlation_id": "corr-y"},
		{"tenant_id": "t1", "project_id": nil, "account_id": "a2", "device_id": "d2", "event_identity": nil,
			"outcome": "refused", "reason": "forbidden", "correlation_id": "corr-x"},
		{"tenant_id": "t1", "project_id": "p1", "account_id": "a1", "device_id": "d1", "event_identity": accepted.EventIdentity,
			"outcome": "accepted", "reason": nil, "correlation_id": "corr-1"},
	}
	for i := range want {
		if fmt.Sprint(rows[i]) != fmt.Sprint(want[i]) {
			t.Errorf("row %d (newest first)\n got %v\nwant %v", i, rows[i], want[i])
		}
	}
	if strings.Contains(r.stdout, "secret-payload-marker") || strings.Contains(r.stdout, "k-1") {
		t.Error("audit list shows payload or idempotency key")
	}

	r = run(t, dsn, "audit", "list", "--tenant", "t1", "--project", "p1")
	r.expect(t, ExitOK, "")
	if n := strings.Count(r.stdout, "\n"); n != 1 || !strings.Contains(r.stdout, `"outcome":"accepted"`) {
		t.Errorf("--project p1: %q", r.stdout)
	}
	r = run(t, dsn, "audit", "list", "--tenant", "t1", "--limit", "1")
	r.expect(t, ExitOK, "")
	if n := strings.Count(r.stdout, "\n"); n != 1 || !strings.Contains(r.stdout, `"reason":"route_mismatch"`) {
		t.Errorf("--limit 1: %q", r.stdout)
	}
	r = run(t, dsn, "audit", "list", "--tenant", "t3")
	r.expect(t, ExitOK, "")
	if r.stdout != "" {
		t.Errorf("a tenant without rows: %q", r.stdout)
	}
}

// TestMigrateLayout: --layout chooses the layout of a new database, migrate and migrate status say
// which it is, and a database migrated with one layout refuses the other, dry run included.
func TestMigrateLayout(t *testing.T) {
	part := storetest.NewEmptyDatabase(t)
	r := run(t, part, "migrate", "--layout", "partitioned")
	r.expect(t, ExitOK, "layout: partitioned (large tables hash-partitioned by tenant_id into 8)")
	run(t, part, "migrate", "status").expect(t, ExitOK, "layout: partitioned")
	// The operator may not read schema_layout; status still tells the layout, from the catalog.
	run(t, storetest.DSNForRole(part, "envelopeworker_operator"), "migrate", "status").expect(t, ExitOK, "layout: partitioned")
	// Later migrate Jobs pass no layout and keep it.
	r = run(t, part, "migrate")
	r.expect(t, ExitOK, "layout: partitioned")
	if !strings.HasSuffix(r.stdout, "nothing to apply\n") {
		t.Errorf("migrate of a current partitioned database: %q", r.stdout)
	}
	run(t, part, "migrate", "--layout", "plain").expect(t, ExitFailure, "migrated with another layout; a layout is chosen before the first migration and never changes: it is partitioned, plain was asked for")
	run(t, part, "migrate", "--dry-run", "--layout", "plain").expect(t, ExitFailure, "it is partitioned, plain was asked for; migrate would refuse")
	run(t, part, "migrate", "--dry-run", "--layout", "partitioned").expect(t, ExitOK, "dry run: 0 migration(s) would be applied")

	plain := storetest.NewEmptyDatabase(t)
	run(t, plain, "migrate", "status").expect(t, ExitOK, "layout: none yet")
	run(t, plain, "migrate", "--dry-run", "--layout", "partitioned").expect(t, ExitOK, "would be applied")
	run(t, plain, "migrate").expect(t, ExitOK, "layout: plain")
	run(t, plain, "migrate", "--layout", "partitioned").expect(t, ExitFailure, "it is plain, partitioned was asked for")
	run(t, plain, "migrate", "status").expect(t, ExitOK, "layout: plain")
	db := storetest.AdminDB(t, plain)
	var kind string
	if err := db.QueryRow(`SELECT relkind::text FROM pg_class WHERE relname = 'event_identities'`).Scan(&kind); err != nil || kind != "r" {
		t.Fatalf("event_identities after a refused change: relkind %q, %v; want r", kind, err)
	}

	for _, bad := range []string{"sharded", "Partitioned", "plain,partitioned"} {
		run(t, plain, "migrate", "--layout="+bad).expect(t, ExitUsage, "--layout must be plain or partitioned")
	}
}
