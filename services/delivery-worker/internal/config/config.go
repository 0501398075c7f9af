// Package config owns delivery-worker's configuration: every setting is an
// environment variable with a mirrored flag (FOO_BAR <-> --foo-bar), a flag
// winning over the environment, and -h listing them all with defaults.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/limiter"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/secrets"
	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/worker"
)

// ErrInvalid reports a setting that cannot be used; the message names it.
var ErrInvalid = errors.New("invalid configuration")

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

type setting struct {
	env   string
	help  string
	value flag.Value
}

func (s setting) flagName() string { return strings.ReplaceAll(strings.ToLower(s.env), "_", "-") }

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
	var tenantMax optionalInt
	settings := []setting{
		{"DATABASE_URL", "PostgreSQL DSN (required; never printed)", (*secretValue)(&c.DatabaseURL)},
		{"METRICS_ADDR", "listen address of /metrics, /healthz and /readyz", (*stringValue)(&c.MetricsAddr)},
		{"WEBHOOK_SECRETS_FILE", `JSON {"<secret_ref>":["whsec_…"|"whsk_…", …]} (required; reloaded when it changes)`, (*stringValue)(&c.WebhookSecretsFile)},
		{"SECRETS_RELOAD_INTERVAL", "how often WEBHOOK_SECRETS_FILE is checked for changes", (*durationValue)(&c.SecretsReloadInterval)},
		{"DELIVERY_LEASE", "claim lease of one attempt (Go duration)", (*durationValue)(&c.Lease)},
		{"DELIVERY_BACKOFF_BASE", "retry delay after the first failed attempt (Go duration)", (*durationValue)(&c.BackoffBase)},
		{"DELIVERY_BACKOFF_MAX", "longest retry delay, also the cap on Retry-After (Go duration)", (*durationValue)(&c.BackoffMax)},
		{"DELIVERY_HTTP_TIMEOUT", "timeout of one HTTP attempt; shortened to 72% of DELIVERY_LEASE when it does not fit under 4/5 of it", (*durationValue)(&c.HTTPTimeout)},
		{"DELIVERY_ALLOW_INSECURE_LOOPBACK", "allow loopback endpoints, and plain http to them only (local runs, tests)", (*boolValue)(&c.AllowInsecureLoopback)},
		{"DELIVERY_CONCURRENCY", "attempts in flight at most", (*intValue)(&c.Concurrency)},
		{"DELIVERY_TENANT_MAX_INFLIGHT", "attempts in flight of one tenant at most, 1 to DELIVERY_CONCURRENCY (equal turns the bound off; default a quarter of DELIVERY_CONCURRENCY, at least 1)", &tenantMax},
		{"DELIVERY_CLAIM_SIZE", "messages per claim at most (1–100)", (*intValue)(&c.ClaimSize)},
		{"DELIVERY_LIMIT_TOKENS", "claims per DELIVERY_LIMIT_INTERVAL per tenant", (*uint64Value)(&c.LimitTokens)},
		{"DELIVERY_LIMIT_INTERVAL", "delivery limiter interval (Go duration)", (*durationValue)(&c.LimitInterval)},
		{"DELIVERY_POLL_INTERVAL", "wait between cycles when nothing is due", (*durationValue)(&c.PollInterval)},
		{"SHUTDOWN_GRACE", "time in-flight attempts may take to finish after SIGTERM", (*durationValue)(&c.ShutdownGrace)},
		{"STORE_TIMEOUT", "deadline of each database operation", (*durationValue)(&c.StoreTimeout)},
		{"DB_MAX_OPEN_CONNS", "database connection pool size", (*intValue)(&c.DBMaxOpenConns)},
		{"LOG_LEVEL", "debug, info, warn or error", (*stringValue)(&c.LogLevel)},
		{"OUTBOX_PAYLOAD_RETENTION", "how long an outbound envelope's body is kept after its last message was delivered or dead (Go duration, 1s to 87600h)", (*durationValue)(&c.OutboxPayloadRetention)},
		{"PPROF_ENABLED", "serve /debug/pprof/ on the METRICS_ADDR listener (profiling; keep that address private)", (*boolValue)(&c.PprofEnabled)},
	}
	for _, s := range settings {
		if v := getenv(s.env); v != "" {
			if err := s.value.Set(v); err != nil {
				return Config{}, fmt.Errorf("%w: %s: %v", ErrInvalid, s.env, err)
			}
		}
	}
	fs := flag.NewFlagSet("delivery-worker", flag.ContinueOnError)
	fs.SetOutput(out)
	for _, s := range settings {
		fs.Var(s.value, s.flagName(), s.help+" (env "+s.env+")")
	}
	fs.Usage = func() {
		fmt.Fprintln(out, "Usage: delivery-worker [flags]")
		fmt.Fprintln(out, "Every flag --foo-bar may instead be set by the environment variable FOO_BAR; a flag wins.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return Config{}, err
		}
		return Config{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("%w: unexpected argument %q", ErrInvalid, fs.Arg(0))
	}
	// Every attempt must end by 4/5 of the lease, the rest being kept for
	// settling. A short lease (local runs, tests of lease expiry) would make
	// the default timeout invalid, so the timeout is shortened to fit rather
	// than the worker refused.
	if limit := c.Lease - c.Lease/5; c.Lease > 0 && c.HTTPTimeout >= limit {
		c.HTTPTimeout = limit - limit/10
	}
	c.TenantMaxInflight = worker.DefaultTenantMaxInflight(c.Concurrency)
	if tenantMax.set {
		c.TenantMaxInflight = tenantMax.n
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
	switch {
	case c.DatabaseURL == "":
		return bad("DATABASE_URL", "is required")
	case c.MetricsAddr == "":
		return bad("METRICS_ADDR", "is empty")
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
	case c.ShutdownGrace <= 0:
		return bad("SHUTDOWN_GRACE", "must be positive")
	case c.StoreTimeout <= 0:
		return bad("STORE_TIMEOUT", "must be positive")
	case c.DBMaxOpenConns < 1:
		return bad("DB_MAX_OPEN_CONNS", "must be at least 1")
	case c.OutboxPayloadRetention < minOutboxPayloadRetention || c.OutboxPayloadRetention > maxOutboxPayloadRetention:
		return bad("OUTBOX_PAYLOAD_RETENTION", "must be between 1s and 87600h (10 years)")
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return bad("LOG_LEVEL", "must be debug, info, warn or error")
	}
	if _, err := secrets.Load(c.WebhookSecretsFile); err != nil {
		return fmt.Errorf("%w: WEBHOOK_SECRETS_FILE: %w", ErrInvalid, err)
	}
	return nil
}

type stringValue string

func (v *stringValue) String() string     { return string(*v) }
func (v *stringValue) Set(s string) error { *v = stringValue(s); return nil }

// secretValue hides its value from -h output: a DSN can hold a password.
type secretValue string

func (v *secretValue) String() string     { return "" }
func (v *secretValue) Set(s string) error { *v = secretValue(s); return nil }

type durationValue time.Duration

func (v *durationValue) String() string { return time.Duration(*v).String() }
func (v *durationValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("not a Go duration")
	}
	*v = durationValue(d)
	return nil
}

type intValue int

func (v *intValue) String() string { return strconv.Itoa(int(*v)) }
func (v *intValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return errors.New("not an integer")
	}
	*v = intValue(n)
	return nil
}

// optionalInt is an integer whose default depends on another setting, so
// -h shows none and Load tells "not given" from any given value.
type optionalInt struct {
	n   int
	set bool
}

func (v *optionalInt) String() string {
	if v == nil || !v.set {
		return ""
	}
	return strconv.Itoa(v.n)
}

func (v *optionalInt) Set(s string) error {
	var n intValue
	if err := n.Set(s); err != nil {
		return err
	}
	v.n, v.set = int(n), true
	return nil
}

type uint64Value uint64

func (v *uint64Value) String() string { return strconv.FormatUint(uint64(*v), 10) }
func (v *uint64Value) Set(s string) error {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return errors.New("not a non-negative integer")
	}
	*v = uint64Value(n)
	return nil
}

type boolValue bool

func (v *boolValue) String() string   { return strconv.FormatBool(bool(*v)) }
func (v *boolValue) IsBoolFlag() bool { return true }
func (v *boolValue) Set(s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return errors.New("not true or false")
	}
	*v = boolValue(b)
	return nil
}
