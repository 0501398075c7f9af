// Package secrets owns the webhook signing secrets of the delivery worker:
// it reads WEBHOOK_SECRETS_FILE ({"<secret_ref>":["whsec_…", …]}), refuses
// secrets it could not sign safely with, and keeps a current, atomically
// swapped set that a Watcher reloads when the file changes, so secrets
// rotate without a restart. Secrets are resolved at each attempt and never
// come from, or go to, the database, logs or metrics.
//
// Accepted forms (Standard Webhooks):
//
//   - whsec_<base64>: HMAC-SHA256 key (scheme v1), at least MinHMACKeyBytes
//     decoded bytes (the Standard Webhooks spec asks for 24 to 64);
//   - whsk_<base64>: Ed25519 private key (scheme v1a), the 32-byte seed or
//     the 64-byte seed‖public key form (whose public half must match).
//
// whpk_ (an Ed25519 public key) is what a receiver verifies with; a worker
// cannot sign with it, so the file refuses it with a message saying so.
// Base64 may be padded or not. A file that fails any rule is refused as a
// whole, with a message naming the ref and rule but never the secret; at
// start-up that stops the worker, on reload the previous set stays in force.
package secrets

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
)

// MinHMACKeyBytes is the shortest accepted decoded whsec_ key.
const MinHMACKeyBytes = 24

// MaxHMACKeyBytes bounds a decoded whsec_ key (Standard Webhooks: 64).
const MaxHMACKeyBytes = 64

// maxFileBytes bounds the secrets file read into memory.
const maxFileBytes = 1 << 20

// ErrInvalid reports an unusable secrets file; the message names the ref
// and the rule, never a secret.
var ErrInvalid = errors.New("secrets: invalid secrets file")

// Scheme is a Standard Webhooks signature scheme.
type Scheme string

const (
	// HMACSHA256 is scheme v1 (whsec_).
	HMACSHA256 Scheme = "v1"
	// Ed25519 is scheme v1a (whsk_).
	Ed25519 Scheme = "v1a"
)

// Secret is one signing secret. Its fields are unexported so that printing
// a Secret (or a Set) by mistake shows nothing secret.
type Secret struct {
	scheme  Scheme
	hmacKey []byte
	edKey   ed25519.PrivateKey
}

// Scheme is the secret's signature scheme.
func (s Secret) Scheme() Scheme { return s.scheme }

// HMACKey is the v1 key (nil for v1a secrets).
func (s Secret) HMACKey() []byte { return s.hmacKey }

// Ed25519Key is the v1a private key (nil for v1 secrets).
func (s Secret) Ed25519Key() ed25519.PrivateKey { return s.edKey }

// String hides the key material.
func (s Secret) String() string { return "secret(" + string(s.scheme) + ")" }

// GoString hides the key material from %#v.
func (s Secret) GoString() string { return s.String() }

// ParseSecret decodes one whsec_ or whsk_ secret.
func ParseSecret(text string) (Secret, error) {
	switch {
	case text == "":
		return Secret{}, errors.New("empty secret")
	case strings.HasPrefix(text, "whsec_"):
		key, err := decodeB64(strings.TrimPrefix(text, "whsec_"))
		if err != nil {
			return Secret{}, errors.New("whsec_ secret is not base64")
		}
		if len(key) < MinHMACKeyBytes {
			return Secret{}, fmt.Errorf("whsec_ secret shorter than %d bytes", MinHMACKeyBytes)
		}
		if len(key) > MaxHMACKeyBytes {
			return Secret{}, fmt.Errorf("whsec_ secret longer than %d bytes", MaxHMACKeyBytes)
		}
		return Secret{scheme: HMACSHA256, hmacKey: key}, nil
	case strings.HasPrefix(text, "whsk_"):
		raw, err := decodeB64(strings.TrimPrefix(text, "whsk_"))
		if err != nil {
			return Secret{}, errors.New("whsk_ secret is not base64")
		}
		switch len(raw) {
		case ed25519.SeedSize:
			return Secret{scheme: Ed25519, edKey: ed25519.NewKeyFromSeed(raw)}, nil
		case ed25519.PrivateKeySize:
			k := ed25519.NewKeyFromSeed(raw[:ed25519.SeedSize])
			if !bytes.Equal(k[ed25519.SeedSize:], raw[ed25519.SeedSize:]) {
				return Secret{}, errors.New("whsk_ secret: public half does not match the seed")
			}
			return Secret{scheme: Ed25519, edKey: k}, nil
		default:
			return Secret{}, errors.New("whsk_ secret must be a 32-byte seed or a 64-byte private key")
		}
	case strings.HasPrefix(text, "whpk_"):
		return Secret{}, errors.New("whpk_ is a public key for receivers; the worker signs with the matching whsk_ secret")
	default:
		return Secret{}, errors.New("secret must start with whsec_ or whsk_")
	}
}

// PublicKey formats the whpk_ public key of a v1a secret, the value given to
// receivers ("" for v1 secrets).
func (s Secret) PublicKey() string {
	if s.scheme != Ed25519 {
		return ""
	}
	return "whpk_" + base64.StdEncoding.EncodeToString(s.edKey.Public().(ed25519.PublicKey))
}

func decodeB64(s string) ([]byte, error) {
	return base64.RawStdEncoding.DecodeString(strings.TrimRight(s, "="))
}

// Set is an immutable map from secret ref to its current secrets, in file
// order.
type Set struct {
	refs map[string][]Secret
	sum  [32]byte
}

// Lookup returns the current secrets of ref (none: the ref is unknown).
func (s *Set) Lookup(ref string) []Secret {
	if s == nil {
		return nil
	}
	return s.refs[ref]
}

// Len is the number of refs.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.refs)
}

// Parse reads a secrets file's content.
func Parse(data []byte) (*Set, error) {
	var raw map[string][]string
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		// The decoder's text can quote file content, which is secret.
		return nil, fmt.Errorf("%w: not a JSON object of arrays of strings", ErrInvalid)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data after the JSON object", ErrInvalid)
	}
	if raw == nil {
		return nil, fmt.Errorf("%w: not a JSON object of arrays of strings", ErrInvalid)
	}
	set := &Set{refs: make(map[string][]Secret, len(raw)), sum: sha256.Sum256(data)}
	for ref, texts := range raw {
		if ref == "" {
			return nil, fmt.Errorf("%w: empty secret ref", ErrInvalid)
		}
		if len(texts) == 0 {
			return nil, fmt.Errorf("%w: ref %q has no secrets", ErrInvalid, ref)
		}
		for i, t := range texts {
			sec, err := ParseSecret(t)
			if err != nil {
				return nil, fmt.Errorf("%w: ref %q secret %d: %v", ErrInvalid, ref, i+1, err)
			}
			set.refs[ref] = append(set.refs[ref], sec)
		}
	}
	return set, nil
}

// Load reads and parses the file at path.
func Load(path string) (*Set, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(data)
}

func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("secrets: open: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("secrets: read: %w", err)
	}
	if len(data) > maxFileBytes {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrInvalid, maxFileBytes)
	}
	return data, nil
}

// Current holds the set in force; it is safe for concurrent use.
type Current struct{ p atomic.Pointer[Set] }

// NewCurrent starts with s.
func NewCurrent(s *Set) *Current {
	c := &Current{}
	c.p.Store(s)
	return c
}

// Get is the set in force.
func (c *Current) Get() *Set { return c.p.Load() }

// Lookup resolves ref in the set in force.
func (c *Current) Lookup(ref string) []Secret { return c.p.Load().Lookup(ref) }
