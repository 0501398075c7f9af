package store

import (
	"context"
	"crypto/ed25519"
	"database/sql"
	"errors"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
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

const insertKeySQL = `
INSERT INTO producer_keys (tenant_id, key_id, public_key) VALUES ($1, $2, $3)
ON CONFLICT (tenant_id, key_id) DO NOTHING`

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
	res, err := s.sqlDB().ExecContext(ctx, insertKeySQL, tenant, keyID, []byte(pub))
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

// Retiring keeps the first retirement time (repeating is a no-op) and cannot
// undo a revocation. The result row tells the three cases apart in one trip.
const retireKeySQL = `
WITH cur AS (
    SELECT state FROM producer_keys WHERE tenant_id = $1 AND key_id = $2 FOR UPDATE
), upd AS (
    UPDATE producer_keys SET state = 'retired', retired_at = now()
    WHERE tenant_id = $1 AND key_id = $2 AND state = 'active'
)
SELECT state FROM cur`

// RetireKey moves an active key to retired: it keeps verifying envelopes
// issued up to now. Retiring a retired key is a no-op; a revoked key is
// ErrConflict (revocation is final); an unknown key is ErrNotFound.
func (s *Credentials) RetireKey(ctx context.Context, tenant, keyID string) error {
	const op = "retire key"
	if !validIdentity(tenant, keyID) {
		return newErr(op, ErrInvalid)
	}
	var before string
	err := s.sqlDB().QueryRowContext(ctx, retireKeySQL, tenant, keyID).Scan(&before)
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

const revokeKeySQL = `
UPDATE producer_keys SET state = 'revoked', revoked_at = coalesce(revoked_at, now())
WHERE tenant_id = $1 AND key_id = $2`

// RevokeKey makes a key verify only exact duplicates of what it signed.
// Revoking twice is a no-op; an unknown key is ErrNotFound.
func (s *Credentials) RevokeKey(ctx context.Context, tenant, keyID string) error {
	const op = "revoke key"
	if !validIdentity(tenant, keyID) {
		return newErr(op, ErrInvalid)
	}
	res, err := s.sqlDB().ExecContext(ctx, revokeKeySQL, tenant, keyID)
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

// A key may go once nothing it signed is inside the replay window: after that
// every envelope it signed is refused as expired at step 4, before the key is
// ever looked up. No new identity can appear for a retired key inside the
// window (only envelopes issued before retirement verify) or a revoked one.
const pruneKeysSQL = `
DELETE FROM producer_keys k
WHERE k.state IN ('retired', 'revoked')
  AND NOT EXISTS (
    SELECT FROM event_identities e
    WHERE e.tenant_id = k.tenant_id AND e.key_id = k.key_id
      AND e.issued_at >= now() - $1::bigint * interval '1 microsecond')`

// PruneKeys deletes retired and revoked keys none of whose envelopes was
// issued within replayWindow of now (a key that signed nothing goes at once).
func (s *Credentials) PruneKeys(ctx context.Context, replayWindow time.Duration) (int, error) {
	const op = "prune keys"
	if replayWindow <= 0 {
		return 0, newErr(op, ErrInvalid)
	}
	res, err := s.sqlDB().ExecContext(ctx, pruneKeysSQL, replayWindow.Microseconds())
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
// the primary key on a table not yet analyzed (migrations/0006).
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
