package envelope

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"testing"
	"time"
)

func TestSignerSignsUnderItsKeyID(t *testing.T) {
	priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{3}, 32))
	s, err := NewSigner("k-1", priv)
	if err != nil {
		t.Fatal(err)
	}
	priv[0] ^= 1 // the signer keeps its own copy
	d := Draft{
		TenantID: "t", ProjectID: "p", ProducerID: "d", EventID: "e", IdempotencyKey: "i", KeyID: "ignored",
		Sequence: 1, IssuedAt: time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC),
		Metadata: Metadata{Kind: "k"}, Payload: []byte(`{}`),
	}
	e, err := s.Sign(d)
	if err != nil {
		t.Fatal(err)
	}
	if e.KeyID != "k-1" || s.KeyID() != "k-1" {
		t.Fatalf("key id %q", e.KeyID)
	}
	if err := e.Verify(s.PublicKey()); err != nil {
		t.Fatal(err)
	}
}

func TestNewSignerRefusesBadKeysAndIDs(t *testing.T) {
	good := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{3}, 32))
	if _, err := NewSigner("-bad", good); err == nil {
		t.Error("bad key id accepted")
	}
	if _, err := NewSigner("k", good[:10]); !errors.Is(err, ErrInvalidPrivateKey) {
		t.Errorf("short key: %v", err)
	}
	mismatched := append(ed25519.PrivateKey(nil), good...)
	mismatched[40] ^= 1
	if _, err := NewSigner("k", mismatched); !errors.Is(err, ErrInvalidPrivateKey) {
		t.Errorf("mismatched halves: %v", err)
	}
}
