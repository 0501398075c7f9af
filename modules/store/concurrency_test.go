package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

func TestConcurrentSameEnvelope(t *testing.T) {
	f := newFixture(t)
	in := ev("e1", 1).input()
	const n = 32
	results := make([]store.Result, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i], errs[i] = f.s.Inbound().Ingest(context.Background(), actor("t1", "d1"), in)
		}()
	}
	close(start)
	wg.Wait()
	count := map[store.Outcome]int{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("sender %d: %v", i, errs[i])
		}
		if results[i].Cursor != 1 {
			t.Fatalf("sender %d: cursor %d", i, results[i].Cursor)
		}
		count[results[i].Outcome]++
	}
	if count[store.OutcomeAccepted] != 1 || count[store.OutcomeDuplicate] != n-1 {
		t.Fatalf("outcomes %v, want 1 accepted and %d duplicates", count, n-1)
	}
	if c := f.tableCounts(); c != [4]int{1, 1, n, 1} {
		t.Fatalf("rows (identities, payloads, audit, cursor sum) = %v", c)
	}
}

// Two producers of one project sending the same event id race on the unique
// index, not on a stream lock: the loser reruns and answers event_conflict.
func TestConcurrentSameEventAcrossStreams(t *testing.T) {
	f := newFixture(t)
	const n = 16
	results := make([]store.Result, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			p := fmt.Sprintf("d%d", i)
			e := env{tenant: "t1", project: "p1", producer: p, eventID: "shared", seq: 1}
			results[i], errs[i] = f.s.Inbound().Ingest(context.Background(), actor("t1", p), e.input())
		}()
	}
	close(start)
	wg.Wait()
	count := map[string]int{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("sender %d: %v", i, errs[i])
		}
		count[string(results[i].Outcome)+"/"+results[i].Reason]++
	}
	if count["accepted/"] != 1 || count["refused/"+store.ReasonEventConflict] != n-1 {
		t.Fatalf("outcomes %v", count)
	}
	if got := f.count(`SELECT count(*) FROM event_identities`); got != 1 {
		t.Fatalf("%d identities", got)
	}
}

func TestConcurrentProducersShuffled(t *testing.T) {
	f := newFixture(t)
	const producers, perProducer, senders = 8, 40, 4
	var wg sync.WaitGroup
	errs := make(chan error, producers*senders)
	for p := range producers {
		name := fmt.Sprintf("d%d", p)
		seqs := rand.New(rand.NewPCG(uint64(p), 1)).Perm(perProducer)
		// Several senders per producer share its shuffled sequences, so the
		// stream sees both reordering and concurrent arrivals.
		for s := range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := s; i < len(seqs); i += senders {
					seq := int64(seqs[i] + 1)
					e := env{tenant: "t1", project: "p1", producer: name, eventID: fmt.Sprintf("%s-%d", name, seq), seq: seq}
					r, err := f.s.Inbound().Ingest(context.Background(), actor("t1", name), e.input())
					if err != nil {
						errs <- err
						return
					}
					if r.Outcome != store.OutcomeAccepted {
						errs <- fmt.Errorf("%s seq %d: %+v", name, seq, r)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for p := range producers {
		name := fmt.Sprintf("d%d", p)
		st, err := f.s.Inbound().Stream(context.Background(), "t1", "p1", name)
		if err != nil || st.Cursor != perProducer {
			t.Fatalf("%s: %+v, %v; want cursor %d", name, st, err, perProducer)
		}
		if n := f.count(`SELECT count(DISTINCT sequence) FROM event_identities WHERE producer_id = $1 AND sequence BETWEEN 1 AND $2`, name, perProducer); n != perProducer {
			t.Fatalf("%s: %d distinct sequences", name, n)
		}
	}
	if n := f.count(`SELECT count(*) FROM event_identities`); n != producers*perProducer {
		t.Fatalf("%d identities, want %d", n, producers*perProducer)
	}
}

// Batches touching the same streams in opposite orders must neither deadlock
// nor fail: streams are locked up front in one order.
func TestConcurrentOverlappingBatches(t *testing.T) {
	f := newFixture(t)
	const workers, rounds = 6, 5
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				var items []store.BatchItem
				for k := range 4 {
					p := fmt.Sprintf("d%d", k)
					if w%2 == 1 {
						p = fmt.Sprintf("d%d", 3-k)
					}
					e := env{tenant: "t1", project: "p1", producer: p, eventID: fmt.Sprintf("w%d-r%d-%s", w, r, p), seq: int64(w*rounds + r + 1)}
					in := e.input()
					items = append(items, store.BatchItem{Actor: actor("t1", p), Ingest: &in})
				}
				if _, err := f.s.Inbound().IngestBatch(context.Background(), items); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for k := range 4 {
		st, err := f.s.Inbound().Stream(context.Background(), "t1", "p1", fmt.Sprintf("d%d", k))
		if err != nil || st.Cursor != workers*rounds {
			t.Fatalf("d%d: %+v, %v", k, st, err)
		}
	}
}
