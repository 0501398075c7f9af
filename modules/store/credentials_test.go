package store_test

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

func TestCredentialLifecycle(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	token, id, err := f.s.Credentials().IssueCredential(ctx, "t1", "a1", "d1", store.RoleDevice)
	if err != nil {
		t.Fatal(err)
	}
	secret, ok := strings.CutPrefix(token, store.TokenPrefix)
	if !ok {
		t.Fatalf("token %q lacks the prefix", token)
	}
	if raw, err := base64.RawURLEncoding.DecodeString(secret); err != nil || len(raw) != 32 {
		t.Fatalf("token body is not base64url of 32 bytes: %v", err)
	}
	if n := f.count(`SELECT count(*) FROM credentials WHERE token_digest = sha256(convert_to($1, 'UTF8'))`, token); n != 1 {
		t.Fatal("the stored digest is not SHA-256 of the token")
	}
	if n := f.count(`SELECT count(*) FROM credentials c WHERE strpos(c::text, $1) > 0 OR strpos(c::text, $2) > 0`, token, secret); n != 0 {
		t.Fatal("the token itself is stored")
	}
	got, err := f.s.Credentials().VerifyCredential(ctx, token)
	want := store.Identity{TenantID: "t1", AccountID: "a1", DeviceID: "d1", Role: store.RoleDevice, CredentialID: id}
	if err != nil || got != want {
		t.Fatalf("Verify = %+v, %v; want %+v", got, err, want)
	}

	other, _, err := f.s.Credentials().IssueCredential(ctx, "t1", "a1", "d1", store.RoleService)
	if err != nil || other == token {
		t.Fatalf("second token %v (same as first: %v)", err, other == token)
	}

	unknown := []string{
		"", "Bearer " + token, token + "x", token[:len(token)-1], strings.ToUpper(token),
		store.TokenPrefix + strings.Repeat("A", 43), "xyz_" + secret,
	}
	for _, tok := range unknown {
		if _, err := f.s.Credentials().VerifyCredential(ctx, tok); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Verify(%q) = %v, want ErrNotFound", tok, err)
		}
	}

	if err := f.s.Credentials().RevokeCredential(ctx, "t1", id); err != nil {
		t.Fatal(err)
	}
	if err := f.s.Credentials().RevokeCredential(ctx, "t1", id); err != nil {
		t.Fatalf("revoking twice: %v", err)
	}
	if _, err := f.s.Credentials().VerifyCredential(ctx, token); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("revoked token verifies: %v", err)
	}
	if _, err := f.s.Credentials().VerifyCredential(ctx, other); err != nil {
		t.Fatalf("revocation touched another credential: %v", err)
	}
	if err := f.s.Credentials().RevokeCredential(ctx, "t2", id); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("revoke in another tenant: %v", err)
	}
	if err := f.s.Credentials().RevokeCredential(ctx, "t1", "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("revoke unknown: %v", err)
	}
}

func TestIssueCredentialRefusesBadInput(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	cases := []struct {
		tenant, account, device string
		role                    store.Role
	}{
		{"", "a", "d", store.RoleDevice},
		{"t", "a b", "d", store.RoleDevice},
		{"t", "a", strings.Repeat("d", 65), store.RoleDevice},
		{"t", "a", "d", "admin"},
		{"t", "a", "d", ""},
	}
	for _, c := range cases {
		if _, _, err := f.s.Credentials().IssueCredential(ctx, c.tenant, c.account, c.device, c.role); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", c, err)
		}
	}
	if err := f.s.Credentials().RevokeCredential(ctx, "", "x"); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("revoke without tenant: %v", err)
	}
	if n := f.count(`SELECT count(*) FROM credentials`); n != 0 {
		t.Fatalf("%d credentials written", n)
	}
}
