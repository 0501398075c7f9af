// Package config owns ingest-api's settings, their defaults and their
// checks; modules/envflag reads them (FOO_BAR or --foo-bar, the flag
// winning, -h listing them all with their defaults).
package config

import (
	"fmt"
	"io"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/envflag"
	"github.com/envelopeworker/envelopeworker/modules/limiter"
	"github.com/envelopeworker/envelopeworker/services/ingest-api/internal/outboundkeys"
	"github.com/envelopeworker/envelopeworker/services/ingest-api/internal/server"
)

// ErrInvalid reports a setting that cannot be used; the message names it.
var ErrInvalid = envflag.ErrInvalid

// MaxCredentialCacheTTL bounds how long a revoked credential can still pass.
const MaxCredentialCacheTTL = 2 * time.Second

// Config is the parsed configuration.
type Config struct {
	DatabaseURL             string
	IngestAddr              string
	MaxInflightBodyBytes    int64
	MetricsAddr             string
	OutboundSigningKeysFile string
	OutboundKeysReload      time.Duration
	PayloadRetention        time.Duration
	ReplayWindow            time.Duration
	MaxSequenceAhead        int64
	SyncLimitTokens         uint64
	SyncLimitInterval       time.Duration
	PeerLimitTokens         uint64
	PeerLimitInterval       time.Duration
	// OutboxLimit* are the sync limiter's values unless set.
	OutboxLimitTokens      uint64
	OutboxLimitInterval    time.Duration
	TrustedProxies         limiter.TrustedProxies
	ShutdownGrace          time.Duration
	StoreTimeout           time.Duration
	DBMaxOpenConns         int
	CredentialCacheTTL     time.Duration
	GroupCommitWindow      time.Duration
	GroupCommitMaxItems    int
	GroupCommitConcurrency int
	LogLevel               string
}

// Load parses args (without the program name) over the environment given by
// getenv. -h prints usage to out and returns flag.ErrHelp.
func Load(args []string, getenv func(string) string, out io.Writer) (Config, error) {
	c := Config{
		IngestAddr:             ":8080",
		MaxInflightBodyBytes:   server.DefaultMaxInflightBodyBytes,
		MetricsAddr:            ":9090",
		PayloadRetention:       2160 * time.Hour,
		ReplayWindow:           2160 * time.Hour,
		MaxSequenceAhead:       1024,
		SyncLimitTokens:        100,
		SyncLimitInterval:      time.Second,
		PeerLimitTokens:        1000,
		PeerLimitInterval:      time.Second,
		ShutdownGrace:          25 * time.Second,
		StoreTimeout:           10 * time.Second,
		DBMaxOpenConns:         32,
		CredentialCacheTTL:     time.Second,
		GroupCommitWindow:      0,
		GroupCommitMaxItems:    100,
		GroupCommitConcurrency: 8,
		LogLevel:               "info",
		OutboundKeysReload:     5 * time.Second,
	}
	outboxTokens := &envflag.Inherited{Value: envflag.Uint64(&c.OutboxLimitTokens)}
	outboxInterval := &envflag.Inherited{Value: envflag.Duration(&c.OutboxLimitInterval)}
	settings := []envflag.Setting{
		envflag.Var("DATABASE_URL", "PostgreSQL DSN (required; never printed)", envflag.Secret(&c.DatabaseURL)),
		envflag.Var("INGEST_ADDR", "API listen address", envflag.String(&c.IngestAddr)),
		envflag.Var("INGEST_MAX_INFLIGHT_BODY_BYTES", "bytes of request bodies held at once, counted as they arrive; past it new requests answer 503 unavailable (more than the 1 MiB body limit)", envflag.Int64(&c.MaxInflightBodyBytes)),
		envflag.Var("METRICS_ADDR", "Prometheus /metrics listen address (separate listener)", envflag.String(&c.MetricsAddr)),
		envflag.Var("OUTBOUND_SIGNING_KEYS_FILE", `optional JSON {"<tenant>":{"key_id":"…","seed":"<base64url 32 bytes>","previous":[{"key_id":"…","public_key":"<base64url 32 bytes>"}]}} (previous optional), checked at start, reloaded when it changes`, envflag.String(&c.OutboundSigningKeysFile)),
		envflag.Var("OUTBOUND_SIGNING_KEYS_RELOAD_INTERVAL", "how often OUTBOUND_SIGNING_KEYS_FILE is checked for changes (a bad new version is logged and the previous keys stay)", envflag.Duration(&c.OutboundKeysReload)),
		envflag.Var("PAYLOAD_RETENTION", "how long inbound payloads are kept (Go duration)", envflag.Duration(&c.PayloadRetention)),
		envflag.Var("REPLAY_WINDOW", "oldest issued_at accepted (Go duration)", envflag.Duration(&c.ReplayWindow)),
		envflag.Var("MAX_SEQUENCE_AHEAD", "largest accepted distance of a sequence past the stream cursor", envflag.Int64(&c.MaxSequenceAhead)),
		envflag.Var("SYNC_LIMIT_TOKENS", "envelopes per SYNC_LIMIT_INTERVAL per verified device", envflag.Uint64(&c.SyncLimitTokens)),
		envflag.Var("SYNC_LIMIT_INTERVAL", "sync limiter interval (Go duration)", envflag.Duration(&c.SyncLimitInterval)),
		envflag.Var("PEER_LIMIT_TOKENS", "/v1/ requests per PEER_LIMIT_INTERVAL per client address (IPv4 address or IPv6 /64; see TRUSTED_PROXIES)", envflag.Uint64(&c.PeerLimitTokens)),
		envflag.Var("PEER_LIMIT_INTERVAL", "peer limiter interval (Go duration)", envflag.Duration(&c.PeerLimitInterval)),
		envflag.Var("OUTBOX_LIMIT_TOKENS", "outbox message requests per OUTBOX_LIMIT_INTERVAL per verified tenant, account and device (default: SYNC_LIMIT_TOKENS)", outboxTokens),
		envflag.Var("OUTBOX_LIMIT_INTERVAL", "outbox limiter interval (Go duration; default: SYNC_LIMIT_INTERVAL)", outboxInterval),
		envflag.Var("TRUSTED_PROXIES", "comma-separated CIDR prefixes of the proxies whose X-Forwarded-For names the client (default none: the TCP peer is the client)", (*proxiesValue)(&c.TrustedProxies)),
		envflag.Var("SHUTDOWN_GRACE", "time allowed to finish in-flight requests after SIGTERM", envflag.Duration(&c.ShutdownGrace)),
		envflag.Var("STORE_TIMEOUT", "deadline of each database operation; past it the answer is 503 unavailable", envflag.Duration(&c.StoreTimeout)),
		envflag.Var("DB_MAX_OPEN_CONNS", "database connection pool size", envflag.Int(&c.DBMaxOpenConns)),
		envflag.Var("CREDENTIAL_CACHE_TTL", "how long a verified credential is cached (0 disables, at most 2s: revocation takes effect within it)", envflag.Duration(&c.CredentialCacheTTL)),
		envflag.Var("GROUP_COMMIT_WINDOW", "extra time a group commit waits for more requests (0: only what queued meanwhile)", envflag.Duration(&c.GroupCommitWindow)),
		envflag.Var("GROUP_COMMIT_MAX_ITEMS", "most single-envelope requests committed in one transaction, and of POST /v1/outbox requests (at most 100) in one outbox transaction (1 disables grouping)", envflag.Int(&c.GroupCommitMaxItems)),
		envflag.Var("GROUP_COMMIT_CONCURRENCY", "group-commit transactions in flight at once, for envelopes and for outbox enqueues each (one being decided, the rest waiting for their WAL flush)", envflag.Int(&c.GroupCommitConcurrency)),
		envflag.Var("LOG_LEVEL", envflag.LogLevelHelp, envflag.String(&c.LogLevel)),
	}

	if err := envflag.Parse("ingest-api", "", settings, args, getenv, out); err != nil {
		return Config{}, err
	}
	// Unset, the outbox limiter follows the sync limiter's settings as they
	// were given, so raising SYNC_LIMIT_* raises both (contract §8.4).
	if !outboxTokens.Given() {
		c.OutboxLimitTokens = c.SyncLimitTokens
	}
	if !outboxInterval.Given() {
		c.OutboxLimitInterval = c.SyncLimitInterval
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Validate checks ranges and cross-field rules.
func (c Config) Validate() error {
	bad := func(name, why string) error { return fmt.Errorf("%w: %s %s", ErrInvalid, name, why) }
	switch {
	case c.IngestAddr == "":
		return bad("INGEST_ADDR", "is empty")
	case c.MaxInflightBodyBytes <= envelope.MaxDocumentBytes:
		return bad("INGEST_MAX_INFLIGHT_BODY_BYTES", "must be more than the 1 MiB body limit")
	case c.PayloadRetention <= 0:
		return bad("PAYLOAD_RETENTION", "must be positive")
	case c.ReplayWindow <= 0:
		return bad("REPLAY_WINDOW", "must be positive")
	case c.MaxSequenceAhead < 1:
		return bad("MAX_SEQUENCE_AHEAD", "must be at least 1")
	case c.OutboundKeysReload <= 0:
		return bad("OUTBOUND_SIGNING_KEYS_RELOAD_INTERVAL", "must be positive")
	case c.CredentialCacheTTL < 0 || c.CredentialCacheTTL > MaxCredentialCacheTTL:
		return bad("CREDENTIAL_CACHE_TTL", "must be between 0 and 2s")
	case c.GroupCommitWindow < 0 || c.GroupCommitWindow > 50*time.Millisecond:
		return bad("GROUP_COMMIT_WINDOW", "must be between 0 and 50ms")
	case c.GroupCommitMaxItems < 1 || c.GroupCommitMaxItems > 1000:
		return bad("GROUP_COMMIT_MAX_ITEMS", "must be between 1 and 1000")
	case c.GroupCommitConcurrency < 1 || c.GroupCommitConcurrency > 64:
		return bad("GROUP_COMMIT_CONCURRENCY", "must be between 1 and 64")
	}
	common := envflag.Service{DatabaseURL: c.DatabaseURL, MetricsAddr: c.MetricsAddr, ShutdownGrace: c.ShutdownGrace,
		StoreTimeout: c.StoreTimeout, DBMaxOpenConns: c.DBMaxOpenConns, LogLevel: c.LogLevel}
	if err := common.Validate(); err != nil {
		return err
	}
	for _, p := range []struct {
		names  string
		policy limiter.Policy
	}{
		{"SYNC_LIMIT_TOKENS/SYNC_LIMIT_INTERVAL", limiter.Policy{Tokens: c.SyncLimitTokens, Interval: c.SyncLimitInterval}},
		{"PEER_LIMIT_TOKENS/PEER_LIMIT_INTERVAL", limiter.Policy{Tokens: c.PeerLimitTokens, Interval: c.PeerLimitInterval}},
		{"OUTBOX_LIMIT_TOKENS/OUTBOX_LIMIT_INTERVAL", limiter.Policy{Tokens: c.OutboxLimitTokens, Interval: c.OutboxLimitInterval}},
	} {
		if err := p.policy.Validate(); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrInvalid, p.names, err)
		}
	}
	if c.OutboundSigningKeysFile != "" {
		if err := checkSigningKeysFile(c.OutboundSigningKeysFile); err != nil {
			return err
		}
	}
	return nil
}

// checkSigningKeysFile fails start-up on a file the outbox could not use, so
// a typo shows at deploy time rather than at the first outbound message.
// The rules are outboundkeys'; its messages never quote a seed.
func checkSigningKeysFile(path string) error {
	if _, err := outboundkeys.OpenFile(path); err != nil {
		return fmt.Errorf("%w: OUTBOUND_SIGNING_KEYS_FILE: %w", ErrInvalid, err)
	}
	return nil
}

// proxiesValue is TRUSTED_PROXIES; the rules are the limiter's.
type proxiesValue limiter.TrustedProxies

func (v *proxiesValue) String() string { return limiter.TrustedProxies(*v).String() }
func (v *proxiesValue) Set(s string) error {
	t, err := limiter.ParseTrustedProxies(s)
	if err != nil {
		return err
	}
	*v = proxiesValue(t)
	return nil
}
