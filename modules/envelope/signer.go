package envelope

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
)

// Signer is one Ed25519 signing key and the key id it is registered under.
// It lets a producer sign drafts without handling a raw key or a signing
// input: the key id written into every envelope is the one that belongs to
// the key, so the two cannot drift apart.
type Signer struct {
	keyID string
	priv  ed25519.PrivateKey
}

// NewSigner checks keyID against the identity rule and priv as Sign does,
// so a misconfigured signer fails at start rather than at its first send.
func NewSigner(keyID string, priv ed25519.PrivateKey) (*Signer, error) {
	if !ValidIdentity(keyID) {
		return nil, errors.New("envelope: key id: " + ruleText["key_id"])
	}
	if len(priv) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("%w: want %d bytes, have %d", ErrInvalidPrivateKey, ed25519.PrivateKeySize, len(priv))
	}
	if !bytes.Equal(ed25519.NewKeyFromSeed(priv.Seed())[32:], priv[32:]) {
		return nil, fmt.Errorf("%w: public half does not match the seed", ErrInvalidPrivateKey)
	}
	// A copy, so a caller that zeroes or reuses its slice does not change
	// what this signer signs with.
	return &Signer{keyID: keyID, priv: append(ed25519.PrivateKey(nil), priv...)}, nil
}

// KeyID is the key id this signer writes into envelopes.
func (s *Signer) KeyID() string { return s.keyID }

// PublicKey is the key receivers verify with (the one to register).
func (s *Signer) PublicKey() ed25519.PublicKey {
	return append(ed25519.PublicKey(nil), s.priv[32:]...)
}

// Sign is Sign(d, key) with d.KeyID set to the signer's key id.
func (s *Signer) Sign(d Draft) (*Envelope, error) {
	d.KeyID = s.keyID
	return Sign(d, s.priv)
}
