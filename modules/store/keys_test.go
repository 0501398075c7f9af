package store_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

func newKey(t *testing.T) ed25519.PublicKey {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

func TestKeyLifecycle(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	pub := newKey(t)
	if err := f.s.Credentials().AddKey(ctx, "t1", "k1", pub); err != nil {
		t.Fatal(err)
	}
	if err := f.s.Credentials().AddKey(ctx, "t1", "k1", newKey(t)); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("existing key id: %v, want ErrConflict", err)
	}
	if err := f.s.Credentials().AddKey(ctx, "t2", "k1", newKey(t)); err != nil {
		t.Fatalf("same key id in another tenant: %v", err)
	}
	k, err := f.s.Credentials().LookupKey(ctx, "t1", "k1")
	if err != nil || !k.PublicKey.Equal(pub) || k.State != store.KeyActive || k.CreatedAt.IsZero() || k.RetiredAt != nil || k.RevokedAt != nil {
		t.Fatalf("LookupKey = %+v, %v", k, err)
	}
	if _, err := f.s.Credentials().LookupKey(ctx, "t3", "k1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("other tenant: %v", err)
	}
	if _, err := f.s.Credentials().LookupKey(ctx, "t1", "bad id!"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("malformed id: %v", err)
	}

	if err := f.s.Credentials().RetireKey(ctx, "t1", "k1"); err != nil {
		t.Fatal(err)
	}
	k, _ = f.s.Credentials().LookupKey(ctx, "t1", "k1")
	if k.State != store.KeyRetired || k.RetiredAt == nil {
		t.Fatalf("after retire: %+v", k)
	}
	retiredAt := *k.RetiredAt
	if err := f.s.Credentials().RetireKey(ctx, "t1", "k1"); err != nil {
		t.Fatalf("retire twice: %v", err)
	}
	if k, _ = f.s.Credentials().LookupKey(ctx, "t1", "k1"); !k.RetiredAt.Equal(retiredAt) {
		t.Fatalf("retiring again moved the retirement time: %v -> %v", retiredAt, k.RetiredAt)
	}
	if err := f.s.Credentials().RevokeKey(ctx, "t1", "k1"); err != nil {
		t.Fatal(err)
	}
	if err := f.s.Credentials().RevokeKey(ctx, "t1", "k1"); err != nil {
		t.Fatalf("revoke twice: %v", err)
	}
	k, _ = f.s.Credentials().LookupKey(ctx, "t1", "k1")
	if k.State != store.KeyRevoked || k.RevokedAt == nil || k.RetiredAt == nil {
		t.Fatalf("after revoke: %+v", k)
	}
	if err := f.s.Credentials().RetireKey(ctx, "t1", "k1"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("retiring a revoked key: %v, want ErrConflict", err)
	}
	for name, err := range map[string]error{
		"retire unknown": f.s.Credentials().RetireKey(ctx, "t1", "nope"),
		"revoke unknown": f.s.Credentials().RevokeKey(ctx, "t1", "nope"),
	} {
		if !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: %v, want ErrNotFound", name, err)
		}
	}
}

func TestAddKeyRefusesWeakKeys(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	identity := make([]byte, 32)
	identity[0] = 1 // the neutral element: small order
	nonCanonical := make([]byte, 32)
	for i := range nonCanonical {
		nonCanonical[i] = 0xff
	}
	nonCanonical[31] = 0x7f // y = 2^255 - 1 >= p
	cases := map[string][]byte{
		"empty":         nil,
		"short":         make([]byte, 31),
		"long":          make([]byte, 33),
		"small order":   identity,
		"non-canonical": nonCanonical,
	}
	for name, k := range cases {
		if err := f.s.Credentials().AddKey(ctx, "t1", "k-"+name[:3], k); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	for _, id := range []string{"", "-k", "k/1"} {
		if err := f.s.Credentials().AddKey(ctx, "t1", id, newKey(t)); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("key id %q: %v, want ErrInvalid", id, err)
		}
	}
	if n := f.count(`SELECT count(*) FROM producer_keys`); n != 0 {
		t.Fatalf("%d keys stored", n)
	}
}

func TestPruneKeys(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	window := 90 * 24 * time.Hour
	for _, id := range []string{"active", "unused", "old", "recent", "revoked-old"} {
		if err := f.s.Credentials().AddKey(ctx, "t1", id, newKey(t)); err != nil {
			t.Fatal(err)
		}
	}
	sign := func(keyID, eventID string, seq int64, issued time.Time) store.IngestInput {
		in := ev(eventID, seq).input()
		in.KeyID, in.IssuedAt = keyID, issued
		mustIngest(t, f.s, actor("t1", "d1"), in)
		return in
	}
	old := time.Now().Add(-window - time.Hour)
	sign("active", "e1", 1, old)
	sign("old", "e2", 2, old)
	sign("recent", "e3", 3, old)
	recent := sign("recent", "e4", 4, time.Now().Add(-time.Hour))
	sign("revoked-old", "e5", 5, old)
	for _, id := range []string{"unused", "old", "recent"} {
		if err := f.s.Credentials().RetireKey(ctx, "t1", id); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.s.Credentials().RevokeKey(ctx, "t1", "revoked-old"); err != nil {
		t.Fatal(err)
	}
	n, err := f.s.Credentials().PruneKeys(ctx, window)
	if err != nil || n != 3 {
		t.Fatalf("PruneKeys = %d, %v; want 3 (unused, old, revoked-old)", n, err)
	}
	for id, want := range map[string]bool{"active": true, "unused": false, "old": false, "recent": true, "revoked-old": false} {
		_, err := f.s.Credentials().LookupKey(ctx, "t1", id)
		if (err == nil) != want {
			t.Errorf("key %s kept = %v, want %v", id, err == nil, want)
		}
	}
	if n := f.count(`SELECT count(*) FROM event_identities`); n != 5 {
		t.Fatalf("pruning touched identities: %d left", n)
	}
	if _, err := f.s.Credentials().PruneKeys(ctx, 0); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("zero window: %v", err)
	}
	ok, err := f.s.Credentials().SignedBy(ctx, "t1", recent.EventIdentity, recent.ContentDigest, "recent")
	if err != nil || !ok {
		t.Fatalf("SignedBy = %v, %v", ok, err)
	}
}

func TestSignedBy(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	in := ev("e1", 1).input()
	mustIngest(t, f.s, actor("t1", "d1"), in)
	other := ev("e1", 1)
	other.content = "changed"
	cases := []struct {
		name                    string
		tenant, identity, keyID string
		digest                  [32]byte
		want                    bool
	}{
		{"exact", "t1", in.EventIdentity, "k1", in.ContentDigest, true},
		{"other key", "t1", in.EventIdentity, "k2", in.ContentDigest, false},
		{"other content", "t1", in.EventIdentity, "k1", other.input().ContentDigest, false},
		{"other tenant", "t2", in.EventIdentity, "k1", in.ContentDigest, false},
		{"unknown event", "t1", ev("e2", 2).identity(), "k1", in.ContentDigest, false},
	}
	for _, c := range cases {
		got, err := f.s.Credentials().SignedBy(ctx, c.tenant, c.identity, c.digest, c.keyID)
		if err != nil || got != c.want {
			t.Errorf("%s: %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	if _, err := f.s.Credentials().SignedBy(ctx, "t1", "not-hex", in.ContentDigest, "k1"); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("bad identity: %v", err)
	}
}
