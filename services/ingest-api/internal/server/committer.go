package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// errCommitterClosed answers requests that arrive after shutdown began.
var errCommitterClosed = errors.New("group committer closed")

// committer is the group commit of single-item requests: concurrent
// requests (any tenant, any stream) are queued, and each flush runs one
// batch call of the store for everything queued (store.IngestBatch for
// POST /v1/envelopes, store.EnqueueBatch for POST /v1/outbox, contract
// §8.6), so many requests share one transaction and one WAL flush. Every
// request is answered only after the shared commit; if the transaction
// fails, every request in it gets the error (503: nothing acknowledged,
// retrying is safe).
//
// Batching is self-clocking: a group takes whatever queued while the group
// before it was being decided, so an idle server commits a lone request at
// once and a busy one commits in larger groups. window optionally waits a
// little longer for stragglers.
//
// Groups are pipelined: one group at a time is being decided (its reads and
// decisions, the CPU-heavy part), and the next starts as soon as only the
// commit of the one before is left, so up to concurrency transactions wait
// for WAL flushes together, which PostgreSQL serves with one flush. Deciding
// one group at a time keeps groups large when the CPU is the limit; not
// waiting for the flush keeps latency at about one flush when the disk is.
// Both batch calls lock the streams of a batch in sorted order, so
// concurrent transactions cannot deadlock each other.
//
// I is the store's item type and R its per-item answer.
type committer[I, R any] struct {
	commitBatch batchFunc[I, R]
	log         *slog.Logger
	size        prometheus.Observer
	duration    prometheus.Observer
	timeout     time.Duration
	window      time.Duration
	maxItems    int

	queue chan *pendingItem[I, R]
	slots chan struct{} // one token per flush allowed in flight
	// deciding is held by the one flush whose transaction is being decided;
	// it is handed on when only the commit is left (store.IngestBatchCommitting).
	deciding chan struct{}

	stop    chan struct{}
	stopped chan struct{}
	// mu guards closed so submit never sends after the loop has drained.
	mu     sync.RWMutex
	closed bool
	wg     sync.WaitGroup
}

// batchFunc commits items in one transaction, answering each in order; it
// calls decided once only the commit is left (store.IngestBatchCommitting,
// store.EnqueueBatchCommitting).
type batchFunc[I, R any] func(ctx context.Context, items []I, decided func()) ([]R, error)

type pendingItem[I, R any] struct {
	item I
	done chan commitResult[R] // buffered: a flush never blocks on a gone waiter
}

type commitResult[R any] struct {
	res R
	err error
}

// newCommitter is the group commit of POST /v1/envelopes.
func newCommitter(in *store.Inbound, log *slog.Logger, m *metrics, timeout, window time.Duration, maxItems, concurrency int) *committer[store.BatchItem, store.Result] {
	return newGroupCommitter(in.IngestBatchCommitting, log, m.commitSize, m.commitDuration, timeout, window, maxItems, concurrency)
}

// newOutboxCommitter is the group commit of POST /v1/outbox (contract §8.6);
// a group is at most one store.EnqueueBatch.
func newOutboxCommitter(out *store.Outbox, log *slog.Logger, m *metrics, timeout, window time.Duration, maxItems, concurrency int) *committer[store.EnqueueItem, store.EnqueueAnswer] {
	return newGroupCommitter(out.EnqueueBatchCommitting, log, m.outboxCommitSize, m.outboxCommitDuration, timeout, window,
		min(maxItems, store.MaxEnqueueBatch), concurrency)
}

func newGroupCommitter[I, R any](run batchFunc[I, R], log *slog.Logger, size, duration prometheus.Observer, timeout, window time.Duration, maxItems, concurrency int) *committer[I, R] {
	c := &committer[I, R]{
		commitBatch: run, log: log, size: size, duration: duration, timeout: timeout, window: window, maxItems: maxItems,
		queue:    make(chan *pendingItem[I, R], maxItems*concurrency),
		slots:    make(chan struct{}, concurrency),
		deciding: make(chan struct{}, 1),
		stop:     make(chan struct{}),
		stopped:  make(chan struct{}),
	}
	if maxItems == 1 {
		// Grouping is off: each request is its own transaction, decided
		// independently of the others.
		c.deciding = make(chan struct{}, concurrency)
	}
	go c.run()
	return c
}

// submit queues one item and waits for its commit. A cancelled ctx stops the
// wait but not the commit: the item may still commit, which is why a
// cancelled request is answered 503 (retry is safe: a retry is a duplicate).
func (c *committer[I, R]) submit(ctx context.Context, item I) (R, error) {
	var zero R
	p := &pendingItem[I, R]{item: item, done: make(chan commitResult[R], 1)}
	c.mu.RLock()
	if c.closed {
		c.mu.RUnlock()
		return zero, errCommitterClosed
	}
	select {
	case c.queue <- p:
		c.mu.RUnlock()
	case <-ctx.Done():
		c.mu.RUnlock()
		return zero, ctx.Err()
	}
	select {
	case r := <-p.done:
		return r.res, r.err
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

func (c *committer[I, R]) run() {
	defer close(c.stopped)
	for {
		var first *pendingItem[I, R]
		select {
		case first = <-c.queue:
		case <-c.stop:
			// close() holds mu, so nothing more can enter the queue: drain
			// what is left and leave.
			for {
				select {
				case p := <-c.queue:
					c.slots <- struct{}{}
					c.deciding <- struct{}{}
					c.wg.Add(1)
					go c.flush([]*pendingItem[I, R]{p})
				default:
					c.wg.Wait()
					return
				}
			}
		}
		// Waiting for a free slot, then for the group before to be decided,
		// is what lets a group form under load.
		c.slots <- struct{}{}
		c.deciding <- struct{}{}
		batch := c.collect(first)
		c.wg.Add(1)
		go c.flush(batch)
	}
}

// collect takes what is queued, up to maxItems, and if a window is set waits
// that long for more.
func (c *committer[I, R]) collect(first *pendingItem[I, R]) []*pendingItem[I, R] {
	batch := make([]*pendingItem[I, R], 1, c.maxItems)
	batch[0] = first
drain:
	for len(batch) < c.maxItems {
		select {
		case p := <-c.queue:
			batch = append(batch, p)
		default:
			break drain
		}
	}
	if c.window <= 0 || len(batch) >= c.maxItems {
		return batch
	}
	t := time.NewTimer(c.window)
	defer t.Stop()
	for len(batch) < c.maxItems {
		select {
		case p := <-c.queue:
			batch = append(batch, p)
		case <-t.C:
			return batch
		case <-c.stop:
			return batch
		}
	}
	return batch
}

func (c *committer[I, R]) flush(batch []*pendingItem[I, R]) {
	defer c.wg.Done()
	defer func() { <-c.slots }()
	var once sync.Once
	decided := func() { once.Do(func() { <-c.deciding }) }
	defer decided()

	results, err := c.commit(batch, decided)
	if err != nil && len(batch) > 1 && !isUnavailable(err) {
		// Not an outage but a refusal of the whole transaction (one item
		// the store rejects as invalid): commit the items one by one so one
		// bad request cannot fail its neighbours.
		c.log.Warn("group commit failed; retrying items singly", slog.Int("items", len(batch)), slog.String("error", err.Error()))
		for _, p := range batch {
			r, err := c.commit([]*pendingItem[I, R]{p}, decided)
			if err != nil {
				p.done <- commitResult[R]{err: err}
				continue
			}
			p.done <- commitResult[R]{res: r[0]}
		}
		return
	}
	for i, p := range batch {
		if err != nil {
			p.done <- commitResult[R]{err: err}
			continue
		}
		p.done <- commitResult[R]{res: results[i]}
	}
}

// commit runs one transaction; decided is called when only its commit is
// left, so the next group can be decided while this one waits for its flush.
func (c *committer[I, R]) commit(batch []*pendingItem[I, R], decided func()) ([]R, error) {
	items := make([]I, len(batch))
	for i, p := range batch {
		items[i] = p.item
	}
	// Detached from any one request: the commit serves all of them, and a
	// client that went away must not abort its neighbours' transaction.
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	start := time.Now()
	results, err := c.commitBatch(ctx, items, decided)
	c.duration.Observe(time.Since(start).Seconds())
	if err != nil {
		return nil, fmt.Errorf("group commit of %d items: %w", len(items), err)
	}
	if len(results) != len(items) {
		return nil, fmt.Errorf("group commit: %d results for %d items", len(results), len(items))
	}
	c.size.Observe(float64(len(items)))
	return results, nil
}

// close stops taking new items, commits everything already queued and
// waits for in-flight flushes. Call it after the HTTP server has drained.
func (c *committer[I, R]) close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		<-c.stopped
		return
	}
	c.closed = true
	c.mu.Unlock()
	close(c.stop)
	<-c.stopped
}

// isUnavailable reports an outage-class error: the database is unreachable,
// restarting or too slow, or the request ran out of time.
func isUnavailable(err error) bool {
	return errors.Is(err, store.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, context.Canceled) || errors.Is(err, errCommitterClosed)
}
