package e2e

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// TestAttemptHistoryEndToEnd runs ingest-api and delivery-worker, built from
// this repository, on a message whose endpoint answers 503 and then 204:
// GET /v1/outbox/{id}/attempts for both roles and every refusal, envctl
// outbox show and outbox attempts on an operator-role connection, and the
// worker's one line per settled attempt (contract §8.8).
func TestAttemptHistoryEndToEnd(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	dir := t.TempDir()
	const tenant = "hist"
	issue := func(tenant, device, role string) string {
		r := envctlRun(t, dsn, "credential", "issue", "--tenant", tenant, "--account", "acct-1", "--device", device, "--role", role)
		if r.code != 0 {
			t.Fatalf("credential issue: %+v", r)
		}
		return strings.TrimSpace(r.stdout)
	}
	device, svc, ops := issue(tenant, "device-1", "device"), issue(tenant, "svc-1", "service"), issue(tenant, "ops-1", "operator")
	otherSvc := issue("other", "svc-1", "service")

	outSeed, _ := randomB64(t, 32, base64.RawURLEncoding)
	keysFile := filepath.Join(dir, "outbound-keys.json")
	if err := os.WriteFile(keysFile, []byte(`{"`+tenant+`":{"key_id":"out-1","seed":"`+outSeed+`"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	whKey, _ := randomB64(t, 32, base64.StdEncoding)
	secretsFile := filepath.Join(dir, "webhook-secrets.json")
	if err := os.WriteFile(secretsFile, []byte(`{"hist-ep":["whsec_`+whKey+`"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	hits := 0
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits++
		n := hits
		mu.Unlock()
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer rc.Close()
	r := envctlRun(t, dsn, "endpoint", "add", "--tenant", tenant, "--project", "proj-1", "--topic", "t.hist",
		"--url", rc.URL+"/hook", "--secret-ref", "hist-ep")
	if r.code != 0 {
		t.Fatalf("endpoint add: %+v", r)
	}
	ep := strings.TrimSpace(r.stdout)

	ingestAddr, ingestMetrics, workerMetrics := freeAddr(t), freeAddr(t), freeAddr(t)
	startService(t, "ingest-api", []string{"DATABASE_URL=" + dsn, "INGEST_ADDR=" + ingestAddr,
		"METRICS_ADDR=" + ingestMetrics, "OUTBOUND_SIGNING_KEYS_FILE=" + keysFile,
		"SYNC_LIMIT_TOKENS=100000", "SYNC_LIMIT_INTERVAL=1h", "PEER_LIMIT_TOKENS=100000", "PEER_LIMIT_INTERVAL=1h"},
		"http://"+ingestAddr+"/readyz")
	worker := startService(t, "delivery-worker", []string{"DATABASE_URL=" + dsn, "METRICS_ADDR=" + workerMetrics,
		"WEBHOOK_SECRETS_FILE=" + secretsFile, "DELIVERY_ALLOW_INSECURE_LOOPBACK=true", "LOG_LEVEL=info",
		"DELIVERY_POLL_INTERVAL=10ms", "DELIVERY_BACKOFF_BASE=10ms", "DELIVERY_BACKOFF_MAX=20ms", "DELIVERY_HTTP_TIMEOUT=2s"},
		"http://"+workerMetrics+"/readyz")
	api := "http://" + ingestAddr

	a := call(t, http.MethodPost, api+"/v1/outbox", svc,
		[]byte(`{"project_id":"proj-1","topic":"t.hist","idempotency_key":"k-1","kind":"proposal","payload":{"n":1},"max_attempts":3}`))
	if a.status != http.StatusCreated {
		t.Fatalf("enqueue: %d %s", a.status, a.body)
	}
	var enq struct {
		MessageIDs []string `json:"message_ids"`
	}
	if err := json.Unmarshal([]byte(a.body), &enq); err != nil || len(enq.MessageIDs) != 1 {
		t.Fatalf("enqueue answer %s: %v", a.body, err)
	}
	id := enq.MessageIDs[0]
	path := api + "/v1/outbox/" + id + "/attempts"

	type entry struct {
		Attempt    int     `json:"attempt"`
		StartedAt  string  `json:"started_at"`
		DurationMS int64   `json:"duration_ms"`
		HTTPStatus *int    `json:"http_status"`
		ErrorCode  *string `json:"error_code"`
		Result     string  `json:"result"`
	}
	var page struct {
		Attempts []entry `json:"attempts"`
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		a := call(t, http.MethodGet, path, svc, nil)
		if a.status != http.StatusOK {
			t.Fatalf("attempts: %d %s", a.status, a.body)
		}
		dec := json.NewDecoder(strings.NewReader(a.body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&page); err != nil {
			t.Fatalf("attempts answer %s: %v", a.body, err)
		}
		if len(page.Attempts) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("attempts after 60s: %s\n%s", a.body, worker.logs.String())
		}
	}
	first, second := page.Attempts[0], page.Attempts[1]
	if first.Attempt != 1 || first.HTTPStatus == nil || *first.HTTPStatus != 503 || first.ErrorCode == nil ||
		*first.ErrorCode != "http_5xx" || first.Result != "retry" || first.DurationMS < 0 {
		t.Errorf("first attempt %+v", first)
	}
	if second.Attempt != 2 || second.HTTPStatus == nil || *second.HTTPStatus != 204 || second.ErrorCode != nil ||
		second.Result != "delivered" {
		t.Errorf("second attempt %+v", second)
	}
	for _, e := range page.Attempts {
		if _, err := time.Parse(time.RFC3339Nano, e.StartedAt); err != nil || !strings.HasSuffix(e.StartedAt, "Z") {
			t.Errorf("started_at %q: %v", e.StartedAt, err)
		}
	}
	if b := call(t, http.MethodGet, path, ops, nil); b.status != http.StatusOK || !strings.Contains(b.body, `"result":"delivered"`) {
		t.Errorf("operator read: %d %s", b.status, b.body)
	}

	for _, c := range []struct {
		name, method, url, token string
		status                   int
		reason                   string
	}{
		{"device role", http.MethodGet, path, device, 403, "forbidden"},
		{"no credential", http.MethodGet, path, "", 401, "unauthenticated"},
		{"other tenant", http.MethodGet, path, otherSvc, 404, "not_found"},
		{"unknown id", http.MethodGet, api + "/v1/outbox/msg_000000000000000000000000/attempts", svc, 404, "not_found"},
		{"malformed id", http.MethodGet, api + "/v1/outbox/not-an-id/attempts", svc, 404, "not_found"},
		{"wrong method", http.MethodPost, path, ops, 405, "method_not_allowed"},
	} {
		a := call(t, c.method, c.url, c.token, nil)
		var refusal struct {
			Reason string `json:"reason"`
		}
		if err := json.Unmarshal([]byte(a.body), &refusal); a.status != c.status || err != nil || refusal.Reason != c.reason {
			t.Errorf("%s: %d %s; want %d %s", c.name, a.status, a.body, c.status, c.reason)
		}
	}

	// envctl on the operator role's connection.
	opsDSN := storetest.DSNForRole(dsn, "envelopeworker_operator")
	r = envctlRun(t, opsDSN, "outbox", "attempts", "--tenant", tenant, "--id", id)
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if r.code != 0 || len(lines) != 2 {
		t.Fatalf("envctl outbox attempts: %+v", r)
	}
	for i, l := range lines {
		var e entry
		dec := json.NewDecoder(strings.NewReader(l))
		dec.DisallowUnknownFields()
		err := dec.Decode(&e)
		got, _ := json.Marshal(e)
		want, _ := json.Marshal(page.Attempts[i])
		if err != nil || string(got) != string(want) {
			t.Errorf("envctl line %d %s (%v), API %s", i, l, err, want)
		}
	}
	r = envctlRun(t, opsDSN, "outbox", "show", "--tenant", tenant, "--id", id)
	if r.code != 0 || !strings.Contains(r.stdout, `"status":"delivered"`) || !strings.Contains(r.stdout, `"attempts":2`) {
		t.Fatalf("envctl outbox show: %+v", r)
	}
	if r := envctlRun(t, opsDSN, "outbox", "attempts", "--tenant", "other", "--id", id); r.code != 1 {
		t.Fatalf("envctl outbox attempts of another tenant: %+v", r)
	}

	// The worker's log: one line per settled attempt.
	worker.stop()
	var settled []map[string]any
	for _, l := range strings.Split(worker.logs.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "attempt settled" {
			settled = append(settled, m)
		}
	}
	if len(settled) != 2 || settled[0]["message_id"] != id || settled[0]["endpoint_id"] != ep ||
		settled[0]["http_status"] != float64(503) || settled[1]["result"] != "delivered" {
		t.Fatalf("worker attempt lines %v\n%s", settled, worker.logs.String())
	}
}
