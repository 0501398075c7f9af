package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"strings"
)

// Role is what a credential may do (contract §2, §4).
type Role string

const (
	RoleDevice   Role = "device"
	RoleService  Role = "service"
	RoleOperator Role = "operator"
)

// Valid reports whether r is one of the three roles.
func (r Role) Valid() bool { return r == RoleDevice || r == RoleService || r == RoleOperator }

// Identity is a verified credential.
type Identity struct {
	TenantID, AccountID, DeviceID string
	Role                          Role
	CredentialID                  string
}

// TokenPrefix marks envelopeworker credentials so secret scanners and people
// recognise a leaked one. The rest is 32 random bytes, base64url unpadded.
const TokenPrefix = "ewk_"

const tokenLen = len(TokenPrefix) + 43 // base64url of 32 bytes, unpadded

func tokenDigest(token string) [32]byte { return sha256.Sum256([]byte(token)) }

// digestsEqual decides every credential: a constant-time comparison of the
// full stored digest with the token's. It is a variable so that a test can
// replace it and see that no other comparison lets a token through.
var digestsEqual = subtle.ConstantTimeCompare

// IssueCredential creates a credential and returns its token, which is shown
// once: only its SHA-256 digest is stored.
func (s *Credentials) IssueCredential(ctx context.Context, tenant, account, device string, role Role) (token, id string, err error) {
	const op = "issue credential"
	if !validIdentity(tenant, account, device) || !role.Valid() {
		return "", "", newErr(op, ErrInvalid)
	}
	secret := make([]byte, 32)
	idBytes := make([]byte, 12)
	if _, err := rand.Read(secret); err != nil {
		return "", "", classify(ctx, op, err)
	}
	if _, err := rand.Read(idBytes); err != nil {
		return "", "", classify(ctx, op, err)
	}
	token = TokenPrefix + base64.RawURLEncoding.EncodeToString(secret)
	id = "cred_" + hex.EncodeToString(idBytes)
	d := tokenDigest(token)
	// The digest is not a field of credentialModel (no listing may read it),
	// so it is this insert's one extra value; status and times are defaults.
	_, err = s.db.NewInsert().Model(&credentialModel{TenantID: tenant, CredentialID: id, AccountID: account,
		DeviceID: device, Role: string(role)}).
		Column("tenant_id", "credential_id", "account_id", "device_id", "role").
		Value("token_digest", "?", d[:]).Exec(ctx)
	if err != nil {
		return "", "", classify(ctx, op, err)
	}
	return token, id, nil
}

// verifyCredentialSQL stays hand-written with a bind parameter: it runs on
// every request, where one cached prepared statement serves every token; bun
// would format each digest into the text, a new statement per token.
const verifyCredentialSQL = `
SELECT tenant_id, credential_id, token_digest, account_id, device_id, role
FROM credentials
WHERE token_digest = $1 AND status = 'active'`

// VerifyCredential resolves a bearer token. Unknown, malformed and revoked
// tokens are all ErrNotFound (the caller answers 401 without saying which);
// a database failure is ErrUnavailable, never ErrNotFound.
func (s *Credentials) VerifyCredential(ctx context.Context, token string) (Identity, error) {
	const op = "verify credential"
	if len(token) != tokenLen || !strings.HasPrefix(token, TokenPrefix) {
		return Identity{}, newErr(op, ErrNotFound)
	}
	d := tokenDigest(token)
	rows, err := s.sqlDB().QueryContext(ctx, verifyCredentialSQL, d[:])
	if err != nil {
		return Identity{}, classify(ctx, op, err)
	}
	defer rows.Close()
	var found *Identity
	for rows.Next() {
		var id Identity
		var stored []byte
		var role string
		if err := rows.Scan(&id.TenantID, &id.CredentialID, &stored, &id.AccountID, &id.DeviceID, &role); err != nil {
			return Identity{}, classify(ctx, op, err)
		}
		id.Role = Role(role)
		// The index narrowed the rows; the decision itself is a constant-time
		// comparison of the full digest.
		if digestsEqual(stored, d[:]) == 1 && found == nil {
			found = &id
		}
	}
	if err := rows.Err(); err != nil {
		return Identity{}, classify(ctx, op, err)
	}
	if found == nil {
		return Identity{}, newErr(op, ErrNotFound)
	}
	return *found, nil
}

// RevokeCredential stops a credential from verifying. Revoking twice is not an
// error; an unknown id is ErrNotFound.
func (s *Credentials) RevokeCredential(ctx context.Context, tenant, id string) error {
	const op = "revoke credential"
	if !validIdentity(tenant) || id == "" || len(id) > 64 {
		return newErr(op, ErrInvalid)
	}
	res, err := s.db.NewUpdate().Model((*credentialModel)(nil)).
		Set("status = ?", string(CredentialRevoked)).Set("revoked_at = coalesce(revoked_at, now())").
		Where("tenant_id = ?", tenant).Where("credential_id = ?", id).Exec(ctx)
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
