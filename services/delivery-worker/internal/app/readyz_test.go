package app

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/httpserve"
	"github.com/envelopeworker/envelopeworker/modules/httpserve/httpservetest"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

func secretsFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "s.json")
	if err := os.WriteFile(p, []byte(`{"ep":["`+secret(1)+`"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestReadyzAtOrAboveBuildSchema: contract §8.1. A later release's migration
// keeps the worker ready; a schema older than the build is 503.
func TestReadyzAtOrAboveBuildSchema(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	admin := storetest.AdminDB(t, dsn)
	if _, err := admin.Exec(`INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, 'from_a_later_release.sql', 'not-ours')`,
		migrations.Latest()+1); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": dsn, "WEBHOOK_SECRETS_FILE": secretsFile(t)}
	addr, _, stop := start(t, env)
	if code, body := get(t, "http://"+addr+"/readyz"); code != 200 || body != "{\"status\":\"ready\"}\n" {
		t.Fatalf("schema newer than the build: /readyz %d %s", code, body)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	if _, err := admin.Exec(`DELETE FROM schema_migrations WHERE version >= $1`, migrations.Latest()); err != nil {
		t.Fatal(err)
	}
	addr, logs, stop := start(t, env)
	if code, body := get(t, "http://"+addr+"/readyz"); code != http.StatusServiceUnavailable || body != "{\"status\":\"unavailable\"}\n" {
		t.Fatalf("schema older than the build: /readyz %d %s", code, body)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "schema older than this build") {
		t.Fatalf("the reason is not logged:\n%s", logs.String())
	}
}

// TestReadyzSharesOneProbe: concurrent /readyz calls wait for one probe
// rather than each sending its own. The probe is held behind a lock on
// schema_migrations; at most one of the worker's sessions may wait on it.
func TestReadyzSharesOneProbe(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	admin := storetest.AdminDB(t, dsn)
	// Locked before the worker starts, so no probe result is cached yet: the
	// first probe (the worker's own schema check at start, or a call) blocks,
	// and every call must join it.
	tx, err := admin.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec(`LOCK TABLE schema_migrations IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	addr, _, stop := start(t, map[string]string{"DATABASE_URL": dsn, "WEBHOOK_SECRETS_FILE": secretsFile(t), "STORE_TIMEOUT": "30s"})
	defer func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	}()
	const calls = 50
	codes := make(chan int, calls)
	var wg sync.WaitGroup
	for range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := http.Get("http://" + addr + "/readyz")
			if err != nil {
				codes <- 0
				return
			}
			res.Body.Close()
			codes <- res.StatusCode
		}()
	}
	// Watch the worker's sessions that wait for the lock for a while: the
	// calls arrive over this time, and every one of them must join the one
	// probe.
	most := 0
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var n int
		if err := admin.QueryRow(`SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'delivery-worker' AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		most = max(most, n)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != 200 {
			t.Fatalf("a /readyz call answered %d after the lock was released", c)
		}
	}
	if most != 1 {
		t.Fatalf("%d sessions probed at once for %d concurrent /readyz calls, want 1", most, calls)
	}
}

// TestListenerCutsSlowClients: the metrics/health listener closes a
// connection whose request headers never end (slow loris) within the header
// timeout, and an idle keep-alive connection within the idle timeout.
func TestListenerCutsSlowClients(t *testing.T) {
	short := httpserve.Timeouts{ReadHeader: 300 * time.Millisecond, Read: time.Second, Write: 10 * time.Second, Idle: 300 * time.Millisecond}
	addr, _, stop := startWith(t, map[string]string{"DATABASE_URL": storetest.NewDatabase(t), "WEBHOOK_SECRETS_FILE": secretsFile(t)}, short)
	httpservetest.CutsSlowClients(t, addr, "/readyz")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestClaimsNothingBeforeMigrate: a worker started on a schema older than its
// build (a surge pod of a rollout whose migrate Job has not run) claims
// nothing until the migration lands, then delivers.
func TestClaimsNothingBeforeMigrate(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	st := storetest.Open(t, dsn)
	admin := storetest.AdminDB(t, dsn)
	var hits atomic.Int64
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		hits.Add(1)
	}))
	defer rc.Close()
	if _, err := st.Outbox().AddEndpoint(context.Background(), store.Endpoint{TenantID: "t1", ProjectID: "p1", Topic: "orders",
		URL: rc.URL + "/hook", SecretRef: "ep"}); err != nil {
		t.Fatal(err)
	}
	enqueueMessage(t, st, "t1", "before-migrate")
	if _, err := admin.Exec(`DELETE FROM schema_migrations WHERE version = $1`, migrations.Latest()); err != nil {
		t.Fatal(err)
	}
	_, logs, stop := start(t, map[string]string{"DATABASE_URL": dsn, "WEBHOOK_SECRETS_FILE": secretsFile(t),
		"DELIVERY_ALLOW_INSECURE_LOOPBACK": "true", "DELIVERY_POLL_INTERVAL": "10ms"})
	defer func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	}()
	time.Sleep(1500 * time.Millisecond) // 150 poll intervals
	var attempts int
	if err := admin.QueryRow(`SELECT attempts FROM outbox_messages`).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if attempts != 0 || hits.Load() != 0 {
		t.Fatalf("on an older schema: %d attempts, %d deliveries; want none", attempts, hits.Load())
	}
	if !strings.Contains(logs.String(), "claiming nothing until envctl migrate has run") {
		t.Fatalf("the wait is not logged:\n%s", logs.String())
	}
	if _, err := migrations.Apply(context.Background(), admin); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); hits.Load() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("nothing delivered 10s after the migration:\n%s", logs.String())
		}
	}
}
