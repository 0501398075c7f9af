package server

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

func TestHealthAndReadiness(t *testing.T) {
	f := newFixture(t)
	r := f.get("", "/healthz")
	if r.status != 200 || string(r.body) != `{"status":"ok"}` {
		t.Fatalf("healthz %d %s", r.status, r.body)
	}
	r = f.get("", "/readyz")
	if r.status != 200 || string(r.body) != `{"status":"ready"}` {
		t.Fatalf("readyz %d %s", r.status, r.body)
	}

	// A database without our migrations is not ready.
	empty := storetest.NewEmptyDatabase(t)
	st, err := store.Open(context.Background(), empty, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	f.srv = f.newServer(testConfig(), st)
	wantAnswer(t, f.get("", "/readyz"), 503, "refused", "unavailable", -1)
	if r := f.get("", "/healthz"); r.status != 200 {
		t.Fatalf("healthz on an unmigrated database: %d", r.status)
	}
}

func TestUnknownRoutesAndMethods(t *testing.T) {
	f := newFixture(t)
	wantAnswer(t, f.get(f.device, "/v1/nope"), 404, "refused", "not_found", -1)
	wantAnswer(t, f.get("", "/"), 404, "refused", "not_found", -1)
	wantAnswer(t, f.get(f.device, "/v1/envelopes"), 405, "refused", "method_not_allowed", -1)
	wantAnswer(t, f.do(req{method: http.MethodPost, path: "/healthz"}), 405, "refused", "method_not_allowed", -1)
	// Unmatched paths share one metric label.
	for _, line := range strings.Split(f.metricsText(), "\n") {
		if strings.Contains(line, "/v1/nope") {
			t.Fatalf("raw path in metrics: %s", line)
		}
	}
	if !strings.Contains(f.metricsText(), `route="unmatched"`) {
		t.Fatal("no unmatched route label")
	}
}

// TestDatabaseDown: an unreachable database answers 503 unavailable on every
// route, never a refusal that would make a client give up.
func TestDatabaseDown(t *testing.T) {
	f := newFixture(t)
	down, err := store.Open(context.Background(), "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2", store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	f.srv = f.newServer(testConfig(), down)
	body := f.sign(draft(1))
	for _, r := range []resp{
		f.post(f.device, body),
		f.post("ewk_"+strings.Repeat("A", 43), body), // well-formed: needs the database
		f.postBatch(f.device, body),
		f.get(f.device, "/v1/streams/proj-1/device-7"),
		f.get(f.service, "/v1/streams/proj-1/device-7/envelopes"),
		f.get("", "/readyz"),
	} {
		wantAnswer(t, r, 503, "refused", "unavailable", -1)
		if r.header.Get("Retry-After") == "" {
			t.Fatal("503 without Retry-After")
		}
	}
	if !strings.Contains(f.metricsText(), "envelopeworker_ingest_store_errors_total operation=\"verify_credential\"") {
		t.Fatalf("store errors not counted:\n%s", f.metricsText())
	}
}

// TestDatabaseLostAfterAuthentication: with credentials cached, the failure
// shows up at key lookup or at the commit; both are 503 and nothing is
// acknowledged.
func TestDatabaseLostAfterAuthentication(t *testing.T) {
	f := newFixture(t)
	st := storetest.Open(t, f.dsn)
	cfg := testConfig()
	cfg.CredentialCacheTTL = 2 * time.Second
	cfg.Now = func() time.Time { return testNow }
	f.srv = f.newServer(cfg, st)
	wantAnswer(t, f.post(f.device, f.sign(draft(1))), 200, "accepted", "", 1)
	wantAnswer(t, f.post(f.service, f.sign(draft(2))), 403, "refused", "forbidden", -1)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	// Device: cached credential, then the key lookup fails.
	wantAnswer(t, f.post(f.device, f.sign(draft(2))), 503, "refused", "unavailable", -1)
	// Service: cached credential, forbidden decided, the audit commit fails.
	wantAnswer(t, f.post(f.service, f.sign(draft(2))), 503, "refused", "unavailable", -1)
	wantAnswer(t, f.postBatch(f.device, f.sign(draft(2))), 503, "refused", "unavailable", -1)
	// Nothing of the failed requests was committed.
	if n := len(f.audit()); n != 2 {
		t.Fatalf("%d audit rows, want 2", n)
	}
}

func TestCorrelationAndTraceparentInLogs(t *testing.T) {
	f := newFixture(t)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	r := f.do(req{method: http.MethodPost, path: "/v1/envelopes", token: f.device, body: f.sign(draft(1)),
		header: map[string]string{"Traceparent": tp}})
	a := wantAnswer(t, r, 200, "accepted", "", 1)
	bad := "00-00000000000000000000000000000000-00f067aa0ba902b7-01"
	r2 := f.do(req{method: http.MethodGet, path: "/healthz", header: map[string]string{"Traceparent": bad}})
	if r2.status != 200 {
		t.Fatal(r2.status)
	}
	var sawGood, sawHealth bool
	sc := bufio.NewScanner(strings.NewReader(f.logs.String()))
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("log line is not JSON: %s", sc.Text())
		}
		if line["correlation_id"] == "" || line["correlation_id"] == nil {
			t.Fatalf("log line without correlation id: %s", sc.Text())
		}
		if line["correlation_id"] == a.CorrelationID {
			sawGood = line["traceparent"] == tp && line["route"] == "/v1/envelopes" && line["outcome"] == "accepted"
		}
		if line["route"] == "/healthz" {
			sawHealth = true
			if _, ok := line["traceparent"]; ok {
				t.Fatalf("invalid traceparent was logged: %s", sc.Text())
			}
		}
	}
	if !sawGood || !sawHealth {
		t.Fatalf("missing log lines:\n%s", f.logs.String())
	}
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{tp, true},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", true},
		{bad, false},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", false},
		{"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", false},
		{"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", false},
		{"", false},
	} {
		if got := validTraceparent(tc.in); got != tc.ok {
			t.Errorf("validTraceparent(%q) = %v", tc.in, got)
		}
	}
}

// TestNoSecretsAnywhere runs a representative session and scans logs,
// metrics, audit rows and every error body for the credentials, signatures,
// idempotency keys and a payload marker used.
func TestNoSecretsAnywhere(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.CredentialCacheTTL = time.Second })
	const marker = "PAYLOAD-MARKER-7f3a"
	mk := func(seq int64) envelope.Draft {
		d := draft(seq)
		d.IdempotencyKey = "idem-SECRET-" + itoa(int(seq))
		d.Payload = []byte(`{"secret":"` + marker + `"}`)
		return d
	}
	var sigs []string
	send := func(token string, d envelope.Draft, hdr map[string]string) resp {
		body := f.sign(d)
		var m map[string]any
		_ = json.Unmarshal(body, &m)
		sigs = append(sigs, m["signature"].(string))
		return f.do(req{method: http.MethodPost, path: "/v1/envelopes", token: token, body: body, header: hdr})
	}
	send(f.device, mk(1), nil)
	send(f.device, mk(1), nil) // duplicate
	conflict := mk(1)
	conflict.Payload = []byte(`{"secret":"` + marker + `-2"}`)
	send(f.device, conflict, nil)
	send(f.device, mk(2), map[string]string{"Idempotency-Key": "idem-SECRET-other"})
	send(f.service, mk(3), nil)
	send("ewk_"+strings.Repeat("Z", 43), mk(3), nil)
	bad := mk(4)
	bad.KeyID = "unknown-key"
	send(f.device, bad, nil)
	tampered := strings.Replace(string(f.sign(mk(5))), marker, marker+"x", 1)
	f.do(req{method: http.MethodPost, path: "/v1/envelopes", token: f.device, body: []byte(tampered)})
	f.postBatch(f.device, f.sign(mk(6)), []byte(`{"payload":"`+marker+`"}`))
	f.do(req{method: http.MethodPost, path: "/v1/envelopes", token: f.device, body: []byte(`{"x":"` + marker + `"`)})
	f.get(f.device, "/v1/streams/proj-1/device-8")

	secrets := append([]string{f.device, f.service, f.operator, marker, "idem-SECRET"}, sigs...)
	var haystack strings.Builder
	haystack.WriteString(f.logs.String())
	haystack.WriteString(f.metricsText())
	rows, err := f.admin.QueryContext(context.Background(), `SELECT row_to_json(a)::text FROM audit_events a`)
	if err != nil {
		t.Fatal(err)
	}
	nrows := 0
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		haystack.WriteString(s)
		nrows++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if nrows < 8 {
		t.Fatalf("only %d audit rows: the session did not run", nrows)
	}
	for _, r := range f.bodies {
		if r.status >= 400 || strings.Contains(string(r.body), `"refused"`) {
			haystack.Write(r.body)
		}
	}
	text := haystack.String()
	for _, s := range secrets {
		if strings.Contains(text, s) {
			t.Errorf("secret %.12q… found in logs, metrics, audit rows or error bodies", s)
		}
	}
	// And no identity as a metric label value.
	m := f.metricsText()
	for _, id := range []string{tenantA, deviceA, "acct-1", projectA, keyA} {
		if strings.Contains(m, id) {
			t.Errorf("metrics mention %q", id)
		}
	}
}
