package e2e

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// runBinary builds services/<name>, runs it to its exit with env and args,
// and returns its combined output and exit error.
func runBinary(t *testing.T, name string, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(buildService(t, name), args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return out.String(), err
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%s did not exit within 2 minutes\n%s", name, out.String())
		return "", nil
	}
}

// TestOutboundRetentionEndToEnd runs ingest-api, delivery-worker (with a
// one-second OUTBOX_PAYLOAD_RETENTION) and retention-janitor, built from this
// repository, through §8.9: deliveries settle, the janitor deletes the
// expired bodies and their attempt rows, then GET /v1/outbox/{id} adds
// "payload_expired":true, the same enqueue answers 200 with a null envelope
// and the original message ids, and replaying the dead letter answers
// 409 payload_expired (envctl dlq replay refuses too). The worker refuses a
// bad OUTBOX_PAYLOAD_RETENTION at start and lists it in -h.
func TestOutboundRetentionEndToEnd(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	dir := t.TempDir()
	const tenant = "ret"
	issue := func(device, role string) string {
		r := envctlRun(t, dsn, "credential", "issue", "--tenant", tenant, "--account", "acct-1", "--device", device, "--role", role)
		if r.code != 0 {
			t.Fatalf("credential issue: %+v", r)
		}
		return strings.TrimSpace(r.stdout)
	}
	svc, ops := issue("svc-1", "service"), issue("ops-1", "operator")
	outSeed, _ := randomB64(t, 32, base64.RawURLEncoding)
	keysFile := filepath.Join(dir, "outbound-keys.json")
	if err := os.WriteFile(keysFile, []byte(`{"`+tenant+`":{"key_id":"out-1","seed":"`+outSeed+`"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	whKey, _ := randomB64(t, 32, base64.StdEncoding)
	secretsFile := filepath.Join(dir, "webhook-secrets.json")
	if err := os.WriteFile(secretsFile, []byte(`{"ep":["whsec_`+whKey+`"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ok" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		w.WriteHeader(http.StatusBadRequest)
	}))
	defer rc.Close()
	for topic, path := range map[string]string{"t.ok": "/ok", "t.reject": "/reject"} {
		if r := envctlRun(t, dsn, "endpoint", "add", "--tenant", tenant, "--project", "proj-1", "--topic", topic,
			"--url", rc.URL+path, "--secret-ref", "ep"); r.code != 0 {
			t.Fatalf("endpoint add %s: %+v", topic, r)
		}
	}

	workerEnv := []string{"DATABASE_URL=" + dsn, "WEBHOOK_SECRETS_FILE=" + secretsFile, "DELIVERY_ALLOW_INSECURE_LOOPBACK=true",
		"DELIVERY_POLL_INTERVAL=10ms"}
	// Refused at start, named; listed by -h.
	for _, bad := range []string{"0s", "90d", "-1h"} {
		out, err := runBinary(t, "delivery-worker", append(workerEnv, "METRICS_ADDR="+freeAddr(t), "OUTBOX_PAYLOAD_RETENTION="+bad))
		if err == nil || !strings.Contains(out, "OUTBOX_PAYLOAD_RETENTION") {
			t.Fatalf("OUTBOX_PAYLOAD_RETENTION=%s: %v\n%s", bad, err, out)
		}
	}
	if out, err := runBinary(t, "delivery-worker", nil, "-h"); err != nil || !strings.Contains(out, "-outbox-payload-retention") ||
		!strings.Contains(out, "OUTBOX_PAYLOAD_RETENTION") {
		t.Fatalf("delivery-worker -h: %v\n%s", err, out)
	}

	ingestAddr, workerMetrics := freeAddr(t), freeAddr(t)
	startService(t, "ingest-api", []string{"DATABASE_URL=" + dsn, "INGEST_ADDR=" + ingestAddr,
		"METRICS_ADDR=" + freeAddr(t), "OUTBOUND_SIGNING_KEYS_FILE=" + keysFile},
		"http://"+ingestAddr+"/readyz")
	worker := startService(t, "delivery-worker", append(workerEnv, "METRICS_ADDR="+workerMetrics, "OUTBOX_PAYLOAD_RETENTION=1s"),
		"http://"+workerMetrics+"/readyz")
	api := "http://" + ingestAddr

	type enqueued struct {
		Envelope       json.RawMessage `json:"envelope"`
		PayloadExpired bool            `json:"payload_expired"`
		MessageIDs     []string        `json:"message_ids"`
	}
	bodies := map[string][]byte{}
	first := map[string]enqueued{}
	for _, topic := range []string{"t.ok", "t.reject"} {
		body := []byte(fmt.Sprintf(`{"project_id":"proj-1","topic":%q,"idempotency_key":"k-%s","kind":"proposal","payload":{"n":1},"max_attempts":2}`, topic, topic))
		a := call(t, http.MethodPost, api+"/v1/outbox", svc, body)
		var e enqueued
		if a.status != http.StatusCreated || json.Unmarshal([]byte(a.body), &e) != nil || len(e.MessageIDs) != 1 || e.PayloadExpired {
			t.Fatalf("enqueue %s: %d %s", topic, a.status, a.body)
		}
		bodies[topic], first[topic] = body, e
	}
	status := func(id string) map[string]any {
		t.Helper()
		a := call(t, http.MethodGet, api+"/v1/outbox/"+id, ops, nil)
		var m map[string]any
		if a.status != http.StatusOK || json.Unmarshal([]byte(a.body), &m) != nil {
			t.Fatalf("GET %s: %d %s", id, a.status, a.body)
		}
		return m
	}
	okID, deadID := first["t.ok"].MessageIDs[0], first["t.reject"].MessageIDs[0]
	for deadline := time.Now().Add(60 * time.Second); status(okID)["status"] != "delivered" || status(deadID)["status"] != "dead"; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not settled after 60s: %v %v\n%s", status(okID), status(deadID), worker.logs.String())
		}
	}
	if _, ok := status(okID)["payload_expired"]; ok {
		t.Fatalf("payload_expired before the janitor ran: %v", status(okID))
	}
	// Attempt rows, as the worker records them (§8.8), to expire with the body.
	admin := storetest.AdminDB(t, dsn)
	if _, err := admin.Exec(`INSERT INTO outbox_attempts (tenant_id, message_id, attempt, started_at, duration_ms, result)
		SELECT tenant_id, message_id, attempts, now(), 1, 'retry' FROM outbox_messages
		ON CONFLICT DO NOTHING`); err != nil {
		t.Fatal(err)
	}
	wantAttempts := 0
	if err := admin.QueryRow(`SELECT count(*) FROM outbox_attempts`).Scan(&wantAttempts); err != nil || wantAttempts < 2 {
		t.Fatalf("attempt rows: %d, %v", wantAttempts, err)
	}

	janitor := func() map[string]any {
		t.Helper()
		out, err := runBinary(t, "retention-janitor", []string{"DATABASE_URL=" + storetest.DSNForRole(dsn, "envelopeworker_janitor")})
		if err != nil {
			t.Fatalf("retention-janitor: %v\n%s", err, out)
		}
		sc := bufio.NewScanner(strings.NewReader(out))
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == "retention summary" {
				return line
			}
		}
		t.Fatalf("no summary line:\n%s", out)
		return nil
	}
	time.Sleep(1500 * time.Millisecond) // past the one-second retention
	sum := janitor()
	if sum["outbound_bodies_deleted"] != float64(2) || sum["outbound_attempts_deleted"] != float64(wantAttempts) || sum["stopped_by"] != "done" {
		t.Fatalf("janitor summary %v, want 2 bodies and %d attempt rows", sum, wantAttempts)
	}

	for _, id := range []string{okID, deadID} {
		if m := status(id); m["payload_expired"] != true {
			t.Fatalf("GET %s after expiry: %v", id, m)
		}
	}
	for _, topic := range []string{"t.ok", "t.reject"} {
		a := call(t, http.MethodPost, api+"/v1/outbox", svc, bodies[topic])
		var e enqueued
		if a.status != http.StatusOK || json.Unmarshal([]byte(a.body), &e) != nil || string(e.Envelope) != "null" ||
			!e.PayloadExpired || !slices.Equal(e.MessageIDs, first[topic].MessageIDs) {
			t.Fatalf("repeat %s after expiry: %d %s", topic, a.status, a.body)
		}
	}
	a := call(t, http.MethodPost, api+"/v1/dead-letters/"+deadID+"/replay", ops, nil)
	var refusal struct {
		Reason string `json:"reason"`
	}
	if a.status != http.StatusConflict || json.Unmarshal([]byte(a.body), &refusal) != nil || refusal.Reason != "payload_expired" {
		t.Fatalf("replay after expiry: %d %s", a.status, a.body)
	}
	if r := envctlRun(t, storetest.DSNForRole(dsn, "envelopeworker_operator"), "dlq", "replay", "--tenant", tenant, "--id", deadID); r.code == 0 ||
		!strings.Contains(r.stderr, "expired") {
		t.Fatalf("envctl dlq replay after expiry: %+v", r)
	}
	if m := status(deadID); m["status"] != "dead" {
		t.Fatalf("refused replays changed the message: %v", m)
	}
	// A second run finds nothing.
	if sum := janitor(); sum["outbound_bodies_deleted"] != float64(0) {
		t.Fatalf("second janitor run: %v", sum)
	}
}
