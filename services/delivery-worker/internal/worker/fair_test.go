package worker

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Contract §8.7: tenant A's endpoint hangs until the test ends (HTTP
// timeout 30 s), so A holds its share of the worker (a quarter of 16 slots)
// and no more; tenant B's 20 messages, enqueued after A's attempts hang,
// are all delivered within 3 s. A's claims never exceed what it runs: the
// rest of its backlog stays pending and untouched, claimable by any other
// worker.
func TestHangingTenantDelaysOnlyItself(t *testing.T) {
	e := newEnv(t)
	var hanging, most atomic.Int32
	release := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := hanging.Add(1)
		defer hanging.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(hang.Close)
	t.Cleanup(func() { close(release) }) // runs first: no handler outlives the server
	fast := newReceiver(t, nil)
	e.endpoint("ta", "orders", hang.URL+"/a", testRefs[0]) // a ref belongs to one tenant
	e.endpoint("tb", "orders", fast.srv.URL+"/b", testRefs[1])
	_, seed := e.enqueue("ta", "orders", 12)
	e.exec(`INSERT INTO outbox_messages (tenant_id, message_id, project_id, topic, endpoint_id, event_identity,
	            max_attempts, budget, next_attempt_at)
	        SELECT tenant_id, 'msg_' || lpad(to_hex(g), 24, '0'), project_id, topic, endpoint_id, event_identity,
	            max_attempts, budget, now()
	        FROM outbox_messages, generate_series(1, 299) g WHERE message_id = $1`, seed[0])

	const concurrency, share = 16, 4
	w, m := newWorker(t, e.dsn, opts{concurrency: concurrency, lease: time.Minute, httpTimeout: 30 * time.Second,
		grace: 50 * time.Millisecond})
	defer start(w)()

	waitFor(t, 10*time.Second, "A's attempts to hang", func() bool { return hanging.Load() >= share })
	time.Sleep(200 * time.Millisecond) // room for any claim beyond the share to show
	if n := hanging.Load(); n != share {
		t.Errorf("A has %d attempts hanging, want its share %d", n, share)
	}
	if n := e.count(`SELECT count(*) FROM outbox_messages WHERE tenant_id = 'ta' AND status = 'delivering'`); n != share {
		t.Errorf("A has %d messages leased, want %d (no more claimed than started)", n, share)
	}
	if n := e.count(`SELECT count(*) FROM outbox_messages WHERE tenant_id = 'ta' AND status = 'pending' AND attempts = 0`); n != 300-share {
		t.Errorf("A has %d messages pending and untouched, want %d", n, 300-share)
	}

	began := time.Now()
	var ids []string
	for range 20 {
		_, id := e.enqueue("tb", "orders", 12)
		ids = append(ids, id...)
	}
	delivered := func() int {
		n := 0
		for _, id := range ids {
			if fast.hits(id) > 0 {
				n++
			}
		}
		return n
	}
	for delivered() < len(ids) && time.Since(began) < 3*time.Second {
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(began)
	if n := delivered(); n < len(ids) {
		t.Fatalf("B: %d of %d delivered within 3 s of being enqueued while A's endpoint hangs", n, len(ids))
	}
	t.Logf("B's 20 messages delivered %v after the first was enqueued", took.Round(time.Millisecond))
	if n := most.Load(); n != share {
		t.Errorf("A had up to %d attempts at once, want %d", n, share)
	}
	if testutil.ToFloat64(m.tenantCapped) == 0 {
		t.Error("skips of A at its share not counted")
	}
}

// noSlotsHeld fails unless every slot of w is free and no tenant is
// accounted for.
func noSlotsHeld(t *testing.T, w *Worker) {
	t.Helper()
	w.slots.mu.Lock()
	defer w.slots.mu.Unlock()
	if w.slots.inUse != 0 || len(w.slots.byTenant) != 0 || w.slots.settling != 0 {
		t.Fatalf("slots held after every attempt ended: %d in use, by tenant %v, %d settling", w.slots.inUse, w.slots.byTenant,
			w.slots.settling)
	}
}

func TestSlotsShareAndTotal(t *testing.T) {
	s := newSlots(6, 4, 100)
	ctx := context.Background()
	if n := s.take(ctx, "a", 100); n != 4 {
		t.Fatalf("a took %d, want its share 4", n)
	}
	if n := s.take(ctx, "a", 1); n != 0 || !s.full("a") {
		t.Fatalf("a took %d more at its share", n)
	}
	if n := s.take(ctx, "b", 2); n != 2 {
		t.Fatalf("b took %d, want the 2 left of 6", n)
	}
	// Every slot is taken: c waits for one (here until its context ends).
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	if n := s.take(short, "c", 1); n != 0 {
		t.Fatalf("c took %d of no free slot", n)
	}
	cancel()
	got := make(chan int)
	go func() { got <- s.take(ctx, "c", 5) }()
	time.Sleep(10 * time.Millisecond)
	s.release("a", 3)
	if n := <-got; n != 3 {
		t.Fatalf("c took %d after a gave back 3, want 3", n)
	}
	if all, ofA := s.held("a"); all != 6 || ofA != 1 {
		t.Fatalf("held %d, a %d; want 6 and 1", all, ofA)
	}
	s.release("a", 1)
	s.release("b", 2)
	s.release("c", 3)
	if all, _ := s.held("a"); all != 0 || len(s.byTenant) != 0 {
		t.Fatalf("after every release: %d in use, %v", all, s.byTenant)
	}
	// A tenant with attempts running waits until half a claim of its share
	// (here 2) is free, then takes what is free.
	s = newSlots(10, 4, 100)
	s.take(ctx, "a", 4)
	s.release("a", 1)
	if n := s.take(ctx, "a", 4); n != 0 || !s.full("a") {
		t.Fatalf("a took %d with 3 of 4 running", n)
	}
	s.release("a", 1)
	if n := s.take(ctx, "a", 4); n != 2 || s.full("b") {
		t.Fatalf("a took %d with 2 of 4 running, want 2", n)
	}
	// A share equal to the total is no bound.
	s = newSlots(6, 6, 100)
	if n := s.take(ctx, "a", 100); n != 6 {
		t.Fatalf("a took %d with the bound off, want 6", n)
	}
	// While attempts run, a claim waits until half a claim of the worker's
	// slots (here 5) is free, or what it may take if less, then takes what
	// is free.
	s = newSlots(10, 10, 100)
	s.refillWait = time.Minute // ended by the context here
	s.take(ctx, "a", 10)
	s.release("a", 4)
	short, cancel = context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if n := s.take(short, "b", 100); n != 0 {
		t.Fatalf("b took %d with 4 of 10 free, want to wait for 5", n)
	}
	if n := s.take(ctx, "b", 4); n != 4 {
		t.Fatalf("b took %d of 4 free when it wants 4, want 4", n)
	}
	s.release("b", 4)
	s.release("a", 1)
	if n := s.take(ctx, "b", 100); n != 5 {
		t.Fatalf("b took %d with 5 of 10 free, want 5", n)
	}
}

// A scheduler whose tenants are all full sleeps through answers that leave
// them full and wakes at the first that gives one room.
func TestSlotsWaitRoom(t *testing.T) {
	s := newSlots(10, 4, 100) // refill 2
	ctx := context.Background()
	s.take(ctx, "a", 4)
	woke := make(chan struct{})
	go func() {
		s.waitRoom(ctx, []string{"a"}, time.Minute)
		close(woke)
	}()
	s.release("a", 1) // 3 of 4 running: still full
	select {
	case <-woke:
		t.Fatal("woke while a was still full")
	case <-time.After(50 * time.Millisecond):
	}
	s.release("a", 1)
	select {
	case <-woke:
	case <-time.After(10 * time.Second):
		t.Fatal("did not wake when a had room")
	}
	start := time.Now()
	s.take(ctx, "b", 4)
	s.waitRoom(ctx, []string{"b"}, 20*time.Millisecond)
	if time.Since(start) < 20*time.Millisecond {
		t.Fatal("returned before its time with b full")
	}
}

// An attempt's slot comes back however the attempt ends, a panic included.
func TestSlotsRunReleasesOnPanic(t *testing.T) {
	s := newSlots(2, 1, 100)
	if s.take(context.Background(), "a", 1) != 1 {
		t.Fatal("take")
	}
	func() {
		defer func() { _ = recover() }()
		s.run("a", func(func()) { panic("attempt bug") })
	}()
	if all, ofA := s.held("a"); all != 0 || ofA != 0 {
		t.Fatalf("a panicking attempt kept its slot: %d, %d", all, ofA)
	}
	select {
	case <-s.freed:
	default:
		t.Fatal("the scheduler was not woken")
	}
}

// The share and the worker's slot come back when the endpoint has answered;
// the attempt then counts as settling until it ends.
func TestSlotsShareEndsAtTheAnswer(t *testing.T) {
	s := newSlots(2, 1, 100)
	if s.take(context.Background(), "a", 1) != 1 {
		t.Fatal("take")
	}
	s.run("a", func(answered func()) {
		if all, ofA := s.held("a"); all != 1 || ofA != 1 || !s.full("a") {
			t.Fatalf("sending: %d, %d", all, ofA)
		}
		answered()
		answered() // once only
		if all, ofA := s.held("a"); all != 0 || ofA != 0 || s.full("a") || s.waitingToSettle() != 1 {
			t.Fatalf("settling: %d held, a %d, %d settling; want no slot and one settling", all, ofA, s.waitingToSettle())
		}
	})
	if all, ofA := s.held("a"); all != 0 || ofA != 0 || s.waitingToSettle() != 0 {
		t.Fatalf("after: %d, %d, %d settling", all, ofA, s.waitingToSettle())
	}
}

// Delivered, retried and dead attempts, and attempts of a claim that came
// back short, all give their slots back.
func TestSlotsReleasedAfterSettles(t *testing.T) {
	e := newEnv(t)
	answers := map[string]int{"/ok": http.StatusNoContent, "/retry": http.StatusInternalServerError, "/dead": http.StatusNotFound}
	rc := newReceiver(t, func(r *http.Request, _ int) int { return answers[r.URL.Path] })
	for i, tenant := range []string{"t1", "t2", "t3"} {
		path := []string{"/ok", "/retry", "/dead"}[i]
		e.endpoint(tenant, "orders", rc.srv.URL+path, testRefs[i]) // a ref belongs to one tenant
		for range 3 {
			e.enqueue(tenant, "orders", 12)
		}
	}
	w, m := newWorker(t, e.dsn, opts{concurrency: 8}) // share 2: claims of 2 then 1
	cycle(t, w)
	noSlotsHeld(t, w)
	cycle(t, w)
	noSlotsHeld(t, w)
	if attempts(m, "delivered", "") != 3 || attempts(m, "dead", "http_4xx") != 3 || attempts(m, "retry", "http_5xx") < 3 {
		t.Fatalf("attempts: delivered %d, dead %d, retry %d", attempts(m, "delivered", ""), attempts(m, "dead", "http_4xx"),
			attempts(m, "retry", "http_5xx"))
	}
}

// A claim that fails gives back every slot it took.
func TestSlotsReleasedAfterFailedClaim(t *testing.T) {
	e := newEnv(t)
	w, m := newWorker(t, e.dsn, opts{concurrency: 8})
	st := storetest.Open(t, e.dsn)
	w.outbox = st.Outbox()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	if _, _, err := w.claimAndStart(context.Background(), context.Background(), "t1", &wg); err == nil {
		t.Fatal("claim on a closed store succeeded")
	}
	noSlotsHeld(t, w)
	if testutil.ToFloat64(m.storeErrors.WithLabelValues("claim")) != 1 {
		t.Fatal("claim failure not counted")
	}
}

// Answered attempts waiting for their settle hold no slot, but no more of
// them than the worker's slots: at that bound claims wait until one is
// settled.
func TestSlotsBoundWhatWaitsToSettle(t *testing.T) {
	s := newSlots(4, 4, 100)
	ctx := context.Background()
	if n := s.take(ctx, "a", 4); n != 4 {
		t.Fatalf("took %d, want 4", n)
	}
	settled := make(chan struct{})
	var running sync.WaitGroup
	for range 4 {
		running.Add(1)
		go s.run("a", func(answered func()) {
			answered()
			running.Done()
			<-settled
		})
	}
	running.Wait()
	if all, _ := s.held("a"); all != 0 || s.waitingToSettle() != 4 {
		t.Fatalf("%d held, %d settling; want 0 and 4", all, s.waitingToSettle())
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if n := s.take(short, "b", 1); n != 0 {
		t.Fatalf("took %d with 4 answers waiting to settle, want to wait", n)
	}
	close(settled)
	if n := s.take(ctx, "b", 1); n != 1 {
		t.Fatalf("took %d after the settles, want 1", n)
	}
}

// Slots held by requests to endpoints that hang come back only at the HTTP
// timeout: a claim waits for half a claim of free slots for refillWait at
// most, then takes what is free, so the other tenants keep being served
// (§8.7).
func TestSlotsHungRequestsDoNotStopClaims(t *testing.T) {
	s := newSlots(100, 40, 50) // half a claim: 25
	ctx := context.Background()
	if s.take(ctx, "a", 50) != 40 || s.take(ctx, "b", 50) != 40 {
		t.Fatal("setup: a and b take their shares")
	}
	// a's and b's requests hang; 20 slots are free.
	s.refillWait = time.Millisecond
	if n := s.take(ctx, "c", 50); n != 20 {
		t.Fatalf("c took %d with 20 free beside hung requests, want 20", n)
	}
}

// held reports the slots in use in all and by tenant, in one lock.
func (s *slots) held(tenant string) (all, ofTenant int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inUse, s.byTenant[tenant]
}

// waitingToSettle reports the answered attempts not yet settled.
func (s *slots) waitingToSettle() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.settling
}
