package worker

import (
	"context"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// Settles that queue while a flush runs go out together in one SettleBatch,
// and each keeps its own outcome: applied, fenced (a stale attempt), or not
// sent at all because its lease deadline has passed.
func TestSettlesQueuedBehindAFlushShareOneCommit(t *testing.T) {
	e := newEnv(t)
	e.endpoint("t1", "orders", "http://127.0.0.1:1/hook", "ep")
	for range 5 {
		e.enqueue("t1", "orders", 12)
	}
	w, m := newWorker(t, e.dsn, opts{})
	claimed, err := e.st.Outbox().Claim(context.Background(), "t1", 5, 30*time.Second)
	if err != nil || len(claimed) != 5 {
		t.Fatalf("Claim: %d, %v", len(claimed), err)
	}

	// Other attempts' flushes are in progress, as many as may be: new
	// settles queue behind them.
	w.settles.mu.Lock()
	w.settles.flushing = maxFlushes
	w.settles.mu.Unlock()

	future := time.Now().Add(time.Minute)
	reqs := make([]*settleReq, len(claimed))
	for i, c := range claimed {
		reqs[i] = &settleReq{tenant: "t1", deadline: future, done: make(chan settleResult, 1),
			st: store.Settlement{MessageID: c.MessageID, Attempt: c.Attempt, Outcome: store.SettleDelivered}}
	}
	reqs[1].st.Attempt++                            // a stale attempt: fenced
	reqs[2].deadline = time.Now().Add(-time.Second) // out of lease: not sent
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Go(func() { errs[i] = w.settle(context.Background(), r) })
	}
	waitQueued := func() bool {
		w.settles.mu.Lock()
		defer w.settles.mu.Unlock()
		return len(w.settles.pending) == len(reqs)
	}
	waitFor(t, 10*time.Second, "every settle to queue", waitQueued)
	// One running flush ends and hands over to the oldest waiter, as settle
	// does: off the queue, into the flush's place.
	w.settles.mu.Lock()
	next := w.settles.pending[0]
	w.settles.pending = w.settles.pending[1:]
	next.done <- settleResult{lead: true}
	w.settles.mu.Unlock()
	wg.Wait()

	for i, err := range errs {
		switch i {
		case 1:
			if !errorsIs(err, store.ErrFenced) {
				t.Errorf("stale attempt: %v, want ErrFenced", err)
			}
		case 2:
			if !errorsIs(err, errLeaseLost) {
				t.Errorf("expired lease: %v, want errLeaseLost", err)
			}
		default:
			if err != nil {
				t.Errorf("settle %d: %v", i, err)
			}
		}
	}
	var h dto.Metric
	if err := m.settleBatch.Write(&h); err != nil {
		t.Fatal(err)
	}
	// One commit carrying the four settles that were sent.
	if h.GetHistogram().GetSampleCount() != 1 || h.GetHistogram().GetSampleSum() != 4 {
		t.Fatalf("settle batches: %d commits of %v settles, want 1 of 4", h.GetHistogram().GetSampleCount(), h.GetHistogram().GetSampleSum())
	}
	if got := e.count(`SELECT count(*) FROM outbox_messages WHERE status = 'delivered'`); got != 3 {
		t.Fatalf("%d delivered, want 3", got)
	}
	if got := e.count(`SELECT count(*) FROM outbox_messages WHERE status = 'delivering'`); got != 2 {
		t.Fatalf("%d still delivering, want 2 (fenced and out of lease)", got)
	}
	if w.settles.flushing != maxFlushes-1 || len(w.settles.pending) != 0 {
		t.Fatalf("settler after the batch: %d flushing, %d pending; want only the other flushes", w.settles.flushing,
			len(w.settles.pending))
	}
}

// With one flush under way, settles queue until secondFlushMin of them
// wait; the one that makes it so starts a second flush with all of them, in
// one commit, and the first flush's place is left as it was.
func TestSecondFlushStartsAtItsMinimum(t *testing.T) {
	e := newEnv(t)
	w, m := newWorker(t, e.dsn, opts{})
	run := newSettles(t, w, claimDue(t, e, secondFlushMin))
	w.settles.mu.Lock()
	w.settles.flushing = 1
	w.settles.mu.Unlock()

	pending := func() int {
		w.settles.mu.Lock()
		defer w.settles.mu.Unlock()
		return len(w.settles.pending)
	}
	for i := range secondFlushMin - 1 {
		run.start(i)
	}
	waitFor(t, 10*time.Second, "all but one settle to queue", func() bool { return pending() == secondFlushMin-1 })
	run.start(secondFlushMin - 1)
	run.wait()
	wantOneBatch(t, m, secondFlushMin)
	if got := e.count(`SELECT count(*) FROM outbox_messages WHERE status = 'delivered'`); got != secondFlushMin {
		t.Fatalf("%d delivered, want %d", got, secondFlushMin)
	}
	if w.settles.flushing != 1 || pending() != 0 {
		t.Fatalf("settler after the batch: %d flushing, %d pending; want the first flush only", w.settles.flushing, pending())
	}
}

// A leader with fewer than lingerFor settles while requests are still out
// waits for more: the settles that arrive meanwhile join its batch, one
// commit for all, and the one that brings the batch to lingerFor ends the
// wait.
func TestLeaderLingersWhileRequestsAreOut(t *testing.T) {
	e := newEnv(t)
	w, m := newWorker(t, e.dsn, opts{})
	w.settles.lingerMax = time.Minute // ended by the batch filling, not by time
	run := newSettles(t, w, claimDue(t, e, lingerFor))
	if w.slots.take(context.Background(), "t2", 1) != 1 { // a request still out
		t.Fatal("take")
	}
	lingering := func() bool {
		w.settles.mu.Lock()
		defer w.settles.mu.Unlock()
		return w.settles.lingering
	}
	run.start(0)
	waitFor(t, 10*time.Second, "the leader to linger", lingering)
	for i := 1; i < lingerFor; i++ {
		run.start(i)
	}
	run.wait()
	wantOneBatch(t, m, lingerFor)
	if w.settles.flushing != 0 || w.settles.lingering {
		t.Fatalf("settler after the batch: %d flushing, lingering %v", w.settles.flushing, w.settles.lingering)
	}
}

// claimDue enqueues n messages of tenant t1 to one endpoint and claims them.
func claimDue(t *testing.T, e *env, n int) []store.Claimed {
	t.Helper()
	e.endpoint("t1", "orders", "http://127.0.0.1:1/hook", "ep")
	for range n {
		e.enqueue("t1", "orders", 12)
	}
	claimed, err := e.st.Outbox().Claim(context.Background(), "t1", n, 30*time.Second)
	if err != nil || len(claimed) != n {
		t.Fatalf("Claim: %d, %v", len(claimed), err)
	}
	return claimed
}

// settles settles claimed messages as delivered on w, each from its own
// goroutine as attempts do, with a minute of lease left.
type settles struct {
	t       *testing.T
	w       *Worker
	claimed []store.Claimed
	errs    []error
	wg      sync.WaitGroup
}

func newSettles(t *testing.T, w *Worker, claimed []store.Claimed) *settles {
	return &settles{t: t, w: w, claimed: claimed, errs: make([]error, len(claimed))}
}

func (s *settles) start(i int) {
	r := delivered(s.claimed[i])
	s.wg.Go(func() { s.errs[i] = s.w.settle(context.Background(), r) })
}

// wait waits for every settle started and fails the test on any error.
func (s *settles) wait() {
	s.t.Helper()
	s.wg.Wait()
	for i, err := range s.errs {
		if err != nil {
			s.t.Errorf("settle %d: %v", i, err)
		}
	}
}

// delivered is the settle request of a delivered attempt of c.
func delivered(c store.Claimed) *settleReq {
	return &settleReq{tenant: c.TenantID, deadline: time.Now().Add(time.Minute), done: make(chan settleResult, 1),
		st: store.Settlement{MessageID: c.MessageID, Attempt: c.Attempt, Outcome: store.SettleDelivered}}
}

// wantOneBatch fails the test unless m saw exactly one settle batch, of n.
func wantOneBatch(t *testing.T, m *Metrics, n int) {
	t.Helper()
	var h dto.Metric
	if err := m.settleBatch.Write(&h); err != nil {
		t.Fatal(err)
	}
	if h.GetHistogram().GetSampleCount() != 1 || h.GetHistogram().GetSampleSum() != float64(n) {
		t.Fatalf("settle batches: %d commits of %v settles, want 1 of %d", h.GetHistogram().GetSampleCount(),
			h.GetHistogram().GetSampleSum(), n)
	}
}

// An idle worker's lone answer is settled at once: with no request out,
// nothing more is coming to linger for.
func TestLoneSettleOfAnIdleWorkerDoesNotLinger(t *testing.T) {
	e := newEnv(t)
	w, _ := newWorker(t, e.dsn, opts{})
	w.settles.lingerMax = time.Hour
	claimed := claimDue(t, e, 1)
	done := make(chan error, 1)
	go func() { done <- w.settle(context.Background(), delivered(claimed[0])) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the lone settle of an idle worker lingered")
	}
}
