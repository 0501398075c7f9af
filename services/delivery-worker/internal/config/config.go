// Package config owns delivery-worker's settings, their defaults and their
// checks; modules/envflag reads them (FOO_BAR or --foo-bar, the flag
// winning, -h listing them all with their defaults).
package config

import (
	"fmt"
	"io"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envflag"
	"github.com/envelopeworker/envelopeworker/modules/limiter"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/secrets"
	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/worker"
)

// ErrInvalid reports a setting that cannot be used; the message names it.
var ErrInvalid = envflag.ErrInvalid

// Config is the parsed configuration.
type Config struct {
	DatabaseURL           string
	MetricsAddr           string
	WebhookSecretsFile    string
	SecretsReloadInterval time.Duration
	Lease                 time.Duration
	BackoffBase           time.Duration
	BackoffMax            time.Duration
	HTTPTimeout           time.Duration
	AllowInsecureLoopback bool
	Concurrency           int
	TenantMaxInflight     int
	ClaimSize             int
	LimitTokens           uint64
	LimitInterval         time.Duration
	PollInterval          time.Duration
	ShutdownGrace         time.Duration
	StoreTimeout          time.Duration
	DBMaxOpenConns        int
	LogLevel              string
	// OutboxPayloadRetention: how long an outbound envelope's body is kept
	// after its last message settled (contract §8.9); this worker's settles
	// fix that time.
	OutboxPayloadRetention time.Duration
	// PprofEnabled serves net/http/pprof on the metrics listener: off by
	// default, since a profile shows whatever the process holds.
	PprofEnabled bool
}

// Bounds of OUTBOX_PAYLOAD_RETENTION: under a second is a unit mistake (a
// body could expire before a replay is even considered), over ten years
// not a retention.
const (
	minOutboxPayloadRetention = time.Second
	maxOutboxPayloadRetention = 10 * 365 * 24 * time.Hour
)

// Load parses args (without the program name) over the environment given by
// getenv. -h prints usage to out and returns flag.ErrHelp.
func Load(args []string, getenv func(string) string, out io.Writer) (Config, error) {
	c := Config{
		MetricsAddr:            ":9090",
		SecretsReloadInterval:  5 * time.Second,
		Lease:                  30 * time.Second,
		BackoffBase:            time.Second,
		BackoffMax:             10 * time.Minute,
		HTTPTimeout:            10 * time.Second,
		Concurrency:            2 * store.MaxClaim, // a full claim goes out while the previous one is still being sent
		ClaimSize:              store.MaxClaim,
		LimitTokens:            50,
		LimitInterval:          time.Second,
		PollInterval:           500 * time.Millisecond,
		ShutdownGrace:          25 * time.Second,
		StoreTimeout:           5 * time.Second,
		DBMaxOpenConns:         8,
		LogLevel:               "info",
		OutboxPayloadRetention: store.DefaultOutboxPayloadRetention,
	}
	// Unset until given: its default follows DELIVERY_CONCURRENCY.
	tenantMax := &envflag.Inherited{Value: envflag.Int(&c.TenantMaxInflight)}
	settings := []envflag.Setting{
		envflag.Var("DATABASE_URL", "PostgreSQL DSN (required; never printed)", envflag.Secret(&c.DatabaseURL)),
		envflag.Var("METRICS_ADDR", "listen address of /metrics, /healthz and /readyz", envflag.String(&c.MetricsAddr)),
		envflag.Var("WEBHOOK_SECRETS_FILE", `JSON {"<secret_ref>":["whsec_…"|"whsk_…", …]} (required; reloaded when it changes)`, envflag.String(&c.WebhookSecretsFile)),
		envflag.Var("SECRETS_RELOAD_INTERVAL", "how often WEBHOOK_SECRETS_FILE is checked for changes", envflag.Duration(&c.SecretsReloadInterval)),
		envflag.Var("DELIVERY_LEASE", "claim lease of one attempt (Go duration)", envflag.Duration(&c.Lease)),
		envflag.Var("DELIVERY_BACKOFF_BASE", "retry delay after the first failed attempt (Go duration)", envflag.Duration(&c.BackoffBase)),
		envflag.Var("DELIVERY_BACKOFF_MAX", "longest retry delay, also the cap on Retry-After (Go duration)", envflag.Duration(&c.BackoffMax)),
		envflag.Var("DELIVERY_HTTP_TIMEOUT", "timeout of one HTTP attempt; shortened to 72% of DELIVERY_LEASE when it does not fit under 4/5 of it", envflag.Duration(&c.HTTPTimeout)),
		envflag.Var("DELIVERY_ALLOW_INSECURE_LOOPBACK", "allow loopback endpoints, and plain http to them only (local runs, tests)", envflag.Bool(&c.AllowInsecureLoopback)),
		envflag.Var("DELIVERY_CONCURRENCY", "attempts in flight at most", envflag.Int(&c.Concurrency)),
		envflag.Var("DELIVERY_TENANT_MAX_INFLIGHT", "attempts in flight of one tenant at most, 1 to DELIVERY_CONCURRENCY (equal turns the bound off; default a quarter of DELIVERY_CONCURRENCY, at least 1)", tenantMax),
		envflag.Var("DELIVERY_CLAIM_SIZE", "messages per claim at most (1–100)", envflag.Int(&c.ClaimSize)),
		envflag.Var("DELIVERY_LIMIT_TOKENS", "claims per DELIVERY_LIMIT_INTERVAL per tenant", envflag.Uint64(&c.LimitTokens)),
		envflag.Var("DELIVERY_LIMIT_INTERVAL", "delivery limiter interval (Go duration)", envflag.Duration(&c.LimitInterval)),
		envflag.Var("DELIVERY_POLL_INTERVAL", "wait between cycles when nothing is due", envflag.Duration(&c.PollInterval)),
		envflag.Var("SHUTDOWN_GRACE", "time in-flight attempts may take to finish after SIGTERM", envflag.Duration(&c.ShutdownGrace)),
		envflag.Var("STORE_TIMEOUT", "deadline of each database operation", envflag.Duration(&c.StoreTimeout)),
		envflag.Var("DB_MAX_OPEN_CONNS", "database connection pool size", envflag.Int(&c.DBMaxOpenConns)),
		envflag.Var("LOG_LEVEL", envflag.LogLevelHelp, envflag.String(&c.LogLevel)),
		envflag.Var("OUTBOX_PAYLOAD_RETENTION", "how long an outbound envelope's body is kept after its last message was delivered or dead (Go duration, 1s to 87600h)", envflag.Duration(&c.OutboxPayloadRetention)),
		envflag.Var("PPROF_ENABLED", "serve /debug/pprof/ on the METRICS_ADDR listener (profiling; keep that address private)", envflag.Bool(&c.PprofEnabled)),
	}
	if err := envflag.Parse("delivery-worker", "", settings, args, getenv, out); err != nil {
		return Config{}, err
	}
	// Every attempt must end by 4/5 of the lease, the rest being kept for
	// settling. A short lease (local runs, tests of lease expiry) would make
	// the default timeout invalid, so the timeout is shortened to fit rather
	// than the worker refused.
	if limit := c.Lease - c.Lease/5; c.Lease > 0 && c.HTTPTimeout >= limit {
		c.HTTPTimeout = limit - limit/10
	}
	if !tenantMax.Given() {
		c.TenantMaxInflight = worker.DefaultTenantMaxInflight(c.Concurrency)
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Validate checks ranges and cross-field rules, and that the secrets file
// loads (a bad file stops the worker at start, not at the first delivery).
func (c Config) Validate() error {
	bad := func(name, why string) error { return fmt.Errorf("%w: %s %s", ErrInvalid, name, why) }
	// The limiter's own range check (contract §8.3), before the database is
	// opened, so a bad policy names its settings at start.
	if err := (limiter.Policy{Tokens: c.LimitTokens, Interval: c.LimitInterval}).Validate(); err != nil {
		return fmt.Errorf("%w: DELIVERY_LIMIT_TOKENS/DELIVERY_LIMIT_INTERVAL: %w", ErrInvalid, err)
	}
	common := envflag.Service{DatabaseURL: c.DatabaseURL, MetricsAddr: c.MetricsAddr, ShutdownGrace: c.ShutdownGrace,
		StoreTimeout: c.StoreTimeout, DBMaxOpenConns: c.DBMaxOpenConns, LogLevel: c.LogLevel}
	if err := common.Validate(); err != nil {
		return err
	}
	switch {
	case c.WebhookSecretsFile == "":
		return bad("WEBHOOK_SECRETS_FILE", "is required")
	case c.SecretsReloadInterval <= 0:
		return bad("SECRETS_RELOAD_INTERVAL", "must be positive")
	case c.Lease <= 0 || c.Lease > store.MaxLease:
		return bad("DELIVERY_LEASE", "must be positive and at most 1h")
	case c.BackoffBase <= 0:
		return bad("DELIVERY_BACKOFF_BASE", "must be positive")
	case c.BackoffMax < c.BackoffBase:
		return bad("DELIVERY_BACKOFF_MAX", "must be at least DELIVERY_BACKOFF_BASE")
	case c.HTTPTimeout <= 0 || c.HTTPTimeout >= c.Lease-c.Lease/5:
		return bad("DELIVERY_HTTP_TIMEOUT", "must be positive and under 4/5 of DELIVERY_LEASE (the rest is kept for settling)")
	case c.Concurrency < 1 || c.Concurrency > 1024:
		return bad("DELIVERY_CONCURRENCY", "must be between 1 and 1024")
	case c.TenantMaxInflight < 1 || c.TenantMaxInflight > c.Concurrency:
		// Refused, not clamped: a share above the concurrency is a
		// misreading of the setting, and clamping it would turn the bound
		// off without anyone having asked for that.
		return bad("DELIVERY_TENANT_MAX_INFLIGHT", "must be between 1 and DELIVERY_CONCURRENCY (equal turns the bound off)")
	case c.ClaimSize < 1 || c.ClaimSize > store.MaxClaim:
		return bad("DELIVERY_CLAIM_SIZE", "must be between 1 and 100")
	case c.PollInterval <= 0:
		return bad("DELIVERY_POLL_INTERVAL", "must be positive")
	case c.OutboxPayloadRetention < minOutboxPayloadRetention || c.OutboxPayloadRetention > maxOutboxPayloadRetention:
		return bad("OUTBOX_PAYLOAD_RETENTION", "must be between 1s and 87600h (10 years)")
	}
	if _, err := secrets.Load(c.WebhookSecretsFile); err != nil {
		return fmt.Errorf("%w: WEBHOOK_SECRETS_FILE: %w", ErrInvalid, err)
	}
	return nil
}
