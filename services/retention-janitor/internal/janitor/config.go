package janitor

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"time"

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

// ErrConfig marks a configuration the janitor refuses to run with.
var ErrConfig = errors.New("invalid configuration")

type setting struct {
	env, usage string
	def        string
}

// LoadConfig reads the environment through getenv, then args. -h prints
// every setting to out and returns flag.ErrHelp.
func LoadConfig(args []string, getenv func(string) string, out io.Writer) (Config, error) {
	settings := []setting{
		{"DATABASE_URL", "PostgreSQL URL for the envelopeworker_janitor role (required)", ""},
		{"JANITOR_TIMEOUT", "Go duration bounding one cycle of deletes", DefaultTimeout.String()},
		{"JANITOR_BATCH_SIZE", "rows deleted per batch (inbound payloads, outbound bodies, attempt rows), 1-1000", strconv.Itoa(DefaultBatchSize)},
		{"JANITOR_MAX_ROWS_PER_SECOND", "average cap on payload rows deleted per second; 0: no cap", strconv.Itoa(DefaultMaxRowsPerSecond)},
		{"JANITOR_WAL_COMPRESSION", "wal_compression of the janitor's sessions: off, pglz, lz4, zstd, or server (the server's setting)", DefaultWALCompression},
		{"PUSHGATEWAY_URL", "Prometheus Pushgateway base URL; empty: metrics only in the summary log line", ""},
		{"PUSHGATEWAY_TIMEOUT", "Go duration bounding the metrics push", DefaultPushTimeout.String()},
		{"LOG_LEVEL", "debug, info, warn or error", "info"},
	}
	fs := flag.NewFlagSet("retention-janitor", flag.ContinueOnError)
	fs.SetOutput(out)
	// Flags are registered with the documented defaults, not the values
	// found in the environment: -h must not print a DATABASE_URL password.
	flags := make(map[string]*string, len(settings))
	for _, s := range settings {
		flags[s.env] = fs.String(flagName(s.env), s.def, s.usage+" (env "+s.env+")")
	}
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: retention-janitor [flags]\n\nDeletes expired inbound payloads once and exits. Every flag also reads the environment variable named after it; a flag given wins.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("%w: unexpected argument %q", ErrConfig, fs.Arg(0))
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	vals := make(map[string]*string, len(settings))
	for _, s := range settings {
		v := *flags[s.env]
		if env := getenv(s.env); env != "" && !given[flagName(s.env)] {
			v = env
		}
		vals[s.env] = &v
	}

	var c Config
	var err error
	c.DatabaseURL = *vals["DATABASE_URL"]
	if c.DatabaseURL == "" {
		return Config{}, fmt.Errorf("%w: DATABASE_URL is required", ErrConfig)
	}
	if c.Timeout, err = positiveDuration("JANITOR_TIMEOUT", *vals["JANITOR_TIMEOUT"]); err != nil {
		return Config{}, err
	}
	if c.PushTimeout, err = positiveDuration("PUSHGATEWAY_TIMEOUT", *vals["PUSHGATEWAY_TIMEOUT"]); err != nil {
		return Config{}, err
	}
	n, err := strconv.Atoi(*vals["JANITOR_BATCH_SIZE"])
	if err != nil || n < 1 || n > store.MaxDeleteBatch {
		return Config{}, fmt.Errorf("%w: JANITOR_BATCH_SIZE must be an integer from 1 to %d", ErrConfig, store.MaxDeleteBatch)
	}
	c.BatchSize = n
	rate, err := strconv.Atoi(*vals["JANITOR_MAX_ROWS_PER_SECOND"])
	if err != nil || rate < 0 || rate > maxRowsPerSecond {
		return Config{}, fmt.Errorf("%w: JANITOR_MAX_ROWS_PER_SECOND must be an integer from 0 (no cap) to %d", ErrConfig, maxRowsPerSecond)
	}
	c.MaxRowsPerSecond = rate
	c.WALCompression = *vals["JANITOR_WAL_COMPRESSION"]
	switch c.WALCompression {
	case WALCompressionServer, "off", "pglz", "lz4", "zstd":
	default:
		return Config{}, fmt.Errorf("%w: JANITOR_WAL_COMPRESSION must be off, pglz, lz4, zstd or server", ErrConfig)
	}
	c.PushgatewayURL = *vals["PUSHGATEWAY_URL"]
	if c.PushgatewayURL != "" {
		u, err := url.Parse(c.PushgatewayURL)
		// The URL is not echoed: it may carry basic-auth credentials.
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return Config{}, fmt.Errorf("%w: PUSHGATEWAY_URL must be an http or https URL", ErrConfig)
		}
	}
	c.LogLevel = *vals["LOG_LEVEL"]
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return Config{}, fmt.Errorf("%w: LOG_LEVEL must be debug, info, warn or error", ErrConfig)
	}
	return c, nil
}

func positiveDuration(name, v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%w: %s must be a positive Go duration such as 10m", ErrConfig, name)
	}
	return d, nil
}

// flagName maps FOO_BAR to foo-bar.
func flagName(env string) string {
	b := []byte(env)
	for i, c := range b {
		switch {
		case c == '_':
			b[i] = '-'
		case c >= 'A' && c <= 'Z':
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
