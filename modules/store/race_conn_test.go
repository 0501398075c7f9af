package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// A producer that loses the unique-index race to another stream of its
// project must get event_conflict or idempotency_conflict, not unavailable —
// also when the pool is so small that the rerun lands on the connection whose
// pipeline failed. (Regression: pgx left that connection busy after the
// error, the rerun failed with "conn busy", and the answer was 503.)
func TestUniqueRaceRerunsOnAHealthyConnection(t *testing.T) {
	dsn := newFixture(t).dsn
	s, err := store.Open(context.Background(), dsn, store.Options{MaxOpenConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })

	for round := range 40 {
		var wg sync.WaitGroup
		results := make([]store.Result, 2)
		errs := make([]error, 2)
		start := make(chan struct{})
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p := fmt.Sprintf("d%d", i)
				e := env{tenant: "t1", project: "p1", producer: p, eventID: fmt.Sprintf("ev-%d-%d", round, i), seq: int64(round + 1)}
				if round%2 == 0 {
					e.eventID = fmt.Sprintf("shared-%d", round) // race on the event identity
				} else {
					e.idemKey = fmt.Sprintf("shared-%d", round) // race on the idempotency digest
				}
				e.content = p // other content: the loser is a conflict, not a duplicate
				<-start
				results[i], errs[i] = s.Inbound().Ingest(context.Background(), actor("t1", p), e.input())
			}()
		}
		close(start)
		wg.Wait()
		want := store.ReasonEventConflict
		if round%2 == 1 {
			want = store.ReasonIdempotencyConflict
		}
		got := map[string]int{}
		for i := range 2 {
			if errs[i] != nil {
				t.Fatalf("round %d sender %d: %v", round, i, errs[i])
			}
			got[string(results[i].Outcome)+"/"+results[i].Reason]++
		}
		if got["accepted/"] != 1 || got["refused/"+want] != 1 {
			t.Fatalf("round %d: outcomes %v", round, got)
		}
	}
}
