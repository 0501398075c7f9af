package worker

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"go.uber.org/goleak"

	"github.com/envelopeworker/envelopeworker/modules/limiter"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
	"github.com/envelopeworker/envelopeworker/modules/telemetry"
	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/secrets"
	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/sender"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testSecret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("worker-test-secret-24byte"))

// testRefs are the secret refs newWorker's secrets hold (all testSecret):
// one per tenant, since a ref belongs to the first tenant that names it.
var testRefs = []string{"ep", "ep2", "ep3"}

// env is one test database, seen through the store API plus an admin
// handle for setting up backlogs and simulating lease expiry.
type env struct {
	t   testing.TB
	dsn string
	st  *store.Store
	// admin is a pool of its own on the same database.
	admin *sql.DB
}

func newEnv(t testing.TB) *env {
	t.Helper()
	dsn := storetest.NewDatabase(t)
	return &env{t: t, dsn: dsn, st: storetest.Open(t, dsn), admin: storetest.AdminDB(t, dsn)}
}

func (e *env) exec(q string, args ...any) {
	e.t.Helper()
	if _, err := e.admin.Exec(q, args...); err != nil {
		e.t.Fatalf("exec %q: %v", q, err)
	}
}

func (e *env) count(q string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.admin.QueryRow(q, args...).Scan(&n); err != nil {
		e.t.Fatalf("count %q: %v", q, err)
	}
	return n
}

func (e *env) endpoint(tenant, topic, url, ref string) string {
	e.t.Helper()
	id, err := e.st.Outbox().AddEndpoint(context.Background(), store.Endpoint{
		TenantID: tenant, ProjectID: "p1", Topic: topic, URL: url, SecretRef: ref,
	})
	if err != nil {
		e.t.Fatalf("AddEndpoint: %v", err)
	}
	return id
}

// enqueue stores one outbound envelope for (tenant, p1, topic) and returns
// its body and message ids.
func (e *env) enqueue(tenant, topic string, maxAttempts int) ([]byte, []string) {
	e.t.Helper()
	nonce := make([]byte, 16)
	if _, err := rand.Read(nonce); err != nil {
		e.t.Fatal(err)
	}
	key := hex.EncodeToString(nonce)
	res, err := e.st.Outbox().Enqueue(context.Background(), store.Actor{TenantID: tenant, DeviceID: "svc1", CorrelationID: "c-" + key[:8]},
		store.EnqueueRequest{
			ProjectID: "p1", ProducerID: "svc1", Topic: topic,
			IdempotencyDigest: sha256.Sum256([]byte(key)), RequestDigest: sha256.Sum256([]byte("body" + key)),
			MaxAttempts: maxAttempts,
			Build: func(seq int64) ([]byte, string, error) {
				ident := sha256.Sum256([]byte(tenant + "\np1\n" + key))
				return []byte(fmt.Sprintf(`{"event_id":%q,"payload":{"n":%d},"sequence":%d}`, key, seq, seq)), hex.EncodeToString(ident[:]), nil
			},
		})
	if err != nil {
		e.t.Fatalf("Enqueue: %v", err)
	}
	return res.Envelope, res.MessageIDs
}

func (e *env) status(tenant, id string) store.MessageStatus {
	e.t.Helper()
	s, err := e.st.Outbox().OutboxMessage(context.Background(), tenant, id)
	if err != nil {
		e.t.Fatalf("OutboxMessage: %v", err)
	}
	return s
}

// receiver is a webhook endpoint that verifies every request with the
// official Standard Webhooks library and records what it saw.
type receiver struct {
	t      testing.TB
	srv    *httptest.Server
	mu     sync.Mutex
	counts map[string]int    // webhook-id -> requests
	bodies map[string][]byte // webhook-id -> last body
	order  []string          // request paths in arrival order
	bad    atomic.Int32      // requests that failed verification
	// answer picks the status for a request (nil: 204).
	answer func(r *http.Request, n int) int
}

func newReceiver(t testing.TB, answer func(r *http.Request, n int) int) *receiver {
	rc := &receiver{t: t, counts: map[string]int{}, bodies: map[string][]byte{}, answer: answer}
	wh, err := standardwebhooks.NewWebhook(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		id := r.Header.Get("webhook-id")
		if err := wh.Verify(body, r.Header); err != nil || r.Header.Get("Idempotency-Key") != id ||
			r.Header.Get("Content-Type") != "application/json" || r.Method != http.MethodPost {
			rc.bad.Add(1)
		}
		rc.mu.Lock()
		rc.counts[id]++
		n := rc.counts[id]
		if prev, ok := rc.bodies[id]; ok && !bytes.Equal(prev, body) {
			rc.bad.Add(1) // body must be byte-identical on every attempt
		}
		rc.bodies[id] = body
		rc.order = append(rc.order, r.URL.Path)
		rc.mu.Unlock()
		status := http.StatusNoContent
		if rc.answer != nil {
			status = rc.answer(r, n)
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) hits(id string) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.counts[id]
}

type opts struct {
	concurrency, claimMax int
	tenantMax             int // 0: the worker's default share
	limit                 limiter.Policy
	now                   func() time.Time
	grace                 time.Duration
	lease, httpTimeout    time.Duration // 0: 30s and 5s
	log                   io.Writer     // the worker's JSON log; nil: discarded
	tracing               *telemetry.Provider
}

// newWorker builds a worker on its own pool, delivering to loopback with a
// 1ms–4ms backoff so retries are due again at once.
func newWorker(t testing.TB, dsn string, o opts) (*Worker, *Metrics) {
	t.Helper()
	st := storetest.Open(t, dsn)
	if o.lease == 0 {
		o.lease = 30 * time.Second
	}
	if o.httpTimeout == 0 {
		o.httpTimeout = 5 * time.Second
	}
	refs := map[string][]string{}
	for _, r := range testRefs {
		refs[r] = []string{testSecret}
	}
	file, err := json.Marshal(refs)
	if err != nil {
		t.Fatal(err)
	}
	set, err := secrets.Parse(file)
	if err != nil {
		t.Fatal(err)
	}
	snd := sender.New(sender.Config{
		Timeout: o.httpTimeout, AllowLoopback: true,
		Backoff: sender.Backoff{Base: time.Millisecond, Cap: 4 * time.Millisecond},
		Secrets: secrets.NewCurrent(set).Lookup,
	})
	t.Cleanup(snd.Close)
	if o.limit.Tokens == 0 {
		o.limit = limiter.Policy{Tokens: 30000, Interval: time.Second} // ample
	}
	lim, err := limiter.New[limiter.DeliveryKey](o.limit)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close(context.Background()) })
	if o.concurrency == 0 {
		o.concurrency = 8
	}
	if o.grace == 0 {
		o.grace = time.Minute
	}
	if o.log == nil {
		o.log = io.Discard
	}
	m := NewMetrics(prometheus.NewRegistry())
	w, err := New(Config{
		Lease: o.lease, Concurrency: o.concurrency, ClaimMax: o.claimMax, TenantMaxInflight: o.tenantMax,
		PollInterval: 5 * time.Millisecond, Grace: o.grace, StoreTimeout: 10 * time.Second, Now: o.now,
		Tracing: o.tracing,
	}, o.httpTimeout, st.Outbox(), snd, lim, slog.New(slog.NewJSONHandler(o.log, nil)), m)
	if err != nil {
		t.Fatal(err)
	}
	return w, m
}

// start runs w until the returned stop is called; stop returns once Run
// has.
func start(w *Worker) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.Run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// cycle runs one scheduler cycle and waits for its attempts to settle.
func cycle(t *testing.T, w *Worker) int {
	t.Helper()
	var wg sync.WaitGroup
	n, err := w.Cycle(context.Background(), context.Background(), &wg)
	wg.Wait()
	if err != nil {
		t.Fatalf("Cycle: %v", err)
	}
	return n
}

// cycleUntil runs cycles until done reports true, failing the test after a
// minute rather than waiting for the binary's timeout.
func cycleUntil(t *testing.T, w *Worker, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatal("cycleUntil: not done after a minute of cycles")
		}
		if cycle(t, w) == 0 {
			time.Sleep(2 * time.Millisecond) // a retry's next_attempt_at is a few ms ahead
		}
	}
}

func attempts(m *Metrics, result, code string) int {
	return int(testutil.ToFloat64(m.attempts.WithLabelValues(result, code)))
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }

// waitFor polls cond until it holds, failing the test after limit: every
// wait of these tests has a deadline of its own.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s after %v", what, limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
