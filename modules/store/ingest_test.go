package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

func TestIngestOutcomesAndAudit(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a := actor("t1", "d1")

	first := ev("e1", 1)
	tooFar := ev("e-far", 1+store.DefaultMaxAhead+1) // cursor is 1 when it arrives

	steps := []struct {
		name    string
		in      store.IngestInput
		outcome store.Outcome
		reason  string
		cursor  int64
		writes  bool
	}{
		{"accepted", first.input(), store.OutcomeAccepted, "", 1, true},
		{"duplicate", first.input(), store.OutcomeDuplicate, "", 1, false},
		{"event_conflict", env{tenant: "t1", project: "p1", producer: "d1", eventID: "e1", seq: 1, content: "other"}.input(),
			store.OutcomeRefused, store.ReasonEventConflict, 1, false},
		{"idempotency_conflict", env{tenant: "t1", project: "p1", producer: "d1", eventID: "e2", idemKey: "idem-e1", seq: 2}.input(),
			store.OutcomeRefused, store.ReasonIdempotencyConflict, 1, false},
		{"sequence_conflict", ev("e3", 1).input(), store.OutcomeRefused, store.ReasonSequenceConflict, 1, false},
		{"sequence_too_far_ahead", tooFar.input(), store.OutcomeRefused, store.ReasonSequenceTooFarAhead, 1, false},
		{"ahead but within bound", ev("e-edge", 1+store.DefaultMaxAhead).input(), store.OutcomeAccepted, "", 1, true},
		{"gap fill", ev("e4", 2).input(), store.OutcomeAccepted, "", 2, true},
	}
	for _, st := range steps {
		before := f.tableCounts()
		r, err := f.s.Inbound().Ingest(ctx, a, st.in)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		want := store.Result{Outcome: st.outcome, Reason: st.reason, EventIdentity: st.in.EventIdentity, Cursor: st.cursor}
		if r != want {
			t.Fatalf("%s: got %+v, want %+v", st.name, r, want)
		}
		after := f.tableCounts()
		if st.writes {
			if after[0] != before[0]+1 || after[1] != before[1]+1 || after[2] != before[2]+1 {
				t.Fatalf("%s: rows %v -> %v, want one more identity, payload and audit row", st.name, before, after)
			}
		} else if after[0] != before[0] || after[1] != before[1] || after[2] != before[2]+1 || after[3] != before[3] {
			t.Fatalf("%s: rows %v -> %v, want the audit row alone", st.name, before, after)
		}
		rows := f.audit("t1")
		last := rows[len(rows)-1]
		wantOutcome := string(st.outcome)
		if last.Outcome != wantOutcome || last.Reason != st.reason || last.EventIdentity != st.in.EventIdentity ||
			last.ProjectID != "p1" || last.AccountID != a.AccountID || last.DeviceID != a.DeviceID ||
			last.CorrelationID != a.CorrelationID || last.TenantID != "t1" || last.At.IsZero() {
			t.Fatalf("%s: audit row %+v", st.name, last)
		}
	}

	// below_replay_floor: raise the floor past the held sequences.
	if _, err := f.s.Inbound().SetReplayFloor(ctx, "t1", "p1", "d1", 5); err != nil {
		t.Fatal(err)
	}
	before := f.tableCounts()
	r := mustIngest(t, f.s, a, ev("e5", 5).input())
	if r.Outcome != store.OutcomeRefused || r.Reason != store.ReasonBelowReplayFloor {
		t.Fatalf("below floor: %+v", r)
	}
	if after := f.tableCounts(); after[0] != before[0] || after[2] != before[2]+1 {
		t.Fatalf("below floor wrote %v -> %v", before, after)
	}
}

func TestIngestPrecedence(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a := actor("t1", "d1")
	mustIngest(t, f.s, a, ev("e1", 1).input())
	mustIngest(t, f.s, a, ev("e2", 2).input())
	if _, err := f.s.Inbound().SetReplayFloor(ctx, "t1", "p1", "d1", 10); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		in     env
		reason string
	}{
		// a before b–e: a retained event below the floor is still a duplicate.
		{"duplicate before floor", ev("e1", 1), ""},
		{"event_conflict before floor", env{tenant: "t1", project: "p1", producer: "d1", eventID: "e1", seq: 7, content: "x"}, store.ReasonEventConflict},
		// b before c–e.
		{"idempotency before floor", env{tenant: "t1", project: "p1", producer: "d1", eventID: "n1", idemKey: "idem-e2", seq: 3}, store.ReasonIdempotencyConflict},
		// c before d: a held sequence at or below the floor is below_replay_floor.
		{"floor before sequence_conflict", ev("n2", 2), store.ReasonBelowReplayFloor},
	}
	for _, c := range cases {
		r := mustIngest(t, f.s, a, c.in.input())
		if r.Reason != c.reason || (c.reason == "" && r.Outcome != store.OutcomeDuplicate) {
			t.Errorf("%s: %+v, want reason %q", c.name, r, c.reason)
		}
	}

	// d before e: a held sequence is sequence_conflict even when a tighter
	// bound would also call it too far ahead.
	mustIngest(t, f.s, a, ev("e20", 20).input())
	in := ev("n3", 20).input()
	in.MaxAhead = 2
	if r := mustIngest(t, f.s, a, in); r.Reason != store.ReasonSequenceConflict {
		t.Fatalf("d before e: %+v", r)
	}
	in = ev("n4", 13).input() // cursor 10, bound 2
	in.MaxAhead = 2
	if r := mustIngest(t, f.s, a, in); r.Reason != store.ReasonSequenceTooFarAhead {
		t.Fatalf("MaxAhead honoured: %+v", r)
	}
	in = ev("n5", 12).input()
	in.MaxAhead = 2
	if r := mustIngest(t, f.s, a, in); r.Outcome != store.OutcomeAccepted || r.Cursor != 10 {
		t.Fatalf("at the bound: %+v", r)
	}
}

func TestIngestScopes(t *testing.T) {
	f := newFixture(t)
	// The same event id in another project, or another tenant, is another event;
	// sequences are per producer.
	for _, e := range []env{
		ev("e1", 1),
		{tenant: "t1", project: "p2", producer: "d1", eventID: "e1", seq: 1},
		{tenant: "t2", project: "p1", producer: "d1", eventID: "e1", seq: 1},
		{tenant: "t1", project: "p1", producer: "d2", eventID: "other", seq: 1},
	} {
		if r := mustIngest(t, f.s, actor(e.tenant, e.producer), e.input()); r.Outcome != store.OutcomeAccepted || r.Cursor != 1 {
			t.Fatalf("%+v: %+v", e, r)
		}
	}
	// ...but the same event id from another producer of the same project is
	// the same event.
	r := mustIngest(t, f.s, actor("t1", "d2"), env{tenant: "t1", project: "p1", producer: "d2", eventID: "e1", seq: 2}.input())
	if r.Reason != store.ReasonEventConflict {
		t.Fatalf("cross-producer event id: %+v", r)
	}
	if n := len(f.audit("t2")); n != 1 {
		t.Fatalf("tenant t2 sees %d audit rows, want its own 1", n)
	}
}

func TestIngestDuplicateAfterPayloadExpired(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a := actor("t1", "d1")
	in := ev("e1", 1).input()
	in.ExpiresAt = time.Now().Add(-time.Second)
	mustIngest(t, f.s, a, in)
	if n, err := f.s.Retention().DeleteExpiredPayloads(ctx, time.Now(), 10); err != nil || n != 1 {
		t.Fatalf("DeleteExpiredPayloads = %d, %v", n, err)
	}
	if r := mustIngest(t, f.s, a, in); r.Outcome != store.OutcomeDuplicate || r.Cursor != 1 {
		t.Fatalf("resend after expiry: %+v", r)
	}
	other := ev("e1", 1)
	other.content = "changed"
	if r := mustIngest(t, f.s, a, other.input()); r.Reason != store.ReasonEventConflict {
		t.Fatalf("changed resend after expiry: %+v", r)
	}
}

func TestIngestRefusesInvalidInput(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	good := ev("e1", 1).input()
	a := actor("t1", "d1")
	cases := map[string]func(*store.Actor, *store.IngestInput){
		"empty tenant":         func(a *store.Actor, _ *store.IngestInput) { a.TenantID = "" },
		"bad tenant":           func(a *store.Actor, _ *store.IngestInput) { a.TenantID = "-t" },
		"bad account":          func(a *store.Actor, _ *store.IngestInput) { a.AccountID = "a b" },
		"bad correlation":      func(a *store.Actor, _ *store.IngestInput) { a.CorrelationID = "x\ny" },
		"empty project":        func(_ *store.Actor, in *store.IngestInput) { in.ProjectID = "" },
		"long producer":        func(_ *store.Actor, in *store.IngestInput) { in.ProducerID = strings.Repeat("p", 65) },
		"bad key id":           func(_ *store.Actor, in *store.IngestInput) { in.KeyID = "k/1" },
		"short identity":       func(_ *store.Actor, in *store.IngestInput) { in.EventIdentity = "abcd" },
		"uppercase identity":   func(_ *store.Actor, in *store.IngestInput) { in.EventIdentity = strings.ToUpper(in.EventIdentity) },
		"sequence zero":        func(_ *store.Actor, in *store.IngestInput) { in.Sequence = 0 },
		"sequence negative":    func(_ *store.Actor, in *store.IngestInput) { in.Sequence = -1 },
		"sequence beyond 2^53": func(_ *store.Actor, in *store.IngestInput) { in.Sequence = 1 << 53 },
		"no canonical":         func(_ *store.Actor, in *store.IngestInput) { in.Canonical = nil },
		"no issued_at":         func(_ *store.Actor, in *store.IngestInput) { in.IssuedAt = time.Time{} },
		"no expiry":            func(_ *store.Actor, in *store.IngestInput) { in.ExpiresAt = time.Time{} },
	}
	for name, mutate := range cases {
		aa, in := a, good
		mutate(&aa, &in)
		_, err := f.s.Inbound().Ingest(ctx, aa, in)
		if !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
	if c := f.tableCounts(); c != [4]int{} {
		t.Fatalf("invalid input wrote rows: %v", c)
	}
	if f.count(`SELECT count(*) FROM streams`) != 0 {
		t.Fatal("invalid input created a stream")
	}
	// The largest sequence the contract allows is fine (and far ahead).
	in := good
	in.Sequence = 1<<53 - 1
	if r := mustIngest(t, f.s, a, in); r.Reason != store.ReasonSequenceTooFarAhead {
		t.Fatalf("max sequence: %+v", r)
	}
}

func TestAuditRefusal(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a := actor("t1", "d1")
	ident := ev("e1", 1).identity()
	if err := f.s.Inbound().Audit(ctx, a, store.AuditEntry{ProjectID: "p1", EventIdentity: ident, Outcome: "refused", Reason: "bad_signature"}); err != nil {
		t.Fatal(err)
	}
	if err := f.s.Inbound().Audit(ctx, a, store.AuditEntry{Outcome: "refused", Reason: "forbidden"}); err != nil {
		t.Fatal(err)
	}
	rows := f.audit("t1")
	if len(rows) != 2 || rows[0].Reason != "bad_signature" || rows[0].EventIdentity != ident || rows[0].ProjectID != "p1" ||
		rows[1].Reason != "forbidden" || rows[1].ProjectID != "" || rows[1].EventIdentity != "" || rows[1].CorrelationID != a.CorrelationID {
		t.Fatalf("audit rows: %+v", rows)
	}
	bad := map[string]store.AuditEntry{
		"no outcome":       {Reason: "forbidden"},
		"outcome not code": {Outcome: "Refused!"},
		"reason not code":  {Outcome: "refused", Reason: "bad reason"},
		"bad project":      {Outcome: "refused", ProjectID: "p 1"},
		"bad identity":     {Outcome: "refused", EventIdentity: "zz"},
	}
	for name, e := range bad {
		if err := f.s.Inbound().Audit(ctx, a, e); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if err := f.s.Inbound().Audit(ctx, store.Actor{}, store.AuditEntry{Outcome: "refused"}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("no tenant: %v, want ErrInvalid", err)
	}
	if n := len(f.audit("t1")); n != 2 {
		t.Fatalf("refused audits wrote rows: %d", n)
	}
}
