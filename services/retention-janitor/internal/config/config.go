// Package config owns the retention-janitor's settings, their defaults and
// their checks; modules/envflag reads them (FOO_BAR or --foo-bar, the flag
// winning, -h listing them all with their documented defaults).
package config

import (
	"fmt"
	"io"
	"net/url"
	"strconv"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envflag"
	"github.com/envelopeworker/envelopeworker/modules/store"
)

// Config is the janitor's configuration. Every field comes from an
// environment variable and the mirrored flag (FOO_BAR is --foo-bar, contract
// §6 and §7.9); a flag given on the command line wins over the environment.
type Config struct {
	// DatabaseURL logs in as the janitor's own role (envelopeworker_janitor),
	// which can only select and delete payload rows.
	DatabaseURL string
	// Timeout bounds one cycle of deletes (JANITOR_TIMEOUT, default 10m).
	// Reaching it is a clean stop: the rest is due again at the next run.
	Timeout time.Duration
	// BatchSize is the most payload rows one DELETE removes (JANITOR_BATCH_SIZE,
	// 1..1000, default DefaultBatchSize): short transactions keep locks and WAL
	// bursts small.
	BatchSize int
	// MaxRowsPerSecond caps the average delete rate so a backlog drains
	// without starving concurrent ingest of WAL bandwidth
	// (JANITOR_MAX_ROWS_PER_SECOND, default DefaultMaxRowsPerSecond; 0 is
	// no cap).
	MaxRowsPerSecond int
	// WALCompression is the wal_compression of the janitor's sessions
	// (JANITOR_WAL_COMPRESSION: off, pglz, lz4 or zstd, default lz4; server
	// leaves the server's setting). Compressing the page images its deletes
	// log halves their WAL. A role that may not set it (migration 0004 grants
	// it where the migrator could) or a server without the method runs at the
	// server's setting, with a warning; the summary shows what was used.
	WALCompression string
	// PushgatewayURL, when set, receives the run's metrics (PUSHGATEWAY_URL);
	// otherwise the figures appear only in the summary log line.
	PushgatewayURL string
	// PushTimeout bounds the push to the gateway (PUSHGATEWAY_TIMEOUT, default 10s).
	PushTimeout time.Duration
	// LogLevel is debug, info, warn or error (LOG_LEVEL, default info).
	LogLevel string
}

// Defaults.
const (
	DefaultTimeout     = 10 * time.Minute
	DefaultPushTimeout = 10 * time.Second
	// DefaultBatchSize: a DELETE of 100 envelope-sized rows writes about
	// 110 KB of WAL, a burst concurrent ingest commits barely notice; 1,000
	// (the contract's bound) did, even paced, when deletes went by primary
	// key (docs/benchmarks.md; not measured again since).
	DefaultBatchSize = 100
	// DefaultMaxRowsPerSecond is the pace at which a 2 vCPU server's ingest
	// p99 rose by -1% and +9% while a backlog drained (medians of 7 rounds;
	// docs/retention-janitor.md).
	// A default 10-minute cycle then deletes up to 6M rows, so an hourly run
	// keeps up with about 1,600 envelopes/s of sustained ingest; above that,
	// raise it, JANITOR_TIMEOUT or the schedule's frequency.
	DefaultMaxRowsPerSecond = 10_000
	maxRowsPerSecond        = 1_000_000
	// DefaultWALCompression: lz4 compressed envelope-shaped page images to
	// about half (docs/retention-janitor.md) at little CPU.
	DefaultWALCompression = "lz4"
	// WALCompressionServer leaves wal_compression as the server sets it.
	WALCompressionServer = "server"
)

// ErrInvalid marks a configuration the janitor refuses to run with.
var ErrInvalid = envflag.ErrInvalid

// Load reads the environment through getenv, then args. -h prints every
// setting to out and returns flag.ErrHelp.
func Load(args []string, getenv func(string) string, out io.Writer) (Config, error) {
	// Read as text and checked below, so that each refusal names its rule
	// whatever the kind of mistake (not a number, or out of range).
	var c Config
	timeout, batch, rate := DefaultTimeout.String(), strconv.Itoa(DefaultBatchSize), strconv.Itoa(DefaultMaxRowsPerSecond)
	c.WALCompression, c.LogLevel = DefaultWALCompression, "info"
	pushTimeout := DefaultPushTimeout.String()
	settings := []envflag.Setting{
		envflag.Var("DATABASE_URL", "PostgreSQL URL for the envelopeworker_janitor role (required; never printed)", envflag.Secret(&c.DatabaseURL)),
		envflag.Var("JANITOR_TIMEOUT", "Go duration bounding one cycle of deletes", envflag.String(&timeout)),
		envflag.Var("JANITOR_BATCH_SIZE", "rows deleted per batch (inbound payloads, outbound bodies, attempt rows), 1-1000", envflag.String(&batch)),
		envflag.Var("JANITOR_MAX_ROWS_PER_SECOND", "average cap on payload rows deleted per second; 0: no cap", envflag.String(&rate)),
		envflag.Var("JANITOR_WAL_COMPRESSION", "wal_compression of the janitor's sessions: off, pglz, lz4, zstd, or server (the server's setting)", envflag.String(&c.WALCompression)),
		// Secret: the URL may carry basic-auth credentials.
		envflag.Var("PUSHGATEWAY_URL", "Prometheus Pushgateway base URL; empty: metrics only in the summary log line", envflag.Secret(&c.PushgatewayURL)),
		envflag.Var("PUSHGATEWAY_TIMEOUT", "Go duration bounding the metrics push", envflag.String(&pushTimeout)),
		envflag.Var("LOG_LEVEL", envflag.LogLevelHelp, envflag.String(&c.LogLevel)),
	}
	if err := envflag.Parse("retention-janitor", "Deletes expired inbound payloads and outbound bodies once and exits.", settings, args, getenv, out); err != nil {
		return Config{}, err
	}

	var err error
	if c.DatabaseURL == "" {
		return Config{}, fmt.Errorf("%w: DATABASE_URL is required", ErrInvalid)
	}
	if c.Timeout, err = positiveDuration("JANITOR_TIMEOUT", timeout); err != nil {
		return Config{}, err
	}
	if c.PushTimeout, err = positiveDuration("PUSHGATEWAY_TIMEOUT", pushTimeout); err != nil {
		return Config{}, err
	}
	n, err := strconv.Atoi(batch)
	if err != nil || n < 1 || n > store.MaxDeleteBatch {
		return Config{}, fmt.Errorf("%w: JANITOR_BATCH_SIZE must be an integer from 1 to %d", ErrInvalid, store.MaxDeleteBatch)
	}
	c.BatchSize = n
	r, err := strconv.Atoi(rate)
	if err != nil || r < 0 || r > maxRowsPerSecond {
		return Config{}, fmt.Errorf("%w: JANITOR_MAX_ROWS_PER_SECOND must be an integer from 0 (no cap) to %d", ErrInvalid, maxRowsPerSecond)
	}
	c.MaxRowsPerSecond = r
	switch c.WALCompression {
	case WALCompressionServer, "off", "pglz", "lz4", "zstd":
	default:
		return Config{}, fmt.Errorf("%w: JANITOR_WAL_COMPRESSION must be off, pglz, lz4, zstd or server", ErrInvalid)
	}
	if c.PushgatewayURL != "" {
		u, err := url.Parse(c.PushgatewayURL)
		// The URL is not echoed: it may carry basic-auth credentials.
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return Config{}, fmt.Errorf("%w: PUSHGATEWAY_URL must be an http or https URL", ErrInvalid)
		}
	}
	if _, err := envflag.ParseLogLevel(c.LogLevel); err != nil {
		return Config{}, err
	}
	return c, nil
}

func positiveDuration(name, v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%w: %s must be a positive Go duration such as 10m", ErrInvalid, name)
	}
	return d, nil
}
