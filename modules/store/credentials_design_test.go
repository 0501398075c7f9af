package store_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// compareLog records every comparison VerifyCredential makes through the
// store's digest comparison, and may override its result.
type compareLog struct {
	mu       sync.Mutex
	stored   [][]byte
	digests  [][]byte
	override *int
}

func (l *compareLog) compare(stored, digest []byte) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stored = append(l.stored, bytes.Clone(stored))
	l.digests = append(l.digests, bytes.Clone(digest))
	if l.override != nil {
		return *l.override
	}
	return subtle.ConstantTimeCompare(stored, digest)
}

func (l *compareLog) reset() (calls int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	calls = len(l.stored)
	l.stored, l.digests = nil, nil
	return calls
}

// The credential decision's timing can leak nothing about a token because
// (1) the database is asked only for the row of the token's SHA-256 digest,
// so an index walk that stops early tells at most how much of a guess's
// digest matches, which says nothing about any token, and (2) the row found
// is accepted only by a constant-time comparison of the whole digest.
// These tests fail when either stops being true: a token accepted without
// the comparison (an == or bytes.Equal shortcut), a comparison of anything
// but full 32-byte digests, or a near-miss token that costs any other work
// than a random one (a lookup by token text or prefix finds rows for near
// misses and compares them). Not parallel: it replaces a package variable.
func TestCredentialDecisionIsOneConstantTimeDigestComparison(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	live, id, err := f.s.Credentials().IssueCredential(ctx, "t1", "a1", "d1", store.RoleDevice)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"d2", "d3", "d4"} {
		if _, _, err := f.s.Credentials().IssueCredential(ctx, "t1", "a1", d, store.RoleDevice); err != nil {
			t.Fatal(err)
		}
	}
	var log compareLog
	defer store.SetDigestsEqual(log.compare)()

	// A live token: one comparison, of its full digest with the stored one.
	if got, err := f.s.Credentials().VerifyCredential(ctx, live); err != nil || got.CredentialID != id {
		t.Fatalf("live token: %+v, %v", got, err)
	}
	want := sha256.Sum256([]byte(live))
	if n := len(log.stored); n != 1 || !bytes.Equal(log.digests[0], want[:]) || !bytes.Equal(log.stored[0], want[:]) {
		t.Fatalf("live token: %d comparisons (%x vs %x); want one of its SHA-256 digest with the stored digest", n, log.stored, log.digests)
	}
	log.reset()

	// The comparison alone decides: refused by it, the live token fails.
	zero := 0
	log.override = &zero
	if _, err := f.s.Credentials().VerifyCredential(ctx, live); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a token the constant-time comparison refused still verified: %v", err)
	}
	log.override = nil
	log.reset()

	// Near misses (all but the last character of the live token) cost
	// exactly what random tokens cost: no row, no comparison.
	others := strings.ReplaceAll("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", live[len(live)-1:], "")
	for i := 0; i < len(others); i++ {
		near := live[:len(live)-1] + others[i:i+1]
		if _, err := f.s.Credentials().VerifyCredential(ctx, near); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("near miss %d: %v", i, err)
		}
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		if _, err := f.s.Credentials().VerifyCredential(ctx, store.TokenPrefix+base64.RawURLEncoding.EncodeToString(b)); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("random token: %v", err)
		}
	}
	if n := log.reset(); n != 0 {
		t.Fatalf("wrong tokens made %d comparisons; a near miss must find no row, as a random token does", n)
	}
}

// A token of the wrong form is refused before any database work, so it
// cannot be told from an unknown one by a database error either.
func TestMalformedTokenNeedsNoDatabase(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	live, _, err := f.s.Credentials().IssueCredential(ctx, "t1", "a1", "d1", store.RoleDevice)
	if err != nil {
		t.Fatal(err)
	}
	dead, err := store.Open(ctx, f.dsn, store.Options{MaxOpenConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := dead.Close(); err != nil {
		t.Fatal(err)
	}
	for _, tok := range []string{"", live[:len(live)-1], live + "A", "xyz_" + live[len(store.TokenPrefix):]} {
		if _, err := dead.Credentials().VerifyCredential(ctx, tok); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("malformed %q on a closed pool: %v, want ErrNotFound", tok, err)
		}
	}
	// A well-formed token does reach the database: a closed pool is
	// unavailable, never a refusal.
	if _, err := dead.Credentials().VerifyCredential(ctx, live); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("well-formed token on a closed pool: %v, want ErrUnavailable", err)
	}
}
