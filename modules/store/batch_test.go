package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// randomItems makes a mixed workload over three streams: in-order, reordered,
// duplicate, conflicting and pre-decided refusals.
func randomItems(r *rand.Rand, n int) []store.BatchItem {
	items := make([]store.BatchItem, 0, n)
	producers := []string{"d1", "d2", "d3"}
	for i := 0; i < n; i++ {
		p := producers[r.IntN(len(producers))]
		a := actor("t1", p)
		a.CorrelationID = fmt.Sprintf("c%d", i)
		switch k := r.IntN(10); {
		case k == 0:
			items = append(items, store.BatchItem{Actor: a, Refusal: &store.AuditEntry{ProjectID: "p1", Outcome: "refused", Reason: "bad_signature"}})
		default:
			e := env{tenant: "t1", project: "p1", producer: p, eventID: fmt.Sprintf("e-%s-%d", p, r.IntN(12)), seq: int64(1 + r.IntN(12))}
			if r.IntN(6) == 0 {
				e.content = "variant"
			}
			in := e.input()
			if r.IntN(8) == 0 {
				in.MaxAhead = 2
			}
			items = append(items, store.BatchItem{Actor: a, Ingest: &in})
		}
	}
	return items
}

type snapshot struct {
	streams    string
	identities string
	audit      string
}

func (f *fixture) snapshot() snapshot {
	f.t.Helper()
	q := func(query string) string {
		var s string
		if err := f.admin.QueryRow(query).Scan(&s); err != nil {
			f.t.Fatalf("%s: %v", query, err)
		}
		return s
	}
	return snapshot{
		streams:    q(`SELECT coalesce(string_agg(format('%s/%s/%s:%s:%s', tenant_id, project_id, producer_id, cursor, replay_floor), ',' ORDER BY producer_id), '') FROM streams`),
		identities: q(`SELECT coalesce(string_agg(format('%s:%s:%s', encode(event_identity, 'hex'), producer_id, sequence), ',' ORDER BY producer_id, sequence), '') FROM event_identities`),
		audit:      q(`SELECT coalesce(string_agg(format('%s:%s:%s:%s:%s', device_id, event_identity, outcome, reason, correlation_id), ',' ORDER BY audit_id), '') FROM audit_events`),
	}
}

func TestIngestBatchMatchesOneByOne(t *testing.T) {
	ctx := context.Background()
	for seed := uint64(1); seed <= 3; seed++ {
		items := randomItems(rand.New(rand.NewPCG(seed, 7)), 80)
		batched, single := newFixture(t), newFixture(t)
		got, err := batched.s.IngestBatch(ctx, items)
		if err != nil {
			t.Fatalf("seed %d: IngestBatch: %v", seed, err)
		}
		if len(got) != len(items) {
			t.Fatalf("seed %d: %d results for %d items", seed, len(got), len(items))
		}
		outcomes := map[store.Outcome]int{}
		for i, it := range items {
			var want store.Result
			if it.Refusal != nil {
				if err := single.s.Audit(ctx, it.Actor, *it.Refusal); err != nil {
					t.Fatal(err)
				}
				want = store.Result{Outcome: store.Outcome(it.Refusal.Outcome), Reason: it.Refusal.Reason}
			} else {
				want = mustIngest(t, single.s, it.Actor, *it.Ingest)
			}
			if got[i] != want {
				t.Fatalf("seed %d item %d: batch %+v, one by one %+v", seed, i, got[i], want)
			}
			outcomes[got[i].Outcome]++
		}
		if outcomes[store.OutcomeAccepted] == 0 || outcomes[store.OutcomeDuplicate] == 0 || outcomes[store.OutcomeRefused] == 0 {
			t.Fatalf("seed %d: workload too narrow: %v", seed, outcomes)
		}
		if b, s := batched.snapshot(), single.snapshot(); b != s {
			t.Fatalf("seed %d: state differs\nbatch  %+v\nsingle %+v", seed, b, s)
		}
	}
}

func TestIngestBatchRefusesInvalid(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	good := ev("e1", 1).input()
	a := actor("t1", "d1")
	if rs, err := f.s.IngestBatch(ctx, nil); err != nil || len(rs) != 0 {
		t.Fatalf("empty batch: %v, %v", rs, err)
	}
	bad := good
	bad.Sequence = 0
	cases := map[string][]store.BatchItem{
		"neither":       {{Actor: a}},
		"both":          {{Actor: a, Ingest: &good, Refusal: &store.AuditEntry{Outcome: "refused"}}},
		"invalid input": {{Actor: a, Ingest: &good}, {Actor: a, Ingest: &bad}},
		"too many":      make([]store.BatchItem, store.MaxBatch+1),
	}
	for i := range cases["too many"] {
		cases["too many"][i] = store.BatchItem{Actor: a, Ingest: &good}
	}
	for name, items := range cases {
		if _, err := f.s.IngestBatch(ctx, items); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if c := f.tableCounts(); c != [4]int{} {
		t.Fatalf("refused batches wrote rows: %v", c)
	}
}

func TestIngestBatchDuplicatesInside(t *testing.T) {
	f := newFixture(t)
	a := actor("t1", "d1")
	in1, in2 := ev("e1", 1).input(), ev("e2", 2).input()
	rs, err := f.s.IngestBatch(context.Background(), []store.BatchItem{
		{Actor: a, Ingest: &in2}, {Actor: a, Ingest: &in1}, {Actor: a, Ingest: &in1}, {Actor: a, Ingest: &in2},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []store.Result{
		{Outcome: store.OutcomeAccepted, EventIdentity: in2.EventIdentity, Cursor: 0},
		{Outcome: store.OutcomeAccepted, EventIdentity: in1.EventIdentity, Cursor: 2},
		{Outcome: store.OutcomeDuplicate, EventIdentity: in1.EventIdentity, Cursor: 2},
		{Outcome: store.OutcomeDuplicate, EventIdentity: in2.EventIdentity, Cursor: 2},
	}
	for i := range want {
		if rs[i] != want[i] {
			t.Fatalf("item %d: %+v, want %+v", i, rs[i], want[i])
		}
	}
}
