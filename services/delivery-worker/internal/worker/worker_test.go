package worker

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/envelopeworker/envelopeworker/modules/limiter"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/sender"
)

func TestSenderCodesAreStoreCodes(t *testing.T) {
	for _, c := range []string{sender.CodeHTTP4xx, sender.CodeHTTP410, sender.CodeHTTP429,
		sender.CodeHTTP5xx, sender.CodeTimeout, sender.CodeConnectFailed, sender.CodeRedirectRefused,
		sender.CodeBlockedAddress, sender.CodeTLSFailed, sender.CodeNoSecret, sender.CodeSecretRefForeign} {
		if !store.ValidErrorCode(c) {
			t.Errorf("sender code %q is not a store error code", c)
		}
	}
}

func TestDeliver(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	e.endpoint("t1", "orders", rc.srv.URL+"/hook", "ep")
	body, ids := e.enqueue("t1", "orders", 12)
	w, m := newWorker(t, e.dsn, opts{})

	if n := cycle(t, w); n != 1 {
		t.Fatalf("claimed %d, want 1", n)
	}
	s := e.status("t1", ids[0])
	if s.Status != store.StatusDelivered || s.Attempts != 1 || s.DeliveredAt == nil || s.LastErrorCode != "" {
		t.Fatalf("status %+v", s)
	}
	if rc.hits(ids[0]) != 1 || rc.bad.Load() != 0 || !bytes.Equal(rc.bodies[ids[0]], body) {
		t.Fatalf("receiver: hits %d bad %d body %q", rc.hits(ids[0]), rc.bad.Load(), rc.bodies[ids[0]])
	}
	if attempts(m, "delivered", "") != 1 {
		t.Fatal("delivered attempt not counted")
	}
	if cycle(t, w) != 0 {
		t.Fatal("a delivered message was claimed again")
	}
}

func TestRetryThenDeliver(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, func(r *http.Request, n int) int {
		switch n {
		case 1:
			return http.StatusInternalServerError
		case 2:
			return http.StatusTooManyRequests
		}
		return http.StatusOK
	})
	e.endpoint("t1", "orders", rc.srv.URL+"/hook", "ep")
	_, ids := e.enqueue("t1", "orders", 12)
	w, m := newWorker(t, e.dsn, opts{})

	cycle(t, w)
	s := e.status("t1", ids[0])
	if s.Status != store.StatusPending || s.Attempts != 1 || s.LastErrorCode != "http_5xx" || s.NextAttemptAt == nil {
		t.Fatalf("after a 500: %+v", s)
	}
	cycleUntil(t, w, func() bool { return e.status("t1", ids[0]).Status == store.StatusDelivered })
	s = e.status("t1", ids[0])
	if s.Attempts != 3 || rc.hits(ids[0]) != 3 || rc.bad.Load() != 0 {
		t.Fatalf("final %+v, hits %d, bad %d", s, rc.hits(ids[0]), rc.bad.Load())
	}
	if attempts(m, "retry", "http_5xx") != 1 || attempts(m, "retry", "http_429") != 1 || attempts(m, "delivered", "") != 1 {
		t.Fatal("attempt metrics do not match the history")
	}
}

func TestMaxAttemptsThenDead(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, func(*http.Request, int) int { return http.StatusServiceUnavailable })
	e.endpoint("t1", "orders", rc.srv.URL+"/hook", "ep")
	_, ids := e.enqueue("t1", "orders", 3)
	w, m := newWorker(t, e.dsn, opts{})

	cycleUntil(t, w, func() bool { return e.status("t1", ids[0]).Status == store.StatusDead })
	s := e.status("t1", ids[0])
	if s.Attempts != 3 || s.LastErrorCode != "http_5xx" || rc.hits(ids[0]) != 3 {
		t.Fatalf("dead %+v after %d requests", s, rc.hits(ids[0]))
	}
	dl, _, err := e.st.Outbox().ListDeadLetters(context.Background(), "t1", "p1", 10, "")
	if err != nil || len(dl) != 1 || dl[0].ErrorCode != "http_5xx" || dl[0].MessageID != ids[0] {
		t.Fatalf("dead letters %+v %v", dl, err)
	}
	if attempts(m, "retry", "http_5xx") != 2 || attempts(m, "dead", "http_5xx") != 1 {
		t.Fatal("the last retryable failure must count as dead")
	}
	if cycle(t, w) != 0 || rc.hits(ids[0]) != 3 {
		t.Fatal("a dead message was attempted again")
	}
}

func TestGoneDisablesEndpoint(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, func(*http.Request, int) int { return http.StatusGone })
	ep := e.endpoint("t1", "orders", rc.srv.URL+"/hook", "ep")
	_, first := e.enqueue("t1", "orders", 12)
	_, second := e.enqueue("t1", "orders", 12)
	// One slot: one message per claim, so the 410 settles before the other
	// message could be claimed.
	w, _ := newWorker(t, e.dsn, opts{concurrency: 1})

	if n := cycle(t, w); n != 1 {
		t.Fatalf("claimed %d", n)
	}
	if n := cycle(t, w); n != 0 {
		t.Fatalf("claimed %d messages of a disabled endpoint", n)
	}
	a, b := e.status("t1", first[0]), e.status("t1", second[0])
	dead, waiting := a, b
	if b.Status == store.StatusDead {
		dead, waiting = b, a
	}
	if dead.Status != store.StatusDead || dead.LastErrorCode != "http_410" || dead.Attempts != 1 {
		t.Fatalf("410 message %+v", dead)
	}
	if waiting.Status != store.StatusPending || waiting.Attempts != 0 {
		t.Fatalf("other message %+v, want pending and never attempted", waiting)
	}
	got, err := e.st.Outbox().GetEndpoint(context.Background(), "t1", ep)
	if err != nil || got.State != store.EndpointDisabled || got.DisabledReason != "http_410" {
		t.Fatalf("endpoint %+v %v", got, err)
	}
	if _, err := e.st.Outbox().Enqueue(context.Background(), store.Actor{TenantID: "t1", CorrelationID: "c1"}, store.EnqueueRequest{
		ProjectID: "p1", ProducerID: "svc1", Topic: "orders", MaxAttempts: 1,
		Build: func(int64) ([]byte, string, error) { return []byte("{}"), "00", nil },
	}); !errorsIs(err, store.ErrNoEndpoint) {
		t.Fatalf("enqueue to a topic whose only endpoint is disabled: %v", err)
	}
}

func TestNoSecretRetriesThenDies(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	e.endpoint("t1", "orders", rc.srv.URL+"/hook", "missing-ref")
	_, ids := e.enqueue("t1", "orders", 2)
	w, m := newWorker(t, e.dsn, opts{})
	cycleUntil(t, w, func() bool { return e.status("t1", ids[0]).Status == store.StatusDead })
	if s := e.status("t1", ids[0]); s.LastErrorCode != "no_secret" || s.Attempts != 2 {
		t.Fatalf("status %+v", s)
	}
	if rc.hits(ids[0]) != 0 || attempts(m, "retry", "no_secret") != 1 || attempts(m, "dead", "no_secret") != 1 {
		t.Fatal("a message without a secret must never be sent")
	}
}

func TestBlockedAndRedirectDieAtOnce(t *testing.T) {
	e := newEnv(t)
	target := newReceiver(t, nil)
	redirect := httptest.NewServer(http.RedirectHandler(target.srv.URL+"/stolen", http.StatusTemporaryRedirect))
	defer redirect.Close()
	e.endpoint("t1", "redir", redirect.URL+"/r", "ep")
	e.endpoint("t1", "meta", "https://169.254.169.254/latest/meta-data", "ep")
	_, r := e.enqueue("t1", "redir", 12)
	_, b := e.enqueue("t1", "meta", 12)
	w, m := newWorker(t, e.dsn, opts{})
	cycle(t, w)
	if s := e.status("t1", r[0]); s.Status != store.StatusDead || s.LastErrorCode != "redirect_refused" || s.Attempts != 1 {
		t.Fatalf("redirect: %+v", s)
	}
	if s := e.status("t1", b[0]); s.Status != store.StatusDead || s.LastErrorCode != "blocked_address" || s.Attempts != 1 {
		t.Fatalf("metadata address: %+v", s)
	}
	target.mu.Lock()
	defer target.mu.Unlock()
	if len(target.order) != 0 {
		t.Fatal("redirect target contacted")
	}
	if attempts(m, "dead", "redirect_refused") != 1 || attempts(m, "dead", "blocked_address") != 1 {
		t.Fatal("dead attempts not counted")
	}
}

// An answered attempt lets go of its body while its settle waits (here
// behind a row lock an operator's transaction holds): bodies of up to 1 MiB
// waiting for a group commit would otherwise double what a worker's
// attempts keep in memory.
func TestAnsweredAttemptLetsGoOfItsBodyBeforeItSettles(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, func(*http.Request, int) int { return http.StatusOK })
	e.endpoint("t1", "orders", rc.srv.URL+"/hook", "ep")
	_, ids := e.enqueue("t1", "orders", 12)
	w, _ := newWorker(t, e.dsn, opts{})
	claimed, err := e.st.Outbox().Claim(context.Background(), "t1", 1, 30*time.Second)
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %d", err, len(claimed))
	}

	tx, err := e.admin.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.Exec(`SELECT 1 FROM outbox_messages WHERE message_id = $1 FOR UPDATE`, ids[0]); err != nil {
		t.Fatal(err)
	}

	// The body the attempt gets is the only reference to its bytes.
	c := claimed[0]
	c.Body = bytes.Clone(c.Body)
	freed := make(chan struct{})
	runtime.AddCleanup(&c.Body[0], func(ch chan struct{}) { close(ch) }, freed)
	// Handed over through a channel, whose slot is cleared on receipt, so
	// no copy outlives the one Attempt holds.
	handover := make(chan store.Claimed, 1)
	handover <- c
	c, claimed = store.Claimed{}, nil
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Attempt(context.Background(), <-handover, time.Now().Add(30*time.Second))
	}()

	waitFor(t, 10*time.Second, "the receipt", func() bool { return rc.hits(ids[0]) == 1 })
	waitFor(t, 5*time.Second, "the body to be collected while the settle waits", func() bool {
		runtime.GC()
		select {
		case <-freed:
			return true
		default:
			return false
		}
	})
	if s := e.status("t1", ids[0]); s.Status != store.StatusDelivering {
		t.Fatalf("settled before the lock was released: %+v", s)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	<-done
	if s := e.status("t1", ids[0]); s.Status != store.StatusDelivered {
		t.Fatalf("after the lock: %+v, want delivered", s)
	}
}

// A worker whose attempt outlived its lease cannot settle: the message was
// claimed again (attempt 2) and the store fences attempt 1's settle.
func TestStaleWorkerCannotSettle(t *testing.T) {
	e := newEnv(t)
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	rc := newReceiver(t, func(r *http.Request, n int) int {
		if n == 1 {
			arrived <- struct{}{}
			<-release
		}
		return http.StatusOK
	})
	e.endpoint("t1", "orders", rc.srv.URL+"/hook", "ep")
	_, ids := e.enqueue("t1", "orders", 12)
	w, m := newWorker(t, e.dsn, opts{})

	claimed, err := e.st.Outbox().Claim(context.Background(), "t1", 1, 30*time.Second)
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %d", err, len(claimed))
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Attempt(context.Background(), claimed[0], time.Now().Add(30*time.Second))
	}()
	<-arrived
	// The lease expires (simulated) and another worker claims attempt 2.
	e.exec(`UPDATE outbox_messages SET next_attempt_at = now() - interval '1 second',
	        lease_expires_at = now() - interval '1 second' WHERE message_id = $1`, ids[0])
	again, err := e.st.Outbox().Claim(context.Background(), "t1", 1, 30*time.Second)
	if err != nil || len(again) != 1 || again[0].Attempt != 2 {
		t.Fatalf("re-claim: %v %+v", err, again)
	}
	close(release)
	<-done
	if got := testutil.ToFloat64(m.fenced); got != 1 {
		t.Fatalf("fenced settles %v, want 1", got)
	}
	if s := e.status("t1", ids[0]); s.Status != store.StatusDelivering || s.Attempts != 2 {
		t.Fatalf("the stale settle changed the message: %+v", s)
	}
	if err := e.st.Outbox().MarkDelivered(context.Background(), "t1", ids[0], 2); err != nil {
		t.Fatalf("the current holder settles: %v", err)
	}
}

// A worker does not even try to settle once its own lease deadline passed.
func TestNoSettleAfterLeaseDeadline(t *testing.T) {
	e := newEnv(t)
	var skew atomic.Int64
	rc := newReceiver(t, func(*http.Request, int) int {
		skew.Store(int64(time.Hour)) // the attempt "took" an hour
		return http.StatusOK
	})
	e.endpoint("t1", "orders", rc.srv.URL+"/hook", "ep")
	_, ids := e.enqueue("t1", "orders", 12)
	w, m := newWorker(t, e.dsn, opts{now: func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }})
	cycle(t, w)
	if s := e.status("t1", ids[0]); s.Status != store.StatusDelivering || s.Attempts != 1 {
		t.Fatalf("settled after the lease deadline: %+v", s)
	}
	if testutil.ToFloat64(m.leaseExpiries) != 1 || testutil.ToFloat64(m.fenced) != 0 || attempts(m, "lease_lost", "") != 1 {
		t.Fatal("lease loss not counted")
	}
	noSlotsHeld(t, w)
}

// Rate limiting decides only whether a tenant is claimed this cycle.
func TestLimiterSkipsTenant(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	e.endpoint("t1", "orders", rc.srv.URL+"/a", "ep")
	e.endpoint("t2", "orders", rc.srv.URL+"/b", testRefs[1])
	for range 3 {
		e.enqueue("t1", "orders", 12)
	}
	e.enqueue("t2", "orders", 12)
	w, m := newWorker(t, e.dsn, opts{concurrency: 1, limit: limiter.Policy{Tokens: 1, Interval: time.Hour}})
	if n := cycle(t, w); n != 2 {
		t.Fatalf("first cycle claimed %d, want one message per tenant", n)
	}
	if n := cycle(t, w); n != 0 {
		t.Fatalf("claimed %d without tokens", n)
	}
	if got := testutil.ToFloat64(m.limiterRefused); got != 1 {
		t.Fatalf("limiter refusals %v, want 1 (t1; t2 has nothing due)", got)
	}
	if n := e.count(`SELECT count(*) FROM outbox_messages WHERE tenant_id = 't1' AND status = 'pending' AND attempts = 0`); n != 2 {
		t.Fatalf("t1 messages touched while rate limited: %d pending untouched, want 2", n)
	}
}

// Several workers over thousands of messages: each is delivered exactly
// once.
func TestManyWorkersDeliverEachOnce(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	tenants := []string{"t1", "t2", "t3"}
	var all []string
	for i, tn := range tenants {
		ref := testRefs[i] // a secret ref belongs to one tenant
		e.endpoint(tn, "orders", rc.srv.URL+"/"+tn+"/a", ref)
		e.endpoint(tn, "orders", rc.srv.URL+"/"+tn+"/b", ref)
	}
	for i := range 1200 {
		_, ids := e.enqueue(tenants[i%3], "orders", 12)
		all = append(all, ids...)
	}
	if len(all) != 2400 {
		t.Fatalf("%d messages", len(all))
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var ms []*Metrics
	for range 3 {
		w, m := newWorker(t, e.dsn, opts{concurrency: 8, claimMax: 20})
		ms = append(ms, m)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = w.Run(ctx)
		}()
	}
	waitFor(t, time.Minute, "every message delivered", func() bool {
		return e.count(`SELECT count(*) FROM outbox_messages WHERE status = 'delivered'`) >= len(all)
	})
	cancel()
	wg.Wait()
	for _, id := range all {
		if n := rc.hits(id); n != 1 {
			t.Fatalf("message %s delivered %d times", id, n)
		}
	}
	if rc.bad.Load() != 0 {
		t.Fatalf("%d requests failed verification", rc.bad.Load())
	}
	if n := e.count(`SELECT count(*) FROM outbox_messages WHERE attempts <> 1`); n != 0 {
		t.Fatalf("%d messages took more than one attempt", n)
	}
	total, busy := 0, 0
	for _, m := range ms {
		n := attempts(m, "delivered", "")
		total += n
		if n > 0 {
			busy++
		}
	}
	if total != len(all) {
		t.Fatalf("workers counted %d deliveries, want %d", total, len(all))
	}
	t.Logf("%d of 3 workers delivered", busy)
}

// 10,000 due messages of tenant A do not delay tenant B's one message by
// more than one claim cycle.
func TestTenantFairness(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	e.endpoint("ta", "orders", rc.srv.URL+"/a", "ep")
	e.endpoint("tb", "orders", rc.srv.URL+"/b", testRefs[1])
	_, seed := e.enqueue("ta", "orders", 12)
	// A's backlog, due a minute before B's message.
	e.exec(`INSERT INTO outbox_messages (tenant_id, message_id, project_id, topic, endpoint_id, event_identity,
	            max_attempts, budget, next_attempt_at)
	        SELECT tenant_id, 'msg_' || lpad(to_hex(g), 24, '0'), project_id, topic, endpoint_id, event_identity,
	            max_attempts, budget, now() - interval '1 minute'
	        FROM outbox_messages, generate_series(1, 9999) g WHERE message_id = $1`, seed[0])
	e.exec(`UPDATE outbox_messages SET next_attempt_at = now() - interval '1 minute' WHERE message_id = $1`, seed[0])
	_, b := e.enqueue("tb", "orders", 12)
	if n := e.count(`SELECT count(*) FROM outbox_messages WHERE tenant_id = 'ta'`); n != 10000 {
		t.Fatalf("backlog %d", n)
	}
	const concurrency = 8
	w, _ := newWorker(t, e.dsn, opts{concurrency: concurrency})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.Run(ctx)
	}()
	waitFor(t, 30*time.Second, "the first message's delivery", func() bool { return rc.hits(b[0]) > 0 })
	cancel()
	<-done
	rc.mu.Lock()
	before := 0
	for _, p := range rc.order {
		if p == "/b" {
			break
		}
		before++
	}
	rc.mu.Unlock()
	// Cycle 1 claims A (at most `concurrency` messages: one per free slot),
	// then B. A's next claim comes after B's, and while B's attempt holds a
	// slot at most concurrency-1 others run: B arrives after at most
	// 2·concurrency−1 of A's requests.
	if before > 2*concurrency-1 {
		t.Fatalf("B's message arrived after %d of A's, want at most %d", before, 2*concurrency-1)
	}
	t.Logf("B delivered after %d of A's 10000 messages", before)
}

func TestGracefulShutdown(t *testing.T) {
	e := newEnv(t)
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	rc := newReceiver(t, func(r *http.Request, n int) int {
		arrived <- struct{}{}
		<-release
		return http.StatusOK
	})
	e.endpoint("t1", "orders", rc.srv.URL+"/hook", "ep")
	_, ids := e.enqueue("t1", "orders", 12)
	_, later := e.enqueue("t1", "orders", 12)
	w, _ := newWorker(t, e.dsn, opts{concurrency: 1})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.Run(ctx)
	}()
	<-arrived
	cancel() // SIGTERM while an attempt is in flight
	close(release)
	<-done
	first, second := e.status("t1", ids[0]), e.status("t1", later[0])
	if first.Status == store.StatusPending {
		first, second = second, first
	}
	if first.Status != store.StatusDelivered {
		t.Fatalf("in-flight attempt not settled within the grace period: %+v", first)
	}
	if second.Status != store.StatusPending || second.Attempts != 0 {
		t.Fatalf("claimed after shutdown began: %+v", second)
	}
}

func TestGraceExpiryLeavesMessageUnsettled(t *testing.T) {
	e := newEnv(t)
	arrived := make(chan struct{}, 1)
	rc := newReceiver(t, func(r *http.Request, n int) int {
		arrived <- struct{}{}
		<-r.Context().Done() // never answers while the worker waits
		return http.StatusOK
	})
	e.endpoint("t1", "orders", rc.srv.URL+"/hook", "ep")
	_, ids := e.enqueue("t1", "orders", 12)
	w, m := newWorker(t, e.dsn, opts{grace: time.Millisecond})
	stop := start(w)
	<-arrived
	stop()
	if s := e.status("t1", ids[0]); s.Status != store.StatusDelivering || s.Attempts != 1 {
		t.Fatalf("an aborted attempt was settled: %+v", s)
	}
	if attempts(m, "aborted", "") != 1 {
		t.Fatal("aborted attempt not counted")
	}
	noSlotsHeld(t, w)
}

// A message whose endpoint names a secret ref its tenant does not own is
// dead at once with secret_ref_foreign and never sent, whichever way the
// endpoint got past the schema's ownership trigger: another tenant's ref
// (a restore with triggers off), a ref several tenants shared before
// migration 0005 (owner NULL), a ref with no owner row at all. The secrets
// file holds every ref, so only the ownership check stops these messages.
func TestForeignSecretRefIsNeverSent(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	e.endpoint("t1", "orders", rc.srv.URL+"/own", testRefs[0])
	e.endpoint("t2", "shared", rc.srv.URL+"/shared", testRefs[1])
	e.endpoint("t2", "orphan", rc.srv.URL+"/orphan", testRefs[2])
	// As the administrator, past the trigger.
	tx, err := e.admin.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`SET LOCAL session_replication_role = replica`,
		`INSERT INTO endpoints (tenant_id, endpoint_id, project_id, topic, url, secret_ref)
		 VALUES ('t2', 'ep_0000000000000000000000f1', 'p1', 'foreign', '` + rc.srv.URL + `/foreign', '` + testRefs[0] + `')`,
		`UPDATE secret_ref_owners SET tenant_id = NULL WHERE secret_ref = '` + testRefs[1] + `'`,
		`DELETE FROM secret_ref_owners WHERE secret_ref = '` + testRefs[2] + `'`,
	} {
		if _, err := tx.Exec(q); err != nil {
			_ = tx.Rollback()
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	_, own := e.enqueue("t1", "orders", 12)
	var refused []string
	for _, topic := range []string{"foreign", "shared", "orphan"} {
		_, ids := e.enqueue("t2", topic, 12)
		refused = append(refused, ids...)
	}
	w, m := newWorker(t, e.dsn, opts{})
	cycleUntil(t, w, func() bool {
		return e.count(`SELECT count(*) FROM outbox_messages WHERE status IN ('pending', 'delivering')`) == 0
	})

	if s := e.status("t1", own[0]); s.Status != store.StatusDelivered || rc.hits(own[0]) != 1 {
		t.Fatalf("the owner's message: %+v, %d requests", s, rc.hits(own[0]))
	}
	for _, id := range refused {
		if s := e.status("t2", id); s.Status != store.StatusDead || s.LastErrorCode != store.CodeSecretRefForeign || s.Attempts != 1 {
			t.Fatalf("message %s: %+v", id, s)
		}
		if n := rc.hits(id); n != 0 {
			t.Fatalf("message %s sent %d times with a ref its tenant does not own", id, n)
		}
	}
	rc.mu.Lock()
	paths := append([]string(nil), rc.order...)
	rc.mu.Unlock()
	if len(paths) != 1 || paths[0] != "/own" {
		t.Fatalf("the sink saw %v, want only /own", paths)
	}
	dl, _, err := e.st.Outbox().ListDeadLetters(context.Background(), "t2", "p1", 10, "")
	if err != nil || len(dl) != len(refused) {
		t.Fatalf("dead letters: %+v, %v", dl, err)
	}
	for _, d := range dl {
		if d.ErrorCode != sender.CodeSecretRefForeign {
			t.Fatalf("dead letter %+v", d)
		}
	}
	if n := attempts(m, "dead", sender.CodeSecretRefForeign); n != len(refused) {
		t.Fatalf("%d refusals counted, want %d", n, len(refused))
	}
}

// A message whose envelope body is gone (expired under it: a replay by an
// older release, a hand edit) is dead at once with payload_expired and never
// sent: a signed empty body would be a valid webhook.
func TestMessageWithoutBodyIsNeverSent(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	e.endpoint("t1", "orders", rc.srv.URL+"/own", testRefs[0])
	_, ids := e.enqueue("t1", "orders", 12)
	if _, err := e.admin.Exec(`DELETE FROM outbound_bodies`); err != nil {
		t.Fatal(err)
	}
	w, _ := newWorker(t, e.dsn, opts{})
	cycleUntil(t, w, func() bool {
		return e.count(`SELECT count(*) FROM outbox_messages WHERE status IN ('pending', 'delivering')`) == 0
	})
	for _, id := range ids {
		if s := e.status("t1", id); s.Status != store.StatusDead || s.LastErrorCode != store.CodePayloadExpired {
			t.Fatalf("message %s: %+v", id, s)
		}
		if n := rc.hits(id); n != 0 {
			t.Fatalf("message %s sent %d times without a body", id, n)
		}
	}
}
