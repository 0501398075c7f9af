package envctl

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

var endpointIDPattern = regexp.MustCompile(`^ep_[0-9a-f]{24}$`)

// addEndpointCLI registers an endpoint through envctl and returns the id it printed.
func addEndpointCLI(t *testing.T, dsn, tenant, project, topic, url string) string {
	t.Helper()
	r := run(t, dsn, "endpoint", "add", "--tenant", tenant, "--project", project, "--topic", topic,
		"--url", url, "--secret-ref", "hooks-"+topic)
	r.expect(t, ExitOK, "added endpoint ")
	id := strings.TrimSuffix(r.stdout, "\n")
	if !endpointIDPattern.MatchString(id) {
		t.Fatalf("endpoint add must print the id alone on one line: %q", r.stdout)
	}
	return id
}

var serviceActor = store.Actor{TenantID: "t1", AccountID: "a1", DeviceID: "svc1", CorrelationID: "corr-enqueue"}

// enqueue stores one outbound envelope for (t1, p1, topic) through the store, as ingest-api's
// POST /v1/outbox would; the envelope is a stand-in (the store does not parse it).
func enqueue(t *testing.T, s *store.Store, topic, key string, maxAttempts int) (store.EnqueueResult, string) {
	t.Helper()
	var identity string
	res, err := s.Outbox().Enqueue(context.Background(), serviceActor, store.EnqueueRequest{
		ProjectID: "p1", ProducerID: "svc1", Topic: topic,
		IdempotencyDigest: sha256.Sum256([]byte("t1\np1\n" + key)),
		RequestDigest:     sha256.Sum256([]byte(key)),
		MaxAttempts:       maxAttempts,
		Build: func(seq int64) ([]byte, string, error) {
			nonce := make([]byte, 16)
			if _, err := rand.Read(nonce); err != nil {
				return nil, "", err
			}
			sum := sha256.Sum256(nonce)
			identity = hex.EncodeToString(sum[:])
			return []byte(fmt.Sprintf(`{"event_id":"%x","payload":{"secret-payload-marker":1},"sequence":%d}`, nonce, seq)), identity, nil
		},
	})
	if err != nil {
		t.Fatalf("Enqueue %s: %v", key, err)
	}
	return res, identity
}

// claimOnly claims every due message of t1 and checks it is exactly want.
func claimOnly(t *testing.T, s *store.Store, want ...string) {
	t.Helper()
	cs, err := s.Outbox().Claim(context.Background(), "t1", store.MaxClaim, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, c := range cs {
		got[c.MessageID] = true
	}
	for _, id := range want {
		if !got[id] {
			t.Fatalf("claim got %v, want %v", got, want)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("claim got %v, want %v", got, want)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestEndpointAddEnableDisable(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	s := storetest.Open(t, dsn)
	ctx := context.Background()

	id := addEndpointCLI(t, dsn, "t1", "p1", "task.proposals", "https://hooks.example.test/in?x=1")
	e, err := s.Outbox().GetEndpoint(ctx, "t1", id)
	if err != nil {
		t.Fatal(err)
	}
	if e.ProjectID != "p1" || e.Topic != "task.proposals" || e.URL != "https://hooks.example.test/in?x=1" ||
		e.SecretRef != "hooks-task.proposals" || e.State != store.EndpointActive || e.DisabledReason != "" {
		t.Errorf("stored endpoint %+v", e)
	}
	// Plain http only for the contract's loopback hosts.
	for _, u := range []string{"http://127.0.0.1:8080/hook", "http://127.9.9.9/hook", "http://[::1]:9000/", "http://localhost/hook"} {
		addEndpointCLI(t, dsn, "t1", "p1", "loop", u)
	}

	show := func(id string) map[string]any {
		t.Helper()
		r := run(t, dsn, "endpoint", "show", "--tenant", "t1", "--id", id)
		r.expect(t, ExitOK, "")
		var m map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &m); err != nil || strings.Count(r.stdout, "\n") != 1 {
			t.Fatalf("show: %q, %v", r.stdout, err)
		}
		return m
	}
	m := show(id)
	if m["endpoint_id"] != id || m["state"] != "active" || m["disabled_reason"] != nil || m["url"] != e.URL ||
		m["secret_ref"] != "hooks-task.proposals" || m["topic"] != "task.proposals" || m["project_id"] != "p1" || len(m) != 9 {
		t.Errorf("show: %v", m)
	}

	r := run(t, dsn, "endpoint", "disable", "--tenant", "t1", "--id", id)
	r.expect(t, ExitOK, "")
	if r.stdout != "endpoint "+id+" in tenant t1 is disabled\n" {
		t.Errorf("disable stdout %q", r.stdout)
	}
	if m := show(id); m["state"] != "disabled" || m["disabled_reason"] != "operator" {
		t.Errorf("after disable: %v", m)
	}
	// A disabled endpoint takes no new messages.
	req := store.EnqueueRequest{ProjectID: "p1", ProducerID: "svc1", Topic: "task.proposals", MaxAttempts: 1,
		Build: func(int64) ([]byte, string, error) { return nil, "", errors.New("must not build") }}
	if _, err := s.Outbox().Enqueue(ctx, serviceActor, req); !errors.Is(err, store.ErrNoEndpoint) {
		t.Errorf("enqueue to a disabled endpoint: %v", err)
	}
	// Disabling twice is not an error; enabling clears the reason.
	run(t, dsn, "endpoint", "disable", "--tenant", "t1", "--id", id).expect(t, ExitOK, "")
	r = run(t, dsn, "endpoint", "enable", "--tenant", "t1", "--id", id)
	r.expect(t, ExitOK, "")
	if r.stdout != "endpoint "+id+" in tenant t1 is active\n" {
		t.Errorf("enable stdout %q", r.stdout)
	}
	if m := show(id); m["state"] != "active" || m["disabled_reason"] != nil {
		t.Errorf("after enable: %v", m)
	}

	// Another tenant's endpoint, and unknown or malformed ids, are not found: exit 1, nothing changes.
	for _, args := range [][]string{
		{"endpoint", "disable", "--tenant", "t2", "--id", id},
		{"endpoint", "enable", "--tenant", "t1", "--id", "ep_000000000000000000000000"},
		{"endpoint", "disable", "--tenant", "t1", "--id", "not-an-id"},
		{"endpoint", "show", "--tenant", "t2", "--id", id},
	} {
		r := run(t, dsn, args...)
		if r.code != ExitFailure || r.stdout != "" || !strings.Contains(r.stderr, "no endpoint ") {
			t.Errorf("envctl %s: code %d stdout %q stderr %q", strings.Join(args, " "), r.code, r.stdout, r.stderr)
		}
	}
	if m := show(id); m["state"] != "active" {
		t.Errorf("a refused disable changed the endpoint: %v", m)
	}
}

// A refused endpoint is refused before the database (exit 2), stores nothing and never echoes the URL,
// which may carry a password.
func TestEndpointAddRefusals(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	admin := storetest.AdminDB(t, dsn)
	base := []string{"endpoint", "add", "--tenant", "t1", "--project", "p1", "--topic", "x", "--secret-ref", "ref"}
	cases := []struct {
		url, secretRef, topic, msg string
	}{
		{"http://hooks.example.test/in", "", "", "http is allowed only for loopback hosts"},
		{"http://10.0.0.1/in", "", "", "http is allowed only for loopback hosts"},
		{"http://[::ffff:127.0.0.1]/in", "", "", "http is allowed only for loopback hosts"},
		{"https://user:hunter2-password@hooks.example.test/in", "", "", "user info not allowed"},
		{"https://hooks.example.test/in#frag-hunter2-password", "", "", "fragment not allowed"},
		{"ftp://hooks.example.test/in", "", "", "scheme must be https"},
		{"hooks.example.test/in", "", "", "--url refused"},
		{"https:///in", "", "", "host missing"},
		{"https://hooks.example.test/in", "whsec_aHVudGVyMi1wYXNzd29yZA", "", "must not be the secret itself"},
		{"https://hooks.example.test/in", "whsk_aHVudGVyMi1wYXNzd29yZA", "", "must not be the secret itself"},
		{"https://hooks.example.test/in", "bad ref hunter2-password", "", "--secret-ref is not a valid name"},
		{"https://hooks.example.test/in", "", "bad topic", `--topic "bad topic" is not a valid topic`},
	}
	for _, c := range cases {
		args := append(append([]string(nil), base...), "--url", c.url)
		if c.secretRef != "" {
			args = append(args, "--secret-ref", c.secretRef)
		}
		if c.topic != "" {
			args = append(args, "--topic", c.topic)
		}
		r := run(t, dsn, args...)
		if r.code != ExitUsage || r.stdout != "" || !strings.Contains(r.stderr, c.msg) {
			t.Errorf("url %q ref %q topic %q: code %d stdout %q stderr %q; want exit 2 mentioning %q",
				c.url, c.secretRef, c.topic, r.code, r.stdout, r.stderr, c.msg)
		}
		if strings.Contains(r.stderr, "hunter2") || strings.Contains(r.stderr, "aHVudGVy") {
			t.Errorf("a refusal echoed a secret: %q", r.stderr)
		}
	}
	var n int
	if err := admin.QueryRowContext(context.Background(), `SELECT count(*) FROM endpoints`).Scan(&n); err != nil || n != 0 {
		t.Errorf("refused endpoints stored: %d, %v", n, err)
	}
}

// A secret ref belongs to the first tenant whose endpoint names it: another tenant's endpoint add is
// refused (exit 1) with a message that does not name the owner, and stores nothing.
func TestEndpointAddRefusesAnotherTenantsSecretRef(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	admin := storetest.AdminDB(t, dsn)
	add := func(tenant, topic string) result {
		return run(t, dsn, "endpoint", "add", "--tenant", tenant, "--project", "p1", "--topic", topic,
			"--url", "https://hooks.example.test/"+topic, "--secret-ref", "prod/hooks")
	}
	add("tenant-owner", "x").expect(t, ExitOK, "added endpoint ")
	add("tenant-owner", "y").expect(t, ExitOK, "added endpoint ")
	r := add("tenant-other", "x")
	r.expect(t, ExitFailure, "refused: secret ref prod/hooks is not tenant tenant-other's: another tenant's endpoints name it")
	if r.stdout != "" || strings.Contains(r.stderr, "tenant-owner") {
		t.Fatalf("refusal: stdout %q stderr %q; want no id and no owner", r.stdout, r.stderr)
	}
	var n int
	if err := admin.QueryRowContext(context.Background(), `SELECT count(*) FROM endpoints WHERE tenant_id = 'tenant-other'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("refused endpoint stored: %d, %v", n, err)
	}
	add("tenant-other", "z").expect(t, ExitFailure, "is not tenant tenant-other's")
}

// Contract §8.12: `endpoint add` and `endpoint enable` refuse a 65th active endpoint of a topic
// with a message that names the topic and the bound, exit 1, and print no id.
func TestEndpointAddAndEnableRefuseA65thActive(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	s, admin := storetest.Open(t, dsn), storetest.AdminDB(t, dsn)
	ctx := context.Background()
	parked := addEndpointCLI(t, dsn, "t1", "p1", "wide", "https://hooks.example.test/parked")
	run(t, dsn, "endpoint", "disable", "--tenant", "t1", "--id", parked).expect(t, ExitOK, "")
	var first string
	for i := range store.MaxTopicEndpoints - 1 {
		id, err := s.Outbox().AddEndpoint(ctx, store.Endpoint{TenantID: "t1", ProjectID: "p1", Topic: "wide",
			URL: fmt.Sprintf("https://hooks.example.test/wide/%d", i), SecretRef: "hooks-wide"})
		must(t, err)
		if i == 0 {
			first = id
		}
	}
	addEndpointCLI(t, dsn, "t1", "p1", "wide", "https://hooks.example.test/64th")

	const full = "refused: topic wide of tenant t1, project p1 has 64 active endpoints, the most allowed"
	r := run(t, dsn, "endpoint", "add", "--tenant", "t1", "--project", "p1", "--topic", "wide",
		"--url", "https://hooks.example.test/65th", "--secret-ref", "hooks-wide")
	r.expect(t, ExitFailure, full)
	if r.stdout != "" || !strings.Contains(r.stderr, "disable one first") {
		t.Fatalf("65th add: stdout %q stderr %q; want no id and what to do", r.stdout, r.stderr)
	}
	r = run(t, dsn, "endpoint", "enable", "--tenant", "t1", "--id", parked)
	r.expect(t, ExitFailure, full)
	if r.stdout != "" {
		t.Fatalf("refused enable printed %q", r.stdout)
	}
	if e, err := s.Outbox().GetEndpoint(ctx, "t1", parked); err != nil || e.State != store.EndpointDisabled {
		t.Fatalf("refused enable changed the endpoint: %+v, %v", e, err)
	}
	var n int
	must(t, admin.QueryRowContext(ctx, `SELECT count(*) FROM endpoints WHERE tenant_id = 't1' AND topic = 'wide' AND state = 'active'`).Scan(&n))
	if n != store.MaxTopicEndpoints {
		t.Fatalf("%d active endpoints after the refusals, want %d", n, store.MaxTopicEndpoints)
	}
	// Another topic is not affected; a freed slot can be taken by enable.
	addEndpointCLI(t, dsn, "t1", "p1", "narrow", "https://hooks.example.test/narrow")
	run(t, dsn, "endpoint", "disable", "--tenant", "t1", "--id", first).expect(t, ExitOK, "")
	run(t, dsn, "endpoint", "enable", "--tenant", "t1", "--id", parked).expect(t, ExitOK, "")
	run(t, dsn, "endpoint", "enable", "--tenant", "t1", "--id", first).expect(t, ExitFailure, full)
}

func TestDLQListAndReplay(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	s := storetest.Open(t, dsn)
	ctx := context.Background()
	epX := addEndpointCLI(t, dsn, "t1", "p1", "x", "https://hooks.example.test/x")
	epY := addEndpointCLI(t, dsn, "t1", "p1", "y", "https://hooks.example.test/y")

	r1, ident1 := enqueue(t, s, "x", "k1", 3)
	r2, _ := enqueue(t, s, "y", "k2", 1)
	r3, _ := enqueue(t, s, "y", "k3", 5)
	m1, m2, m3 := r1.MessageIDs[0], r2.MessageIDs[0], r3.MessageIDs[0]
	claimOnly(t, s, m1, m2, m3)
	must(t, s.Outbox().MarkDead(ctx, "t1", m1, 1, store.CodeHTTP410, true))
	must(t, s.Outbox().MarkRetry(ctx, "t1", m2, 1, time.Now().Add(time.Hour), store.CodeTimeout)) // last attempt: dead
	must(t, s.Outbox().MarkDelivered(ctx, "t1", m3, 1))

	list := func(args ...string) ([]map[string]any, result) {
		t.Helper()
		r := run(t, dsn, append([]string{"dlq", "list", "--tenant", "t1", "--project", "p1"}, args...)...)
		r.expect(t, ExitOK, "")
		var out []map[string]any
		for _, l := range strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n") {
			if l == "" {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("line %q: %v", l, err)
			}
			out = append(out, m)
		}
		return out, r
	}
	all, r := list()
	if len(all) != 2 || r.stderr != "" {
		t.Fatalf("dlq list: %q stderr %q", r.stdout, r.stderr)
	}
	members := []string{"message_id", "endpoint_id", "topic", "attempts", "error_code", "created_at", "dead_at"}
	for _, m := range all {
		if len(m) != len(members) {
			t.Errorf("dead letter %v: want exactly %v", m, members)
		}
		for _, k := range []string{"created_at", "dead_at"} {
			if _, err := time.Parse(time.RFC3339Nano, fmt.Sprint(m[k])); err != nil {
				t.Errorf("%s %v: %v", k, m[k], err)
			}
		}
	}
	// Oldest death first.
	want := []map[string]any{
		{"message_id": m1, "endpoint_id": epX, "topic": "x", "attempts": 1.0, "error_code": "http_410"},
		{"message_id": m2, "endpoint_id": epY, "topic": "y", "attempts": 1.0, "error_code": "timeout"},
	}
	for i, w := range want {
		for k, v := range w {
			if all[i][k] != v {
				t.Errorf("dead letter %d: %s = %v, want %v", i, k, all[i][k], v)
			}
		}
	}
	if strings.Contains(r.stdout, "secret-payload-marker") {
		t.Error("dlq list shows a payload")
	}

	// Paging: the cursor goes to stderr, stdout stays one object per dead letter.
	page, r := list("--limit", "1")
	if len(page) != 1 || page[0]["message_id"] != m1 || !strings.HasPrefix(r.stderr, "next_after ") {
		t.Fatalf("first page: %q stderr %q", r.stdout, r.stderr)
	}
	cursor := strings.TrimSpace(strings.TrimPrefix(r.stderr, "next_after "))
	page, r = list("--limit", "1", "--after", cursor)
	if len(page) != 1 || page[0]["message_id"] != m2 || r.stderr != "" {
		t.Fatalf("second page: %q stderr %q", r.stdout, r.stderr)
	}
	run(t, dsn, "dlq", "list", "--tenant", "t1", "--project", "p1", "--after", "bogus!").
		expect(t, ExitUsage, "--after is not a cursor printed by dlq list")
	for _, args := range [][]string{{"--tenant", "t2", "--project", "p1"}, {"--tenant", "t1", "--project", "p2"}} {
		r := run(t, dsn, append([]string{"dlq", "list"}, args...)...)
		r.expect(t, ExitOK, "")
		if r.stdout != "" {
			t.Errorf("dlq list %v shows another tenant's or project's dead letters: %q", args, r.stdout)
		}
	}

	// Replay: back to pending, attempts kept, audited with the envelope's identity.
	r = run(t, dsn, "dlq", "replay", "--tenant", "t1", "--id", m1, "--account", "ops-1")
	r.expect(t, ExitOK, "replayed message "+m1)
	var st map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || strings.Count(r.stdout, "\n") != 1 {
		t.Fatalf("replay stdout %q: %v", r.stdout, err)
	}
	if st["message_id"] != m1 || st["endpoint_id"] != epX || st["topic"] != "x" || st["status"] != "pending" ||
		st["attempts"] != 1.0 || st["last_error_code"] != "http_410" || st["delivered_at"] != nil || len(st) != 8 {
		t.Errorf("replay status %v", st)
	}
	if _, err := time.Parse(time.RFC3339Nano, fmt.Sprint(st["next_attempt_at"])); err != nil {
		t.Errorf("next_attempt_at %v: %v", st["next_attempt_at"], err)
	}
	corr := regexp.MustCompile(`audit correlation id (envctl-[0-9a-f]{24})`).FindStringSubmatch(r.stderr)
	if corr == nil {
		t.Fatalf("stderr %q names no correlation id", r.stderr)
	}
	recs, err := s.Inbound().ListAudit(ctx, store.AuditFilter{TenantID: "t1", Limit: 1})
	if err != nil || len(recs) != 1 {
		t.Fatalf("audit: %v %v", recs, err)
	}
	if a := recs[0]; a.Outcome != "replayed" || a.EventIdentity != ident1 || a.AccountID != "ops-1" ||
		a.CorrelationID != corr[1] || a.ProjectID != "p1" {
		t.Errorf("replay audit row %+v (event identity %s)", a, ident1)
	}
	if page, _ := list(); len(page) != 1 || page[0]["message_id"] != m2 {
		t.Errorf("a replayed message stays on the dead-letter list: %v", page)
	}
	// The 410 disabled epX; the replayed message waits until the endpoint is enabled.
	claimOnly(t, s)
	run(t, dsn, "endpoint", "enable", "--tenant", "t1", "--id", epX).expect(t, ExitOK, "")
	claimOnly(t, s, m1)

	// Refusals: not dead (names the status), unknown, another tenant's.
	cases := []struct {
		args []string
		msg  string
	}{
		{[]string{"--tenant", "t1", "--id", m1}, "refused: message " + m1 + " is not dead (status delivering)"},
		{[]string{"--tenant", "t1", "--id", m3}, "is not dead (status delivered)"},
		{[]string{"--tenant", "t1", "--id", "msg_000000000000000000000000"}, `no message "msg_000000000000000000000000" in tenant t1`},
		{[]string{"--tenant", "t2", "--id", m2}, `no message "` + m2 + `" in tenant t2`},
	}
	for _, c := range cases {
		r := run(t, dsn, append([]string{"dlq", "replay"}, c.args...)...)
		if r.code != ExitFailure || r.stdout != "" || !strings.Contains(r.stderr, c.msg) {
			t.Errorf("dlq replay %v: code %d stdout %q stderr %q; want exit 1 mentioning %q", c.args, r.code, r.stdout, r.stderr, c.msg)
		}
	}
	if st, err := s.Outbox().OutboxMessage(ctx, "t1", m2); err != nil || st.Status != "dead" {
		t.Errorf("another tenant's replay touched %s: %+v %v", m2, st, err)
	}
	if recs, err := s.Inbound().ListAudit(ctx, store.AuditFilter{TenantID: "t1", Limit: 10}); err != nil || len(recs) != 1 {
		t.Errorf("refused replays wrote audit rows: %d, %v", len(recs), err)
	}
}

func TestOutboxUsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		msg  string
	}{
		{[]string{"endpoint"}, "Usage: envctl endpoint <command>"},
		{[]string{"endpoint", "add", "--tenant", "t1", "--project", "p1", "--topic", "x", "--url", "https://h.test/"}, "--secret-ref is required"},
		{[]string{"endpoint", "add", "--tenant", "t1", "--project", "p1", "--topic", "x", "--secret-ref", "r"}, "--url is required"},
		{[]string{"endpoint", "add", "--tenant", "t1", "--project", "p1", "--url", "https://h.test/", "--secret-ref", "r"}, "--topic is required"},
		{[]string{"endpoint", "add", "--tenant", "t1", "--topic", "x", "--url", "https://h.test/", "--secret-ref", "r"}, "--project is required"},
		{[]string{"endpoint", "add", "--tenant", "t1", "--project", "p1", "--topic", "x", "--url", "https://h.test/", "--secret-ref", "r", "--secret", "s"}, "flag provided but not defined: -secret"},
		{[]string{"endpoint", "add", "--tenant", "t1", "--project", "p1", "--topic", "x", "--url", "https://h.test/", "--secret-ref", "r"}, "DATABASE_URL is not set"},
		{[]string{"endpoint", "enable", "--tenant", "t1"}, "--id is required"},
		{[]string{"endpoint", "disable", "--id", "ep_1"}, "--tenant is required"},
		{[]string{"endpoint", "show", "--tenant", "t1", "--id", strings.Repeat("e", 65)}, "--id is longer than 64 bytes"},
		{[]string{"dlq", "list", "--tenant", "t1"}, "--project is required"},
		{[]string{"dlq", "list", "--tenant", "t1", "--project", "p1", "--limit", "0"}, "--limit 0 is outside 1-100"},
		{[]string{"dlq", "list", "--tenant", "t1", "--project", "p1", "--limit", "101"}, "--limit 101 is outside 1-100"},
		{[]string{"dlq", "list", "--tenant", "t1", "--project", "p1"}, "DATABASE_URL is not set"},
		{[]string{"dlq", "replay", "--tenant", "t1"}, "--id is required"},
		{[]string{"dlq", "replay", "--tenant", "t1", "--id", "msg_1", "--account", "a b"}, `--account "a b" is not a valid identity`},
		{[]string{"dlq", "replay", "--tenant", "t1", "--id", strings.Repeat("m", 65)}, "--id is longer than 64 bytes"},
		{[]string{"verify", "extra"}, `unexpected argument "extra"`},
		{[]string{"verify"}, "DATABASE_URL is not set"},
	}
	for _, c := range cases {
		r := run(t, "", c.args...)
		if r.code != ExitUsage || !strings.Contains(r.stderr, c.msg) || r.stdout != "" {
			t.Errorf("envctl %s: code %d stdout %q stderr %q; want exit 2 mentioning %q",
				strings.Join(c.args, " "), r.code, r.stdout, r.stderr, c.msg)
		}
	}
	// verify -h names every invariant it checks.
	r := run(t, "", "verify", "-h")
	r.expect(t, ExitOK, "")
	for _, inv := range invariants() {
		if !strings.Contains(r.stdout, inv.name+" ") {
			t.Errorf("verify -h does not list %s:\n%s", inv.name, r.stdout)
		}
	}
}
