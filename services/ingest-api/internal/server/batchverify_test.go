package server

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"testing"
)

// TestBatchSignaturesAsOneByOne: a batch's signatures are checked together
// (one batch equation over the active and retired keys' items), yet every
// item gets the answer the single route gives it, sent one by one against
// the same keys: good and bad signatures under an active and a retired key,
// an unknown key, and a revoked key's duplicate and new envelope.
func TestBatchSignaturesAsOneByOne(t *testing.T) {
	const retiredKey, revokedKey, absentKey = "k-retired", "k-revoked", "k-absent"
	seeds := func(b byte) ed25519.PrivateKey {
		return ed25519.NewKeyFromSeed(bytes.Repeat([]byte{b}, ed25519.SeedSize))
	}
	retiredPriv, revokedPriv, strangerPriv := seeds(1), seeds(2), seeds(3)
	withKey := func(seq int64, keyID string) func() []byte {
		return func() []byte {
			d := draft(seq)
			d.KeyID = keyID
			switch keyID {
			case retiredKey:
				return signWith(t, retiredPriv, d)
			case revokedKey:
				return signWith(t, revokedPriv, d)
			default:
				return signWith(t, strangerPriv, d)
			}
		}
	}
	setup := func() *fixture {
		f := newFixture(t)
		ctx := context.Background()
		for id, priv := range map[string]ed25519.PrivateKey{retiredKey: retiredPriv, revokedKey: revokedPriv} {
			if err := f.st.Credentials().AddKey(ctx, tenantA, id, priv.Public().(ed25519.PublicKey)); err != nil {
				t.Fatal(err)
			}
		}
		wantAnswer(t, f.post(f.device, withKey(1, revokedKey)()), 200, "accepted", "", 1)
		if err := f.st.Credentials().RetireKey(ctx, tenantA, retiredKey); err != nil {
			t.Fatal(err)
		}
		if err := f.st.Credentials().RevokeKey(ctx, tenantA, revokedKey); err != nil {
			t.Fatal(err)
		}
		return f
	}

	batchF, singleF := setup(), setup()
	tampered := bytes.Replace(batchF.sign(draft(3)), []byte(`"n":3`), []byte(`"n":4`), 1)
	wrongSigner := draft(5)
	items := [][]byte{
		batchF.sign(draft(2)),
		tampered,
		withKey(3, retiredKey)(),               // issued before the retirement
		signWith(t, strangerPriv, wrongSigner), // keyA named, another key signed
		func() []byte { d := draft(4); d.KeyID = retiredKey; return signWith(t, strangerPriv, d) }(),
		withKey(1, revokedKey)(), // exact duplicate under the revoked key
		withKey(4, revokedKey)(), // anything new under it
		withKey(4, absentKey)(),
		batchF.sign(draft(4)),
		batchF.sign(draft(2)), // duplicate within the batch
	}
	want := []itemWant{
		{200, "accepted", "", 2},
		{403, "refused", "bad_signature", 0},
		{200, "accepted", "", 3},
		{403, "refused", "bad_signature", 0},
		{403, "refused", "bad_signature", 0},
		{200, "duplicate", "", 3},
		{403, "refused", "key_revoked", 0},
		{403, "refused", "unknown_key", 0},
		{200, "accepted", "", 4},
		{200, "duplicate", "", 4},
	}
	checkItems(t, decodeBatch(t, batchF.postBatch(batchF.device, items...)), want)
	for i, body := range items {
		w := want[i]
		cursor := w.cursor
		if w.outcome == "refused" {
			cursor = -1
		}
		wantAnswer(t, singleF.post(singleF.device, body), w.status, w.outcome, w.reason, cursor)
	}
}
