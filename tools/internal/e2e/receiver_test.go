package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/envelopeworker/envelopeworker/modules/buildinfo/buildtest"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// rxSupervisor runs the testreceiver program and starts it again whenever
// it dies, as a process manager would, counting the restarts.
type rxSupervisor struct {
	mu       sync.Mutex
	cmd      *exec.Cmd
	restarts int
	stopped  bool
	done     chan struct{}
	logs     *lockedBuffer
}

// checkRestarts returns how often the receiver was restarted after it
// crashed on every crashEvery-th of n effects, and fails unless that was at
// least once and at most n/crashEvery times. Each crash kills the requests in
// flight beside it too: one of them whose effect had already committed (its
// sequence a multiple of crashEvery) is a duplicate on its retry and crashes
// nothing, so concurrent deliveries can make fewer crashes than multiples. At
// least one crash is what a test needs to mean something.
func (s *rxSupervisor) checkRestarts(t *testing.T, n, crashEvery int) int {
	t.Helper()
	s.mu.Lock()
	restarts := s.restarts
	s.mu.Unlock()
	if restarts < 1 || restarts > n/crashEvery {
		t.Fatalf("receiver restarted %d times, want 1..%d (one per crash)", restarts, n/crashEvery)
	}
	return restarts
}

func startReceiver(t *testing.T, env []string) *rxSupervisor {
	t.Helper()
	bin := buildtest.Binary(t, "tools/internal/e2e/testreceiver", t.TempDir())
	s := &rxSupervisor{done: make(chan struct{}), logs: &lockedBuffer{}}
	go func() {
		defer close(s.done)
		for first := true; ; first = false {
			s.mu.Lock()
			if s.stopped {
				s.mu.Unlock()
				return
			}
			if !first {
				s.restarts++
			}
			cmd := exec.Command(bin)
			cmd.Env = append(os.Environ(), env...)
			cmd.Stdout, cmd.Stderr = s.logs, s.logs
			if err := cmd.Start(); err != nil {
				s.mu.Unlock()
				t.Errorf("start testreceiver: %v", err)
				return
			}
			s.cmd = cmd
			s.mu.Unlock()
			_ = cmd.Wait()
			time.Sleep(50 * time.Millisecond)
		}
	}()
	t.Cleanup(func() {
		s.mu.Lock()
		s.stopped = true
		if s.cmd != nil {
			_ = s.cmd.Process.Kill()
		}
		s.mu.Unlock()
		<-s.done
	})
	return s
}

// TestReceiverEffectsExactlyOnceAcrossSIGKILL runs ingest-api, the
// delivery-worker and a receiver built on modules/receiver (fetching the
// outbound keys from GET /v1/outbound-keys, receipts in its own database).
// The receiver SIGKILLs itself after committing the effect of every third
// envelope and before answering; it is restarted each time. Every message
// must end delivered, and every event's effect must be in the receiver's
// database exactly once.
func TestReceiverEffectsExactlyOnceAcrossSIGKILL(t *testing.T) {
	const messages, crashEvery = 30, 3
	r := newUpgradeRig(t)
	rxDSN := storetest.NewDatabase(t)
	issue := func(device, role string) string {
		res := envctlRun(t, r.dsn, "credential", "issue", "--tenant", "up", "--account", "acct-1", "--device", device, "--role", role)
		if res.code != 0 {
			t.Fatalf("credential issue: %+v", res)
		}
		return strings.TrimSpace(res.stdout)
	}
	svc := issue("svc-1", "service")
	rxAddr := freeAddr(t)
	if res := envctlRun(t, r.dsn, "endpoint", "add", "--tenant", "up", "--project", "proj-1", "--topic", "orders",
		"--url", "http://"+rxAddr+"/hook", "--secret-ref", "ep"); res.code != 0 {
		t.Fatalf("endpoint add: %+v", res)
	}
	startService(t, "ingest-api", r.ingestEnv, r.ingestURL+"/readyz")
	startService(t, "delivery-worker", append(r.workEnv, "DELIVERY_BACKOFF_BASE=50ms", "DELIVERY_BACKOFF_MAX=500ms",
		"DELIVERY_HTTP_TIMEOUT=5s"), r.workURL+"/readyz")
	rx := startReceiver(t, []string{"RX_ADDR=" + rxAddr, "RX_DSN=" + rxDSN, "RX_SECRET=" + r.whSecret,
		"RX_KEYS_URL=" + r.ingestURL, "RX_TOKEN=" + svc, fmt.Sprintf("RX_CRASH_EVERY=%d", crashEvery)})

	var ids []string
	for i := 1; i <= messages; i++ {
		a := call(t, http.MethodPost, r.ingestURL+"/v1/outbox", svc, []byte(fmt.Sprintf(
			`{"project_id":"proj-1","topic":"orders","idempotency_key":"rx-%d","kind":"proposal","payload":{"n":%d},"max_attempts":50}`, i, i)))
		var enq struct {
			MessageIDs []string `json:"message_ids"`
		}
		if err := json.Unmarshal([]byte(a.body), &enq); err != nil || a.status != http.StatusCreated || len(enq.MessageIDs) != 1 {
			t.Fatalf("enqueue %d: %d %s", i, a.status, a.body)
		}
		ids = append(ids, enq.MessageIDs[0])
	}

	for deadline := time.Now().Add(120 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var delivered, dead int
		if err := r.admin.QueryRow(`SELECT count(*) FILTER (WHERE status = 'delivered'), count(*) FILTER (WHERE status = 'dead')
			FROM outbox_messages WHERE message_id = ANY($1)`, ids).Scan(&delivered, &dead); err != nil {
			t.Fatal(err)
		}
		if dead > 0 {
			t.Fatalf("%d messages dead\nreceiver: %s", dead, rx.logs.String())
		}
		if delivered == messages {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d delivered after 120s\nreceiver: %s", delivered, messages, rx.logs.String())
		}
	}

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, rxDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var effects, events, hooks int
	var seqs []int64
	if err := conn.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id), count(DISTINCT webhook_id),
		array_agg(sequence ORDER BY sequence) FROM rx_effects`).Scan(&effects, &events, &hooks, &seqs); err != nil {
		t.Fatal(err)
	}
	if effects != messages || events != messages || hooks != messages {
		t.Fatalf("%d effects of %d events and %d webhook ids, want %d each", effects, events, hooks, messages)
	}
	for i, s := range seqs {
		if s != int64(i+1) {
			t.Fatalf("effect sequences %v: not 1..%d", seqs, messages)
		}
	}
	restarts := rx.checkRestarts(t, messages, crashEvery)
	t.Logf("%d messages, %d receiver crashes between effect and answer, every effect once", messages, restarts)
}
