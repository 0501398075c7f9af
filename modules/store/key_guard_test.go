package store_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// sqlStateKeyGuard is what migration 0005's producer_keys trigger raises.
const sqlStateKeyGuard = "EW001"

// The producer_keys trigger holds for every role, the schema owner
// included: a key's identity, public key and recorded times never change,
// and its state only moves forward (active -> retired -> revoked, active ->
// revoked). The forward moves still work, by SQL and through the store.
func TestProducerKeyGuard(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	operator := openRole(t, f.dsn, roleOperator)
	for _, k := range []string{"active", "retired", "revoked", "fwd"} {
		if err := f.s.Credentials().AddKey(ctx, "t1", k, newKey(t)); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.s.Credentials().RetireKey(ctx, "t1", "retired"); err != nil {
		t.Fatal(err)
	}
	if err := f.s.Credentials().RevokeKey(ctx, "t1", "revoked"); err != nil {
		t.Fatal(err)
	}

	refused := []struct{ key, set string }{
		{"active", `public_key = decode(repeat('ab', 32), 'hex')`},
		{"active", `key_id = 'renamed'`},
		{"active", `tenant_id = 't2'`},
		{"active", `created_at = now() - interval '1 day'`},
		{"retired", `state = 'active'`},
		{"retired", `state = 'active', retired_at = NULL`},
		{"retired", `retired_at = now() + interval '1 day'`},
		{"retired", `retired_at = NULL`},
		{"revoked", `state = 'active'`},
		{"revoked", `state = 'retired', retired_at = now()`},
		{"revoked", `revoked_at = now() + interval '1 day'`},
	}
	for _, r := range refused {
		q := `UPDATE producer_keys SET ` + r.set + ` WHERE tenant_id = 't1' AND key_id = '` + r.key + `'`
		for who, db := range map[string]*sql.DB{"owner": f.admin, "operator": operator} {
			_, err := db.ExecContext(ctx, q)
			var pg *pgconn.PgError
			if !errors.As(err, &pg) {
				t.Errorf("%s: %s: %v, want refused", who, q, err)
				continue
			}
			// The operator may not even name the other columns (42501); where
			// the grant lets it through, the trigger refuses.
			if pg.Code != sqlStateKeyGuard && !(who == "operator" && pg.Code == "42501") {
				t.Errorf("%s: %s: SQLSTATE %s (%s), want %s", who, q, pg.Code, pg.Message, sqlStateKeyGuard)
			}
			if who == "operator" && pg.Code == "42501" && (r.key != "active") {
				t.Errorf("operator: %s refused by a grant, want the trigger (the state columns are granted)", q)
			}
		}
	}
	if n := f.count(`SELECT count(*) FROM producer_keys WHERE tenant_id = 't1' AND state::text = key_id`); n != 3 {
		t.Fatalf("%d of 3 keys kept their state", n)
	}

	// Forward moves, as the operator role by SQL: active -> retired -> revoked.
	for _, q := range []string{
		`UPDATE producer_keys SET state = 'retired', retired_at = now() WHERE tenant_id = 't1' AND key_id = 'fwd'`,
		`UPDATE producer_keys SET state = 'revoked', revoked_at = now() WHERE tenant_id = 't1' AND key_id = 'fwd'`,
		`UPDATE producer_keys SET state = 'revoked' WHERE tenant_id = 't1' AND key_id = 'fwd'`,
	} {
		if _, err := operator.ExecContext(ctx, q); err != nil {
			t.Fatalf("operator: %s: %v", q, err)
		}
	}
	// And through the store: revoking twice, and a retire of a revoked key
	// (ErrConflict from the store, before the trigger).
	if err := f.s.Credentials().RevokeKey(ctx, "t1", "revoked"); err != nil {
		t.Fatalf("revoke twice: %v", err)
	}
	if err := f.s.Credentials().RevokeKey(ctx, "t1", "retired"); err != nil {
		t.Fatalf("revoke a retired key: %v", err)
	}
	if err := f.s.Credentials().RetireKey(ctx, "t1", "active"); err != nil {
		t.Fatalf("retire: %v", err)
	}
}
