package server

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"database/sql"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"
)

// TestCachedKeyReplaced: the single route caches active keys, so a key id
// that is pruned and added again with another public key must not leave the
// old one in use. An envelope signed with the new key is accepted (the cached
// key fails to verify it, and a fresh lookup decides); one signed with the
// old key is bad_signature, though the cache once held it.
func TestCachedKeyReplaced(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	wantAnswer(t, f.post(f.device, f.sign(draft(1))), 200, "accepted", "", 1) // caches the key

	db, err := sql.Open("pgx", f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// What `envctl key prune` does once the replay window has passed.
	if _, err := db.ExecContext(ctx, `DELETE FROM producer_keys WHERE tenant_id = $1 AND key_id = $2`, tenantA, keyA); err != nil {
		t.Fatal(err)
	}
	wantAnswer(t, f.post(f.device, f.sign(draft(2))), 403, "refused", "unknown_key", -1)

	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.st.Credentials().AddKey(ctx, tenantA, keyA, pub); err != nil {
		t.Fatal(err)
	}
	old := f.sign(draft(2))
	wantAnswer(t, f.post(f.device, signWith(t, priv, draft(2))), 200, "accepted", "", 2)
	wantAnswer(t, f.post(f.device, old), 403, "refused", "bad_signature", -1)
	wantAnswer(t, f.post(f.device, signWith(t, priv, draft(3))), 200, "accepted", "", 3)
}

// TestCachedKeyRevokedBetweenRequests: with the key cached, a revocation
// committed between two requests refuses the second at once (the store
// re-checks the key inside the ingest transaction), and leaves exact
// duplicates answered duplicate.
func TestCachedKeyRevokedBetweenRequests(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for seq := int64(1); seq <= 3; seq++ {
		wantAnswer(t, f.post(f.device, f.sign(draft(seq))), 200, "accepted", "", seq)
	}
	if err := f.st.Credentials().RevokeKey(ctx, tenantA, keyA); err != nil {
		t.Fatal(err)
	}
	wantAnswer(t, f.post(f.device, f.sign(draft(4))), 403, "refused", "key_revoked", -1)
	wantAnswer(t, f.post(f.device, f.sign(draft(3))), 200, "duplicate", "", 3)
	if _, ok := f.srv.activeKeys.get(tenantA, keyA); ok {
		t.Fatal("a revoked key is still cached as active")
	}
	st, err := f.st.Inbound().Stream(ctx, tenantA, projectA, deviceA)
	if err != nil || st.Cursor != 3 {
		t.Fatalf("stream after revocation: %+v, %v", st, err)
	}
}
