package server

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/limiter"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testNow is the server clock in tests: a minute after the shared vectors
// were issued, so they stay inside the replay window whenever tests run.
var testNow = time.Date(2026, 11, 29, 20, 1, 0, 0, time.UTC)

const (
	tenantA  = "tenant-a"
	projectA = "proj-1"
	deviceA  = "device-7"
	keyA     = "k2026-11"
	clientIP = "192.0.2.10"
)

type vectorFile struct {
	PrivateSeedHex string `json:"private_seed_hex"`
	PublicKey      string `json:"public_key_base64url"`
	Vectors        []struct {
		Name                 string `json:"name"`
		Body                 string `json:"body"`
		EventIdentity        string `json:"event_identity"`
		ExpectValidSignature bool   `json:"expect_valid_signature"`
		ExpectReason         string `json:"expect_reason"`
	} `json:"vectors"`
}

// loadVectors reads testdata/envelopes.json, a copy of the contract's shared
// test vectors (vectors/envelopes.json next to the contract).
func loadVectors(t testing.TB) vectorFile {
	t.Helper()
	data, err := os.ReadFile("testdata/envelopes.json")
	if err != nil {
		t.Fatal(err)
	}
	var v vectorFile
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func vectorKey(t testing.TB) (ed25519.PrivateKey, ed25519.PublicKey) {
	t.Helper()
	v := loadVectors(t)
	seed, err := hex.DecodeString(v.PrivateSeedHex)
	if err != nil {
		t.Fatal(err)
	}
	priv := ed25519.NewKeyFromSeed(seed)
	pub, err := envelope.ParsePublicKey(v.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return priv, pub
}

// syncBuffer collects log output written from many goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type fixture struct {
	t   testing.TB
	dsn string
	st  *store.Store
	// admin is a pool of its own on the fixture's database, for setting up
	// rows and looking behind the API.
	admin *sql.DB
	srv   *Server
	reg   *prometheus.Registry
	logs  *syncBuffer
	priv  ed25519.PrivateKey

	device, service, operator string // tokens in tenant-a
	// bodies collects every answer body the fixture saw, for the leak scan.
	mu     sync.Mutex
	bodies []resp
	// observe, when set, sees every request do served and its answer (the
	// OpenAPI test validates each answer against the document).
	observe func(*http.Request, resp)
}

func testConfig() Config {
	return Config{
		PayloadRetention:   100 * 365 * 24 * time.Hour,
		SyncLimit:          limiter.Policy{Tokens: limiter.MaxTokens, Interval: time.Hour},
		PeerLimit:          limiter.Policy{Tokens: limiter.MaxTokens, Interval: time.Hour},
		CredentialCacheTTL: 0,
		Now:                func() time.Time { return testNow },
	}
}

// newFixture gives a fresh migrated database, tenant-a with the vectors'
// key, device-7 (device), svc-1 (service) and ops-1 (operator) credentials,
// and a server over it.
func newFixture(t testing.TB, edit ...func(*Config)) *fixture {
	t.Helper()
	dsn := storetest.NewDatabase(t)
	st := storetest.Open(t, dsn)
	f := &fixture{t: t, dsn: dsn, st: st, admin: storetest.AdminDB(t, dsn), logs: &syncBuffer{}}
	var pub ed25519.PublicKey
	f.priv, pub = vectorKey(t)
	ctx := context.Background()
	if err := st.Credentials().AddKey(ctx, tenantA, keyA, pub); err != nil {
		t.Fatal(err)
	}
	f.device = f.issue(tenantA, "acct-1", deviceA, store.RoleDevice)
	f.service = f.issue(tenantA, "acct-1", "svc-1", store.RoleService)
	f.operator = f.issue(tenantA, "acct-1", "ops-1", store.RoleOperator)

	cfg := testConfig()
	for _, e := range edit {
		e(&cfg)
	}
	f.srv = f.newServer(cfg, st)
	return f
}

func (f *fixture) newServer(cfg Config, st *store.Store) *Server {
	f.t.Helper()
	f.reg = NewRegistry()
	log := slog.New(slog.NewJSONHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, err := New(cfg, st, log, f.reg)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() {
		if err := srv.Close(context.Background()); err != nil {
			f.t.Errorf("server Close: %v", err)
		}
	})
	return srv
}

func (f *fixture) issue(tenant, account, device string, role store.Role) string {
	f.t.Helper()
	tok, _, err := f.st.Credentials().IssueCredential(context.Background(), tenant, account, device, role)
	if err != nil {
		f.t.Fatal(err)
	}
	return tok
}

// draft is a valid envelope of device-7's stream proj-1 with sequence seq.
func draft(seq int64) envelope.Draft {
	return envelope.Draft{
		TenantID: tenantA, ProjectID: projectA, ProducerID: deviceA,
		EventID:        fmt.Sprintf("evt-%d", seq),
		IdempotencyKey: fmt.Sprintf("idem-%d", seq),
		KeyID:          keyA,
		Sequence:       seq,
		IssuedAt:       testNow.Add(-30 * time.Second),
		Metadata:       envelope.Metadata{Kind: "task.status"},
		Payload:        []byte(fmt.Sprintf(`{"n":%d}`, seq)),
	}
}

func (f *fixture) sign(d envelope.Draft) []byte {
	return signWith(f.t, f.priv, d)
}

func signWith(t testing.TB, priv ed25519.PrivateKey, d envelope.Draft) []byte {
	t.Helper()
	env, err := envelope.Sign(d, priv)
	if err != nil {
		t.Fatalf("sign: %v", err)
	}
	return env.Canonical()
}

// signMap signs an arbitrary JSON object (members the Draft type cannot
// express, e.g. schema_version 2) the way a producer would.
func signMap(t testing.TB, priv ed25519.PrivateKey, m map[string]any) []byte {
	t.Helper()
	delete(m, "signature")
	raw, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	jcs, err := envelope.Canonicalize(raw)
	if err != nil {
		t.Fatal(err)
	}
	sig := ed25519.Sign(priv, append([]byte(envelope.SigningPrefix), jcs...))
	m["signature"] = b64url(sig)
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// draftMap is draft(seq) as a generic object.
func draftMap(seq int64) map[string]any {
	return map[string]any{
		"schema_version": 1, "tenant_id": tenantA, "project_id": projectA, "producer_id": deviceA,
		"event_id": fmt.Sprintf("evt-%d", seq), "idempotency_key": fmt.Sprintf("idem-%d", seq),
		"key_id": keyA, "sequence": seq, "issued_at": testNow.Add(-30 * time.Second).Format(time.RFC3339),
		"metadata": map[string]any{"kind": "task.status"}, "payload": map[string]any{"n": seq},
	}
}

type req struct {
	method, path, token string
	body                []byte
	header              map[string]string
	remote              string // default clientIP:40000
	chunked             bool
}

type resp struct {
	status int
	header http.Header
	body   []byte
}

func (r resp) answer(t testing.TB) answer {
	t.Helper()
	var a answer
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		t.Fatalf("answer body %q: %v", r.body, err)
	}
	return a
}

// do runs one request through the server's handler in process.
func (f *fixture) do(r req) resp {
	f.t.Helper()
	var body io.Reader = http.NoBody
	if r.body != nil {
		body = bytes.NewReader(r.body)
		if r.chunked {
			body = io.MultiReader(bytes.NewReader(r.body)) // hides the length
		}
	}
	hr := httptest.NewRequest(r.method, r.path, body)
	if r.chunked {
		hr.ContentLength = -1
	}
	hr.RemoteAddr = r.remote
	if hr.RemoteAddr == "" {
		hr.RemoteAddr = clientIP + ":40000"
	}
	if r.token != "" {
		hr.Header.Set("Authorization", "Bearer "+r.token)
	}
	if r.body != nil {
		hr.Header.Set("Content-Type", "application/json")
	}
	for k, v := range r.header {
		hr.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(w, hr)
	res := resp{status: w.Code, header: w.Header(), body: w.Body.Bytes()}
	f.mu.Lock()
	f.bodies = append(f.bodies, res)
	f.mu.Unlock()
	if f.observe != nil {
		f.observe(hr, res)
	}
	return res
}

// doMulti is do with one header sent with several values.
func (f *fixture) doMulti(r req, name string, values ...string) resp {
	f.t.Helper()
	hr := httptest.NewRequest(r.method, r.path, bytes.NewReader(r.body))
	hr.RemoteAddr = clientIP + ":40000"
	hr.Header.Set("Authorization", "Bearer "+r.token)
	for _, v := range values {
		hr.Header.Add(name, v)
	}
	w := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(w, hr)
	return resp{status: w.Code, header: w.Header(), body: w.Body.Bytes()}
}

func (f *fixture) post(token string, body []byte) resp {
	return f.do(req{method: http.MethodPost, path: "/v1/envelopes", token: token, body: body})
}

func (f *fixture) postBatch(token string, items ...[]byte) resp {
	return f.do(req{method: http.MethodPost, path: "/v1/envelopes/batch", token: token, body: batchBody(items...)})
}

func batchBody(items ...[]byte) []byte {
	var b bytes.Buffer
	b.WriteString(`{"envelopes":[`)
	for i, it := range items {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(it)
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

// wantAnswer checks status, outcome, reason and, when wantCursor >= 0, the
// cursor; it returns the answer.
func wantAnswer(t testing.TB, r resp, status int, outcome, reason string, wantCursor int64) answer {
	t.Helper()
	a := r.answer(t)
	if r.status != status || string(a.Outcome) != outcome || string(a.Reason) != reason {
		t.Fatalf("got %d %s/%s, want %d %s/%s (body %s)", r.status, a.Outcome, a.Reason, status, outcome, reason, r.body)
	}
	if a.CorrelationID == "" || r.header.Get("X-Correlation-Id") != a.CorrelationID {
		t.Fatalf("correlation id %q, header %q", a.CorrelationID, r.header.Get("X-Correlation-Id"))
	}
	if outcome == string(outcomeRefused) {
		if a.Cursor != nil {
			t.Fatalf("refusal carries a cursor: %s", r.body)
		}
		checkDetail(t, r.status, a.Detail, r.body)
	} else if a.Cursor == nil || (wantCursor >= 0 && *a.Cursor != wantCursor) {
		t.Fatalf("cursor = %v, want %d (body %s)", a.Cursor, wantCursor, r.body)
	}
	return a
}

// audit returns tenant-a's audit rows, oldest first.
func (f *fixture) audit() []store.AuditRecord {
	f.t.Helper()
	rows, err := f.st.Inbound().ListAudit(context.Background(), store.AuditFilter{TenantID: tenantA, Limit: 1000})
	if err != nil {
		f.t.Fatal(err)
	}
	for i, j := 0, len(rows)-1; i < j; i, j = i+1, j-1 {
		rows[i], rows[j] = rows[j], rows[i]
	}
	return rows
}

func (f *fixture) metricsText() string {
	f.t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			b.WriteString(mf.GetName())
			for _, l := range m.GetLabel() {
				fmt.Fprintf(&b, " %s=%q", l.GetName(), l.GetValue())
			}
			b.WriteByte('\n')
		}
	}
	return b.String()
}
