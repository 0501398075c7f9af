package loaddelivery

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/envelopeworker/envelopeworker/modules/buildinfo/buildtest"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
	"github.com/envelopeworker/envelopeworker/tools/internal/proccpu"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMainRefusesIncompleteCommandLines(t *testing.T) {
	getenv := func(string) string { return "" }
	for _, args := range [][]string{
		{},                                   // no database, no binary
		{"--database-url", "postgres://x/y"}, // no binary
		{"--worker-bin", "w", "--database-url", ""}, // empty database
		{"--worker-bin", "w", "--database-url", "d", "--workers", "0"},
		{"--worker-bin", "w", "--database-url", "d", "--messages", "1"},
		{"--worker-bin", "w", "--database-url", "d", "--concurrency", "0"},
		{"--worker-bin", "w", "--database-url", "d", "--concurrency", "16", "--tenant-max-inflight", "17"},
		{"--worker-bin", "w", "--database-url", "d", "--tenant-max-inflight", "-1"},
		{"--worker-bin", "w", "--database-url", "d", "--poll-interval", "0s"},
		{"--worker-bin", "w", "--database-url", "d", "--sink-latency", "-1ms"},
		{"--no-such-flag"},
	} {
		var out, errw bytes.Buffer
		if code := Main(context.Background(), args, getenv, &out, &errw); code != 2 || out.Len() != 0 {
			t.Errorf("%q: exit %d, stdout %q; want 2 and nothing", args, code, out.String())
		}
	}
}

// -h prints the flags' defaults: DATABASE_URL is not one of them.
func TestHelpHidesDatabaseURL(t *testing.T) {
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return "postgres://admin:pw-secret-1@db/envelopeworker"
		}
		return ""
	}
	var out, errw bytes.Buffer
	if code := Main(context.Background(), []string{"-h"}, getenv, &out, &errw); code != 0 {
		t.Fatalf("-h: exit %d", code)
	}
	if help := out.String() + errw.String(); !strings.Contains(help, "-database-url") || strings.Contains(help, "pw-secret-1") {
		t.Fatalf("-h output: %s", help)
	}
}

// A small end-to-end run: the built worker drains the backlog once, every
// message reaches the sink once and ends delivered, and the one tenant never
// has more than its share in flight. The sink holds each request, so the
// share is also reached.
func TestRunDrainsBacklogThroughTheWorker(t *testing.T) {
	bin := buildtest.Binary(t, "services/delivery-worker", t.TempDir())
	dsn := storetest.NewDatabase(t)
	var out bytes.Buffer
	code := Main(context.Background(), []string{"--database-url", dsn, "--worker-bin", bin, "--messages", "300",
		"--concurrency", "16", "--tenant-max-inflight", "3", "--sink-latency", "50ms", "--timeout", "2m"}, func(string) string { return "" }, &out, io.Discard)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	var rep Report
	if err := json.Unmarshal([]byte(strings.TrimSpace(out.String())), &rep); err != nil {
		t.Fatalf("report %q: %v", out.String(), err)
	}
	if rep.Messages != 300 || rep.DeliveredInDB != 300 || rep.DuplicateHits != 0 || rep.BodyBytes < 1000 {
		t.Fatalf("report %+v: want 300 delivered once, ~1 KiB bodies", rep)
	}
	if rep.TenantShare != 3 || rep.SinkMaxInFlight != 3 || rep.SinkLatencyMs != 50 {
		t.Fatalf("report %+v: want share 3, 3 requests at once at the sink, each held 50ms", rep)
	}
	if rep.RawRowsPerSec <= 0 || rep.WorkerPerSec <= 0 || rep.WorkerVsRaw <= 0 {
		t.Fatalf("report %+v: rates must be positive", rep)
	}
	if !(rep.LatencyP50ms <= rep.LatencyP90ms && rep.LatencyP90ms <= rep.LatencyP99ms && rep.LatencyP99ms <= rep.LatencyMaxms) {
		t.Fatalf("report %+v: percentiles out of order", rep)
	}
	// The drain's CPU: the worker, the sink and the test's local server
	// each did work for every message (tools/internal/proccpu tests the
	// readings themselves).
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Logf("no /proc here (not Linux): no CPU figures to check")
		return
	}
	if rep.WorkerCPUPerMsg <= 0 || rep.SinkCPUPerMsg <= 0 || rep.CPUCoresBusy <= 0 {
		t.Fatalf("report %+v: want the worker's and the sink's CPU per message and the cores busy", rep)
	}
	if pg, err := proccpu.Postgres(); err == nil && len(pg.PIDs) == 0 {
		t.Logf("no postgres process in /proc: the test server is not local, no PostgreSQL CPU to check")
	} else if rep.PostgresCPUPerMsg <= 0 {
		t.Fatalf("report %+v: want the PostgreSQL server's CPU per message", rep)
	}
}
