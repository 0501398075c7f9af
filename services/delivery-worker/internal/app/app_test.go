package app

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"go.uber.org/goleak"

	"github.com/envelopeworker/envelopeworker/modules/httpserve"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func secret(b byte) string {
	return "whsec_" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, 32))
}

// syncBuffer is a log sink safe for the app's goroutines and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// enqueueMessage enqueues one message of tenant to its endpoint of project
// p1, topic orders.
func enqueueMessage(t *testing.T, st *store.Store, tenant, key string) {
	t.Helper()
	_, err := st.Outbox().Enqueue(context.Background(), store.Actor{TenantID: tenant, CorrelationID: "c1"}, store.EnqueueRequest{
		ProjectID: "p1", ProducerID: "svc", Topic: "orders", MaxAttempts: 3,
		IdempotencyDigest: sha256.Sum256([]byte(key)), RequestDigest: sha256.Sum256([]byte(key)),
		Build: func(seq int64) ([]byte, string, error) {
			id := sha256.Sum256([]byte(key))
			return []byte(fmt.Sprintf(`{"k":%q,"sequence":%d}`, key, seq)), hex.EncodeToString(id[:]), nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
}

func start(t *testing.T, env map[string]string) (addr string, logs *syncBuffer, stop func() error) {
	t.Helper()
	return startWith(t, env, httpserve.DefaultTimeouts)
}

// startWith is start with the listener's timeouts.
func startWith(t *testing.T, env map[string]string, timeouts httpserve.Timeouts) (addr string, logs *syncBuffer, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs = &syncBuffer{}
	ready := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, []string{"--metrics-addr", "127.0.0.1:0"}, func(k string) string { return env[k] }, logs,
			func(a net.Addr) { ready <- a.String() }, timeouts)
	}()
	select {
	case addr = <-ready:
	case err := <-errc:
		cancel()
		t.Fatalf("Run: %v", err)
	case <-time.After(time.Minute):
		cancel()
		t.Fatalf("the listener is not up within a minute; logs:\n%s", logs.String())
	}
	return addr, logs, func() error { cancel(); return <-errc }
}

// The binary's wiring end to end: health, delivery, rotation of the secrets
// file without a restart, metrics, graceful stop.
func TestRunDeliversAndRotates(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	st := storetest.Open(t, dsn)
	dir := t.TempDir()
	secretsPath := filepath.Join(dir, "secrets.json")
	writeSecrets := func(s ...string) {
		tmp := secretsPath + ".tmp"
		if err := os.WriteFile(tmp, []byte(`{"ep":["`+strings.Join(s, `","`)+`"]}`), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, secretsPath); err != nil {
			t.Fatal(err)
		}
	}
	writeSecrets(secret(1))

	type delivery struct {
		body []byte
		h    http.Header
	}
	got := make(chan delivery, 4)
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- delivery{b, r.Header.Clone()}
	}))
	defer rc.Close()
	if _, err := st.Outbox().AddEndpoint(context.Background(), store.Endpoint{TenantID: "tenant-secret-name", ProjectID: "p1",
		Topic: "orders", URL: rc.URL + "/hook", SecretRef: "ep"}); err != nil {
		t.Fatal(err)
	}
	enqueue := func(key string) { t.Helper(); enqueueMessage(t, st, "tenant-secret-name", key) }

	addr, logs, stop := start(t, map[string]string{
		"DATABASE_URL":                     dsn,
		"WEBHOOK_SECRETS_FILE":             secretsPath,
		"SECRETS_RELOAD_INTERVAL":          "10ms",
		"DELIVERY_ALLOW_INSECURE_LOOPBACK": "true",
		"DELIVERY_POLL_INTERVAL":           "10ms",
	})
	if code, body := get(t, "http://"+addr+"/healthz"); code != 200 || !strings.Contains(body, "ok") {
		t.Fatalf("/healthz %d %s", code, body)
	}
	if code, body := get(t, "http://"+addr+"/readyz"); code != 200 || !strings.Contains(body, "ready") {
		t.Fatalf("/readyz %d %s", code, body)
	}

	// Every wait is bounded: a worker that never delivers fails the test
	// with what it logged, instead of hanging until the test binary's
	// timeout.
	const wait = 10 * time.Second
	next := func(what string) delivery {
		t.Helper()
		select {
		case d := <-got:
			return d
		case <-time.After(wait):
			t.Fatalf("%s: nothing delivered within %v; logs:\n%s", what, wait, logs.String())
			return delivery{}
		}
	}
	enqueue("first")
	d := next("first delivery")
	wh1, _ := standardwebhooks.NewWebhook(secret(1))
	if err := wh1.Verify(d.body, d.h); err != nil {
		t.Fatalf("first delivery: %v", err)
	}

	// Rotation: both secrets are current; then only the new one.
	writeSecrets(secret(1), secret(2))
	for deadline := time.Now().Add(wait); !strings.Contains(logs.String(), "secrets reloaded"); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("secrets not reloaded within %v; logs:\n%s", wait, logs.String())
		}
	}
	enqueue("second")
	d = next("second delivery")
	wh2, _ := standardwebhooks.NewWebhook(secret(2))
	if err := wh1.Verify(d.body, d.h); err != nil {
		t.Fatalf("rotation: old secret refuses: %v", err)
	}
	if err := wh2.Verify(d.body, d.h); err != nil {
		t.Fatalf("rotation: new secret refuses: %v", err)
	}
	if n := len(strings.Fields(d.h.Get("webhook-signature"))); n != 2 {
		t.Fatalf("%d signatures during rotation, want 2", n)
	}

	// The receiver answered; wait for the worker to settle and count both
	// deliveries (the row commits before the counter moves) before reading
	// the rest of its metrics.
	const delivered = `envelopeworker_delivery_attempts_total{code="",result="delivered"} 2`
	var metrics string
	admin := storetest.AdminDB(t, dsn)
	for deadline := time.Now().Add(wait); ; {
		var n int
		if err := admin.QueryRow(`SELECT count(*) FROM outbox_messages WHERE status = 'delivered'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		_, metrics = get(t, "http://"+addr+"/metrics")
		if n == 2 && strings.Contains(metrics, delivered) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10s: %d delivered rows; metrics:\n%s", n, metrics)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, want := range []string{delivered,
		"envelopeworker_delivery_due_messages", "envelopeworker_delivery_oldest_due_age_seconds",
		"envelopeworker_delivery_lease_expiries_total", "envelopeworker_delivery_fenced_settles_total",
		"envelopeworker_delivery_attempt_duration_seconds_bucket", `envelopeworker_delivery_secret_reloads_total{result="ok"}`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	all := metrics + logs.String()
	for _, leak := range []string{"tenant-secret-name", rc.URL, secret(1)[6:], secret(2)[6:], `"k":"first"`} {
		if strings.Contains(all, leak) {
			t.Errorf("metrics or logs contain %q", leak)
		}
	}
}

func TestReadyzWithoutDatabase(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "s.json")
	if err := os.WriteFile(p, []byte(`{"ep":["`+secret(1)+`"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, _, stop := start(t, map[string]string{
		"DATABASE_URL":         "postgres://nobody:pw@127.0.0.1:1/x?sslmode=disable&connect_timeout=1",
		"WEBHOOK_SECRETS_FILE": p,
		"STORE_TIMEOUT":        "1s",
	})
	if code, _ := get(t, "http://"+addr+"/healthz"); code != 200 {
		t.Fatalf("/healthz %d", code)
	}
	code, body := get(t, "http://"+addr+"/readyz")
	if code != http.StatusServiceUnavailable || strings.Contains(body, "pw") || strings.Contains(body, "refused") {
		t.Fatalf("/readyz %d %s", code, body)
	}
	if err := stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
}

func TestRunRefusesBadConfig(t *testing.T) {
	var stdout bytes.Buffer // -h is asked-for output, so it goes to stdout
	err := Run(context.Background(), []string{"-h"}, func(string) string { return "" }, &stdout, nil)
	if !errors.Is(err, flag.ErrHelp) || !strings.Contains(stdout.String(), "WEBHOOK_SECRETS_FILE") {
		t.Fatalf("-h: %v", err)
	}
	err = Run(context.Background(), nil, func(string) string { return "" }, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "DATABASE_URL is required") {
		t.Fatalf("empty env: %v", err)
	}
}
