package store

import (
	"context"
	"crypto/ed25519"
	"database/sql"
	"errors"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/uptrace/bun"
)

// KeyState is the lifecycle of a producer key (contract §2, key state).
type KeyState string

const (
	KeyActive  KeyState = "active"
	KeyRetired KeyState = "retired"
	KeyRevoked KeyState = "revoked"
)

// Key is a producer's registered Ed25519 public key.
type Key struct {
	TenantID, KeyID string
	PublicKey       ed25519.PublicKey
	State           KeyState
	CreatedAt       time.Time
	RetiredAt       *time.Time
	RevokedAt       *time.Time
}

// AddKey registers an active key. A key that is not 32 bytes, not a canonical
// point encoding or of small order is ErrInvalid; an existing key id in the
// tenant (whatever its state) is ErrConflict.
func (s *Credentials) AddKey(ctx context.Context, tenant, keyID string, pub ed25519.PublicKey) error {
	const op = "add key"
	if !validIdentity(tenant, keyID) {
		return newErr(op, ErrInvalid)
	}
	if err := envelope.ValidatePublicKey(pub); err != nil {
		return newErr(op+": weak or malformed public key", ErrInvalid)
	}
	// The state and times are the table's defaults; a taken id inserts
	// nothing rather than failing, so the answer is ErrConflict, not a
	// unique violation.
	res, err := s.db.NewInsert().Model(&keyModel{TenantID: tenant, KeyID: keyID, PublicKey: []byte(pub)}).
		Column("tenant_id", "key_id", "public_key").On("CONFLICT (tenant_id, key_id) DO NOTHING").Exec(ctx)
	if err != nil {
		return classify(ctx, op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return classify(ctx, op, err)
	}
	if n == 0 {
		return newErr(op+": key id exists", ErrConflict)
	}
	return nil
}

// lookupKeySQL stays hand-written with bind parameters: LookupKey is ingest
// step 3 on a key-cache miss, and a bun query, formatted client-side, would
// be a new prepared statement (an extra round trip) for every key.
const lookupKeySQL = `
SELECT public_key, state, created_at, retired_at, revoked_at
FROM producer_keys WHERE tenant_id = $1 AND key_id = $2`

// LookupKey resolves a key id inside a tenant; ErrNotFound when unknown.
func (s *Credentials) LookupKey(ctx context.Context, tenant, keyID string) (Key, error) {
	const op = "lookup key"
	if !validIdentity(tenant, keyID) {
		// Not ErrInvalid: an id the contract would refuse cannot be registered,
		// so for a lookup it is simply unknown.
		return Key{}, newErr(op, ErrNotFound)
	}
	k := Key{TenantID: tenant, KeyID: keyID}
	var pub []byte
	var state string
	var retired, revoked sql.NullTime
	err := s.sqlDB().QueryRowContext(ctx, lookupKeySQL, tenant, keyID).
		Scan(&pub, &state, &k.CreatedAt, &retired, &revoked)
	if errors.Is(err, sql.ErrNoRows) {
		return Key{}, newErr(op, ErrNotFound)
	}
	if err != nil {
		return Key{}, classify(ctx, op, err)
	}
	k.PublicKey = ed25519.PublicKey(pub)
	k.State = KeyState(state)
	if retired.Valid {
		k.RetiredAt = &retired.Time
	}
	if revoked.Valid {
		k.RevokedAt = &revoked.Time
	}
	return k, nil
}

// RetireKey moves an active key to retired: it keeps verifying envelopes
// issued up to now. Retiring a retired key is a no-op; a revoked key is
// ErrConflict (revocation is final); an unknown key is ErrNotFound.
func (s *Credentials) RetireKey(ctx context.Context, tenant, keyID string) error {
	const op = "retire key"
	if !validIdentity(tenant, keyID) {
		return newErr(op, ErrInvalid)
	}
	// Retiring keeps the first retirement time (repeating is a no-op) and
	// cannot undo a revocation. One statement: cur locks the row and reads
	// the state before, upd changes it only when active, so the result row
	// tells the three cases apart in one trip.
	var before string
	err := s.db.NewSelect().
		With("cur", s.db.NewSelect().Model((*keyModel)(nil)).Column("state").
			Where("tenant_id = ?", tenant).Where("key_id = ?", keyID).For("UPDATE")).
		With("upd", s.db.NewUpdate().Model((*keyModel)(nil)).Set("state = ?", string(KeyRetired)).Set("retired_at = now()").
			Where("tenant_id = ?", tenant).Where("key_id = ?", keyID).Where("state = ?", string(KeyActive))).
		Table("cur").Column("state").Scan(ctx, &before)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return newErr(op, ErrNotFound)
	case err != nil:
		return classify(ctx, op, err)
	case before == string(KeyRevoked):
		return newErr(op+": key is revoked", ErrConflict)
	}
	return nil
}

// RevokeKey makes a key verify only exact duplicates of what it signed.
// Revoking twice is a no-op; an unknown key is ErrNotFound.
func (s *Credentials) RevokeKey(ctx context.Context, tenant, keyID string) error {
	const op = "revoke key"
	if !validIdentity(tenant, keyID) {
		return newErr(op, ErrInvalid)
	}
	res, err := s.db.NewUpdate().Model((*keyModel)(nil)).
		Set("state = ?", string(KeyRevoked)).Set("revoked_at = coalesce(revoked_at, now())").
		Where("tenant_id = ?", tenant).Where("key_id = ?", keyID).Exec(ctx)
	if err != nil {
		return classify(ctx, op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return classify(ctx, op, err)
	}
	if n == 0 {
		return newErr(op, ErrNotFound)
	}
	return nil
}

// PruneKeys deletes retired and revoked keys none of whose envelopes was
// issued within replayWindow of now (a key that signed nothing goes at once).
func (s *Credentials) PruneKeys(ctx context.Context, replayWindow time.Duration) (int, error) {
	const op = "prune keys"
	if replayWindow <= 0 {
		return 0, newErr(op, ErrInvalid)
	}
	// A key may go once nothing it signed is inside the replay window: after
	// that every envelope it signed is refused as expired at step 4, before
	// the key is ever looked up. No new identity can appear for a retired key
	// inside the window (only envelopes issued before retirement verify) or a
	// revoked one. event_identities is a hot table with no model: the
	// subquery is its one read here.
	res, err := s.db.NewDelete().Model((*keyModel)(nil)).ModelTableExpr("producer_keys AS k").
		Where("k.state IN (?)", bun.In([]string{string(KeyRetired), string(KeyRevoked)})).
		Where(`NOT EXISTS (SELECT FROM event_identities e
    WHERE e.tenant_id = k.tenant_id AND e.key_id = k.key_id
      AND e.issued_at >= now() - ?::bigint * interval '1 microsecond')`, replayWindow.Microseconds()).
		Exec(ctx)
	if err != nil {
		return 0, classify(ctx, op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, classify(ctx, op, err)
	}
	return int(n), nil
}

// signedBySQL looks the identity up by its key alone and compares the rest:
// with key_id among the conditions, event_identities_key_idx would tie with
// the primary key on a table not yet analyzed (migrations/0006). It stays
// hand-written SQL with bind parameters: it runs at ingest step 3 for every
// envelope of a revoked key, on the hot table, and its plan is checked.
const signedBySQL = `
SELECT coalesce((
    SELECT content_digest = $3 AND key_id = $4 FROM event_identities
    WHERE tenant_id = $1 AND event_identity = $2), false)`

// SignedBy reports whether the tenant holds exactly this envelope (identity
// and content digest) signed by keyID: the only thing a revoked key may still
// verify (step 3), so that the resend ends as a duplicate at step 5.
func (s *Credentials) SignedBy(ctx context.Context, tenant, eventIdentity string, contentDigest [32]byte, keyID string) (bool, error) {
	const op = "signed by"
	ev, ok := decodeEventIdentity(eventIdentity)
	if !ok || !validIdentity(tenant, keyID) {
		return false, newErr(op, ErrInvalid)
	}
	var yes bool
	if err := s.sqlDB().QueryRowContext(ctx, signedBySQL, tenant, ev, contentDigest[:], keyID).Scan(&yes); err != nil {
		return false, classify(ctx, op, err)
	}
	return yes, nil
}
