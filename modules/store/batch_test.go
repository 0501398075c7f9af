package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// randomItems makes a mixed workload over six streams of two tenants:
// in-order, reordered, duplicate, conflicting (event, idempotency key,
// sequence), too far ahead and pre-decided refusals.
func randomItems(r *rand.Rand, n int) []store.BatchItem {
	items := make([]store.BatchItem, 0, n)
	tenants := []string{"t1", "t2"}
	producers := []string{"d1", "d2", "d3"}
	for i := 0; i < n; i++ {
		t, p := tenants[r.IntN(len(tenants))], producers[r.IntN(len(producers))]
		a := actor(t, p)
		a.CorrelationID = fmt.Sprintf("c%d", i)
		switch k := r.IntN(10); {
		case k == 0:
			items = append(items, store.BatchItem{Actor: a, Refusal: &store.AuditEntry{ProjectID: "p1", Outcome: "refused", Reason: "bad_signature"}})
		case k == 1 && i > 0:
			items = append(items, items[r.IntN(i)]) // resent: a duplicate if it was accepted
		default:
			// Event ids are shared by the producers of a tenant, so the
			// same id from another stream is an event_conflict.
			e := env{tenant: t, project: "p1", producer: p, eventID: fmt.Sprintf("e-%d", r.IntN(24)), seq: int64(1 + r.IntN(16))}
			if r.IntN(6) == 0 {
				e.content = "variant"
			}
			if r.IntN(5) == 0 {
				e.idemKey = fmt.Sprintf("k-%d", r.IntN(6))
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
		streams:    q(`SELECT coalesce(string_agg(format('%s/%s/%s:%s:%s', tenant_id, project_id, producer_id, cursor, replay_floor), ',' ORDER BY tenant_id, producer_id), '') FROM streams`),
		identities: q(`SELECT coalesce(string_agg(format('%s:%s:%s:%s', tenant_id, encode(event_identity, 'hex'), producer_id, sequence), ',' ORDER BY tenant_id, producer_id, sequence), '') FROM event_identities`),
		audit:      q(`SELECT coalesce(string_agg(format('%s:%s:%s:%s:%s', device_id, event_identity, outcome, reason, correlation_id), ',' ORDER BY audit_id), '') FROM audit_events`),
	}
}

// TestIngestBatchMatchesOneByOne is the differential test of the two
// implementations of step 5: IngestBatch decides set-based, Ingest in SQL.
// Several rounds per seed, with replay floors raised between them, so later
// batches meet what earlier ones stored.
func TestIngestBatchMatchesOneByOne(t *testing.T) {
	outcomes := map[string]int{}
	for seed := uint64(1); seed <= 6; seed++ {
		r := rand.New(rand.NewPCG(seed, 7))
		batched, single := newFixture(t), newFixture(t)
		for round := 0; round < 4; round++ {
			label := fmt.Sprintf("seed %d round %d", seed, round)
			if round > 0 && r.IntN(2) == 0 {
				raiseFloorBoth(t, label, r, batched, single)
			}
			for _, res := range ingestBoth(t, label, batched, single, randomItems(r, 2+r.IntN(79))) {
				outcomes[string(res.Outcome)+"/"+res.Reason]++
			}
		}
	}
	// The workload must reach every verdict, or the comparison proves little.
	for _, want := range []string{"accepted/", "duplicate/", "refused/bad_signature", "refused/" + store.ReasonEventConflict,
		"refused/" + store.ReasonIdempotencyConflict, "refused/" + store.ReasonSequenceConflict,
		"refused/" + store.ReasonSequenceTooFarAhead, "refused/" + store.ReasonBelowReplayFloor} {
		if outcomes[want] == 0 {
			t.Errorf("workload never reached %s: %v", want, outcomes)
		}
	}
	t.Logf("verdicts compared: %v", outcomes)
}

func TestIngestBatchRefusesInvalid(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	good := ev("e1", 1).input()
	a := actor("t1", "d1")
	if rs, err := f.s.Inbound().IngestBatch(ctx, nil); err != nil || len(rs) != 0 {
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
		if _, err := f.s.Inbound().IngestBatch(ctx, items); !errors.Is(err, store.ErrInvalid) {
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
	rs, err := f.s.Inbound().IngestBatch(context.Background(), []store.BatchItem{
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

// IngestBatchCommitting calls its hook exactly once, when only the commit is
// left: nothing is visible yet, and everything is once it returns.
func TestIngestBatchCommitting(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a := actor("t1", "d1")

	// One envelope: the hook runs before COMMIT is sent, so another session
	// sees nothing yet.
	in1 := ev("e1", 1).input()
	calls := 0
	var seen [4]int
	rs, err := f.s.Inbound().IngestBatchCommitting(ctx, []store.BatchItem{{Actor: a, Ingest: &in1}}, func() {
		calls++
		seen = f.tableCounts()
	})
	if err != nil || rs[0].Outcome != store.OutcomeAccepted {
		t.Fatalf("single: %+v, %v", rs, err)
	}
	if calls != 1 || seen != [4]int{} {
		t.Fatalf("single: hook called %d times, saw %v before the commit; want once, nothing", calls, seen)
	}
	if c := f.tableCounts(); c != [4]int{1, 1, 1, 1} {
		t.Fatalf("single: after return %v", c)
	}

	// A set-based batch: the hook runs once, everything is committed on return.
	in2, in3 := ev("e2", 2).input(), ev("e3", 3).input()
	calls = 0
	rs, err = f.s.Inbound().IngestBatchCommitting(ctx, []store.BatchItem{{Actor: a, Ingest: &in2}, {Actor: a, Ingest: &in3}}, func() { calls++ })
	if err != nil || rs[0].Outcome != store.OutcomeAccepted || rs[1].Outcome != store.OutcomeAccepted {
		t.Fatalf("batch: %+v, %v", rs, err)
	}
	if calls != 1 {
		t.Fatalf("batch: hook called %d times", calls)
	}
	if c := f.tableCounts(); c != [4]int{3, 3, 3, 3} {
		t.Fatalf("batch: after return %v", c)
	}

	// A failure before any database work still calls it, once.
	bad := ev("e4", 4).input()
	bad.Sequence = 0
	calls = 0
	if _, err := f.s.Inbound().IngestBatchCommitting(ctx, []store.BatchItem{{Actor: a, Ingest: &bad}}, func() { calls++ }); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("invalid: %v", err)
	}
	if calls != 1 {
		t.Fatalf("invalid: hook called %d times", calls)
	}
}
