package envelope

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"
)

func vectorKey(t testing.TB) ed25519.PrivateKey {
	t.Helper()
	seed, err := hex.DecodeString("2883bf4b47b0e8c3d7c9b52f7584ab2ba8c8fc99c4cd65876417505575efd591")
	if err != nil {
		t.Fatal(err)
	}
	return ed25519.NewKeyFromSeed(seed)
}

func basicDraft() Draft {
	return Draft{
		TenantID: "tenant-a", ProjectID: "proj-1", ProducerID: "device-7", EventID: "evt-0001",
		IdempotencyKey: "idem-0001", KeyID: "k2026-11", Sequence: 1,
		IssuedAt: time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC),
		Metadata: Metadata{Kind: "task.status"},
		Payload:  []byte(`{ "state": "running", "progress": 0.50 }`),
	}
}

// Ed25519 is deterministic, so signing the "basic" vector's content must
// reproduce the vector's envelope byte for byte.
func TestSignReproducesVector(t *testing.T) {
	priv := vectorKey(t)
	e, err := Sign(basicDraft(), priv)
	if err != nil {
		t.Fatal(err)
	}
	vf := loadVectors(t)
	want, err := Canonicalize([]byte(vf.Vectors[0].Body))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(e.Canonical(), want) {
		t.Fatalf("\n got %s\nwant %s", e.Canonical(), want)
	}
	if err := e.Verify(priv.Public().(ed25519.PublicKey)); err != nil {
		t.Fatal(err)
	}
	// What Sign returns is what a receiver parses from the stored form.
	r, err := Parse(e.Canonical())
	if err != nil || !bytes.Equal(r.SigningInput(), e.SigningInput()) || !bytes.Equal(r.Signature, e.Signature) {
		t.Fatalf("round trip: %v", err)
	}
	if r.Verify(priv.Public().(ed25519.PublicKey)) != nil || r.Validate(vectorNow, 0) != nil {
		t.Fatal("round trip does not verify or validate")
	}
}

func TestSignOptionalMetadataAndEscapes(t *testing.T) {
	priv := vectorKey(t)
	d := basicDraft()
	d.Metadata = Metadata{Kind: "k", CorrelationID: "c:1", Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	d.IdempotencyKey = `q"b\s`
	d.IssuedAt = time.Date(2026, 11, 29, 21, 0, 0, 120000000, time.FixedZone("CET", 3600))
	e, err := Sign(d, priv)
	if err != nil {
		t.Fatal(err)
	}
	if e.Metadata != d.Metadata || e.IdempotencyKey != d.IdempotencyKey || !e.IssuedAt.Equal(d.IssuedAt) {
		t.Fatalf("got %+v", e)
	}
	if !strings.Contains(string(e.Canonical()), `"issued_at":"2026-11-29T20:00:00.12Z"`) {
		t.Fatalf("issued_at not UTC/minimal: %s", e.Canonical())
	}
	if err := e.Validate(vectorNow, 0); err != nil {
		t.Fatal(err)
	}
}

func TestSignRefusals(t *testing.T) {
	priv := vectorKey(t)
	mod := func(f func(*Draft)) Draft { d := basicDraft(); f(&d); return d }
	cases := []struct {
		name string
		d    Draft
	}{
		{"no issued_at", mod(func(d *Draft) { d.IssuedAt = time.Time{} })},
		{"no payload", mod(func(d *Draft) { d.Payload = nil })},
		{"payload not JSON", mod(func(d *Draft) { d.Payload = []byte(`{`) })},
		{"payload smuggles a member", mod(func(d *Draft) { d.Payload = []byte(`1,"x":2`) })},
		{"payload duplicate", mod(func(d *Draft) { d.Payload = []byte(`{"a":1,"a":2}`) })},
		{"bad tenant", mod(func(d *Draft) { d.TenantID = "a b" })},
		{"tenant with quote", mod(func(d *Draft) { d.TenantID = `a","x":"` })},
		{"invalid UTF-8", mod(func(d *Draft) { d.EventID = "e\xff" })},
		{"sequence 0", mod(func(d *Draft) { d.Sequence = 0 })},
		{"sequence 2^53", mod(func(d *Draft) { d.Sequence = 1 << 53 })},
		{"year 10000", mod(func(d *Draft) { d.IssuedAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) })},
		{"payload too deep", mod(func(d *Draft) { d.Payload = []byte(nestedArrays(64)) })},
	}
	for _, c := range cases {
		_, err := Sign(c.d, priv)
		if r, ok := ReasonOf(err); !ok || r != ReasonInvalidEnvelope {
			t.Errorf("%s: %v, want invalid_envelope", c.name, err)
		}
	}
	if _, err := Sign(basicDraft(), priv[:63]); !errors.Is(err, ErrInvalidPrivateKey) {
		t.Errorf("short key: %v", err)
	}
	mismatched := bytes.Clone(priv)
	mismatched[40] ^= 1
	if _, err := Sign(basicDraft(), mismatched); !errors.Is(err, ErrInvalidPrivateKey) {
		t.Errorf("mismatched key: %v", err)
	}
	// Step 4 is not Sign's business: a bad kind signs and fails Validate.
	e, err := Sign(mod(func(d *Draft) { d.Metadata.Kind = "" }), priv)
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := ReasonOf(e.Validate(vectorNow, 0)); r != ReasonInvalidMetadata {
		t.Fatalf("empty kind: %v", e.Validate(vectorNow, 0))
	}
}

func TestVerifyRefusals(t *testing.T) {
	priv := vectorKey(t)
	e, err := Sign(basicDraft(), priv)
	if err != nil {
		t.Fatal(err)
	}
	other := ed25519.NewKeyFromSeed(make([]byte, 32)).Public().(ed25519.PublicKey)
	if r, _ := ReasonOf(e.Verify(other)); r != ReasonBadSignature {
		t.Errorf("other key: %v", e.Verify(other))
	}
	for _, k := range []ed25519.PublicKey{nil, make([]byte, 31), make([]byte, 33)} {
		err := e.Verify(k)
		if !errors.Is(err, ErrInvalidPublicKey) {
			t.Errorf("key of %d bytes: %v", len(k), err)
		}
		if _, ok := ReasonOf(err); ok {
			t.Errorf("key of %d bytes reported as a contract reason", len(k))
		}
	}
	// A signature moved onto other content does not verify.
	d := basicDraft()
	d.Sequence = 2
	e2, _ := Sign(d, priv)
	e2.Signature = e.Signature
	if r, _ := ReasonOf(e2.Verify(priv.Public().(ed25519.PublicKey))); r != ReasonBadSignature {
		t.Error("swapped signature verified")
	}
}

func TestDerivedIdentities(t *testing.T) {
	// The contract's definitions written out with crypto/sha256 directly.
	sum := sha256.Sum256([]byte("tenant-a\nproj-1\nevt:1"))
	if got := EventIdentity("tenant-a", "proj-1", "evt:1"); got != hex.EncodeToString(sum[:]) {
		t.Fatalf("EventIdentity = %s", got)
	}
	if got := IdempotencyDigest("tenant-a", "proj-1", `k"1`); got != sha256.Sum256([]byte("tenant-a\nproj-1\nk\"1")) {
		t.Fatalf("IdempotencyDigest = %x", got)
	}
	e, err := Sign(basicDraft(), vectorKey(t))
	if err != nil {
		t.Fatal(err)
	}
	if e.ContentDigest() != sha256.Sum256(e.SigningInput()) ||
		e.EventIdentity() != EventIdentity(e.TenantID, e.ProjectID, e.EventID) ||
		e.IdempotencyDigest() != IdempotencyDigest(e.TenantID, e.ProjectID, e.IdempotencyKey) {
		t.Fatal("method and function disagree")
	}
}
