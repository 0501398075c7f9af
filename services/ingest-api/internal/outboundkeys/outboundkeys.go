// Package outboundkeys owns where ingest-api gets the private Ed25519 keys
// it signs outbound (outbox) envelopes with: the Source interface, and File,
// which reads OUTBOUND_SIGNING_KEYS_FILE and follows its changes so a key can
// be rotated without a restart. Private keys live only in this process's
// memory; they never reach the database, a log line, a metric or an error.
//
// The file is a JSON object of tenants:
//
//	{"<tenant>":{"key_id":"<identity>","seed":"<base64url of 32 bytes>",
//	             "previous":[{"key_id":"<identity>","public_key":"<base64url of 32 bytes>"}]}}
//
// previous is optional (files without it keep their meaning): the PUBLIC
// halves of the tenant's earlier keys, which receivers must still accept
// because messages in retry keep the signature they were enqueued with
// (contract §8.10). Only public keys are listed: an earlier private key has
// no business staying on the signing host. GET /v1/outbound-keys serves the
// current key and these (PublicKeys).
//
// It is read strictly: duplicate or unknown members, a tenant or key id that
// is not a contract identity, a seed that is not base64url (with or
// without padding) of exactly 32 bytes, a previous key that is not a valid
// Ed25519 public key (envelope.ParsePublicKey), more than MaxPreviousKeys
// of them, or a key id named twice in a tenant refuse the whole file. At start that
// is an error; on a later reload the previous good set stays in force and
// the problem is reported (tenant and rule only, never the seed).
//
// A key-management service can implement Source instead of File.
package outboundkeys

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
)

// ErrNoKey is the answer for a tenant without an outbound key (HTTP 422
// no_signing_key). Any other error from a Source is a failing dependency.
var ErrNoKey = errors.New("outboundkeys: no signing key for the tenant")

// ErrInvalid reports a keys file that cannot be used. Its messages name the
// tenant (when it is a valid identity) and the rule, never key material.
var ErrInvalid = errors.New("outboundkeys: invalid keys file")

// Source resolves a tenant's current outbound signing key.
type Source interface {
	Key(ctx context.Context, tenant string) (keyID string, priv ed25519.PrivateKey, err error)
}

// PublicKey is one outbound public key of a tenant, as receivers fetch it.
type PublicKey struct {
	KeyID   string
	Key     ed25519.PublicKey
	Current bool
}

// Publisher is a Source that also knows a tenant's earlier public keys.
// It is separate from Source so that existing Sources keep compiling; for
// one that is not a Publisher, PublicKeys serves the current key only.
type Publisher interface {
	PublicKeys(ctx context.Context, tenant string) ([]PublicKey, error)
}

// PublicKeys lists the tenant's outbound public keys, the current one
// first; a tenant without keys has none (and no error).
func PublicKeys(ctx context.Context, src Source, tenant string) ([]PublicKey, error) {
	if p, ok := src.(Publisher); ok {
		return p.PublicKeys(ctx, tenant)
	}
	id, priv, err := src.Key(ctx, tenant)
	if errors.Is(err, ErrNoKey) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return []PublicKey{{KeyID: id, Key: priv.Public().(ed25519.PublicKey), Current: true}}, nil
}

// None is a Source without keys: every tenant is ErrNoKey. It stands for an
// unset OUTBOUND_SIGNING_KEYS_FILE, which the contract allows.
type None struct{}

// Key implements Source.
func (None) Key(context.Context, string) (string, ed25519.PrivateKey, error) {
	return "", nil, ErrNoKey
}

// PublicKeys implements Publisher: no keys.
func (None) PublicKeys(context.Context, string) ([]PublicKey, error) { return nil, nil }

// MaxFileBytes bounds the keys file; a file this large is a mistake, not a
// key set.
const MaxFileBytes = 1 << 20

// MaxPreviousKeys bounds a tenant's earlier keys: enough for rotations
// within any retry horizon, few enough that a receiver's key list stays
// small.
const MaxPreviousKeys = 16

type key struct {
	id       string
	priv     ed25519.PrivateKey
	previous []PublicKey
}

// Parse reads a keys file's content strictly (see the package doc).
func Parse(data []byte) (map[string]key, error) {
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrInvalid, MaxFileBytes)
	}
	// The envelope reader refuses duplicate members, invalid UTF-8 and lone
	// surrogates, which encoding/json would let through silently. Its error
	// detail may quote offsets but never content; it is still not echoed.
	if _, err := envelope.Canonicalize(data); err != nil {
		return nil, fmt.Errorf("%w: not well-formed JSON (or a member is repeated)", ErrInvalid)
	}
	var tenants map[string]json.RawMessage
	if err := json.Unmarshal(data, &tenants); err != nil || tenants == nil {
		return nil, fmt.Errorf("%w: not a JSON object of tenants", ErrInvalid)
	}
	out := make(map[string]key, len(tenants))
	for tenant, raw := range tenants {
		if !envelope.ValidIdentity(tenant) {
			return nil, fmt.Errorf("%w: a tenant name is not a valid identity", ErrInvalid)
		}
		bad := func(rule string) error { return fmt.Errorf("%w: tenant %q: %s", ErrInvalid, tenant, rule) }
		var members map[string]json.RawMessage
		if err := json.Unmarshal(raw, &members); err != nil || members == nil {
			return nil, bad(`want an object {"key_id":…,"seed":…}`)
		}
		for name := range members {
			// encoding/json matches struct fields case-insensitively, so
			// the member names are checked here, exactly.
			if name != "key_id" && name != "seed" && name != "previous" {
				return nil, bad("only key_id, seed and previous are allowed")
			}
		}
		keyID, ok := jsonString(members["key_id"])
		if !ok || !envelope.ValidIdentity(keyID) {
			return nil, bad("key_id must be a string matching the identity rule")
		}
		seedText, ok := jsonString(members["seed"])
		if !ok {
			return nil, bad("seed must be a string")
		}
		seed, ok := decodeSeed(seedText)
		if !ok {
			return nil, bad("seed must be base64url of exactly 32 bytes")
		}
		k := key{id: keyID, priv: ed25519.NewKeyFromSeed(seed)}
		clear(seed)
		if raw, present := members["previous"]; present {
			prev, err := parsePrevious(raw, keyID)
			if err != nil {
				return nil, bad(err.Error())
			}
			k.previous = prev
		}
		out[tenant] = k
	}
	return out, nil
}

// parsePrevious reads a tenant's previous member; its errors are rules,
// never key material.
func parsePrevious(raw json.RawMessage, current string) ([]PublicKey, error) {
	var items []json.RawMessage
	if len(raw) == 0 || raw[0] != '[' || json.Unmarshal(raw, &items) != nil {
		return nil, errors.New(`previous must be an array of {"key_id":…,"public_key":…}`)
	}
	if len(items) > MaxPreviousKeys {
		return nil, fmt.Errorf("previous lists more than %d keys", MaxPreviousKeys)
	}
	seen := map[string]bool{current: true}
	out := make([]PublicKey, 0, len(items))
	for _, item := range items {
		var members map[string]json.RawMessage
		if err := json.Unmarshal(item, &members); err != nil || members == nil {
			return nil, errors.New(`previous must be an array of {"key_id":…,"public_key":…}`)
		}
		for name := range members {
			if name != "key_id" && name != "public_key" {
				return nil, errors.New("a previous key has only key_id and public_key")
			}
		}
		id, ok := jsonString(members["key_id"])
		if !ok || !envelope.ValidIdentity(id) {
			return nil, errors.New("a previous key_id must be a string matching the identity rule")
		}
		if seen[id] {
			return nil, errors.New("a key_id is named twice")
		}
		seen[id] = true
		text, ok := jsonString(members["public_key"])
		if !ok {
			return nil, errors.New("a previous public_key must be a string")
		}
		pub, err := envelope.ParsePublicKey(text)
		if err != nil {
			return nil, errors.New("a previous public_key must be base64url of a valid 32-byte Ed25519 public key")
		}
		out = append(out, PublicKey{KeyID: id, Key: pub})
	}
	return out, nil
}

// jsonString decodes raw when it is a JSON string (not null, which
// encoding/json would accept as "nothing").
func jsonString(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false
	}
	return s, true
}

// decodeSeed accepts base64url with or without padding, strictly (no
// standard-alphabet characters, no stray bits).
func decodeSeed(s string) ([]byte, bool) {
	enc := base64.RawURLEncoding.Strict()
	if strings.HasSuffix(s, "=") {
		enc = base64.URLEncoding.Strict()
	}
	b, err := enc.DecodeString(s)
	if err != nil || len(b) != ed25519.SeedSize {
		return nil, false
	}
	return b, true
}

// File is a Source backed by a JSON keys file that Run re-reads, so keys can
// be added, rotated or removed without a restart. A change is noticed by the
// file's SHA-256, not its modification time, which coarse file systems and
// atomic renames make unreliable.
type File struct {
	path string

	mu     sync.RWMutex
	keys   map[string]key
	digest [32]byte
}

// OpenFile reads path and fails when it cannot be used.
func OpenFile(path string) (*File, error) {
	f := &File{path: path}
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	keys, err := Parse(data)
	if err != nil {
		return nil, err
	}
	f.keys, f.digest = keys, sha256.Sum256(data)
	return f, nil
}

func readFile(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("outboundkeys: %w", err)
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("outboundkeys: read %s: %w", path, err)
	}
	return data, nil
}

// Key implements Source.
func (f *File) Key(_ context.Context, tenant string) (string, ed25519.PrivateKey, error) {
	f.mu.RLock()
	k, ok := f.keys[tenant]
	f.mu.RUnlock()
	if !ok {
		return "", nil, ErrNoKey
	}
	return k.id, k.priv, nil
}

// PublicKeys implements Publisher: the current key, then the previous ones
// in file order.
func (f *File) PublicKeys(_ context.Context, tenant string) ([]PublicKey, error) {
	f.mu.RLock()
	k, ok := f.keys[tenant]
	f.mu.RUnlock()
	if !ok {
		return nil, nil
	}
	out := make([]PublicKey, 0, 1+len(k.previous))
	out = append(out, PublicKey{KeyID: k.id, Key: k.priv.Public().(ed25519.PublicKey), Current: true})
	return append(out, k.previous...), nil
}

// Reload re-reads the file. changed is true when a new key set took effect.
// An unreadable or invalid file leaves the current set in force and returns
// the error.
func (f *File) Reload() (changed bool, err error) {
	data, err := readFile(f.path)
	if err != nil {
		return false, err
	}
	d := sha256.Sum256(data)
	f.mu.RLock()
	same := d == f.digest
	f.mu.RUnlock()
	if same {
		return false, nil
	}
	keys, err := Parse(data)
	if err != nil {
		return false, err
	}
	f.mu.Lock()
	f.keys, f.digest = keys, d
	f.mu.Unlock()
	return true, nil
}

// Tenants returns how many tenants have a key, for the reload log line.
func (f *File) Tenants() int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return len(f.keys)
}

// Run reloads the file every interval until ctx ends, logging changes and
// problems (never key material). A problem is logged when it first appears
// and when it changes, not at every poll.
func (f *File) Run(ctx context.Context, interval time.Duration, log *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	lastErr := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		changed, err := f.Reload()
		if err != nil {
			if err.Error() != lastErr {
				lastErr = err.Error()
				log.Warn("outbound signing keys file not reloaded; the previous keys stay in force",
					slog.String("error", lastErr))
			}
			continue
		}
		lastErr = ""
		if changed {
			log.Info("outbound signing keys reloaded", slog.Int("tenants", f.Tenants()))
		}
	}
}
