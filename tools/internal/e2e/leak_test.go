package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/buildinfo/buildtest"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
	"github.com/envelopeworker/envelopeworker/tools/internal/access"
)

// lockedBuffer collects a child process's output while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// service is a binary of services/ built from this repository and running.
type service struct {
	logs *lockedBuffer
	stop func() // SIGTERM and wait; safe to call twice
}

// built holds the binaries this test process has compiled, by service name. Every
// test starts the same sources, and each `go build` re-links the binary even when
// GOCACHE holds every package; one build per service per process (per
// scripts/test.sh run: buildtest) keeps make test short. TestMain removes dir.
var built struct {
	mu   sync.Mutex
	dir  string
	bins map[string]string
}

// buildService compiles services/<name> of this repository once per test process
// and returns the binary's path.
func buildService(t *testing.T, name string) string {
	t.Helper()
	built.mu.Lock()
	defer built.mu.Unlock()
	if bin, ok := built.bins[name]; ok {
		return bin
	}
	if built.dir == "" {
		var err error
		if built.dir, err = os.MkdirTemp("", "e2e-bin-"); err != nil {
			t.Fatal(err)
		}
		built.bins = map[string]string{}
	}
	bin := buildtest.Binary(t, "services/"+name, built.dir)
	built.bins[name] = bin
	return bin
}

// startService builds services/<name>, starts it with env added to the
// environment and waits until readyURL answers 200.
func startService(t *testing.T, name string, env []string, readyURL string) *service {
	t.Helper()
	return launchService(t, name, env, readyURL, http.StatusOK)
}

// launchService is startService waiting for readyURL to answer status want.
func launchService(t *testing.T, name string, env []string, readyURL string, want int) *service {
	t.Helper()
	bin := buildService(t, name)
	s := &service{logs: &lockedBuffer{}}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = s.logs, s.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var once sync.Once
	s.stop = func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case err := <-exited:
				if err != nil {
					t.Errorf("%s did not exit cleanly on SIGTERM: %v\n%s", name, err, s.logs.String())
				}
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
				t.Errorf("%s ignored SIGTERM for 30s", name)
			}
		})
	}
	t.Cleanup(s.stop)
	client := &http.Client{Timeout: 2 * time.Second}
	for deadline := time.Now().Add(60 * time.Second); ; {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("%s exited during start-up: %v\n%s", name, err, s.logs.String())
		default:
		}
		if resp, err := client.Get(readyURL); err == nil {
			resp.Body.Close()
			if resp.StatusCode == want {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer %d after 60s\n%s", name, want, s.logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type httpAnswer struct {
	status int
	body   string
	header http.Header
}

func call(t *testing.T, method, url, token string, body []byte) httpAnswer {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return roundTrip(t, req)
}

// roundTrip sends req and reads the whole answer.
func roundTrip(t *testing.T, req *http.Request) httpAnswer {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return httpAnswer{resp.StatusCode, string(b), resp.Header}
}

func randomB64(t *testing.T, n int, enc *base64.Encoding) (string, []byte) {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return enc.EncodeToString(b), b
}

// TestNoSecretLeaksEndToEnd runs ingest-api and delivery-worker, both built
// from this repository at LOG_LEVEL=debug, through a full session: inbound
// accepts, duplicates and refusals; outbound enqueues, repeats and refusals;
// deliveries that succeed, fail with 5xx and retry into a dead letter, are
// refused with 4xx, 410 and a redirect, lack their secret, and aim at the
// metadata address; a replay; envctl's dead-letter and audit listings. The
// webhook receiver answers every failure with a secret marker in its body
// and headers. Then it scans both binaries' logs, both /metrics pages, every
// answer that is not an envelope by contract, envctl's output, and every
// database row outside the two tables that hold signed envelopes by
// contract, for tokens, seeds, the webhook secret, webhook and envelope
// signatures, idempotency keys, payload markers, the provider's response
// body and headers, the redirect target and the URL's query token. The two
// envelope tables are scanned for everything an envelope does not carry.
func TestNoSecretLeaksEndToEnd(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	dir := t.TempDir()
	ctx := context.Background()
	const (
		tenant         = "leak"
		payloadMark    = "PAYLOAD-SECRET-5d1c"
		idemMark       = "IDEM-SECRET-a7e2"
		providerBody   = "PROVIDER-BODY-SECRET-93bf"
		providerHeader = "PROVIDER-HEADER-SECRET-2c41"
		redirectMark   = "REDIRECT-SECRET-0e6a"
		urlToken       = "URL-TOKEN-SECRET-71d9"
	)

	issue := func(device, role string) string {
		r := envctlRun(t, dsn, "credential", "issue", "--tenant", tenant, "--account", "acct-1", "--device", device, "--role", role)
		if r.code != 0 {
			t.Fatalf("credential issue: %+v", r)
		}
		return strings.TrimSpace(r.stdout)
	}
	device, svc, ops := issue("device-1", "device"), issue("svc-1", "service"), issue("ops-1", "operator")
	if err := access.WriteSecretFile(filepath.Join(dir, "token"), device+"\n"); err != nil {
		t.Fatal(err)
	}
	seedFile := filepath.Join(dir, "seed")
	r := envctlRun(t, "", "keygen", "--seed-file", seedFile)
	if r.code != 0 {
		t.Fatalf("keygen: %+v", r)
	}
	if r = envctlRun(t, dsn, "key", "add", "--tenant", tenant, "--key-id", "leak-key", "--public-key", strings.TrimSpace(r.stdout)); r.code != 0 {
		t.Fatalf("key add: %+v", r)
	}
	inSeed, err := os.ReadFile(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	stranger := filepath.Join(dir, "stranger")
	if r = envctlRun(t, "", "keygen", "--seed-file", stranger); r.code != 0 {
		t.Fatalf("keygen: %+v", r)
	}

	outSeed, outSeedRaw := randomB64(t, 32, base64.RawURLEncoding)
	keysFile := filepath.Join(dir, "outbound-keys.json")
	if err := os.WriteFile(keysFile, []byte(`{"`+tenant+`":{"key_id":"out-1","seed":"`+outSeed+`"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	whKey, whRaw := randomB64(t, 32, base64.StdEncoding)
	whSecret := "whsec_" + whKey
	secretsFile := filepath.Join(dir, "webhook-secrets.json")
	if err := os.WriteFile(secretsFile, []byte(`{"ep":["`+whSecret+`"]}`), 0o600); err != nil {
		t.Fatal(err)
	}

	// The webhook receiver: every failure answers with secret markers.
	var mu sync.Mutex
	var webhookSigs []string
	hits := map[string]int{}
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		hits[r.URL.Path]++
		for _, s := range strings.Fields(r.Header.Get("webhook-signature")) {
			webhookSigs = append(webhookSigs, strings.TrimPrefix(s, "v1,"))
		}
		mu.Unlock()
		w.Header().Set("X-Provider-Debug", providerHeader)
		w.Header().Set("Set-Cookie", "session="+providerHeader)
		switch r.URL.Path {
		case "/ok":
			w.WriteHeader(http.StatusNoContent)
			return
		case "/redirect":
			w.Header().Set("Location", "http://127.0.0.1:1/"+redirectMark)
			w.WriteHeader(http.StatusFound)
		case "/fail":
			w.WriteHeader(http.StatusInternalServerError)
		case "/reject":
			w.WriteHeader(http.StatusBadRequest)
		case "/gone":
			w.WriteHeader(http.StatusGone)
		}
		fmt.Fprintf(w, `{"error":"%s","echo":"%s"}`, providerBody, r.Header.Get("webhook-signature"))
	}))
	defer rc.Close()
	topics := map[string]struct{ url, ref, code string }{
		"t.ok":       {rc.URL + "/ok?token=" + urlToken, "ep", ""},
		"t.fail":     {rc.URL + "/fail?token=" + urlToken, "ep", "http_5xx"},
		"t.reject":   {rc.URL + "/reject?token=" + urlToken, "ep", "http_4xx"},
		"t.gone":     {rc.URL + "/gone?token=" + urlToken, "ep", "http_410"},
		"t.redirect": {rc.URL + "/redirect?token=" + urlToken, "ep", "redirect_refused"},
		"t.nosecret": {rc.URL + "/ok?token=" + urlToken, "missing-ref", "no_secret"},
		"t.blocked":  {"https://169.254.169.254/latest/meta-data?token=" + urlToken, "ep", "blocked_address"},
	}
	for topic, e := range topics {
		if r := envctlRun(t, dsn, "endpoint", "add", "--tenant", tenant, "--project", "proj-1", "--topic", topic,
			"--url", e.url, "--secret-ref", e.ref); r.code != 0 {
			t.Fatalf("endpoint add %s: %+v", topic, r)
		}
	}

	ingestAddr, ingestMetrics, workerMetrics := freeAddr(t), freeAddr(t), freeAddr(t)
	ingest := startService(t, "ingest-api", []string{"DATABASE_URL=" + dsn, "INGEST_ADDR=" + ingestAddr,
		"METRICS_ADDR=" + ingestMetrics, "OUTBOUND_SIGNING_KEYS_FILE=" + keysFile, "LOG_LEVEL=debug",
		"SYNC_LIMIT_TOKENS=100000", "SYNC_LIMIT_INTERVAL=1h", "PEER_LIMIT_TOKENS=100000", "PEER_LIMIT_INTERVAL=1h"},
		"http://"+ingestAddr+"/readyz")
	worker := startService(t, "delivery-worker", []string{"DATABASE_URL=" + dsn, "METRICS_ADDR=" + workerMetrics,
		"WEBHOOK_SECRETS_FILE=" + secretsFile, "DELIVERY_ALLOW_INSECURE_LOOPBACK=true", "LOG_LEVEL=debug",
		"DELIVERY_POLL_INTERVAL=10ms", "DELIVERY_BACKOFF_BASE=10ms", "DELIVERY_BACKOFF_MAX=20ms", "DELIVERY_HTTP_TIMEOUT=2s"},
		"http://"+workerMetrics+"/readyz")
	api := "http://" + ingestAddr

	// Everything an answer carries that is not an envelope by contract.
	var answers strings.Builder
	keep := func(a httpAnswer) httpAnswer {
		answers.WriteString(a.body)
		for k, vs := range a.header {
			answers.WriteString(k + ": " + strings.Join(vs, ",") + "\n")
		}
		return a
	}

	// Inbound.
	fixed := time.Now().UTC().Truncate(time.Second).Format(time.RFC3339)
	inDraft := func(event string, seq int, note string) string {
		return fmt.Sprintf(`{"tenant_id":%q,"project_id":"proj-1","producer_id":"device-1","event_id":%q,
 "idempotency_key":"%s-%s","key_id":"leak-key","sequence":%d,"issued_at":%q,
 "metadata":{"kind":"task.status"},"payload":{"m":"%s","note":%q}}`, tenant, event, idemMark, event, seq, fixed, payloadMark, note)
	}
	for _, s := range []struct {
		draft, seed string
		extra       []string
		status      int
	}{
		{inDraft("evt-1", 1, "one"), seedFile, nil, 200},
		{inDraft("evt-1", 1, "one"), seedFile, nil, 200}, // duplicate
		{inDraft("evt-1", 2, "changed"), seedFile, nil, 409},
		{inDraft("evt-2", 2, "two"), stranger, nil, 403},
		{inDraft("evt-3", 2, "three"), seedFile, []string{"--idempotency-header", idemMark + "-other"}, 400},
		{inDraft("evt-4", 2, "four"), seedFile, nil, 200},
	} {
		status, a := send(t, api, dir, s.seed, s.draft, s.extra...)
		if status != s.status {
			t.Fatalf("send: HTTP %d %+v, want %d", status, a, s.status)
		}
		b, _ := json.Marshal(a)
		answers.Write(b)
	}
	keep(call(t, http.MethodPost, api+"/v1/envelopes", device, []byte(`{"payload":"`+payloadMark+`","signature":"`+idemMark+`"`)))
	keep(call(t, http.MethodPost, api+"/v1/envelopes", "ewk_"+strings.Repeat("A", 43), []byte(inDraft("evt-9", 9, "x"))))
	keep(call(t, http.MethodPost, api+"/v1/envelopes", svc, []byte(inDraft("evt-9", 9, "x"))))
	keep(call(t, http.MethodGet, api+"/v1/streams/proj-1/device-1", device, nil))

	// Outbound.
	var msgIDs []string
	for topic := range topics {
		body := []byte(fmt.Sprintf(`{"project_id":"proj-1","topic":%q,"idempotency_key":"%s-%s","kind":"proposal","payload":{"m":"%s"},"max_attempts":2}`,
			topic, idemMark, topic, payloadMark))
		a := call(t, http.MethodPost, api+"/v1/outbox", svc, body)
		if a.status != http.StatusCreated {
			t.Fatalf("enqueue %s: %d %s", topic, a.status, a.body)
		}
		var ans struct {
			MessageIDs []string `json:"message_ids"`
		}
		if err := json.Unmarshal([]byte(a.body), &ans); err != nil || len(ans.MessageIDs) != 1 {
			t.Fatalf("enqueue answer %s: %v", a.body, err)
		}
		msgIDs = append(msgIDs, ans.MessageIDs[0])
		if again := call(t, http.MethodPost, api+"/v1/outbox", svc, body); again.status != http.StatusOK {
			t.Fatalf("repeat %s: %d", topic, again.status)
		}
		conflict := bytes.Replace(body, []byte(`"max_attempts":2`), []byte(`"max_attempts":3`), 1)
		if a := keep(call(t, http.MethodPost, api+"/v1/outbox", svc, conflict)); a.status != 422 {
			t.Fatalf("conflict %s: %d %s", topic, a.status, a.body)
		}
	}
	keep(call(t, http.MethodPost, api+"/v1/outbox", svc, []byte(`{"project_id":"proj-1","topic":"t.none","idempotency_key":"`+idemMark+`-none","kind":"proposal","payload":{"m":"`+payloadMark+`"}}`)))
	keep(call(t, http.MethodPost, api+"/v1/outbox", device, []byte(`{"project_id":"proj-1","topic":"t.ok","idempotency_key":"`+idemMark+`-dev","kind":"proposal","payload":{"m":"`+payloadMark+`"}}`)))
	keep(call(t, http.MethodPost, api+"/v1/outbox", svc, []byte(`{"project_id":"proj-1","topic":"t.ok","idempotency_key":"`+idemMark+`-bad","kind":"proposal","payload":{"m":"`+payloadMark+`"},"extra":"`+payloadMark+`"}`)))

	admin := storetest.AdminDB(t, dsn)
	settled := func() bool {
		var n int
		if err := admin.QueryRowContext(ctx, `SELECT count(*) FROM outbox_messages WHERE status IN ('pending', 'delivering')`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	}
	waitSettled := func() {
		t.Helper()
		for deadline := time.Now().Add(60 * time.Second); !settled(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("outbox not settled after 60s\n%s", worker.logs.String())
			}
		}
	}
	waitSettled()
	codes := map[string]string{}
	rows, err := admin.QueryContext(ctx, `SELECT topic, status, last_error_code FROM outbox_messages`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var topic, status, code string
		if err := rows.Scan(&topic, &status, &code); err != nil {
			t.Fatal(err)
		}
		codes[topic] = status + "/" + code
	}
	rows.Close()
	for topic, e := range topics {
		want := "dead/" + e.code
		if e.code == "" {
			want = "delivered/"
		}
		if codes[topic] != want {
			t.Errorf("%s: %s, want %s", topic, codes[topic], want)
		}
	}

	// Operator reads and a replay of the 5xx dead letter, which dies again.
	keep(call(t, http.MethodGet, api+"/v1/dead-letters?project_id=proj-1", ops, nil))
	for _, id := range msgIDs {
		keep(call(t, http.MethodGet, api+"/v1/outbox/"+id, svc, nil))
		keep(call(t, http.MethodGet, api+"/v1/outbox/"+id+"/attempts", ops, nil))
	}
	var failID string
	if err := admin.QueryRowContext(ctx, `SELECT message_id FROM outbox_messages WHERE topic = 't.fail'`).Scan(&failID); err != nil {
		t.Fatal(err)
	}
	if a := keep(call(t, http.MethodPost, api+"/v1/dead-letters/"+failID+"/replay", ops, nil)); a.status != 200 {
		t.Fatalf("replay: %d %s", a.status, a.body)
	}
	waitSettled()
	keep(call(t, http.MethodPost, api+"/v1/dead-letters/"+msgIDs[0]+"/replay", svc, nil))
	var cli strings.Builder
	for _, args := range [][]string{
		{"dlq", "list", "--tenant", tenant, "--project", "proj-1"},
		{"audit", "list", "--tenant", tenant, "--limit", "1000"},
		{"outbox", "attempts", "--tenant", tenant, "--id", failID},
		{"outbox", "show", "--tenant", tenant, "--id", failID},
	} {
		r := envctlRun(t, dsn, args...)
		if r.code != 0 {
			t.Fatalf("envctl %v: %+v", args, r)
		}
		cli.WriteString(r.stdout + r.stderr)
	}

	_, ingestM := get(t, "http://"+ingestMetrics+"/metrics")
	_, workerM := get(t, "http://"+workerMetrics+"/metrics")
	ingest.stop()
	worker.stop()
	logs := ingest.logs.String() + worker.logs.String()

	// Database rows: every table but the two that hold signed envelopes by
	// contract, and the endpoint URL (configuration, with its query token).
	dump := func(q string) string {
		t.Helper()
		rows, err := admin.QueryContext(ctx, q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		defer rows.Close()
		var b strings.Builder
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			b.WriteString(s + "\n")
		}
		return b.String()
	}
	var db strings.Builder
	for _, table := range []string{"credentials", "producer_keys", "streams", "event_identities", "audit_events",
		"outbound_streams", "outbox_messages", "outbox_attempts", "schema_migrations"} {
		db.WriteString(dump(`SELECT to_jsonb(x)::text FROM ` + table + ` x`))
	}
	db.WriteString(dump(`SELECT (to_jsonb(x) - 'url')::text FROM endpoints x`))
	envelopes := dump(`SELECT convert_from(envelope, 'UTF8') FROM inbound_payloads`) +
		dump(`SELECT convert_from(coalesce(b.envelope, o.envelope), 'UTF8') FROM outbound_envelopes o
			LEFT JOIN outbound_bodies b ON b.tenant_id = o.tenant_id AND b.event_identity = o.event_identity`)

	// The signatures the envelopes carry, inbound and outbound.
	var envSigs []string
	for _, line := range strings.Split(strings.TrimSpace(envelopes), "\n") {
		var e struct {
			Signature string `json:"signature"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil || e.Signature == "" {
			t.Fatalf("stored envelope %q: %v", line, err)
		}
		envSigs = append(envSigs, e.Signature)
	}
	mu.Lock()
	sigs := append([]string(nil), webhookSigs...)
	mu.Unlock()
	if len(sigs) == 0 || len(envSigs) < 2+len(topics) {
		t.Fatalf("%d webhook signatures, %d envelope signatures: the session did not run", len(sigs), len(envSigs))
	}

	// What never appears outside an envelope, and what no envelope carries.
	envelopeOnly := append([]string{payloadMark, idemMark}, envSigs...)
	never := []string{
		device, svc, ops, device[4:], svc[4:], ops[4:],
		strings.TrimSpace(string(inSeed)), outSeed, hex.EncodeToString(outSeedRaw),
		whSecret, whKey, hex.EncodeToString(whRaw), base64.RawURLEncoding.EncodeToString(whRaw),
		providerBody, providerHeader, redirectMark, urlToken,
	}
	never = append(never, sigs...)
	haystacks := map[string]string{
		"ingest-api and delivery-worker logs":                   logs,
		"ingest-api /metrics":                                   ingestM,
		"delivery-worker /metrics":                              workerM,
		"answers (refusals, statuses, dead letters, replays)":   answers.String(),
		"envctl dlq list, audit list, outbox attempts and show": cli.String(),
		"database rows":                                         db.String(),
	}
	checked := 0
	for where, text := range haystacks {
		if text == "" {
			t.Errorf("%s: nothing collected", where)
		}
		for _, s := range append(never, envelopeOnly...) {
			checked++
			if strings.Contains(text, s) {
				t.Errorf("%s hold %.24q…", where, s)
			}
		}
	}
	for _, s := range never {
		checked++
		if strings.Contains(envelopes, s) {
			t.Errorf("a stored envelope holds %.24q…", s)
		}
	}
	// The scan had something to find: the markers did travel, and the
	// haystacks hold what they should.
	if !strings.Contains(envelopes, payloadMark) || !strings.Contains(envelopes, idemMark) {
		t.Fatal("markers missing from the stored envelopes: the scan proves nothing")
	}
	for where, want := range map[string][2]string{
		"logs":           {logs, `"route":"/v1/dead-letters/:id/replay"`},
		"worker logs":    {logs, "endpoint disabled after 410 Gone"},
		"worker metrics": {workerM, `code="blocked_address"`},
		"ingest metrics": {ingestM, `reason="idempotency_conflict"`},
		"answers":        {answers.String(), `"last_error_code":"http_5xx"`},
		"attempts":       {answers.String(), `"http_status":500,"error_code":"http_5xx","result":"retry"`},
		"worker lines":   {logs, `"msg":"attempt settled"`},
		"attempt rows":   {db.String(), `"http_status": 410`},
		"envctl":         {cli.String(), `"error_code":"no_secret"`},
	} {
		if !strings.Contains(want[0], want[1]) {
			t.Errorf("%s lack %s: the scan did not see the session", where, want[1])
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if hits["/fail"] != 4 || hits["/ok"] != 1 || hits["/reject"] != 1 || hits["/gone"] != 1 || hits["/redirect"] != 1 {
		t.Errorf("receiver hits %v, want /fail 4 (2 attempts, replayed, 2 more), the others once", hits)
	}
	t.Logf("%d secrets x %d places scanned (%d checks); %d log bytes, %d DB row bytes, %d answer bytes; %d webhook and %d envelope signatures; outcomes %v",
		len(never)+len(envelopeOnly), len(haystacks)+1, checked, len(logs), db.Len(), answers.Len(), len(sigs), len(envSigs), codes)
}

// get fetches url and returns its status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	a := call(t, http.MethodGet, url, "", nil)
	return a.status, a.body
}
