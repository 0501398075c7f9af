package store_test

import (
	"context"
	"testing"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// TestVerifiedWithKeyCheck: an input that names the public key it was
// verified with is decided only while that key is active with that public
// key, on both paths (one envelope: decideSQL; a batch: set-based). A stale
// input writes nothing, not even an audit row, and leaves its batch
// neighbours decided as usual.
func TestVerifiedWithKeyCheck(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	a := actor("t1", "d1")
	pub, other := newKey(t), newKey(t)
	for _, k := range []string{"k1", "k-retired", "k-revoked"} {
		if err := f.s.Credentials().AddKey(ctx, "t1", k, pub); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.s.Credentials().RetireKey(ctx, "t1", "k-retired"); err != nil {
		t.Fatal(err)
	}
	if err := f.s.Credentials().RevokeKey(ctx, "t1", "k-revoked"); err != nil {
		t.Fatal(err)
	}

	seq := int64(0)
	next := func(keyID string, with []byte) store.IngestInput {
		seq++
		in := ev("e-"+keyID+string(rune('a'+seq)), seq).input()
		in.KeyID, in.VerifiedWith = keyID, with
		return in
	}
	stale := []struct {
		name  string
		keyID string
		with  []byte
	}{
		{"other public key", "k1", other},
		{"retired", "k-retired", pub},
		{"revoked", "k-revoked", pub},
		{"unknown (pruned)", "k-gone", pub},
	}

	// One envelope at a time.
	if r := mustIngest(t, f.s, a, next("k1", pub)); r.Outcome != store.OutcomeAccepted || r.Cursor != 1 {
		t.Fatalf("active key: %+v", r)
	}
	before := f.tableCounts()
	for _, c := range stale {
		in := next(c.keyID, c.with)
		seq-- // a stale envelope takes no slot
		if r := mustIngest(t, f.s, a, in); r.Outcome != store.OutcomeStale {
			t.Errorf("single, %s: %+v, want stale", c.name, r)
		}
	}
	if after := f.tableCounts(); after != before {
		t.Fatalf("stale singles wrote rows: %v -> %v", before, after)
	}

	// The same inside a batch, between envelopes that are decided.
	items := []store.BatchItem{}
	in2 := next("k1", pub)
	items = append(items, store.BatchItem{Actor: a, Ingest: &in2})
	for _, c := range stale {
		in := next(c.keyID, c.with)
		seq--
		items = append(items, store.BatchItem{Actor: a, Ingest: &in})
	}
	in3 := next("k1", nil) // no check asked: decided whatever the key
	items = append(items, store.BatchItem{Actor: a, Ingest: &in3})
	rs, err := f.s.Inbound().IngestBatch(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	if rs[0].Outcome != store.OutcomeAccepted || rs[0].Cursor != 2 {
		t.Fatalf("batch item 0: %+v", rs[0])
	}
	for i, c := range stale {
		if r := rs[i+1]; r.Outcome != store.OutcomeStale || r.EventIdentity != items[i+1].Ingest.EventIdentity {
			t.Errorf("batch, %s: %+v, want stale", c.name, r)
		}
	}
	if last := rs[len(rs)-1]; last.Outcome != store.OutcomeAccepted || last.Cursor != 3 {
		t.Fatalf("batch last item: %+v", last)
	}
	want := before
	want[0], want[1], want[2], want[3] = want[0]+2, want[1]+2, want[2]+2, 3
	if after := f.tableCounts(); after != want {
		t.Fatalf("batch wrote %v, want %v (stale items write nothing)", after, want)
	}
}
