// Package access holds what the tools need to reach the service with a credential: Ed25519 seeds and
// bearer tokens read from (and written to) files, base URLs checked so that a credential never goes
// somewhere it should not, and one raw POST. Sending envelopes as a device does is the producer
// module's job (modules/producer); Post is for the tools that must see every answer on the wire as it
// is — envctl send without a state file (any envelope, any sequence), the chaos harness's outbox
// clients. The chaos harness's devices go through the producer module and watch every answer with
// producer.WithObserver.
package access

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/envelopeworker/envelopeworker/modules/redact"
)

// SeedSize is the length of an Ed25519 seed; seeds are exchanged as base64url text.
const SeedSize = ed25519.SeedSize

// maxSecretFile bounds what is read from a seed or token file: both are short lines, and a mistyped
// path (a log file, a device) should fail fast rather than fill memory.
const maxSecretFile = 4096

// DecodeBase64URL accepts base64url with or without padding. Padding, when present, must be correct:
// a half-padded string is more likely a copy-paste accident than a key.
func DecodeBase64URL(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "=") {
		return base64.URLEncoding.Strict().DecodeString(s)
	}
	return base64.RawURLEncoding.Strict().DecodeString(s)
}

// EncodeBase64URL is the unpadded base64url form every tool prints.
func EncodeBase64URL(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// ParseSeed turns base64url text of a 32-byte seed into a private key.
func ParseSeed(s string) (ed25519.PrivateKey, error) {
	b, err := DecodeBase64URL(s)
	if err != nil {
		// The decoder's message quotes an offset, never the text itself, so it is safe to wrap.
		return nil, fmt.Errorf("seed is not base64url: %w", err)
	}
	if len(b) != SeedSize {
		return nil, fmt.Errorf("seed is %d bytes, want %d", len(b), SeedSize)
	}
	return ed25519.NewKeyFromSeed(b), nil
}

// ReadSeedFile reads a seed written by `envctl keygen --seed-file`.
func ReadSeedFile(path string) (ed25519.PrivateKey, error) {
	text, err := readSecretFile(path)
	if err != nil {
		return nil, err
	}
	priv, err := ParseSeed(text)
	if err != nil {
		return nil, fmt.Errorf("seed file %s: %w", path, err)
	}
	return priv, nil
}

// ReadTokenFile reads a bearer token (the line `envctl credential issue` printed).
func ReadTokenFile(path string) (string, error) {
	text, err := readSecretFile(path)
	if err != nil {
		return "", err
	}
	tok := strings.TrimSpace(text)
	if err := CheckToken(tok); err != nil {
		return "", fmt.Errorf("token file %s: %w", path, err)
	}
	return tok, nil
}

// CheckToken refuses tokens that cannot be sent in an Authorization header as they are.
func CheckToken(tok string) error {
	if tok == "" {
		return errors.New("token is empty")
	}
	for i := 0; i < len(tok); i++ {
		if c := tok[i]; c < 0x21 || c > 0x7e {
			return errors.New("token has characters outside printable ASCII")
		}
	}
	return nil
}

func readSecretFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > maxSecretFile {
		return "", fmt.Errorf("%s is larger than %d bytes: not a seed or token file", path, maxSecretFile)
	}
	return string(b), nil
}

// WriteSecretFile creates path with owner-only permissions and refuses to overwrite: losing a seed or
// token that a running producer still uses is not recoverable.
func WriteSecretFile(path, content string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

// IsLoopbackHost reports whether host (no port) names this machine: localhost or a loopback address.
func IsLoopbackHost(host string) bool {
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// CheckURL parses a service base URL. loopbackOnly restricts it to this machine (load generators must
// never be pointed at someone else's service); otherwise plain http is still refused for other hosts,
// because the bearer token would cross the network in clear text.
func CheckURL(raw string, loopbackOnly bool) (*url.URL, error) {
	// Errors name the URL through redact.URL: a refused URL may be refused for
	// the user info or query it carries.
	shown := redact.URL(raw)
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New("url does not parse")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("url %s: scheme must be http or https", shown)
	}
	if u.Host == "" || u.Hostname() == "" {
		return nil, fmt.Errorf("url %s has no host", shown)
	}
	if u.User != nil {
		return nil, fmt.Errorf("url %s: user info is not allowed (use a token)", shown)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("url %s: give the service base URL, without query or fragment", shown)
	}
	loop := IsLoopbackHost(u.Hostname())
	if loopbackOnly && !loop {
		return nil, fmt.Errorf("url %s: only loopback hosts are allowed", shown)
	}
	if u.Scheme == "http" && !loop {
		return nil, fmt.Errorf("url %s: plain http is only allowed to loopback hosts; use https", shown)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	return u, nil
}

// Endpoint joins a base URL from CheckURL with a route path such as "/v1/envelopes".
func Endpoint(base *url.URL, route string) string {
	u := *base
	u.Path = base.Path + route
	return u.String()
}

// Answer is what the service said.
type Answer struct {
	Status        int
	Body          []byte
	CorrelationID string
}

// maxAnswer bounds how much of an answer is kept; a batch of 100 results is a few KiB.
const maxAnswer = 1 << 20

// Post sends one JSON body with a bearer token. A non-2xx status is an Answer, not an error: the caller
// decides what a refusal means; the error is for transport failures only.
func Post(ctx context.Context, c *http.Client, endpoint, token string, body []byte, header http.Header) (Answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return Answer{}, fmt.Errorf("build request: %w", err)
	}
	for k, vs := range header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		return Answer{}, fmt.Errorf("post %s: %w", endpoint, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return Answer{}, fmt.Errorf("read answer from %s: %w", endpoint, err)
	}
	return Answer{Status: resp.StatusCode, Body: b, CorrelationID: resp.Header.Get("X-Correlation-Id")}, nil
}
