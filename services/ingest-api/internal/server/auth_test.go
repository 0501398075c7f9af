package server

import (
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

func TestBearerToken(t *testing.T) {
	long := "ewk_" + string(make([]byte, maxTokenLen))
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"Bearer abc", "abc", true},
		{"bearer abc", "abc", true},
		{"BEARER  abc ", "abc", true},
		{"Bearer", "", false},
		{"Bearer ", "", false},
		{"Basic abc", "", false},
		{"Bearerabc", "", false},
		{"Bearer a b", "", false},
		{"", "", false},
		{"Bearer " + long, "", false},
	} {
		got, ok := bearerToken(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("bearerToken(%.20q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestCredentialCacheExpires(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newCredentialCache(2*time.Second, func() time.Time { return now })
	k := sha256.Sum256([]byte("tok"))
	id := store.Identity{TenantID: "t", DeviceID: "d", Role: store.RoleDevice}
	c.put(k, id)
	now = now.Add(1999 * time.Millisecond)
	if got, ok := c.get(k); !ok || got != id {
		t.Fatal("entry gone before its TTL")
	}
	now = now.Add(time.Millisecond)
	if _, ok := c.get(k); ok {
		t.Fatal("entry served at its TTL")
	}
	off := newCredentialCache(0, time.Now)
	off.put(k, id)
	if _, ok := off.get(k); ok {
		t.Fatal("disabled cache served an entry")
	}
}

// TestRevokedCredential: without a cache, revocation takes effect at once.
func TestRevokedCredential(t *testing.T) {
	f := newFixture(t)
	tok, id, err := f.st.Credentials().IssueCredential(context.Background(), tenantA, "acct-1", deviceA, store.RoleDevice)
	if err != nil {
		t.Fatal(err)
	}
	wantAnswer(t, f.post(tok, f.sign(draft(1))), 200, "accepted", "", 1)
	if err := f.st.Credentials().RevokeCredential(context.Background(), tenantA, id); err != nil {
		t.Fatal(err)
	}
	wantAnswer(t, f.post(tok, f.sign(draft(1))), 401, "refused", "unauthenticated", -1)
	if n := len(f.audit()); n != 1 {
		t.Fatalf("%d audit rows; a 401 is never audited", n)
	}
}

func TestCommitterRefusesAfterClose(t *testing.T) {
	f := newFixture(t)
	c := newCommitter(f.st.Inbound(), slog.New(slog.NewTextHandler(io.Discard, nil)), newMetrics(NewRegistry(), &bodyBudget{}), time.Minute, 0, 10, 1)
	item := store.BatchItem{
		Actor:   store.Actor{TenantID: tenantA, AccountID: "acct-1", DeviceID: deviceA, CorrelationID: "c1"},
		Refusal: &store.AuditEntry{Outcome: string(outcomeRefused), Reason: string(reasonForbidden)},
	}
	if r, err := c.submit(context.Background(), item); err != nil || r.Outcome != store.OutcomeRefused {
		t.Fatalf("submit: %+v, %v", r, err)
	}
	c.close()
	c.close()
	if _, err := c.submit(context.Background(), item); !errors.Is(err, errCommitterClosed) {
		t.Fatalf("submit after close: %v", err)
	}
	// An invalid item fails alone; its neighbours in the same group commit.
	c2 := newCommitter(f.st.Inbound(), slog.New(slog.NewTextHandler(io.Discard, nil)), newMetrics(NewRegistry(), &bodyBudget{}), time.Minute, 50*time.Millisecond, 10, 1)
	defer c2.close()
	bad := item
	bad.Refusal = &store.AuditEntry{Outcome: string(outcomeRefused), Reason: "Not A Code"}
	errs := make(chan error, 3)
	for _, it := range []store.BatchItem{item, bad, item} {
		go func() {
			_, err := c2.submit(context.Background(), it)
			errs <- err
		}()
	}
	var failed int
	for range 3 {
		if err := <-errs; err != nil {
			if !errors.Is(err, store.ErrInvalid) {
				t.Fatalf("unexpected error %v", err)
			}
			failed++
		}
	}
	if failed != 1 {
		t.Fatalf("%d items failed, want exactly the invalid one", failed)
	}
	// The failed group handed on its turn to decide: the next request commits
	// (a leaked turn would hold it until the deadline).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r, err := c2.submit(ctx, item); err != nil || r.Outcome != store.OutcomeRefused {
		t.Fatalf("submit after a failed group: %+v, %v", r, err)
	}
}
