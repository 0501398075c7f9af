package server

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/migrations"
)

// TestReadyAtOrAboveBuildSchema: contract §8.1. A later release's migration
// (a schema newer than this build) keeps the server ready; a schema older
// than this build is 503 unavailable.
func TestReadyAtOrAboveBuildSchema(t *testing.T) {
	f := newFixture(t)
	if _, err := f.admin.Exec(`INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, 'from_a_later_release.sql', 'not-ours')`,
		migrations.Latest()+1); err != nil {
		t.Fatal(err)
	}
	if r := f.get("", "/readyz"); r.status != 200 || string(r.body) != `{"status":"ready"}` {
		t.Fatalf("schema newer than the build: readyz %d %s", r.status, r.body)
	}
	wantAnswer(t, f.post(f.device, f.sign(draft(1))), 200, "accepted", "", 1)

	if _, err := f.admin.Exec(`DELETE FROM schema_migrations WHERE version >= $1`, migrations.Latest()); err != nil {
		t.Fatal(err)
	}
	f.srv = f.newServer(testConfig(), f.st) // a fresh probe
	r := f.get("", "/readyz")
	wantAnswer(t, r, 503, "refused", "unavailable", -1)
	if r.header.Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
	if !strings.Contains(f.logs.String(), `"operation":"schema_version"`) {
		t.Fatalf("an older schema is not logged as such:\n%s", f.logs.String())
	}
}

// TestReadyzSharesProbes: /readyz is public and never limited, so 200
// concurrent calls must cost the database one probe; a second later the next
// call probes again.
func TestReadyzSharesProbes(t *testing.T) {
	var now atomic.Int64
	now.Store(testNow.UnixNano())
	f := newFixture(t, func(c *Config) { c.Now = func() time.Time { return time.Unix(0, now.Load()) } })
	var wg sync.WaitGroup
	var notReady atomic.Int64
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r := f.get("", "/readyz"); r.status != 200 {
				notReady.Add(1)
			}
		}()
	}
	wg.Wait()
	if n := notReady.Load(); n != 0 {
		t.Fatalf("%d of 200 /readyz calls not ready", n)
	}
	if n := f.srv.ready.Probes(); n != 1 {
		t.Fatalf("%d probes for 200 concurrent /readyz calls, want 1", n)
	}
	now.Add(int64(time.Second))
	if r := f.get("", "/readyz"); r.status != 200 || f.srv.ready.Probes() != 2 {
		t.Fatalf("a second later: %d, %d probes; want 200 from a second probe", r.status, f.srv.ready.Probes())
	}
}
