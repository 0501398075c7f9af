package envctl

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// jsonLines decodes stdout of a listing: one JSON object a line, nothing else.
func jsonLines(t *testing.T, stdout string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSuffix(stdout, "\n"), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q is not one JSON object: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

func field(ms []map[string]any, k string) []string {
	var out []string
	for _, m := range ms {
		out = append(out, fmt.Sprint(m[k]))
	}
	return out
}

// nextAfter is the cursor a full page printed on stderr, "" when none.
func nextAfter(stderr string) string {
	for _, l := range strings.Split(stderr, "\n") {
		if v, ok := strings.CutPrefix(l, "next_after "); ok {
			return v
		}
	}
	return ""
}

// Every admin test runs envctl as envelopeworker_operator, so a statement beyond its grants fails here.
func operatorDSN(t *testing.T) (admin *store.Store, dsn, ops string) {
	t.Helper()
	dsn = storetest.NewDatabase(t)
	return storetest.Open(t, dsn), dsn, storetest.DSNForRole(dsn, "envelopeworker_operator")
}

func TestEndpointListAndUpdate(t *testing.T) {
	_, _, ops := operatorDSN(t)
	a := addEndpointCLI(t, ops, "t1", "p1", "x", "https://hooks.example.test/a")
	b := addEndpointCLI(t, ops, "t1", "p1", "y", "https://hooks.example.test/b")
	c := addEndpointCLI(t, ops, "t1", "p2", "x", "https://hooks.example.test/c")
	other := addEndpointCLI(t, ops, "t2", "p1", "z", "https://hooks.example.test/other")

	r := run(t, ops, "endpoint", "list", "--tenant", "t1")
	r.expect(t, ExitOK, "")
	all := jsonLines(t, r.stdout)
	want := []string{a, b, c}
	sortStrings(want)
	if got := field(all, "endpoint_id"); strings.Join(got, ",") != strings.Join(want, ",") || r.stderr != "" {
		t.Fatalf("endpoint list: %v (stderr %q), want %v in id order", got, r.stderr, want)
	}
	members := []string{"endpoint_id", "tenant_id", "project_id", "topic", "url", "secret_ref", "state", "disabled_reason", "created_at"}
	for _, m := range all {
		if len(m) != len(members) {
			t.Errorf("endpoint line %v: want exactly %v", m, members)
		}
	}
	r = run(t, ops, "endpoint", "list", "--tenant", "t1", "--project", "p2")
	r.expect(t, ExitOK, "")
	if got := field(jsonLines(t, r.stdout), "endpoint_id"); len(got) != 1 || got[0] != c {
		t.Fatalf("endpoint list --project p2: %v", got)
	}
	// Paging: a full page names its last id; the next page starts after it.
	var paged []string
	after := ""
	for i := 0; i < 5; i++ {
		args := []string{"endpoint", "list", "--tenant", "t1", "--limit", "2"}
		if after != "" {
			args = append(args, "--after", after)
		}
		r = run(t, ops, args...)
		r.expect(t, ExitOK, "")
		paged = append(paged, field(jsonLines(t, r.stdout), "endpoint_id")...)
		if after = nextAfter(r.stderr); after == "" {
			break
		}
	}
	if strings.Join(paged, ",") != strings.Join(want, ",") {
		t.Fatalf("paged endpoint list: %v, want %v", paged, want)
	}

	// Update: URL, then secret ref; printed as endpoint show prints it, state untouched.
	r = run(t, ops, "endpoint", "update", "--tenant", "t1", "--id", a, "--url", "https://hooks2.example.test/a")
	r.expect(t, ExitOK, "")
	got := jsonLines(t, r.stdout)
	if len(got) != 1 || got[0]["url"] != "https://hooks2.example.test/a" || got[0]["secret_ref"] != "hooks-x" || got[0]["state"] != "active" {
		t.Fatalf("endpoint update --url: %q", r.stdout)
	}
	r = run(t, ops, "endpoint", "update", "--tenant", "t1", "--id", a, "--secret-ref", "hooks-renamed")
	r.expect(t, ExitOK, "")
	r = run(t, ops, "endpoint", "show", "--tenant", "t1", "--id", a)
	r.expect(t, ExitOK, "")
	if got := jsonLines(t, r.stdout); got[0]["url"] != "https://hooks2.example.test/a" || got[0]["secret_ref"] != "hooks-renamed" {
		t.Fatalf("endpoint show after update: %q", r.stdout)
	}

	// Refusals. A ref belongs to the first tenant whose endpoint named it: hooks-y is t1's.
	r = run(t, ops, "endpoint", "update", "--tenant", "t2", "--id", other, "--secret-ref", "hooks-y")
	r.expect(t, ExitFailure, "refused: secret ref hooks-y is not tenant t2's")
	r = run(t, ops, "endpoint", "update", "--tenant", "t2", "--id", a, "--url", "https://h.example.test/")
	r.expect(t, ExitFailure, fmt.Sprintf("no endpoint %q in tenant t2", a))
	r = run(t, ops, "endpoint", "update", "--tenant", "t1", "--id", "ep_000000000000000000000000", "--url", "https://h.example.test/")
	r.expect(t, ExitFailure, `no endpoint "ep_000000000000000000000000" in tenant t1`)
	r = run(t, ops, "endpoint", "update", "--tenant", "t1", "--id", a, "--url", "http://user:hunter2@example.test/")
	r.expect(t, ExitUsage, "--url refused")
	if strings.Contains(r.stderr, "hunter2") {
		t.Fatalf("a refused URL was echoed: %q", r.stderr)
	}
	r = run(t, ops, "endpoint", "show", "--tenant", "t1", "--id", a)
	if got := jsonLines(t, r.stdout); got[0]["url"] != "https://hooks2.example.test/a" {
		t.Fatalf("a refused update changed the endpoint: %q", r.stdout)
	}
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

func TestKeyAndCredentialList(t *testing.T) {
	admin, _, ops := operatorDSN(t)
	ctx := context.Background()
	pubs := map[string]string{}
	for _, k := range []string{"k2", "k1", "k3"} {
		pub, _, err := ed25519.GenerateKey(rand.Reader)
		must(t, err)
		pubs[k] = base64.RawURLEncoding.EncodeToString(pub)
		run(t, ops, "key", "add", "--tenant", "t1", "--key-id", k, "--public-key", pubs[k]).expect(t, ExitOK, "")
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	must(t, admin.Credentials().AddKey(ctx, "t2", "k9", pub))
	run(t, ops, "key", "retire", "--tenant", "t1", "--key-id", "k2").expect(t, ExitOK, "")

	r := run(t, ops, "key", "list", "--tenant", "t1")
	r.expect(t, ExitOK, "")
	keys := jsonLines(t, r.stdout)
	if got := field(keys, "key_id"); strings.Join(got, ",") != "k1,k2,k3" {
		t.Fatalf("key list: %v", got)
	}
	for _, k := range keys {
		id := fmt.Sprint(k["key_id"])
		if k["public_key"] != pubs[id] || k["tenant_id"] != "t1" {
			t.Errorf("key %s: %v", id, k)
		}
		if wantRetired := id == "k2"; (k["state"] == "retired") != wantRetired || (k["retired_at"] != nil) != wantRetired {
			t.Errorf("key %s state: %v", id, k)
		}
	}
	r = run(t, ops, "key", "list", "--tenant", "t1", "--limit", "2", "--after", "k1")
	r.expect(t, ExitOK, "next_after k3")
	if got := field(jsonLines(t, r.stdout), "key_id"); strings.Join(got, ",") != "k2,k3" {
		t.Fatalf("key list --after k1: %v", got)
	}

	var tokens []string
	var ids []string
	for _, dev := range []string{"d1", "d2"} {
		tok, id, err := admin.Credentials().IssueCredential(ctx, "t1", "a1", dev, store.RoleDevice)
		must(t, err)
		tokens, ids = append(tokens, tok), append(ids, id)
	}
	_, _, err := admin.Credentials().IssueCredential(ctx, "t2", "a1", "d1", store.RoleDevice)
	must(t, err)
	run(t, ops, "credential", "revoke", "--tenant", "t1", "--id", ids[0]).expect(t, ExitOK, "")
	r = run(t, ops, "credential", "list", "--tenant", "t1")
	r.expect(t, ExitOK, "")
	creds := jsonLines(t, r.stdout)
	if len(creds) != 2 {
		t.Fatalf("credential list: %q", r.stdout)
	}
	for _, tok := range tokens {
		if strings.Contains(r.stdout, tok) || strings.Contains(r.stdout, store.TokenPrefix) {
			t.Fatalf("credential list shows a token: %q", r.stdout)
		}
	}
	members := []string{"credential_id", "tenant_id", "account_id", "device_id", "role", "status", "created_at", "revoked_at"}
	for _, c := range creds {
		if len(c) != len(members) {
			t.Errorf("credential line %v: want exactly %v", c, members)
		}
		revoked := c["credential_id"] == ids[0]
		if (c["status"] == "revoked") != revoked || (c["revoked_at"] != nil) != revoked || c["role"] != "device" {
			t.Errorf("credential %v", c)
		}
	}
	// An unknown tenant has nothing: an empty listing, exit 0.
	r = run(t, ops, "credential", "list", "--tenant", "nobody")
	r.expect(t, ExitOK, "")
	if r.stdout != "" || r.stderr != "" {
		t.Fatalf("credential list of an unknown tenant: %q %q", r.stdout, r.stderr)
	}
}

func TestMigrateStatusAndDryRun(t *testing.T) {
	dsn := storetest.NewEmptyDatabase(t)
	r := run(t, dsn, "migrate", "--dry-run")
	r.expect(t, ExitOK, fmt.Sprintf("dry run: %d migration(s) would be applied; nothing was changed", migrations.Latest()))
	lines := jsonLines(t, r.stdout)
	if len(lines) != migrations.Latest() {
		t.Fatalf("migrate --dry-run on an empty database: %q", r.stdout)
	}
	for i, l := range lines {
		m := migrations.All()[i]
		if l["version"] != float64(m.Version) || l["name"] != m.Name || l["state"] != "pending" ||
			l["embedded_checksum"] != m.Checksum || l["applied_checksum"] != nil {
			t.Errorf("dry-run line %d: %v", i, l)
		}
	}
	s := storetest.Open(t, dsn)
	if v, err := s.SchemaVersion(context.Background()); err != nil || v != 0 {
		t.Fatalf("migrate --dry-run changed the schema: version %d, %v", v, err)
	}

	run(t, dsn, "migrate").expect(t, ExitOK, "")
	r = run(t, dsn, "migrate", "status")
	r.expect(t, ExitOK, "")
	lines = jsonLines(t, r.stdout)
	if len(lines) != migrations.Latest() {
		t.Fatalf("migrate status: %q", r.stdout)
	}
	for _, l := range lines {
		if l["state"] != "applied" || l["applied_checksum"] != l["embedded_checksum"] || l["applied_at"] == nil {
			t.Errorf("status line after migrate: %v", l)
		}
	}
	r = run(t, dsn, "migrate", "--dry-run")
	r.expect(t, ExitOK, "dry run: 0 migration(s) would be applied")
	if r.stdout != "" {
		t.Fatalf("dry run on a current schema: %q", r.stdout)
	}

	// A later release's row is "newer"; an edited file is "modified" and fails status and dry-run.
	db := storetest.AdminDB(t, dsn)
	if _, err := db.Exec(`INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, 'later.sql', 'theirs')`, migrations.Latest()+1); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE schema_migrations SET checksum = 'edited' WHERE version = 1`); err != nil {
		t.Fatal(err)
	}
	r = run(t, dsn, "migrate", "status")
	r.expect(t, ExitFailure, "1 applied migration(s) differ from this build's files")
	lines = jsonLines(t, r.stdout)
	if first, last := lines[0], lines[len(lines)-1]; first["state"] != "modified" || first["applied_checksum"] != "edited" ||
		last["state"] != "newer" || last["name"] != "later.sql" || last["embedded_checksum"] != nil {
		t.Fatalf("status with an edited and a later migration: %v ... %v", first, last)
	}
	run(t, dsn, "migrate", "--dry-run").expect(t, ExitFailure, "migration 1 (0001_init.sql) was applied from a different file")

	// migrate status reads schema_migrations, which the operator role may read.
	run(t, storetest.DSNForRole(dsn, "envelopeworker_operator"), "migrate", "status").expect(t, ExitFailure, "differ")
}

func TestAuditListFilters(t *testing.T) {
	_, dsn, ops := operatorDSN(t)
	db := storetest.AdminDB(t, dsn)
	base := time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)
	// Five rows an hour apart: accepted, refused, accepted, replayed, accepted; one of another tenant.
	for i, o := range []string{"accepted", "refused", "accepted", "replayed", "accepted"} {
		if _, err := db.Exec(`INSERT INTO audit_events (tenant_id, project_id, outcome, correlation_id, at) VALUES ('t1', 'p1', $1, $2, $3)`,
			o, fmt.Sprintf("c%d", i), base.Add(time.Duration(i)*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Exec(`INSERT INTO audit_events (tenant_id, outcome, at) VALUES ('t2', 'accepted', $1)`, base); err != nil {
		t.Fatal(err)
	}
	list := func(args ...string) ([]string, result) {
		t.Helper()
		r := run(t, ops, append([]string{"audit", "list", "--tenant", "t1"}, args...)...)
		r.expect(t, ExitOK, "")
		return field(jsonLines(t, r.stdout), "correlation_id"), r
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "c4,c3,c2,c1,c0"},
		{[]string{"--outcome", "accepted"}, "c4,c2,c0"},
		{[]string{"--since", base.Add(time.Hour).Format(time.RFC3339)}, "c4,c3,c2,c1"},
		{[]string{"--until", base.Add(2 * time.Hour).Format(time.RFC3339)}, "c1,c0"},
		{[]string{"--since", "2026-01-02T01:00:00Z", "--until", "2026-01-02T04:00:00Z", "--outcome", "accepted"}, "c2"},
		{[]string{"--outcome", "revoked"}, ""},
	} {
		got, _ := list(c.args...)
		if strings.Join(got, ",") != c.want {
			t.Errorf("audit list %v: %v, want %s", c.args, got, c.want)
		}
	}
	// Pages of two: the cursor on stderr, and the pages together are the whole list.
	var paged []string
	after := ""
	for i := 0; i < 5; i++ {
		args := []string{"--limit", "2", "--outcome", "accepted"}
		if after != "" {
			args = append(args, "--after", after)
		}
		got, r := list(args...)
		paged = append(paged, got...)
		if after = nextAfter(r.stderr); after == "" {
			break
		}
	}
	if strings.Join(paged, ",") != "c4,c2,c0" {
		t.Fatalf("paged audit list: %v", paged)
	}
}

// deadLetters makes n dead letters of (t1, p1) on endpoint ep with the given code, oldest first.
func deadLetters(t *testing.T, s *store.Store, topic, code string, n int) []string {
	t.Helper()
	var ids []string
	for i := 0; i < n; i++ {
		r, _ := enqueue(t, s, topic, fmt.Sprintf("%s-%s-%d-%d", topic, code, i, time.Now().UnixNano()), 1)
		ids = append(ids, r.MessageIDs[0])
	}
	claimOnly(t, s, ids...)
	for _, id := range ids {
		must(t, s.Outbox().MarkDead(context.Background(), "t1", id, 1, code, false))
	}
	return ids
}

func TestDLQBulkReplay(t *testing.T) {
	admin, dsn, ops := operatorDSN(t)
	ctx := context.Background()
	epX := addEndpointCLI(t, ops, "t1", "p1", "x", "https://hooks.example.test/x")
	addEndpointCLI(t, ops, "t1", "p1", "y", "https://hooks.example.test/y")
	x5xx := deadLetters(t, admin, "x", store.CodeHTTP5xx, 3)
	yTimeout := deadLetters(t, admin, "y", store.CodeTimeout, 2)
	deadCount := func() int {
		dls, _, err := admin.Outbox().ListDeadLetters(ctx, "t1", "p1", store.MaxDeadLetterPage, "")
		must(t, err)
		return len(dls)
	}

	// --dry-run lists the matches and changes nothing.
	r := run(t, ops, "dlq", "replay", "--tenant", "t1", "--project", "p1", "--code", store.CodeHTTP5xx, "--dry-run")
	r.expect(t, ExitOK, "dry run: 3 dead letter(s) would be replayed; nothing was changed")
	if got := field(jsonLines(t, r.stdout), "message_id"); strings.Join(got, ",") != strings.Join(x5xx, ",") {
		t.Fatalf("dry run --code: %v, want %v", got, x5xx)
	}
	r = run(t, ops, "dlq", "replay", "--tenant", "t1", "--project", "p1", "--endpoint", epX, "--limit", "2", "--dry-run")
	r.expect(t, ExitOK, "dry run: 2 dead letter(s)")
	r = run(t, ops, "dlq", "replay", "--tenant", "t1", "--project", "p1", "--since", time.Now().Add(time.Hour).Format(time.RFC3339), "--dry-run")
	r.expect(t, ExitOK, "dry run: 0 dead letter(s)")
	// --since skips what died before it: the first letter died an hour ago.
	if _, err := storetest.AdminDB(t, dsn).Exec(`UPDATE outbox_messages SET dead_at = now() - interval '1 hour' WHERE message_id = $1`, x5xx[0]); err != nil {
		t.Fatal(err)
	}
	r = run(t, ops, "dlq", "replay", "--tenant", "t1", "--project", "p1", "--since", time.Now().Add(-30*time.Minute).Format(time.RFC3339), "--dry-run")
	r.expect(t, ExitOK, "dry run: 4 dead letter(s)")
	if got := field(jsonLines(t, r.stdout), "message_id"); strings.Contains(strings.Join(got, ","), x5xx[0]) {
		t.Fatalf("dry run --since listed a letter that died before: %v", got)
	}
	if deadCount() != 5 {
		t.Fatal("a dry run replayed")
	}

	// Refused without --dry-run or --yes, and with both.
	run(t, ops, "dlq", "replay", "--tenant", "t1", "--project", "p1").expect(t, ExitUsage, "exactly one of --dry-run")
	run(t, ops, "dlq", "replay", "--tenant", "t1", "--project", "p1", "--dry-run", "--yes").expect(t, ExitUsage, "exactly one of --dry-run")
	if deadCount() != 5 {
		t.Fatal("a refused bulk replay replayed")
	}

	// --yes replays the timeouts, each with its own audit row, all of the run's correlation id.
	r = run(t, ops, "dlq", "replay", "--tenant", "t1", "--project", "p1", "--code", store.CodeTimeout, "--yes", "--account", "ops1", "--pace", "1ms")
	r.expect(t, ExitOK, "replayed 2, skipped 0, failed 0; audit correlation id envctl-")
	statuses := jsonLines(t, r.stdout)
	if got := field(statuses, "message_id"); strings.Join(got, ",") != strings.Join(yTimeout, ",") {
		t.Fatalf("bulk replay: %v, want %v", got, yTimeout)
	}
	for _, st := range statuses {
		if st["status"] != store.StatusPending {
			t.Errorf("replayed message %v", st)
		}
	}
	corr := r.stderr[strings.Index(r.stderr, "envctl-"):]
	corr = strings.TrimSpace(corr)
	recs, err := admin.Inbound().ListAudit(ctx, store.AuditFilter{TenantID: "t1", Outcome: store.OutcomeReplayed})
	must(t, err)
	if len(recs) != 2 {
		t.Fatalf("bulk replay of 2 wrote %d audit rows", len(recs))
	}
	for _, rec := range recs {
		if rec.CorrelationID != corr || rec.AccountID != "ops1" || rec.ProjectID != "p1" || rec.EventIdentity == "" {
			t.Errorf("audit row %+v, want correlation id %s, account ops1", rec, corr)
		}
	}
	if deadCount() != 3 {
		t.Fatalf("after replaying 2 of 5, %d dead", deadCount())
	}
	// Nothing left to match: a second run replays none and still succeeds.
	r = run(t, ops, "dlq", "replay", "--tenant", "t1", "--project", "p1", "--code", store.CodeTimeout, "--yes")
	r.expect(t, ExitOK, "replayed 0, skipped 0, failed 0")
}

func TestAdminUsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		msg  string
	}{
		{[]string{"endpoint", "list"}, "--tenant is required"},
		{[]string{"endpoint", "list", "--tenant", "t1", "--limit", "0"}, "--limit 0 is outside 1-1000"},
		{[]string{"endpoint", "list", "--tenant", "t1", "--project", "p/1"}, `--project "p/1" is not a valid identity`},
		{[]string{"endpoint", "list", "--tenant", "t1", "--after", strings.Repeat("e", 65)}, "--after is longer than 64 bytes"},
		{[]string{"endpoint", "list", "--tenant", "t1"}, "DATABASE_URL is not set"},
		{[]string{"endpoint", "update", "--tenant", "t1", "--url", "https://h.test/"}, "--id is required"},
		{[]string{"endpoint", "update", "--tenant", "t1", "--id", "ep_1"}, "nothing to update"},
		{[]string{"endpoint", "update", "--tenant", "t1", "--id", "ep_1", "--url", "http://h.example.test/"}, "--url refused"},
		{[]string{"endpoint", "update", "--tenant", "t1", "--id", "ep_1", "--secret-ref", "whsec_abc"}, "must not be the secret itself"},
		{[]string{"endpoint", "update", "--tenant", "t1", "--id", "ep_1", "--secret-ref", "-bad"}, "--secret-ref is not a valid name"},
		{[]string{"endpoint", "update", "--tenant", "t1", "--id", "ep_1", "--topic", "z"}, "flag provided but not defined: -topic"},
		{[]string{"key", "list"}, "--tenant is required"},
		{[]string{"key", "list", "--tenant", "t1", "--limit", "1001"}, "--limit 1001 is outside 1-1000"},
		{[]string{"credential", "list", "--tenant", "t 1"}, `--tenant "t 1" is not a valid identity`},
		{[]string{"credential", "list", "--tenant", "t1", "extra"}, `unexpected argument "extra"`},
		{[]string{"migrate", "status", "--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"migrate", "status"}, "DATABASE_URL is not set"},
		{[]string{"migrate", "--dry-run"}, "DATABASE_URL is not set"},
		{[]string{"audit", "list", "--tenant", "t1", "--since", "yesterday"}, `--since "yesterday" is not an RFC 3339 time`},
		{[]string{"audit", "list", "--tenant", "t1", "--until", "2026-01-02"}, `--until "2026-01-02" is not an RFC 3339 time`},
		{[]string{"audit", "list", "--tenant", "t1", "--since", "2026-01-02T00:00:00Z", "--until", "2026-01-01T00:00:00Z"}, "--since must be before --until"},
		{[]string{"audit", "list", "--tenant", "t1", "--outcome", "Accepted"}, `--outcome "Accepted" is not an outcome code`},
		{[]string{"audit", "list", "--tenant", "t1", "--after", "abc"}, "--after is not a cursor printed by audit list"},
		{[]string{"audit", "list", "--tenant", "t1", "--after", "0"}, "--after is not a cursor printed by audit list"},
		{[]string{"dlq", "replay", "--tenant", "t1", "--project", "p1"}, "exactly one of --dry-run"},
		{[]string{"dlq", "replay", "--tenant", "t1", "--project", "p1", "--dry-run", "--yes"}, "exactly one of --dry-run"},
		{[]string{"dlq", "replay", "--tenant", "t1", "--project", "p 1", "--dry-run"}, `--project "p 1" is not a valid identity`},
		{[]string{"dlq", "replay", "--tenant", "t1", "--project", "p1", "--code", "http_999", "--dry-run"}, `--code "http_999" is not a delivery error code`},
		{[]string{"dlq", "replay", "--tenant", "t1", "--project", "p1", "--limit", "0", "--dry-run"}, "--limit 0 is outside 1-10000"},
		{[]string{"dlq", "replay", "--tenant", "t1", "--project", "p1", "--since", "now", "--dry-run"}, `--since "now" is not an RFC 3339 time`},
		{[]string{"dlq", "replay", "--tenant", "t1", "--project", "p1", "--pace", "-1s", "--yes"}, "--pace must not be negative"},
		{[]string{"dlq", "replay", "--tenant", "t1", "--project", "p1", "--endpoint", strings.Repeat("e", 65), "--yes"}, "--endpoint is longer than 64 bytes"},
		{[]string{"dlq", "replay", "--tenant", "t1", "--id", "msg_1", "--yes"}, "--yes selects a bulk replay; it cannot be given with --id"},
		{[]string{"dlq", "replay", "--tenant", "t1", "--id", "msg_1", "--project", "p1"}, "--project selects a bulk replay"},
		{[]string{"dlq", "replay", "--tenant", "t1", "--project", "p1", "--yes"}, "DATABASE_URL is not set"},
	}
	for _, c := range cases {
		r := run(t, "", c.args...)
		if r.code != ExitUsage || !strings.Contains(r.stderr, c.msg) || r.stdout != "" || !strings.Contains(r.stderr, "-h' for usage") {
			t.Errorf("envctl %s: code %d stdout %q stderr %q; want exit 2 mentioning %q and usage",
				strings.Join(c.args, " "), r.code, r.stdout, r.stderr, c.msg)
		}
	}
}

// Every leaf command's -h shows an example, and the example names the command itself.
func TestHelpShowsAnExample(t *testing.T) {
	var walk func(prefix []string, cmds []*command)
	n := 0
	walk = func(prefix []string, cmds []*command) {
		for _, c := range cmds {
			p := append(append([]string(nil), prefix...), c.name)
			walk(p, c.subs)
			if c.run == nil {
				continue
			}
			n++
			r := run(t, "", append(p, "-h")...)
			r.expect(t, ExitOK, "")
			name := "envctl " + strings.Join(p, " ")
			i := strings.Index(r.stdout, "\nExample:\n  ")
			if i < 0 || !strings.Contains(r.stdout[i:], name) {
				t.Errorf("%s -h shows no example of itself:\n%s", name, r.stdout)
			}
		}
	}
	walk(nil, commands())
	if n < 25 {
		t.Fatalf("only %d runnable commands", n)
	}
}
