package receiver

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
)

// ErrUnknownKey is a KeySource's answer for a key id it does not know.
var ErrUnknownKey = errors.New("receiver: unknown envelope key id")

// ErrKeysUnavailable is a KeySource's answer when it cannot say yet: the
// keys could not be fetched, or a refresh is not yet allowed. The delivery
// is answered 503 so that the sender retries it.
var ErrKeysUnavailable = errors.New("receiver: outbound keys unavailable")

// KeySource resolves the tenant's outbound public key that signed an
// envelope. It answers ErrUnknownKey or ErrKeysUnavailable (possibly
// wrapped) when it has no key.
type KeySource interface {
	PublicKey(ctx context.Context, keyID string) (ed25519.PublicKey, error)
}

// StaticKeys is a fixed KeySource: key id → public key, base64url as
// GET /v1/outbound-keys serves it.
func StaticKeys(keys map[string]string) (KeySource, error) {
	m := make(staticKeys, len(keys))
	for id, text := range keys {
		if !envelope.ValidIdentity(id) {
			return nil, fmt.Errorf("%w: a key id is not a valid identity", ErrSecret)
		}
		pub, err := envelope.ParsePublicKey(text)
		if err != nil {
			return nil, fmt.Errorf("%w: key %q: %w", ErrSecret, id, err)
		}
		m[id] = pub
	}
	return m, nil
}

type staticKeys map[string]ed25519.PublicKey

func (s staticKeys) PublicKey(_ context.Context, keyID string) (ed25519.PublicKey, error) {
	if pub, ok := s[keyID]; ok {
		return pub, nil
	}
	return nil, ErrUnknownKey
}

// OutboundKeysPath is the ingest API route that serves a tenant's outbound
// public keys (contract §8.10).
const OutboundKeysPath = "/v1/outbound-keys"

// OutboundKeys is the answer of GET /v1/outbound-keys.
type OutboundKeys struct {
	Keys []OutboundKey `json:"keys"`
}

// OutboundKey is one outbound public key of a tenant. Current is the key
// new envelopes are signed with; the others are earlier keys that messages
// still in retry were signed with.
type OutboundKey struct {
	KeyID     string `json:"key_id"`
	PublicKey string `json:"public_key"`
	Current   bool   `json:"current"`
}

// RefreshInterval is the least time between two fetches of the keys: an
// envelope under an unknown key id triggers at most one fetch a minute.
const RefreshInterval = time.Minute

// maxKeysBody bounds the keys answer read into memory.
const maxKeysBody = 1 << 20

// RemoteKeys is a KeySource that fetches GET /v1/outbound-keys with a
// service or operator credential and caches the answer. An unknown key id
// triggers a refresh at most once per RefreshInterval; until one is
// allowed, it answers ErrKeysUnavailable (the sender retries) rather than
// ErrUnknownKey (the sender gives up), so a freshly rotated key is never a
// dead letter.
type RemoteKeys struct {
	url, token string
	client     *http.Client
	now        func() time.Time

	mu   sync.RWMutex
	keys map[string]ed25519.PublicKey

	// fetchMu makes fetches one at a time: deliveries under a new key id
	// wait for the same fetch instead of each starting one, while
	// deliveries under known keys never wait for a fetch.
	fetchMu sync.Mutex
	fetched time.Time // last fetch attempt, under fetchMu; zero: never
}

// NewRemoteKeys returns a RemoteKeys for the API at baseURL. client may be
// nil (http.DefaultClient with a 10 s timeout per fetch).
func NewRemoteKeys(baseURL, token string, client *http.Client) *RemoteKeys {
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	return &RemoteKeys{
		url:    strings.TrimRight(baseURL, "/") + OutboundKeysPath,
		token:  token,
		client: client,
		now:    time.Now,
	}
}

// PublicKey implements KeySource.
func (r *RemoteKeys) PublicKey(ctx context.Context, keyID string) (ed25519.PublicKey, error) {
	if pub, ok := r.lookup(keyID); ok {
		return pub, nil
	}
	r.fetchMu.Lock()
	defer r.fetchMu.Unlock()
	// A fetch that finished while this one waited may have brought it.
	if pub, ok := r.lookup(keyID); ok {
		return pub, nil
	}
	if !r.fetched.IsZero() && r.now().Sub(r.fetched) < RefreshInterval {
		return nil, fmt.Errorf("%w: key id not yet known, refresh not yet allowed", ErrKeysUnavailable)
	}
	if err := r.refreshLocked(ctx); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKeysUnavailable, err)
	}
	if pub, ok := r.lookup(keyID); ok {
		return pub, nil
	}
	return nil, ErrUnknownKey
}

func (r *RemoteKeys) lookup(keyID string) (ed25519.PublicKey, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	pub, ok := r.keys[keyID]
	return pub, ok
}

// Refresh fetches the keys now, whatever the last fetch was; call it at
// start to fail early on a wrong URL or credential. A failed fetch keeps
// the keys already known.
func (r *RemoteKeys) Refresh(ctx context.Context) error {
	r.fetchMu.Lock()
	defer r.fetchMu.Unlock()
	return r.refreshLocked(ctx)
}

func (r *RemoteKeys) refreshLocked(ctx context.Context) error {
	r.fetched = r.now()
	keys, err := r.fetch(ctx)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.keys = keys
	r.mu.Unlock()
	return nil
}

func (r *RemoteKeys) fetch(ctx context.Context) (map[string]ed25519.PublicKey, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url, nil)
	if err != nil {
		return nil, fmt.Errorf("receiver: outbound keys request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+r.token)
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("receiver: fetch outbound keys: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxKeysBody+1))
	if err != nil {
		return nil, fmt.Errorf("receiver: read outbound keys: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("receiver: fetch outbound keys: status %d", resp.StatusCode)
	}
	if len(data) > maxKeysBody {
		return nil, errors.New("receiver: outbound keys answer too large")
	}
	return parseOutboundKeys(data)
}

// parseOutboundKeys reads a GET /v1/outbound-keys answer strictly: every
// key id an identity, every public key a valid Ed25519 point, no key id
// twice.
func parseOutboundKeys(data []byte) (map[string]ed25519.PublicKey, error) {
	if _, err := envelope.Canonicalize(data); err != nil {
		return nil, errors.New("receiver: outbound keys answer is not well-formed JSON")
	}
	var ans OutboundKeys
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ans); err != nil || ans.Keys == nil {
		return nil, errors.New(`receiver: outbound keys answer is not {"keys":[…]}`)
	}
	keys := make(map[string]ed25519.PublicKey, len(ans.Keys))
	for _, k := range ans.Keys {
		if !envelope.ValidIdentity(k.KeyID) {
			return nil, errors.New("receiver: outbound keys answer has an invalid key id")
		}
		if _, dup := keys[k.KeyID]; dup {
			return nil, errors.New("receiver: outbound keys answer repeats a key id")
		}
		pub, err := envelope.ParsePublicKey(k.PublicKey)
		if err != nil {
			return nil, fmt.Errorf("receiver: outbound key %q: %w", k.KeyID, err)
		}
		keys[k.KeyID] = pub
	}
	return keys, nil
}
