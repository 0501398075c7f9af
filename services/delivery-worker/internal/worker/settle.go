package worker

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// errLeaseLost: the attempt's lease deadline passed before its settle could
// be sent, so it was not sent.
var errLeaseLost = errors.New("worker: lease deadline passed before settling")

// Settling is group commit. Every finished attempt queues its settlement;
// one that finds no flush running becomes a leader (or, with one running,
// the one that brings the queue to secondFlushMin: see maxFlushes), takes
// everything queued (at most store.MaxSettleBatch) and applies it with one
// store.SettleBatch per tenant, one round trip and one commit each. While it
// does, later attempts queue up behind it, so under load each commit carries
// many settles and costs each message a fraction of a round trip; an idle
// worker settles a lone attempt at once. When a leader is done and more is
// queued it hands leadership to the oldest waiter instead of flushing on, so
// no attempt waits for more than the batches ahead of its own. There is no
// background goroutine: a worker that is not running holds nothing.
//
// Each settlement keeps its own fence (attempt and status, checked by the
// store) and its own lease deadline: one whose deadline has passed when its
// batch is sent is dropped (lease_lost), and a batch's store call is
// bounded by the earliest deadline in it.
type settler struct {
	lingerMax time.Duration // lingerMax; tests lengthen it

	mu        sync.Mutex
	pending   []*settleReq
	flushing  int           // flushes under way, at most maxFlushes
	lingering bool          // a leader waits for its batch to fill (linger)
	filled    chan struct{} // capacity 1: the lingering leader's batch is full enough
}

// maxFlushes is how many settle batches may be under way at once: a second
// starts while one is under way once secondFlushMin settles wait, so a
// burst of answers is not held behind a batch the database is still
// executing, and a trickle still shares one commit instead of sending
// one-row batches side by side (a settle statement costs about as much for
// one row as for ten: BenchmarkSettleBatchSize).
const (
	maxFlushes     = 2
	secondFlushMin = 32
)

// A leader with fewer than lingerFor settles to send waits up to lingerMax
// for more while the worker still has requests out, since a settle costs
// about as much for one row as for ten (a round trip, a commit, the
// statement's start: BenchmarkSettleBatchSize): a tenant at its share (50
// requests out at the defaults) otherwise settled 17 rows a batch on
// average, and its settles cost half again as much database time per
// message as a tenant's without the share (pg_stat_statements over
// bench-delivery.sh). An idle worker's lone answer is not delayed: with no
// request out nothing more is coming.
const (
	lingerFor = secondFlushMin
	lingerMax = 2 * time.Millisecond
)

func newSettler() settler { return settler{lingerMax: lingerMax, filled: make(chan struct{}, 1)} }

type settleReq struct {
	tenant   string
	st       store.Settlement
	deadline time.Time
	done     chan settleResult // buffered (1): a lead handover, then the result
}

type settleResult struct {
	err  error
	lead bool // become the leader instead
}

// settle queues r and waits for its outcome: nil, errLeaseLost,
// store.ErrFenced, store.ErrNotFound or a store failure.
func (w *Worker) settle(ctx context.Context, r *settleReq) error {
	b := &w.settles
	b.mu.Lock()
	if b.flushing >= maxFlushes || (b.flushing > 0 && (b.lingering || len(b.pending)+1 < secondFlushMin)) {
		b.pending = append(b.pending, r)
		if b.lingering && len(b.pending)+1 >= lingerFor {
			select {
			case b.filled <- struct{}{}:
			default:
			}
		}
		b.mu.Unlock()
		res := <-r.done
		if !res.lead {
			return res.err
		}
		// Made leader: taken off pending, in the flush slot of the leader
		// that handed over.
		b.mu.Lock()
	} else {
		b.flushing++
	}
	// Only a lone flush lingers: with two under way the second started
	// because enough were waiting, and one lingering leader at a time keeps
	// the filled signal its own.
	if b.flushing == 1 && len(b.pending)+1 < lingerFor && w.slots.sending() > 0 {
		b.linger(ctx)
	}
	n := min(len(b.pending), store.MaxSettleBatch-1)
	batch := append([]*settleReq{r}, b.pending[:n]...)
	b.pending = slices.Delete(b.pending, 0, n)
	b.mu.Unlock()

	w.flush(ctx, batch) // answers every request in batch, r among them

	b.mu.Lock()
	if len(b.pending) > 0 {
		next := b.pending[0]
		b.pending = slices.Delete(b.pending, 0, 1)
		next.done <- settleResult{lead: true}
	} else {
		b.flushing--
	}
	b.mu.Unlock()
	return (<-r.done).err
}

// linger waits, with b.mu held on entry and on return, until lingerFor
// settles are queued, lingerMax passes or ctx ends. No other flush starts
// meanwhile: the settles that arrive join this one.
func (b *settler) linger(ctx context.Context) {
	b.lingering = true
	select {
	case <-b.filled: // a poke left from an earlier linger
	default:
	}
	b.mu.Unlock()
	t := time.NewTimer(b.lingerMax)
	select {
	case <-t.C:
	case <-b.filled:
	case <-ctx.Done():
	}
	t.Stop()
	b.mu.Lock()
	b.lingering = false
}

// flush settles batch, one SettleBatch per tenant, and answers each request.
func (w *Worker) flush(ctx context.Context, batch []*settleReq) {
	byTenant := map[string][]*settleReq{}
	var order []string
	now := w.cfg.Now()
	for _, r := range batch {
		if !now.Before(r.deadline) {
			r.done <- settleResult{err: errLeaseLost}
			continue
		}
		if _, ok := byTenant[r.tenant]; !ok {
			order = append(order, r.tenant)
		}
		byTenant[r.tenant] = append(byTenant[r.tenant], r)
	}
	for _, tenant := range order {
		reqs := byTenant[tenant]
		earliest := reqs[0].deadline
		ss := make([]store.Settlement, len(reqs))
		for i, r := range reqs {
			ss[i] = r.st
			if r.deadline.Before(earliest) {
				earliest = r.deadline
			}
		}
		sctx, cancel := context.WithTimeout(ctx, min(w.cfg.StoreTimeout, earliest.Sub(w.cfg.Now())))
		results, err := w.outbox.SettleBatch(sctx, tenant, ss)
		cancel()
		w.m.settleBatch.Observe(float64(len(ss)))
		for i, r := range reqs {
			if err != nil {
				r.done <- settleResult{err: err}
			} else {
				r.done <- settleResult{err: results[i]}
			}
		}
	}
}
