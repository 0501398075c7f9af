package server

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// errUnauthenticated is a credential that does not verify (401);
// errNoBearer, which wraps it, an Authorization header that is missing or
// not a Bearer credential at all.
var (
	errUnauthenticated = errors.New("unauthenticated")
	errNoBearer        = fmt.Errorf("%w: no bearer credential", errUnauthenticated)
)

// authDetail is the detail of a 401: whether the header was unusable or
// the credential is not live (unknown, revoked and expired alike, so the
// answer says nothing about which credentials exist).
func authDetail(err error) string {
	if errors.Is(err, errNoBearer) {
		return detailNoCredential
	}
	return detailBadCredential
}

// maxTokenLen bounds the bearer token we hash or send to the database.
const maxTokenLen = 512

// bearerToken extracts the token of "Authorization: Bearer <token>" (scheme
// case-insensitive, as RFC 9110 says). ok is false for a missing or
// malformed header, which is answered 401 without database work.
func bearerToken(h string) (string, bool) {
	const scheme = "bearer "
	if len(h) <= len(scheme) || !strings.EqualFold(h[:len(scheme)], scheme) {
		return "", false
	}
	tok := strings.TrimSpace(h[len(scheme):])
	if tok == "" || len(tok) > maxTokenLen || strings.ContainsAny(tok, " \t") {
		return "", false
	}
	return tok, true
}

// credentialCache remembers verified identities for at most ttl (<= 2s, see
// config), so a revoked credential stops working within ttl. It is keyed by
// SHA-256 of the token: the token itself is never kept. Failures are never
// cached, so a newly issued credential works at once.
type credentialCache = ttlCache[[32]byte, store.Identity]

// maxCachedCredentials bounds memory.
const maxCachedCredentials = 100_000

func newCredentialCache(ttl time.Duration, now func() time.Time) *credentialCache {
	return newTTLCache[[32]byte, store.Identity](ttl, maxCachedCredentials, now)
}

// authenticate turns the Authorization header into a verified identity:
// errUnauthenticated for anything that is not a live credential, any other
// error for a failing database (503, never 401).
func (s *Server) authenticate(ctx context.Context, header string) (store.Identity, error) {
	tok, ok := bearerToken(header)
	if !ok {
		return store.Identity{}, errNoBearer
	}
	k := sha256.Sum256([]byte(tok))
	if id, ok := s.creds.get(k); ok {
		return id, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
	defer cancel()
	id, err := s.store.credentials.VerifyCredential(ctx, tok)
	switch {
	case err == nil:
		s.creds.put(k, id)
		return id, nil
	case errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrInvalid):
		return store.Identity{}, errUnauthenticated
	default:
		return store.Identity{}, err
	}
}
