package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// One batch answers every kind of item as if each were sent alone, in order:
// new items take consecutive sequences in item order, repeats (of a stored
// envelope or of an earlier item) and refusals take none.
func TestEnqueueBatchAnswersAsOneByOne(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.addEndpoint("t1", "p1", "task.proposals")
	f.addEndpoint("t1", "p1", "task.proposals")
	stored := f.enqueue(actor("t1", "svc1"), out("k-stored", `{"n":0}`)) // sequence 1

	buildErr := errors.New("build failed")
	failing := out("k-fail", `{}`).request()
	failing.Build = func(int64) ([]byte, string, error) { return nil, "", buildErr }
	noEndpoint := out("k-none", `{}`)
	noEndpoint.topic = "task.none"
	other := out("k-other", `{"n":4}`)
	other.producer = "svc2"
	items := []store.EnqueueItem{
		{actor("t1", "svc1"), out("k-a", `{"n":1}`).request()},      // 0 new, seq 2
		{actor("t1", "svc1"), out("k-a", `{"n":1}`).request()},      // 1 repeat of 0
		{actor("t1", "svc1"), out("k-a", `{"n":2}`).request()},      // 2 conflict with 0
		{actor("t1", "svc1"), out("k-stored", `{"n":0}`).request()}, // 3 repeat of stored
		{actor("t1", "svc1"), out("k-stored", `{"n":9}`).request()}, // 4 conflict with stored
		{actor("t1", "svc1"), noEndpoint.request()},                 // 5 no endpoint
		{actor("t1", "svc1"), failing},                              // 6 build error
		{actor("t1", "svc2"), other.request()},                      // 7 new, svc2 seq 1
		{actor("t1", "svc1"), out("k-b", `{"n":3}`).request()},      // 8 new, seq 3
	}
	as, err := f.s.Outbox().EnqueueBatch(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	if len(as) != len(items) {
		t.Fatalf("%d answers for %d items", len(as), len(items))
	}
	wantSeq := map[int]int64{0: 2, 7: 1, 8: 3}
	for i, seq := range wantSeq {
		if as[i].Err != nil || !as[i].Result.Created || len(as[i].Result.MessageIDs) != 2 {
			t.Fatalf("item %d: %+v, want created with 2 messages", i, as[i])
		}
		if got := seqOf(t, as[i].Result.Envelope); got != seq {
			t.Fatalf("item %d: sequence %d, want %d", i, got, seq)
		}
	}
	if as[1].Err != nil || as[1].Result.Created || !bytes.Equal(as[1].Result.Envelope, as[0].Result.Envelope) ||
		!slices.Equal(as[1].Result.MessageIDs, as[0].Result.MessageIDs) {
		t.Fatalf("item 1 is not a repeat of item 0: %+v", as[1])
	}
	if as[3].Err != nil || as[3].Result.Created || !bytes.Equal(as[3].Result.Envelope, stored.Envelope) ||
		!slices.Equal(as[3].Result.MessageIDs, stored.MessageIDs) {
		t.Fatalf("item 3 is not a repeat of the stored enqueue: %+v", as[3])
	}
	wantErr(t, "item 2", as[2].Err, store.ErrIdempotencyConflict)
	wantErr(t, "item 4", as[4].Err, store.ErrIdempotencyConflict)
	wantErr(t, "item 5", as[5].Err, store.ErrNoEndpoint)
	wantErr(t, "item 6", as[6].Err, buildErr)
	if n := f.count(`SELECT count(*) FROM outbox_messages`); n != 8 {
		t.Fatalf("%d messages, want 8 (4 envelopes × 2 endpoints)", n)
	}
	if n := f.count(`SELECT last_sequence FROM outbound_streams WHERE producer_id = 'svc1'`); n != 3 {
		t.Fatalf("svc1 last sequence %d, want 3", n)
	}
	// The next lone enqueue continues the stream.
	if r := f.enqueue(actor("t1", "svc1"), out("k-c", `{}`)); seqOf(t, r.Envelope) != 4 {
		t.Fatalf("next sequence %d, want 4", seqOf(t, r.Envelope))
	}
}

// A batch of repeats and refusals only writes nothing and creates no stream.
func TestEnqueueBatchOfRefusalsStoresNothing(t *testing.T) {
	f := newFixture(t)
	o := out("k-1", `{}`)
	o.topic = "task.none"
	as, err := f.s.Outbox().EnqueueBatch(context.Background(), []store.EnqueueItem{{actor("t1", "svc1"), o.request()}})
	if err != nil {
		t.Fatal(err)
	}
	wantErr(t, "no endpoint", as[0].Err, store.ErrNoEndpoint)
	if f.count(`SELECT count(*) FROM outbound_streams`) != 0 || o.builds.Load() != 0 {
		t.Fatal("a refused batch created a stream or built an envelope")
	}
	_, err = f.s.Outbox().EnqueueBatch(context.Background(), make([]store.EnqueueItem, store.MaxEnqueueBatch+1))
	wantErr(t, "oversized batch", err, store.ErrInvalid)
}

// Random batches and the same items one by one end in the same answers and
// sequences: the set-based decision is the one-by-one decision.
func TestEnqueueBatchMatchesOneByOne(t *testing.T) {
	batch, single := newFixture(t), newFixture(t)
	for _, f := range []*fixture{batch, single} {
		f.addEndpoint("t1", "p1", "task.proposals")
		f.addEndpoint("t2", "p1", "task.proposals")
	}
	rng := rand.New(rand.NewPCG(14, 5))
	for round := 0; round < 20; round++ {
		n := 1 + rng.IntN(30)
		items := make([]store.EnqueueItem, n)
		for i := range items {
			o := out(fmt.Sprintf("k-%d", rng.IntN(40)), fmt.Sprintf(`{"v":%d}`, rng.IntN(2)))
			o.producer = []string{"svc1", "svc2"}[rng.IntN(2)]
			tenant := []string{"t1", "t2"}[rng.IntN(2)]
			if rng.IntN(8) == 0 {
				o.topic = "task.none"
			}
			items[i] = store.EnqueueItem{Actor: actor(tenant, o.producer), Request: o.request()}
		}
		got, err := batch.s.Outbox().EnqueueBatch(context.Background(), items)
		if err != nil {
			t.Fatal(err)
		}
		for i, it := range items {
			want, werr := single.s.Outbox().Enqueue(context.Background(), it.Actor, it.Request)
			if !sameErr(got[i].Err, werr) || got[i].Result.Created != want.Created ||
				len(got[i].Result.MessageIDs) != len(want.MessageIDs) {
				t.Fatalf("round %d item %d: batch %+v / %v, one by one %+v / %v", round, i, got[i].Result, got[i].Err, want, werr)
			}
			if werr == nil && seqOf(t, got[i].Result.Envelope) != seqOf(t, want.Envelope) {
				t.Fatalf("round %d item %d: sequence %d in the batch, %d one by one", round, i,
					seqOf(t, got[i].Result.Envelope), seqOf(t, want.Envelope))
			}
		}
	}
	q := `SELECT string_agg(tenant_id || '/' || producer_id || '/' || last_sequence, ',' ORDER BY tenant_id, producer_id) FROM outbound_streams`
	var a, b string
	if err := batch.admin.QueryRow(q).Scan(&a); err != nil {
		t.Fatal(err)
	}
	if err := single.admin.QueryRow(q).Scan(&b); err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatalf("streams after batches %s, one by one %s", a, b)
	}
}

func sameErr(a, b error) bool {
	for _, e := range []error{store.ErrIdempotencyConflict, store.ErrNoEndpoint} {
		if errors.Is(a, e) != errors.Is(b, e) {
			return false
		}
	}
	return (a == nil) == (b == nil)
}

// Concurrent batches and lone enqueues of one stream, some of a stream not
// yet created (its first sequences are raced for), leave the stream's
// sequences contiguous from 1 with no gap or repeat.
func TestEnqueueBatchConcurrentSequencesContiguous(t *testing.T) {
	f := newFixture(t)
	f.addEndpoint("t1", "p1", "task.proposals")
	const workers, per = 16, 5
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			items := make([]store.EnqueueItem, per)
			for i := range items {
				items[i] = store.EnqueueItem{Actor: actor("t1", "svc1"), Request: out(fmt.Sprintf("k-%d-%d", w, i), `{}`).request()}
			}
			as, err := f.s.Outbox().EnqueueBatch(context.Background(), items)
			if err == nil {
				for _, a := range as {
					if a.Err != nil || !a.Result.Created {
						err = fmt.Errorf("answer %+v", a)
					}
				}
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := f.count(`SELECT count(*) FROM outbound_envelopes WHERE sequence BETWEEN 1 AND $1`, workers*per); n != workers*per {
		t.Fatalf("%d envelopes in 1..%d", n, workers*per)
	}
	if n := f.count(`SELECT last_sequence FROM outbound_streams`); n != workers*per {
		t.Fatalf("last sequence %d, want %d", n, workers*per)
	}
}

// A batch of new items builds each envelope once, in parallel, at the
// sequence it commits with.
func TestEnqueueBatchBuildsEachOnce(t *testing.T) {
	f := newFixture(t)
	f.addEndpoint("t1", "p1", "task.proposals")
	outs := make([]outReq, 12)
	items := make([]store.EnqueueItem, len(outs))
	for i := range outs {
		outs[i] = out(fmt.Sprintf("k-%d", i), `{}`)
		items[i] = store.EnqueueItem{Actor: actor("t1", "svc1"), Request: outs[i].request()}
	}
	as, err := f.s.Outbox().EnqueueBatch(context.Background(), items)
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range as {
		if a.Err != nil || seqOf(t, a.Result.Envelope) != int64(i+1) || outs[i].builds.Load() != 1 {
			t.Fatalf("item %d: %+v, %d builds; want sequence %d built once", i, a, outs[i].builds.Load(), i+1)
		}
	}
}
