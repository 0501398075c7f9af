package server

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
	"github.com/envelopeworker/envelopeworker/services/ingest-api/internal/outboundkeys"
)

const (
	topicA     = "task.proposals"
	outKeyID   = "out-1"
	payloadTag = "PAYLOAD-MARKER-7c1e"
)

// outboxFixture is a fixture whose server signs with a keys file for
// tenant-a, and whose proj-1/task.proposals has two active endpoints, one
// disabled endpoint, and a neighbour topic with its own endpoint.
type outboxFixture struct {
	*fixture
	keysPath string
	keys     *outboundkeys.File
	seed     []byte
	pub      ed25519.PublicKey
	active   []string // sorted
	disabled string
}

func newSeed(b byte) ([]byte, ed25519.PublicKey) {
	seed := bytes.Repeat([]byte{b}, 32)
	return seed, ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)
}

func writeKeysFile(t testing.TB, path string, entries map[string][2]string) {
	t.Helper()
	m := map[string]map[string]string{}
	for tenant, e := range entries {
		m[tenant] = map[string]string{"key_id": e[0], "seed": e[1]}
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func newOutboxFixture(t testing.TB, edit ...func(*Config)) *outboxFixture {
	t.Helper()
	o := &outboxFixture{keysPath: filepath.Join(t.TempDir(), "outbound-keys.json")}
	o.seed, o.pub = newSeed(3)
	writeKeysFile(t, o.keysPath, map[string][2]string{tenantA: {outKeyID, base64.RawURLEncoding.EncodeToString(o.seed)}})
	var err error
	if o.keys, err = outboundkeys.OpenFile(o.keysPath); err != nil {
		t.Fatal(err)
	}
	o.fixture = newFixture(t, append([]func(*Config){func(c *Config) { c.OutboundKeys = o.keys }}, edit...)...)
	o.active = []string{o.addEndpoint(tenantA, projectA, topicA), o.addEndpoint(tenantA, projectA, topicA)}
	slices.Sort(o.active)
	o.disabled = o.addEndpoint(tenantA, projectA, topicA)
	if err := o.st.Outbox().SetEndpointState(context.Background(), tenantA, o.disabled, store.EndpointDisabled, "test"); err != nil {
		t.Fatal(err)
	}
	o.addEndpoint(tenantA, projectA, "task.other")
	return o
}

func (f *fixture) addEndpoint(tenant, project, topic string) string {
	f.t.Helper()
	id, err := f.st.Outbox().AddEndpoint(context.Background(), store.Endpoint{
		TenantID: tenant, ProjectID: project, Topic: topic,
		URL: "https://hooks.example.test/" + topic, SecretRef: "sec-" + tenant, // a secret ref belongs to one tenant
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return id
}

// outboxBody is a request for proj-1/task.proposals with idempotency key key.
func outboxBody(key string, payloadNote string) []byte {
	return []byte(fmt.Sprintf(`{"project_id":"proj-1","topic":"task.proposals","idempotency_key":%q,`+
		`"kind":"proposal","payload":{"marker":"%s","note":%q},"max_attempts":8}`, key, payloadTag, payloadNote))
}

func (f *fixture) postOutbox(token string, body []byte) resp {
	return f.do(req{method: http.MethodPost, path: "/v1/outbox", token: token, body: body})
}

type outboxAnswer struct {
	Envelope   json.RawMessage `json:"envelope"`
	MessageIDs []string        `json:"message_ids"`
}

func decodeStrict(t testing.TB, body []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("body %s: %v", body, err)
	}
}

// enqueued checks a 201/200 answer and returns it with the parsed, verified
// envelope.
func (o *outboxFixture) enqueued(r resp, status int, pub ed25519.PublicKey) (outboxAnswer, *envelope.Envelope) {
	o.t.Helper()
	if r.status != status {
		o.t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
	}
	var a outboxAnswer
	decodeStrict(o.t, r.body, &a)
	env, err := envelope.Parse(a.Envelope)
	if err != nil {
		o.t.Fatalf("answer envelope does not parse: %v", err)
	}
	if !bytes.Equal(env.Canonical(), a.Envelope) {
		o.t.Fatalf("answer envelope is not canonical:\n%s\n%s", a.Envelope, env.Canonical())
	}
	if err := env.Verify(pub); err != nil {
		o.t.Fatalf("answer envelope does not verify: %v", err)
	}
	if err := env.Validate(testNow, 0); err != nil {
		o.t.Fatalf("answer envelope fails step 4: %v", err)
	}
	return a, env
}

// wantRefusal checks status and the exact refusal body of contract §7.12,
// plus the detail of §8.11 (a known sentence; none on a 5xx).
func wantRefusal(t testing.TB, r resp, status int, reason string) {
	t.Helper()
	var m map[string]string
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("refusal body %s: %v", r.body, err)
	}
	members := 4
	if status >= 500 {
		members = 3
	}
	if r.status != status || len(m) != members || m["outcome"] != "refused" || m["reason"] != reason ||
		m["correlation_id"] == "" || m["correlation_id"] != r.header.Get("X-Correlation-Id") {
		t.Fatalf("got %d %s, want %d refused/%s", r.status, r.body, status, reason)
	}
	checkDetail(t, r.status, m["detail"], r.body)
}

func (f *fixture) count(query string, args ...any) int {
	f.t.Helper()
	var n int
	if err := f.admin.QueryRowContext(context.Background(), query, args...).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

func TestOutboxEnqueueAndRepeat(t *testing.T) {
	o := newOutboxFixture(t)
	// A payload with characters a JSON encoder might escape: the answer must
	// still be the stored bytes.
	body := outboxBody("k-1", `<a & b> `+"\u2028")
	first := o.postOutbox(o.service, body)
	a, env := o.enqueued(first, http.StatusCreated, o.pub)
	if env.TenantID != tenantA || env.ProjectID != projectA || env.ProducerID != "svc-1" || env.KeyID != outKeyID ||
		env.IdempotencyKey != "k-1" || env.Sequence != 1 || env.Metadata.Kind != "proposal" ||
		env.Metadata.CorrelationID != "" || !strings.HasPrefix(env.EventID, "ob-") || !env.IssuedAt.Equal(testNow) {
		t.Fatalf("envelope %s", a.Envelope)
	}
	if want := `{"marker":"` + payloadTag + `","note":"<a & b> ` + "\u2028" + `"}`; string(env.Payload) != want {
		t.Fatalf("payload %s, want %s", env.Payload, want)
	}
	if len(a.MessageIDs) != 2 {
		t.Fatalf("message ids %v, want one per active endpoint", a.MessageIDs)
	}

	// One stored envelope, byte for byte the answer; one pending message per
	// active endpoint, none for the disabled one or the other topic.
	var stored []byte
	if err := o.admin.QueryRowContext(context.Background(),
		`SELECT envelope FROM outbound_bodies WHERE tenant_id = $1`, tenantA).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(stored, a.Envelope) {
		t.Fatalf("stored %s\nanswered %s", stored, a.Envelope)
	}
	rows, err := o.admin.QueryContext(context.Background(), `SELECT endpoint_id, status, attempts, max_attempts,
		encode(event_identity, 'hex') FROM outbox_messages WHERE tenant_id = $1 ORDER BY endpoint_id`, tenantA)
	if err != nil {
		t.Fatal(err)
	}
	var endpoints []string
	for rows.Next() {
		var ep, status, ident string
		var attempts, maxAttempts int
		if err := rows.Scan(&ep, &status, &attempts, &maxAttempts, &ident); err != nil {
			t.Fatal(err)
		}
		if status != "pending" || attempts != 0 || maxAttempts != 8 || ident != env.EventIdentity() {
			t.Fatalf("message row %s %s %d %d %s", ep, status, attempts, maxAttempts, ident)
		}
		endpoints = append(endpoints, ep)
	}
	rows.Close()
	if !slices.Equal(endpoints, o.active) {
		t.Fatalf("messages for %v, want %v", endpoints, o.active)
	}

	// The same request again, even with other member order and white space
	// (same JCS): 200 and the same bytes.
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	reordered, _ := json.MarshalIndent(m, "", "  ")
	for _, b := range [][]byte{body, reordered} {
		again := o.postOutbox(o.service, b)
		if again.status != http.StatusOK || !bytes.Equal(again.body, first.body) {
			t.Fatalf("repeat: %d %s\nfirst: %s", again.status, again.body, first.body)
		}
	}
	// Same key, other content: 422, nothing stored.
	wantRefusal(t, o.postOutbox(o.service, outboxBody("k-1", "other")), 422, "idempotency_conflict")
	noMax := []byte(`{"project_id":"proj-1","topic":"task.proposals","idempotency_key":"k-1","kind":"proposal","payload":{"marker":"` + payloadTag + `","note":"<a & b> ` + "\u2028" + `"}}`)
	wantRefusal(t, o.postOutbox(o.service, noMax), 422, "idempotency_conflict")

	// Repeats and refusals took no sequence: the next one is 2, then 3, and
	// max_attempts defaults to 12.
	_, env2 := o.enqueued(o.postOutbox(o.service, noMaxKey("k-2")), http.StatusCreated, o.pub)
	_, env3 := o.enqueued(o.postOutbox(o.service, outboxBody("k-3", "")), http.StatusCreated, o.pub)
	if env2.Sequence != 2 || env3.Sequence != 3 || env2.EventID == env.EventID {
		t.Fatalf("sequences %d %d, event ids %s %s", env2.Sequence, env3.Sequence, env.EventID, env2.EventID)
	}
	if n := o.count(`SELECT count(*) FROM outbox_messages WHERE tenant_id = $1 AND max_attempts = 12`, tenantA); n != 2 {
		t.Fatalf("%d messages with the default max_attempts, want 2", n)
	}
	if n := o.count(`SELECT count(*) FROM outbound_envelopes`); n != 3 {
		t.Fatalf("%d outbound envelopes, want 3", n)
	}

	// Another service credential of the tenant is another producer: its
	// own stream starts at 1.
	svc2 := o.issue(tenantA, "acct-1", "svc-2", store.RoleService)
	_, env4 := o.enqueued(o.postOutbox(svc2, outboxBody("k-4", "")), http.StatusCreated, o.pub)
	if env4.ProducerID != "svc-2" || env4.Sequence != 1 {
		t.Fatalf("svc-2: producer %s sequence %d", env4.ProducerID, env4.Sequence)
	}

	// Outbound streams are not inbound streams: the read API does not show
	// them, and the inbound tables are untouched.
	r := o.get(o.service, "/v1/streams/proj-1/svc-1/envelopes")
	if r.status != 200 || string(r.body) != `{"envelopes":[],"cursor":0}` {
		t.Fatalf("inbound read of the outbound stream: %d %s", r.status, r.body)
	}
	if n := o.count(`SELECT count(*) FROM event_identities`) + o.count(`SELECT count(*) FROM streams`); n != 0 {
		t.Fatalf("%d inbound rows after outbound enqueues", n)
	}
	// An inbound envelope of device-7 does not move the outbound sequence,
	// nor the other way round.
	wantAnswer(t, o.post(o.device, o.sign(draft(1))), 200, "accepted", "", 1)
	_, env5 := o.enqueued(o.postOutbox(o.service, outboxBody("k-5", "")), http.StatusCreated, o.pub)
	if env5.Sequence != 4 {
		t.Fatalf("sequence after an inbound accept: %d, want 4", env5.Sequence)
	}
	if !strings.Contains(o.metricsText(), `envelopeworker_ingest_outbox_enqueues_total result="repeated"`) ||
		!strings.Contains(o.metricsText(), `envelopeworker_ingest_requests_total outcome="created" reason="" route="/v1/outbox"`) {
		t.Fatalf("metrics:\n%s", o.metricsText())
	}
}

func noMaxKey(key string) []byte {
	return []byte(`{"project_id":"proj-1","topic":"task.proposals","idempotency_key":"` + key + `","kind":"proposal","payload":null}`)
}

func TestOutboxSequencesUnderConcurrency(t *testing.T) {
	o := newOutboxFixture(t)
	const n = 12
	seqs := make([]int64, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := o.postOutbox(o.service, outboxBody(fmt.Sprintf("c-%d", i), ""))
			if r.status != http.StatusCreated {
				t.Errorf("enqueue %d: %d %s", i, r.status, r.body)
				return
			}
			var a outboxAnswer
			if err := json.Unmarshal(r.body, &a); err != nil {
				t.Error(err)
				return
			}
			env, err := envelope.Parse(a.Envelope)
			if err != nil {
				t.Error(err)
				return
			}
			seqs[i] = env.Sequence
		}()
	}
	wg.Wait()
	slices.Sort(seqs)
	for i, s := range seqs {
		if s != int64(i+1) {
			t.Fatalf("sequences %v, want 1..%d", seqs, n)
		}
	}
}

func TestOutboxRefusals(t *testing.T) {
	o := newOutboxFixture(t)
	valid := string(outboxBody("k-1", ""))
	replace := func(old, new string) []byte { return []byte(strings.Replace(valid, old, new, 1)) }
	drop := func(member string) []byte {
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(valid), &m); err != nil {
			t.Fatal(err)
		}
		delete(m, member)
		b, _ := json.Marshal(m)
		return b
	}
	invalid := map[string][]byte{
		"empty body":               nil,
		"not json":                 []byte(`project_id=proj-1`),
		"array":                    []byte(`[` + valid + `]`),
		"trailing data":            []byte(valid + `{}`),
		"duplicate member":         replace(`"kind":"proposal"`, `"kind":"proposal","kind":"proposal"`),
		"duplicate in payload":     replace(`"note":""`, `"note":"","note":""`),
		"unknown member":           replace(`"kind":"proposal"`, `"kind":"proposal","priority":1`),
		"case of a member":         replace(`"kind"`, `"Kind"`),
		"missing project_id":       drop("project_id"),
		"missing topic":            drop("topic"),
		"missing idempotency_key":  drop("idempotency_key"),
		"missing kind":             drop("kind"),
		"missing payload":          drop("payload"),
		"project_id not identity":  replace(`"proj-1"`, `"-proj"`),
		"project_id number":        replace(`"proj-1"`, `7`),
		"project_id null":          replace(`"proj-1"`, `null`),
		"topic with slash":         replace(`"task.proposals"`, `"task/proposals"`),
		"topic empty":              replace(`"task.proposals"`, `""`),
		"idempotency_key empty":    replace(`"k-1"`, `""`),
		"idempotency_key space":    replace(`"k-1"`, `"k 1"`),
		"idempotency_key too long": replace(`"k-1"`, `"`+strings.Repeat("k", 256)+`"`),
		"kind upper case":          replace(`"proposal"`, `"Proposal"`),
		"kind object":              replace(`"proposal"`, `{"kind":"proposal"}`),
		"max_attempts 0":           replace(`"max_attempts":8`, `"max_attempts":0`),
		"max_attempts 51":          replace(`"max_attempts":8`, `"max_attempts":51`),
		"max_attempts -1":          replace(`"max_attempts":8`, `"max_attempts":-1`),
		"max_attempts 8.0":         replace(`"max_attempts":8`, `"max_attempts":8.0`),
		"max_attempts 8e0":         replace(`"max_attempts":8`, `"max_attempts":8e0`),
		"max_attempts string":      replace(`"max_attempts":8`, `"max_attempts":"8"`),
		"max_attempts null":        replace(`"max_attempts":8`, `"max_attempts":null`),
		"max_attempts huge":        replace(`"max_attempts":8`, `"max_attempts":100000000000000000000`),
		"lone surrogate":           replace(`"note":""`, `"note":"\ud800"`),
		"too deep":                 replace(`"note":""`, `"note":`+strings.Repeat("[", 64)+strings.Repeat("]", 64)),
		// Within the request's 10,000 items, beyond the envelope's: the
		// envelope has more members than the request.
		"envelope over item limit": replace(`"note":""`, `"note":[`+strings.TrimSuffix(strings.Repeat("0,", 9990), ",")+`]`),
	}
	for name, body := range invalid {
		t.Run(name, func(t *testing.T) {
			wantRefusal(t, o.postOutbox(o.service, body), 400, "invalid_request")
		})
	}
	wantRefusal(t, o.postOutbox(o.device, []byte(valid)), 403, "forbidden")
	wantRefusal(t, o.postOutbox(o.operator, []byte(valid)), 403, "forbidden")
	wantRefusal(t, o.postOutbox("", []byte(valid)), 401, "unauthenticated")
	wantRefusal(t, o.postOutbox("ewk_"+strings.Repeat("A", 43), []byte(valid)), 401, "unauthenticated")
	big := replace(`"note":""`, `"note":"`+strings.Repeat("x", 1<<20)+`"`)
	wantRefusal(t, o.postOutbox(o.service, big), 413, "body_too_large")
	wantRefusal(t, o.do(req{method: http.MethodPost, path: "/v1/outbox", token: o.service, body: big, chunked: true}),
		413, "body_too_large")
	wantRefusal(t, o.do(req{method: http.MethodGet, path: "/v1/outbox", token: o.service}), 405, "method_not_allowed")

	// No active endpoint for the topic (none at all, or only a disabled
	// one): 422 and no sequence taken.
	wantRefusal(t, o.postOutbox(o.service, replace(`"task.proposals"`, `"task.none"`)), 422, "no_endpoint")
	for _, id := range o.active {
		if err := o.st.Outbox().SetEndpointState(context.Background(), tenantA, id, store.EndpointDisabled, "http_410"); err != nil {
			t.Fatal(err)
		}
	}
	wantRefusal(t, o.postOutbox(o.service, []byte(valid)), 422, "no_endpoint")
	if err := o.st.Outbox().SetEndpointState(context.Background(), tenantA, o.active[0], store.EndpointActive, ""); err != nil {
		t.Fatal(err)
	}
	a, env := o.enqueued(o.postOutbox(o.service, []byte(valid)), http.StatusCreated, o.pub)
	if env.Sequence != 1 || len(a.MessageIDs) != 1 {
		t.Fatalf("after refusals: sequence %d, %d messages", env.Sequence, len(a.MessageIDs))
	}

	// A tenant without an outbound key: 422 no_signing_key, even with an
	// endpoint.
	otherSvc := o.issue("tenant-b", "acct-1", "svc-1", store.RoleService)
	o.addEndpoint("tenant-b", projectA, topicA)
	wantRefusal(t, o.postOutbox(otherSvc, []byte(valid)), 422, "no_signing_key")
	// A server without a keys file at all: the same.
	o.srv = o.newServer(testConfig(), o.st)
	wantRefusal(t, o.postOutbox(o.service, outboxBody("k-9", "")), 422, "no_signing_key")

	// Refusals store nothing and are not audited (see the package doc).
	if n := o.count(`SELECT count(*) FROM outbound_envelopes`); n != 1 {
		t.Fatalf("%d outbound envelopes, want 1", n)
	}
	if n := o.count(`SELECT count(*) FROM outbound_streams WHERE last_sequence <> 1`); n != 0 {
		t.Fatal("a refusal took a sequence")
	}
	if n := len(o.audit()); n != 0 {
		t.Fatalf("%d audit rows", n)
	}
}

// TestOutboxTenantIsolation: tenant-b, with its own key and an endpoint on
// the same project and topic names, never sees or touches tenant-a's
// messages, and the reverse.
func TestOutboxTenantIsolation(t *testing.T) {
	o := newOutboxFixture(t)
	seedB, pubB := newSeed(5)
	writeKeysFile(t, o.keysPath, map[string][2]string{
		tenantA:    {outKeyID, base64.RawURLEncoding.EncodeToString(o.seed)},
		"tenant-b": {"b-key", base64.RawURLEncoding.EncodeToString(seedB)},
	})
	if changed, err := o.keys.Reload(); !changed || err != nil {
		t.Fatalf("reload: %v %v", changed, err)
	}
	svcB := o.issue("tenant-b", "acct-1", "svc-1", store.RoleService)
	opsB := o.issue("tenant-b", "acct-1", "ops-1", store.RoleOperator)
	// tenant-b has no endpoint yet: tenant-a's are not its own.
	wantRefusal(t, o.postOutbox(svcB, outboxBody("k-1", "")), 422, "no_endpoint")
	epB := o.addEndpoint("tenant-b", projectA, topicA)

	a, envA := o.enqueued(o.postOutbox(o.service, outboxBody("k-1", "")), http.StatusCreated, o.pub)
	// The same key and content in tenant-b is tenant-b's own first request.
	b, envB := o.enqueued(o.postOutbox(svcB, outboxBody("k-1", "")), http.StatusCreated, pubB)
	if envB.TenantID != "tenant-b" || envB.KeyID != "b-key" || envB.Sequence != 1 || envA.Sequence != 1 ||
		len(b.MessageIDs) != 1 || envB.EventIdentity() == envA.EventIdentity() {
		t.Fatalf("tenant-b envelope %s", b.Envelope)
	}
	if err := envB.Verify(o.pub); err == nil {
		t.Fatal("tenant-b's envelope verifies with tenant-a's key")
	}
	if st, err := o.st.Outbox().OutboxMessage(context.Background(), "tenant-b", b.MessageIDs[0]); err != nil || st.EndpointID != epB {
		t.Fatalf("tenant-b message: %+v %v", st, err)
	}

	msgA := a.MessageIDs[0]
	kill(t, o.fixture, tenantA, msgA)
	for _, tok := range []string{svcB, opsB} {
		wantRefusal(t, o.get(tok, "/v1/outbox/"+msgA), 404, "not_found")
	}
	wantRefusal(t, o.do(req{method: http.MethodPost, path: "/v1/dead-letters/" + msgA + "/replay", token: opsB}), 404, "not_found")
	r := o.get(opsB, "/v1/dead-letters?project_id=proj-1")
	if r.status != 200 || string(r.body) != `{"dead_letters":[],"next_after":null}` {
		t.Fatalf("tenant-b's dead letters: %d %s", r.status, r.body)
	}
	// And tenant-a cannot see tenant-b's message.
	wantRefusal(t, o.get(o.service, "/v1/outbox/"+b.MessageIDs[0]), 404, "not_found")
	// tenant-a's message is still dead, untouched by the attempts above.
	if st, err := o.st.Outbox().OutboxMessage(context.Background(), tenantA, msgA); err != nil || st.Status != "dead" {
		t.Fatalf("tenant-a's message: %+v %v", st, err)
	}
}

// kill claims tenant's due messages and settles ids dead, as a worker that
// got a 400 would, and the others for a retry in an hour.
func kill(t testing.TB, f *fixture, tenant string, ids ...string) {
	t.Helper()
	ctx := context.Background()
	claimed, err := f.st.Outbox().Claim(ctx, tenant, store.MaxClaim, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, c := range claimed {
		if slices.Contains(ids, c.MessageID) {
			found++
			if err := f.st.Outbox().MarkDead(ctx, tenant, c.MessageID, c.Attempt, store.CodeHTTP4xx, false); err != nil {
				t.Fatal(err)
			}
		} else if err := f.st.Outbox().MarkRetry(ctx, tenant, c.MessageID, c.Attempt, time.Now().Add(time.Hour), store.CodeHTTP5xx); err != nil {
			t.Fatal(err)
		}
	}
	if found != len(ids) {
		t.Fatalf("%d of messages %v were claimable", found, ids)
	}
}

type statusAnswer struct {
	MessageID     string  `json:"message_id"`
	EndpointID    string  `json:"endpoint_id"`
	Topic         string  `json:"topic"`
	Status        string  `json:"status"`
	Attempts      int     `json:"attempts"`
	LastErrorCode *string `json:"last_error_code"`
	NextAttemptAt *string `json:"next_attempt_at"`
	DeliveredAt   *string `json:"delivered_at"`
	// Present only once the body expired (§8.9).
	PayloadExpired *bool `json:"payload_expired"`
}

func (f *fixture) status(token, id string) statusAnswer {
	f.t.Helper()
	r := f.get(token, "/v1/outbox/"+id)
	if r.status != 200 {
		f.t.Fatalf("GET /v1/outbox/%s: %d %s", id, r.status, r.body)
	}
	var s statusAnswer
	decodeStrict(f.t, r.body, &s)
	for _, member := range []string{`"last_error_code":`, `"next_attempt_at":`, `"delivered_at":`} {
		if !bytes.Contains(r.body, []byte(member)) {
			f.t.Fatalf("%s missing from %s", member, r.body)
		}
	}
	return s
}

func TestOutboxMessageStatus(t *testing.T) {
	o := newOutboxFixture(t)
	a, _ := o.enqueued(o.postOutbox(o.service, outboxBody("k-1", "")), http.StatusCreated, o.pub)
	id := a.MessageIDs[0]
	for _, tok := range []string{o.service, o.operator} {
		s := o.status(tok, id)
		if s.MessageID != id || s.EndpointID != o.active[0] || s.Topic != topicA || s.Status != "pending" ||
			s.Attempts != 0 || s.LastErrorCode != nil || s.NextAttemptAt == nil || s.DeliveredAt != nil {
			t.Fatalf("pending status %+v", s)
		}
		if _, err := time.Parse(time.RFC3339Nano, *s.NextAttemptAt); err != nil || !strings.HasSuffix(*s.NextAttemptAt, "Z") {
			t.Fatalf("next_attempt_at %q", *s.NextAttemptAt)
		}
	}

	// Delivered: attempts 1, delivered_at set, nothing next.
	ctx := context.Background()
	claimed, err := o.st.Outbox().Claim(ctx, tenantA, store.MaxClaim, time.Minute)
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claim: %d %v", len(claimed), err)
	}
	for _, c := range claimed {
		if c.MessageID == id {
			if err := o.st.Outbox().MarkDelivered(ctx, tenantA, id, c.Attempt); err != nil {
				t.Fatal(err)
			}
		} else if err := o.st.Outbox().MarkRetry(ctx, tenantA, c.MessageID, c.Attempt, time.Now().Add(time.Hour), store.CodeHTTP5xx); err != nil {
			t.Fatal(err)
		}
	}
	s := o.status(o.service, id)
	if s.Status != "delivered" || s.Attempts != 1 || s.DeliveredAt == nil || s.NextAttemptAt != nil || s.LastErrorCode != nil {
		t.Fatalf("delivered status %+v", s)
	}
	s = o.status(o.operator, a.MessageIDs[1])
	if s.Status != "pending" || s.Attempts != 1 || s.LastErrorCode == nil || *s.LastErrorCode != "http_5xx" {
		t.Fatalf("retried status %+v", s)
	}

	wantRefusal(t, o.get(o.device, "/v1/outbox/"+id), 403, "forbidden")
	wantRefusal(t, o.get("", "/v1/outbox/"+id), 401, "unauthenticated")
	wantRefusal(t, o.get(o.service, "/v1/outbox/msg_000000000000000000000000"), 404, "not_found")
	wantRefusal(t, o.get(o.service, "/v1/outbox/not-an-id"), 404, "not_found")
	wantRefusal(t, o.get(o.service, "/v1/outbox/"+strings.Repeat("x", 4000)), 404, "not_found")
	wantRefusal(t, o.do(req{method: http.MethodDelete, path: "/v1/outbox/" + id, token: o.operator}), 405, "method_not_allowed")
	if strings.Contains(o.metricsText(), id) || !strings.Contains(o.metricsText(), `route="/v1/outbox/:id"`) {
		t.Fatalf("metrics must label the route template only:\n%s", o.metricsText())
	}
}

type deadPage struct {
	DeadLetters []struct {
		MessageID  string `json:"message_id"`
		EndpointID string `json:"endpoint_id"`
		Topic      string `json:"topic"`
		Attempts   int    `json:"attempts"`
		ErrorCode  string `json:"error_code"`
		CreatedAt  string `json:"created_at"`
		DeadAt     string `json:"dead_at"`
	} `json:"dead_letters"`
	NextAfter *string `json:"next_after"`
}

func (f *fixture) deadLetters(token, query string) deadPage {
	f.t.Helper()
	r := f.get(token, "/v1/dead-letters?"+query)
	if r.status != 200 {
		f.t.Fatalf("dead letters %s: %d %s", query, r.status, r.body)
	}
	var p deadPage
	decodeStrict(f.t, r.body, &p)
	if !bytes.Contains(r.body, []byte(`"next_after":`)) {
		f.t.Fatalf("next_after missing: %s", r.body)
	}
	return p
}

func TestDeadLettersAndReplay(t *testing.T) {
	o := newOutboxFixture(t)
	a, env := o.enqueued(o.postOutbox(o.service, outboxBody("k-1", "")), http.StatusCreated, o.pub)
	if p := o.deadLetters(o.operator, "project_id=proj-1"); len(p.DeadLetters) != 0 || p.NextAfter != nil {
		t.Fatalf("no dead letters yet: %+v", p)
	}
	kill(t, o.fixture, tenantA, a.MessageIDs...)
	// Dead at once: next_attempt_at is null, the code stays.
	s := o.status(o.operator, a.MessageIDs[0])
	if s.Status != "dead" || s.NextAttemptAt != nil || s.LastErrorCode == nil || *s.LastErrorCode != "http_4xx" {
		t.Fatalf("dead status %+v", s)
	}

	all := o.deadLetters(o.operator, "project_id=proj-1&limit=100")
	if len(all.DeadLetters) != 2 || all.NextAfter != nil {
		t.Fatalf("all dead letters: %+v", all)
	}
	d := all.DeadLetters[0]
	if !slices.Contains(a.MessageIDs, d.MessageID) || !slices.Contains(o.active, d.EndpointID) || d.Topic != topicA ||
		d.ErrorCode != "http_4xx" || d.Attempts < 1 {
		t.Fatalf("dead letter %+v", d)
	}
	for _, ts := range []string{d.CreatedAt, d.DeadAt} {
		if _, err := time.Parse(time.RFC3339Nano, ts); err != nil {
			t.Fatalf("time %q: %v", ts, err)
		}
	}
	// Paging: limit 1, then the cursor.
	p1 := o.deadLetters(o.operator, "project_id=proj-1&limit=1")
	if len(p1.DeadLetters) != 1 || p1.NextAfter == nil || p1.DeadLetters[0].MessageID != all.DeadLetters[0].MessageID {
		t.Fatalf("page 1: %+v", p1)
	}
	p2 := o.deadLetters(o.operator, "project_id=proj-1&limit=1&after="+*p1.NextAfter)
	if len(p2.DeadLetters) != 1 || p2.DeadLetters[0].MessageID != all.DeadLetters[1].MessageID || p2.NextAfter != nil {
		t.Fatalf("page 2 (the last): %+v", p2)
	}
	if p := o.deadLetters(o.operator, "project_id=proj-2"); len(p.DeadLetters) != 0 {
		t.Fatalf("another project: %+v", p)
	}

	// Refusals of the list.
	for q, reason := range map[string]string{
		"":                                  "invalid_request",
		"limit=10":                          "invalid_request",
		"project_id=":                       "invalid_request",
		"project_id=-bad":                   "invalid_request",
		"project_id=proj-1&project_id=p2":   "invalid_request",
		"project_id=proj-1&limit=0":         "invalid_page",
		"project_id=proj-1&limit=101":       "invalid_page",
		"project_id=proj-1&limit=ten":       "invalid_page",
		"project_id=proj-1&limit=1&limit=2": "invalid_page",
		"project_id=proj-1&after=garbage":   "invalid_page",
		"project_id=proj-1&after=":          "invalid_page",
	} {
		wantRefusal(t, o.get(o.operator, "/v1/dead-letters?"+q), 400, reason)
	}
	wantRefusal(t, o.get(o.service, "/v1/dead-letters?project_id=proj-1"), 403, "forbidden")
	wantRefusal(t, o.get(o.device, "/v1/dead-letters?project_id=proj-1"), 403, "forbidden")

	// Replay: back to pending with a fresh budget; attempts keep their
	// count; it leaves the list; audited as replayed.
	replay := func(token, id string) resp {
		return o.do(req{method: http.MethodPost, path: "/v1/dead-letters/" + id + "/replay", token: token})
	}
	id := a.MessageIDs[0]
	wantRefusal(t, replay(o.service, id), 403, "forbidden")
	wantRefusal(t, replay(o.device, id), 403, "forbidden")
	wantRefusal(t, replay("", id), 401, "unauthenticated")
	before := o.status(o.operator, id)
	r := replay(o.operator, id)
	if r.status != 200 {
		t.Fatalf("replay: %d %s", r.status, r.body)
	}
	var rs statusAnswer
	decodeStrict(t, r.body, &rs)
	if rs.MessageID != id || rs.Status != "pending" || rs.Attempts != before.Attempts || rs.NextAttemptAt == nil {
		t.Fatalf("replayed status %+v", rs)
	}
	if got := o.status(o.service, id); got.Status != rs.Status || got.Attempts != rs.Attempts {
		t.Fatalf("GET after replay %+v, replay answered %+v", got, rs)
	}
	wantRefusal(t, replay(o.operator, id), 409, "not_dead")
	wantRefusal(t, replay(o.operator, "msg_000000000000000000000000"), 404, "not_found")
	wantRefusal(t, replay(o.operator, "nope"), 404, "not_found")
	left := o.deadLetters(o.operator, "project_id=proj-1")
	if len(left.DeadLetters) != 1 || left.DeadLetters[0].MessageID != a.MessageIDs[1] {
		t.Fatalf("after replay: %+v", left)
	}
	rows := o.audit()
	if len(rows) != 1 {
		t.Fatalf("%d audit rows, want 1 (the replay)", len(rows))
	}
	row := rows[0]
	if row.Outcome != "replayed" || row.EventIdentity != env.EventIdentity() || row.ProjectID != projectA ||
		row.DeviceID != "ops-1" || row.CorrelationID != r.header.Get("X-Correlation-Id") {
		t.Fatalf("audit row %+v", row)
	}
	// The replayed message is claimable again with the same body.
	claimed, err := o.st.Outbox().Claim(context.Background(), tenantA, store.MaxClaim, time.Minute)
	if err != nil || len(claimed) != 1 || claimed[0].MessageID != id || !bytes.Equal(claimed[0].Body, a.Envelope) ||
		claimed[0].Attempt != before.Attempts+1 {
		t.Fatalf("claim after replay: %+v %v", claimed, err)
	}
}

// TestOutboxAfterPayloadExpiry: once the retention-janitor deleted an
// envelope's body (§8.9), status adds payload_expired, the same enqueue
// answers 200 with a null envelope and the original ids, other content is
// still a conflict, and a replay of its dead letter is 409 payload_expired.
func TestOutboxAfterPayloadExpiry(t *testing.T) {
	o := newOutboxFixture(t)
	a, _ := o.enqueued(o.postOutbox(o.service, outboxBody("k-1", "")), http.StatusCreated, o.pub)
	if s := o.status(o.service, a.MessageIDs[0]); s.PayloadExpired != nil {
		t.Fatalf("payload_expired before expiry: %+v", s)
	}
	kill(t, o.fixture, tenantA, a.MessageIDs...)
	// The settles fixed the expiry at now + the default 2160h; the janitor
	// runs past it.
	for {
		d, err := o.st.Retention().DeleteExpiredOutbound(context.Background(), time.Now().Add(2200*time.Hour), store.MaxDeleteBatch)
		if err != nil {
			t.Fatal(err)
		}
		if d.Bodies == 0 && d.Attempts == 0 {
			break
		}
	}
	for _, id := range a.MessageIDs {
		s := o.status(o.operator, id)
		if s.Status != "dead" || s.PayloadExpired == nil || !*s.PayloadExpired {
			t.Fatalf("status after expiry %+v", s)
		}
	}
	r := o.postOutbox(o.service, outboxBody("k-1", ""))
	if r.status != http.StatusOK {
		t.Fatalf("repeat after expiry: %d %s", r.status, r.body)
	}
	var rep struct {
		Envelope       json.RawMessage `json:"envelope"`
		PayloadExpired bool            `json:"payload_expired"`
		MessageIDs     []string        `json:"message_ids"`
	}
	decodeStrict(t, r.body, &rep)
	if string(rep.Envelope) != "null" || !rep.PayloadExpired || !slices.Equal(rep.MessageIDs, a.MessageIDs) {
		t.Fatalf("repeat after expiry: %s", r.body)
	}
	// The batch route answers such an item the same way, with its status.
	items := o.batchResults(o.postOutboxBatch(o.service, outboxBatchBody(outboxBody("k-1", ""))))
	if len(items) != 1 || string(items[0].Envelope) != "null" || !items[0].PayloadExpired ||
		!slices.Equal(items[0].MessageIDs, a.MessageIDs) || items[0].Status != http.StatusOK {
		t.Fatalf("batch repeat after expiry: %+v", items)
	}
	wantRefusal(t, o.postOutbox(o.service, outboxBody("k-1", "other")), 422, "idempotency_conflict")
	wantRefusal(t, o.do(req{method: http.MethodPost, path: "/v1/dead-letters/" + a.MessageIDs[0] + "/replay", token: o.operator}),
		409, "payload_expired")
	if s := o.status(o.operator, a.MessageIDs[0]); s.Status != "dead" {
		t.Fatalf("refused replay changed the message: %+v", s)
	}
}

// TestOutboxKeyRotation: a new keys file takes effect on reload without a
// restart; a broken one is refused and the last good keys keep signing; a
// removed tenant answers no_signing_key.
func TestOutboxKeyRotation(t *testing.T) {
	o := newOutboxFixture(t)
	_, env1 := o.enqueued(o.postOutbox(o.service, outboxBody("k-1", "")), http.StatusCreated, o.pub)
	if env1.KeyID != outKeyID {
		t.Fatalf("key id %s", env1.KeyID)
	}
	seed2, pub2 := newSeed(4)
	writeKeysFile(t, o.keysPath, map[string][2]string{tenantA: {"out-2", base64.RawURLEncoding.EncodeToString(seed2)}})
	if changed, err := o.keys.Reload(); !changed || err != nil {
		t.Fatalf("reload: %v %v", changed, err)
	}
	_, env2 := o.enqueued(o.postOutbox(o.service, outboxBody("k-2", "")), http.StatusCreated, pub2)
	if env2.KeyID != "out-2" || env2.Sequence != 2 {
		t.Fatalf("after rotation: key %s sequence %d", env2.KeyID, env2.Sequence)
	}
	// A repeat of the first request is still the envelope the old key signed.
	_, again := o.enqueued(o.postOutbox(o.service, outboxBody("k-1", "")), http.StatusOK, o.pub)
	if again.KeyID != outKeyID {
		t.Fatalf("repeat re-signed: %s", again.KeyID)
	}
	if err := os.WriteFile(o.keysPath, []byte(`{"tenant-a":{"key_id":"out-3"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := o.keys.Reload(); err == nil {
		t.Fatal("a broken keys file was taken")
	}
	o.enqueued(o.postOutbox(o.service, outboxBody("k-3", "")), http.StatusCreated, pub2)
	writeKeysFile(t, o.keysPath, map[string][2]string{})
	if changed, err := o.keys.Reload(); !changed || err != nil {
		t.Fatalf("reload: %v %v", changed, err)
	}
	wantRefusal(t, o.postOutbox(o.service, outboxBody("k-4", "")), 422, "no_signing_key")
}

// TestOutboxDatabaseFailures: with the credential cached and the database
// gone, every outbox route answers 503, never a refusal.
func TestOutboxDatabaseFailures(t *testing.T) {
	o := newOutboxFixture(t)
	a, _ := o.enqueued(o.postOutbox(o.service, outboxBody("k-1", "")), http.StatusCreated, o.pub)
	st := storetest.Open(t, o.dsn)
	cfg := testConfig()
	cfg.CredentialCacheTTL = 2 * time.Second
	cfg.OutboundKeys = o.keys
	o.srv = o.newServer(cfg, st)
	o.status(o.service, a.MessageIDs[0])
	o.deadLetters(o.operator, "project_id=proj-1")
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	for _, r := range []resp{
		o.postOutbox(o.service, outboxBody("k-2", "")),
		o.postOutbox(o.service, outboxBody("k-1", "")),
		o.get(o.service, "/v1/outbox/"+a.MessageIDs[0]),
		o.get(o.operator, "/v1/dead-letters?project_id=proj-1"),
		o.do(req{method: http.MethodPost, path: "/v1/dead-letters/" + a.MessageIDs[0] + "/replay", token: o.operator}),
	} {
		wantRefusal(t, r, 503, "unavailable")
		if r.header.Get("Retry-After") == "" {
			t.Fatal("503 without Retry-After")
		}
	}
	for _, op := range []string{"enqueue", "outbox_message", "list_dead_letters", "replay_dead_letter"} {
		if !strings.Contains(o.metricsText(), `envelopeworker_ingest_store_errors_total operation="`+op+`"`) {
			t.Fatalf("store error %s not counted:\n%s", op, o.metricsText())
		}
	}
	// And with the database unreachable from the start, authentication
	// fails first: 503 too.
	down, err := store.Open(context.Background(), "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2", store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	o.srv = o.newServer(testConfig(), down)
	wantRefusal(t, o.postOutbox(o.service, outboxBody("k-3", "")), 503, "unavailable")
	wantRefusal(t, o.get(o.operator, "/v1/dead-letters?project_id=proj-1"), 503, "unavailable")
}

// TestOutboxSecretsStayOut: the seed, the payload and the idempotency key
// never reach a log line or a metric, and no answer but the enqueue answers
// (which carry the envelope by contract) holds the payload or the seed.
func TestOutboxSecretsStayOut(t *testing.T) {
	o := newOutboxFixture(t)
	idemKey := "idem-secret-91f3"
	body := []byte(strings.Replace(string(outboxBody(idemKey, "")), "k-1", idemKey, 1))
	a, _ := o.enqueued(o.postOutbox(o.service, body), http.StatusCreated, o.pub)
	o.postOutbox(o.service, body)
	o.postOutbox(o.service, outboxBody(idemKey, "conflict"))
	o.postOutbox(o.device, body)
	o.postOutbox(o.service, append(body, '}'))
	kill(t, o.fixture, tenantA, a.MessageIDs[0])
	o.status(o.operator, a.MessageIDs[0])
	o.deadLetters(o.operator, "project_id=proj-1")
	o.do(req{method: http.MethodPost, path: "/v1/dead-letters/" + a.MessageIDs[0] + "/replay", token: o.operator})
	// A broken keys file on reload: its error may be logged, never the seed.
	if err := os.WriteFile(o.keysPath, []byte(`{"tenant-a":{"key_id":"x","seed":"`+
		base64.RawURLEncoding.EncodeToString(o.seed)+`","extra":1}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := o.keys.Reload(); err == nil || strings.Contains(err.Error(), base64.RawURLEncoding.EncodeToString(o.seed)) {
		t.Fatalf("reload error %v", err)
	}

	secrets := []string{
		base64.RawURLEncoding.EncodeToString(o.seed), hex.EncodeToString(o.seed),
		base64.StdEncoding.EncodeToString(o.seed), o.service, o.operator,
	}
	logs, metrics := o.logs.String(), o.metricsText()
	for _, s := range append(secrets, payloadTag, idemKey) {
		if strings.Contains(logs, s) || strings.Contains(metrics, s) {
			t.Fatalf("%q leaked into logs or metrics", s)
		}
	}
	for _, r := range o.bodies {
		text := string(r.body) + fmt.Sprint(r.header)
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Fatalf("%q leaked into an answer: %s", s, r.body)
			}
		}
		if r.status != http.StatusCreated && r.status != http.StatusOK || !bytes.HasPrefix(r.body, []byte(`{"envelope":`)) {
			if strings.Contains(text, payloadTag) {
				t.Fatalf("payload in a non-enqueue answer: %d %s", r.status, r.body)
			}
		}
	}
}
