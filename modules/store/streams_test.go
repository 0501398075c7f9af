package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

func TestStreamNeverWritten(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	st, err := f.s.Inbound().Stream(ctx, "t1", "p1", "nobody")
	if err != nil || st != (store.StreamState{}) {
		t.Fatalf("Stream = %+v, %v", st, err)
	}
	envs, cursor, err := f.s.Inbound().ReadStream(ctx, "t1", "p1", "nobody", 0, 100, 1<<20)
	if err != nil || cursor != 0 || len(envs) != 0 {
		t.Fatalf("ReadStream = %v, %d, %v", envs, cursor, err)
	}
	if _, err := f.s.Inbound().Stream(ctx, "t1", "", "d1"); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("empty project: %v", err)
	}
}

func TestReadStream(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a := actor("t1", "d1")
	ins := map[int64]store.IngestInput{}
	for _, seq := range []int64{1, 2, 3, 5, 6} { // 4 is a gap
		in := ev("e"+string(rune('0'+seq)), seq).input()
		if seq == 2 {
			in.ExpiresAt = time.Now().Add(-time.Second) // expired, not yet deleted
		}
		ins[seq] = in
		mustIngest(t, f.s, a, in)
	}
	// Another stream's and another tenant's rows never show up.
	mustIngest(t, f.s, actor("t1", "d2"), env{tenant: "t1", project: "p1", producer: "d2", eventID: "x", seq: 1}.input())
	mustIngest(t, f.s, actor("t2", "d1"), env{tenant: "t2", project: "p1", producer: "d1", eventID: "y", seq: 1}.input())

	envs, cursor, err := f.s.Inbound().ReadStream(ctx, "t1", "p1", "d1", 0, 100, 1<<20)
	if err != nil || cursor != 3 || len(envs) != 3 {
		t.Fatalf("ReadStream = %d envelopes, cursor %d, %v; want 3 up to the cursor", len(envs), cursor, err)
	}
	for i, e := range envs {
		seq := int64(i + 1)
		in := ins[seq]
		if e.Sequence != seq || e.EventIdentity != in.EventIdentity {
			t.Fatalf("item %d: %+v", i, e)
		}
		if seq == 2 {
			if e.Envelope != nil || !e.PayloadExpired {
				t.Fatalf("expired payload served: %+v", e)
			}
		} else if string(e.Envelope) != string(in.Canonical) || e.PayloadExpired {
			t.Fatalf("item %d envelope %q, want %q", i, e.Envelope, in.Canonical)
		}
	}
	// Paging.
	envs, cursor, err = f.s.Inbound().ReadStream(ctx, "t1", "p1", "d1", 1, 1, 1<<20)
	if err != nil || cursor != 3 || len(envs) != 1 || envs[0].Sequence != 2 {
		t.Fatalf("page after 1: %+v, %d, %v", envs, cursor, err)
	}
	envs, _, err = f.s.Inbound().ReadStream(ctx, "t1", "p1", "d1", 3, 100, 1<<20)
	if err != nil || len(envs) != 0 {
		t.Fatalf("after the cursor: %+v, %v", envs, err)
	}
	// Filling the gap exposes 4..6; the janitor's deletion reads as expired too.
	mustIngest(t, f.s, a, ev("e4", 4).input())
	if _, err := f.admin.Exec(`DELETE FROM inbound_payloads WHERE event_identity = decode($1, 'hex')`, ins[5].EventIdentity); err != nil {
		t.Fatal(err)
	}
	envs, cursor, err = f.s.Inbound().ReadStream(ctx, "t1", "p1", "d1", 3, 100, 1<<20)
	if err != nil || cursor != 6 || len(envs) != 3 || envs[1].Sequence != 5 || !envs[1].PayloadExpired || envs[1].Envelope != nil || envs[2].PayloadExpired {
		t.Fatalf("after the fill: %+v, %d, %v", envs, cursor, err)
	}
	for name, c := range map[string]struct {
		after int64
		limit int
	}{"negative after": {-1, 10}, "zero limit": {0, 0}, "huge limit": {0, store.MaxReadLimit + 1}} {
		if _, _, err := f.s.Inbound().ReadStream(ctx, "t1", "p1", "d1", c.after, c.limit, 1<<20); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, _, err := f.s.Inbound().ReadStream(ctx, "t1", "p1", "d1", 0, 10, 0); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("no byte budget: %v", err)
	}
}

// TestReadStreamByteBudget: a page stops before the envelope that would take
// it past maxBytes, but always carries its first envelope, however large; an
// expired payload takes none of the budget.
func TestReadStreamByteBudget(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a := actor("t1", "d1")
	sizes := map[int64]int{}
	for seq := int64(1); seq <= 6; seq++ {
		e := ev(fmt.Sprintf("e%d", seq), seq)
		e.content = strings.Repeat("x", 1000)
		if seq == 1 {
			e.content = strings.Repeat("x", 5000) // alone over the budget
		}
		in := e.input()
		if seq == 4 {
			in.ExpiresAt = time.Now().Add(-time.Second)
		}
		sizes[seq] = len(in.Canonical)
		mustIngest(t, f.s, a, in)
	}
	budget := int64(sizes[2] + sizes[3] + sizes[5]/2) // two envelopes and a half
	var pages [][]int64
	for after := int64(0); ; {
		envs, cursor, err := f.s.Inbound().ReadStream(ctx, "t1", "p1", "d1", after, 100, budget)
		if err != nil || cursor != 6 {
			t.Fatalf("after %d: cursor %d, %v", after, cursor, err)
		}
		if len(envs) == 0 {
			break
		}
		var seqs []int64
		for _, e := range envs {
			seqs = append(seqs, e.Sequence)
			after = e.Sequence
		}
		pages = append(pages, seqs)
	}
	if got, want := fmt.Sprint(pages), "[[1] [2 3 4] [5 6]]"; got != want {
		t.Fatalf("pages %s, want %s (sizes %v, budget %d)", got, want, sizes, budget)
	}
	// limit still applies inside the budget.
	envs, _, err := f.s.Inbound().ReadStream(ctx, "t1", "p1", "d1", 1, 1, budget)
	if err != nil || len(envs) != 1 || envs[0].Sequence != 2 {
		t.Fatalf("limit 1: %+v, %v", envs, err)
	}
}

func TestSetReplayFloor(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a := actor("t1", "d1")
	for _, seq := range []int64{1, 4, 5, 7} {
		mustIngest(t, f.s, a, ev("e"+string(rune('0'+seq)), seq).input())
	}
	steps := []struct {
		floor int64
		want  store.StreamState
		err   error
	}{
		{2, store.StreamState{Cursor: 2, ReplayFloor: 2}, nil}, // 3 missing
		{3, store.StreamState{Cursor: 5, ReplayFloor: 3}, nil}, // runs through 4, 5
		{3, store.StreamState{Cursor: 5, ReplayFloor: 3}, nil}, // same floor: no-op
		{1, store.StreamState{Cursor: 5, ReplayFloor: 3}, store.ErrConflict},
		{6, store.StreamState{Cursor: 7, ReplayFloor: 6}, nil},
		{9, store.StreamState{Cursor: 9, ReplayFloor: 9}, nil}, // floor past everything
	}
	for _, st := range steps {
		got, err := f.s.Inbound().SetReplayFloor(ctx, "t1", "p1", "d1", st.floor)
		if !errors.Is(err, st.err) || (st.err == nil && err != nil) || got != st.want {
			t.Fatalf("floor %d: %+v, %v; want %+v, %v", st.floor, got, err, st.want, st.err)
		}
		if s, _ := f.s.Inbound().Stream(ctx, "t1", "p1", "d1"); s != st.want {
			t.Fatalf("floor %d: stored %+v", st.floor, s)
		}
	}
	// A floor on a stream never written creates it.
	if got, err := f.s.Inbound().SetReplayFloor(ctx, "t1", "p1", "fresh", 3); err != nil || got != (store.StreamState{Cursor: 3, ReplayFloor: 3}) {
		t.Fatalf("fresh stream: %+v, %v", got, err)
	}
	if r := mustIngest(t, f.s, actor("t1", "fresh"), env{tenant: "t1", project: "p1", producer: "fresh", eventID: "f4", seq: 4}.input()); r.Outcome != store.OutcomeAccepted || r.Cursor != 4 {
		t.Fatalf("first envelope above the floor: %+v", r)
	}
	for _, floor := range []int64{-1, 1 << 53} {
		if _, err := f.s.Inbound().SetReplayFloor(ctx, "t1", "p1", "d1", floor); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("floor %d: %v", floor, err)
		}
	}
}

func TestListAudit(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for i, p := range []string{"p1", "p2", "p1", "", "p1"} {
		a := actor("t1", "d1")
		a.CorrelationID = "c" + string(rune('0'+i))
		if err := f.s.Inbound().Audit(ctx, a, store.AuditEntry{ProjectID: p, Outcome: "refused", Reason: "forbidden"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.s.Inbound().Audit(ctx, actor("t2", "d1"), store.AuditEntry{Outcome: "refused", Reason: "forbidden"}); err != nil {
		t.Fatal(err)
	}
	all, err := f.s.Inbound().ListAudit(ctx, store.AuditFilter{TenantID: "t1"})
	if err != nil || len(all) != 5 || all[0].CorrelationID != "c4" || all[4].CorrelationID != "c0" {
		t.Fatalf("all: %+v, %v", all, err)
	}
	p1, err := f.s.Inbound().ListAudit(ctx, store.AuditFilter{TenantID: "t1", ProjectID: "p1", Limit: 2})
	if err != nil || len(p1) != 2 || p1[0].CorrelationID != "c4" || p1[1].CorrelationID != "c2" {
		t.Fatalf("p1 page 1: %+v, %v", p1, err)
	}
	next, err := f.s.Inbound().ListAudit(ctx, store.AuditFilter{TenantID: "t1", ProjectID: "p1", Limit: 2, BeforeID: p1[1].ID})
	if err != nil || len(next) != 1 || next[0].CorrelationID != "c0" {
		t.Fatalf("p1 page 2: %+v, %v", next, err)
	}
	for name, flt := range map[string]store.AuditFilter{
		"no tenant":      {},
		"bad project":    {TenantID: "t1", ProjectID: "p 1"},
		"negative limit": {TenantID: "t1", Limit: -1},
		"huge limit":     {TenantID: "t1", Limit: store.MaxAuditLimit + 1},
		"negative page":  {TenantID: "t1", BeforeID: -1},
	} {
		if _, err := f.s.Inbound().ListAudit(ctx, flt); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestDeleteExpiredPayloads(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a := actor("t1", "d1")
	now := time.Now()
	for seq := int64(1); seq <= 7; seq++ {
		in := ev("e"+string(rune('0'+seq)), seq).input()
		if seq <= 5 {
			in.ExpiresAt = now.Add(-time.Duration(seq) * time.Minute)
		}
		mustIngest(t, f.s, a, in)
	}
	before := f.tableCounts()
	streams := f.snapshot()
	n, err := f.s.Retention().DeleteExpiredPayloads(ctx, now, 2)
	if err != nil || n != 2 {
		t.Fatalf("first pass: %d, %v", n, err)
	}
	// Oldest first: sequences 5 and 4 expired earliest.
	if got := f.count(`SELECT count(*) FROM inbound_payloads p JOIN event_identities e USING (tenant_id, event_identity) WHERE e.sequence IN (4, 5)`); got != 0 {
		t.Fatalf("the oldest payloads were not deleted first")
	}
	n, err = f.s.Retention().DeleteExpiredPayloads(ctx, now, store.MaxDeleteBatch)
	if err != nil || n != 3 {
		t.Fatalf("second pass: %d, %v", n, err)
	}
	if n, err = f.s.Retention().DeleteExpiredPayloads(ctx, now, store.MaxDeleteBatch); err != nil || n != 0 {
		t.Fatalf("nothing left: %d, %v", n, err)
	}
	after := f.tableCounts()
	if after[0] != before[0] || after[2] != before[2] || after[3] != before[3] || after[1] != 2 {
		t.Fatalf("retention touched other tables: %v -> %v", before, after)
	}
	if f.snapshot() != streams {
		t.Fatal("retention changed identities, streams or audit")
	}
	for _, b := range []int{0, -1, store.MaxDeleteBatch + 1} {
		if _, err := f.s.Retention().DeleteExpiredPayloads(ctx, now, b); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("batch %d: %v", b, err)
		}
	}
}

// DeleteExpiredPayloads and DeleteExpiredOutbound delete by ctid, which
// names one row only within one heap: on a partitioned or inherited table
// the same ctid exists in every partition. The plain layout has one heap per
// table; the partitioned one (storetest.Layout) hash partitions that are
// plain heaps themselves, which the deletes name one at a time. Any other
// shape must revisit deleteExpiredSQL and the outbound deletes.
func TestRetentionTablesAreHeapsTheDeletesName(t *testing.T) {
	f := newFixture(t)
	for _, table := range []string{"inbound_payloads", "outbound_bodies", "outbox_attempts"} {
		kind := f.count(`SELECT CASE relkind WHEN 'r' THEN 1 WHEN 'p' THEN 2 ELSE 0 END FROM pg_class WHERE oid = $1::regclass`, table)
		children := f.count(`SELECT count(*) FROM pg_inherits WHERE inhparent = $1::regclass OR inhrelid = $1::regclass`, table)
		plainParts := f.count(`SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass AND c.relkind = 'r' AND c.relispartition
  AND NOT EXISTS (SELECT FROM pg_inherits g WHERE g.inhparent = c.oid)`, table)
		switch storetest.Layout() {
		case migrations.LayoutPlain:
			if kind != 1 || children != 0 {
				t.Errorf("%s: relkind code %d with %d inheritance links; want one plain heap", table, kind, children)
			}
		case migrations.LayoutPartitioned:
			if kind != 2 || children != migrations.Partitions || plainParts != migrations.Partitions {
				t.Errorf("%s: relkind code %d, %d children, %d of them plain partitions; want %d plain partitions",
					table, kind, children, plainParts, migrations.Partitions)
			}
		}
	}
}

// A payload table with an inheritance child is neither layout: the janitor
// refuses to delete by ctid there rather than guess.
func TestDeleteExpiredRefusesAnInheritedTable(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if _, err := f.admin.ExecContext(ctx, `CREATE TABLE stray_payloads () INHERITS (inbound_payloads)`); err != nil {
		if storetest.Layout() == migrations.LayoutPartitioned {
			// A partitioned table takes no inheritance child; attach a
			// sub-partitioned partition instead.
			if _, err := f.admin.ExecContext(ctx, `CREATE TABLE stray_outbound_bodies (LIKE outbound_bodies) PARTITION BY LIST (tenant_id)`); err != nil {
				t.Fatal(err)
			}
			if _, err := f.admin.ExecContext(ctx, `ALTER TABLE outbound_bodies DETACH PARTITION outbound_bodies_p0;
ALTER TABLE outbound_bodies ATTACH PARTITION stray_outbound_bodies FOR VALUES WITH (MODULUS 8, REMAINDER 0)`); err != nil {
				t.Fatal(err)
			}
			if _, err := f.s.Retention().DeleteExpiredOutbound(ctx, time.Now(), 10); !errors.Is(err, store.ErrInternal) {
				t.Fatalf("DeleteExpiredOutbound with a sub-partitioned partition = %v, want ErrInternal", err)
			}
			return
		}
		t.Fatal(err)
	}
	if _, err := f.s.Retention().DeleteExpiredPayloads(ctx, time.Now(), 10); !errors.Is(err, store.ErrInternal) {
		t.Fatalf("DeleteExpiredPayloads on an inherited table = %v, want ErrInternal", err)
	}
}
