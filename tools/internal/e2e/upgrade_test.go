package e2e

import (
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
	"github.com/envelopeworker/envelopeworker/tools/internal/access"
	"github.com/envelopeworker/envelopeworker/tools/internal/webhooksink"
)

// upgradeRig is a fresh database and the files the two services need, each
// service logging in as its own role.
type upgradeRig struct {
	dsn, dir           string
	admin              *sql.DB
	keysFile, secrets  string
	whSecret           string
	ingestEnv, workEnv []string
	ingestURL, workURL string
}

func newUpgradeRig(t *testing.T) *upgradeRig {
	t.Helper()
	r := &upgradeRig{dsn: storetest.NewDatabase(t), dir: t.TempDir()}
	r.admin = storetest.AdminDB(t, r.dsn)
	outSeed, _ := randomB64(t, 32, base64.RawURLEncoding)
	r.keysFile = filepath.Join(r.dir, "outbound-keys.json")
	if err := os.WriteFile(r.keysFile, []byte(`{"up":{"key_id":"out-1","seed":"`+outSeed+`"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	whKey, _ := randomB64(t, 32, base64.StdEncoding)
	r.whSecret = "whsec_" + whKey
	r.secrets = filepath.Join(r.dir, "webhook-secrets.json")
	if err := os.WriteFile(r.secrets, []byte(`{"ep":["`+r.whSecret+`"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	ingestAddr, ingestMetrics, workerMetrics := freeAddr(t), freeAddr(t), freeAddr(t)
	r.ingestURL, r.workURL = "http://"+ingestAddr, "http://"+workerMetrics
	r.ingestEnv = []string{"DATABASE_URL=" + storetest.DSNForRole(r.dsn, "envelopeworker_ingest"),
		"INGEST_ADDR=" + ingestAddr, "METRICS_ADDR=" + ingestMetrics, "OUTBOUND_SIGNING_KEYS_FILE=" + r.keysFile}
	r.workEnv = []string{"DATABASE_URL=" + storetest.DSNForRole(r.dsn, "envelopeworker_delivery"),
		"METRICS_ADDR=" + workerMetrics, "WEBHOOK_SECRETS_FILE=" + r.secrets,
		"DELIVERY_ALLOW_INSECURE_LOOPBACK=true", "DELIVERY_POLL_INTERVAL=20ms"}
	return r
}

func (r *upgradeRig) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	if _, err := r.admin.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// readyWithin polls url until it answers 200 or within passes.
func readyWithin(t *testing.T, url string, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(100 * time.Millisecond) {
		if a := call(t, http.MethodGet, url, "", nil); a.status == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready after %v", url, within)
		}
	}
}

// TestSchemaOlderThanBinaries: contract §8.1. Binaries started before the
// release's migrate Job ran are not ready (503 unavailable), and become ready
// once it has, without a restart.
func TestSchemaOlderThanBinaries(t *testing.T) {
	r := newUpgradeRig(t)
	r.exec(t, `DELETE FROM schema_migrations WHERE version = $1`, migrations.Latest())

	launchService(t, "ingest-api", r.ingestEnv, r.ingestURL+"/readyz", http.StatusServiceUnavailable)
	launchService(t, "delivery-worker", r.workEnv, r.workURL+"/readyz", http.StatusServiceUnavailable)
	a := call(t, http.MethodGet, r.ingestURL+"/readyz", "", nil)
	var refusal struct {
		Outcome, Reason string
		CorrelationID   string `json:"correlation_id"`
	}
	if err := json.Unmarshal([]byte(a.body), &refusal); err != nil || a.status != http.StatusServiceUnavailable ||
		refusal.Outcome != "refused" || refusal.Reason != "unavailable" || refusal.CorrelationID == "" || a.header.Get("Retry-After") == "" {
		t.Fatalf("ingest-api /readyz on an older schema: %d %s %v", a.status, a.body, a.header)
	}
	if a := call(t, http.MethodGet, r.workURL+"/readyz", "", nil); a.status != http.StatusServiceUnavailable || a.body != "{\"status\":\"unavailable\"}\n" {
		t.Fatalf("delivery-worker /readyz on an older schema: %d %s", a.status, a.body)
	}

	res := envctlRun(t, r.dsn, "migrate")
	if res.code != 0 || !strings.Contains(res.stdout, "applied migration(s)") {
		t.Fatalf("envctl migrate: %+v", res)
	}
	// The probes are at most a second old.
	readyWithin(t, r.ingestURL+"/readyz", 10*time.Second)
	readyWithin(t, r.workURL+"/readyz", 10*time.Second)
}

// TestSchemaNewerThanBinaries: contract §8.1. The next release's migrate Job
// has run (a version these binaries do not embed); they stay ready and keep
// serving: ingest-api accepts a signed envelope and the delivery-worker
// delivers an outbox message.
func TestSchemaNewerThanBinaries(t *testing.T) {
	r := newUpgradeRig(t)
	r.exec(t, `INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, 'from_a_later_release.sql', 'not-ours')`,
		migrations.Latest()+1)

	issue := func(device, role string) string {
		res := envctlRun(t, r.dsn, "credential", "issue", "--tenant", "up", "--account", "acct-1", "--device", device, "--role", role)
		if res.code != 0 {
			t.Fatalf("credential issue: %+v", res)
		}
		return strings.TrimSpace(res.stdout)
	}
	device, svc := issue("device-1", "device"), issue("svc-1", "service")
	if err := access.WriteSecretFile(filepath.Join(r.dir, "token"), device+"\n"); err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(r.dir, "seed")
	res := envctlRun(t, "", "keygen", "--seed-file", seed)
	if res.code != 0 {
		t.Fatalf("keygen: %+v", res)
	}
	if res = envctlRun(t, r.dsn, "key", "add", "--tenant", "up", "--key-id", "demo-key", "--public-key", strings.TrimSpace(res.stdout)); res.code != 0 {
		t.Fatalf("key add: %+v", res)
	}
	key, err := webhooksink.ParseSecret(r.whSecret)
	if err != nil {
		t.Fatal(err)
	}
	sink, err := webhooksink.New(webhooksink.Config{Secrets: [][]byte{key}})
	if err != nil {
		t.Fatal(err)
	}
	hook := httptest.NewServer(sink)
	defer hook.Close()
	if res = envctlRun(t, r.dsn, "endpoint", "add", "--tenant", "up", "--project", "proj-1", "--topic", "orders",
		"--url", hook.URL+"/hook", "--secret-ref", "ep"); res.code != 0 {
		t.Fatalf("endpoint add: %+v", res)
	}

	startService(t, "ingest-api", r.ingestEnv, r.ingestURL+"/readyz")
	startService(t, "delivery-worker", r.workEnv, r.workURL+"/readyz")
	if a := call(t, http.MethodGet, r.ingestURL+"/readyz", "", nil); a.status != 200 || a.body != `{"status":"ready"}` {
		t.Fatalf("ingest-api /readyz on a newer schema: %d %s", a.status, a.body)
	}

	d := strings.Replace(draft("device-1", "evt-1", 1, "one"), `"demo"`, `"up"`, 1)
	if status, a := send(t, r.ingestURL, r.dir, seed, d); status != 200 || a.Outcome != "accepted" {
		t.Fatalf("envelope on a newer schema: HTTP %d %+v", status, a)
	}
	a := call(t, http.MethodPost, r.ingestURL+"/v1/outbox", svc,
		[]byte(`{"project_id":"proj-1","topic":"orders","idempotency_key":"up-1","kind":"proposal","payload":{"n":1}}`))
	var enq struct {
		MessageIDs []string `json:"message_ids"`
	}
	if err := json.Unmarshal([]byte(a.body), &enq); err != nil || a.status != http.StatusCreated || len(enq.MessageIDs) != 1 {
		t.Fatalf("enqueue on a newer schema: %d %s", a.status, a.body)
	}
	// The sink answers 204 only to a delivery whose webhook signature checks
	// out; anything else would end the message dead, not delivered.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var status string
		if err := r.admin.QueryRow(`SELECT status FROM outbox_messages WHERE message_id = $1`, enq.MessageIDs[0]).Scan(&status); err != nil {
			t.Fatal(err)
		}
		if status == "delivered" {
			break
		}
		if status == "dead" || time.Now().After(deadline) {
			t.Fatalf("message %s on a newer schema: %s", enq.MessageIDs[0], status)
		}
	}
}
