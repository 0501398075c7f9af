package app

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/envelopeworker/envelopeworker/modules/httpserve"
	"github.com/envelopeworker/envelopeworker/modules/httpserve/httpservetest"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// startTimeout bounds the wait for Run's listeners: far above a start on a
// loaded machine, far below the test binary's timeout.
const startTimeout = time.Minute

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func TestRunServesAndShutsDown(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	keys := filepath.Join(t.TempDir(), "keys.json")
	seed := strings.Repeat("A", 43) // 32 zero bytes, base64url
	if err := os.WriteFile(keys, []byte(`{"tenant-a":{"key_id":"out-1","seed":"`+seed+`"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": dsn, "PEER_LIMIT_TOKENS": "50",
		"OUTBOUND_SIGNING_KEYS_FILE": keys, "OUTBOUND_SIGNING_KEYS_RELOAD_INTERVAL": "1ms"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type addrs struct{ api, metrics net.Addr }
	ready := make(chan addrs, 1)
	var logs bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, []string{"--ingest-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0", "--shutdown-grace", "5s"},
			func(k string) string { return env[k] }, &logs, func(api, metrics net.Addr) { ready <- addrs{api, metrics} })
	}()
	var a addrs
	select {
	case a = <-ready:
	case err := <-done:
		t.Fatalf("Run returned early: %v", err)
	case <-time.After(startTimeout):
		t.Fatalf("listeners not up within %v", startTimeout)
	}
	if code, body := get(t, "http://"+a.api.String()+"/readyz"); code != 200 || body != `{"status":"ready"}` {
		t.Fatalf("readyz %d %s", code, body)
	}
	if code, body := get(t, "http://"+a.api.String()+"/v1/streams/p/d"); code != 401 || !strings.Contains(body, "unauthenticated") {
		t.Fatalf("unauthenticated read %d %s", code, body)
	}
	code, body := get(t, "http://"+a.metrics.String()+"/metrics")
	if code != 200 || !strings.Contains(body, "envelopeworker_ingest_requests_total") || !strings.Contains(body, "go_goroutines") {
		t.Fatalf("metrics %d", code)
	}
	// /metrics is not on the API listener.
	if code, _ := get(t, "http://"+a.api.String()+"/metrics"); code != 404 {
		t.Fatalf("metrics on the API listener: %d", code)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !strings.Contains(logs.String(), `"msg":"stopped"`) || strings.Contains(logs.String(), dsn) ||
		!strings.Contains(logs.String(), `"msg":"outbound signing keys loaded","tenants":1`) || strings.Contains(logs.String(), seed) {
		t.Fatalf("logs:\n%s", logs.String())
	}
}

func TestRunRefusesBadConfig(t *testing.T) {
	var stdout bytes.Buffer // -h is asked-for output, so it goes to stdout
	err := Run(context.Background(), []string{"-h"}, func(string) string { return "" }, &stdout, nil)
	if !errors.Is(err, flag.ErrHelp) || !strings.Contains(stdout.String(), "-sync-limit-tokens") {
		t.Fatalf("-h: %v\n%s", err, stdout.String())
	}
	err = Run(context.Background(), nil, func(string) string { return "" }, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Fatalf("missing DATABASE_URL: %v", err)
	}
	env := map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/x?sslmode=disable", "INGEST_ADDR": "256.0.0.1:99999"}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = Run(ctx, nil, func(k string) string { return env[k] }, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "listen") {
		t.Fatalf("bad listen address: %v", err)
	}
}

// TestListenersCutSlowClients: both listeners close a connection whose
// request headers never end (slow loris) within the header timeout, and an
// idle keep-alive connection within the idle timeout.
func TestListenersCutSlowClients(t *testing.T) {
	env := map[string]string{"DATABASE_URL": storetest.NewDatabase(t)}
	short := httpserve.Timeouts{ReadHeader: 300 * time.Millisecond, Read: time.Second, Write: time.Second, Idle: 300 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type addrs struct{ api, metrics net.Addr }
	ready := make(chan addrs, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--ingest-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"},
			func(k string) string { return env[k] }, io.Discard, func(api, metrics net.Addr) { ready <- addrs{api, metrics} }, short)
	}()
	var a addrs
	select {
	case a = <-ready:
	case err := <-done:
		t.Fatalf("run returned early: %v", err)
	case <-time.After(startTimeout):
		t.Fatalf("listeners not up within %v", startTimeout)
	}
	httpservetest.CutsSlowClients(t, a.api.String(), "/healthz")
	httpservetest.CutsSlowClients(t, a.metrics.String(), "/metrics")
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}
