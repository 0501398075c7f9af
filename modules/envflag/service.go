package envflag

import (
	"fmt"
	"io"
	"log/slog"
	"time"
)

// Service is the settings ingest-api and delivery-worker both have, under the
// same names and rules; each config checks them with Validate and keeps its
// own help lines and defaults.
type Service struct {
	DatabaseURL    string        // DATABASE_URL, required
	MetricsAddr    string        // METRICS_ADDR, not empty
	ShutdownGrace  time.Duration // SHUTDOWN_GRACE, positive
	StoreTimeout   time.Duration // STORE_TIMEOUT, positive
	DBMaxOpenConns int           // DB_MAX_OPEN_CONNS, at least 1
	LogLevel       string        // LOG_LEVEL, as ParseLogLevel
}

// Validate is the rule of every Service setting, in the order above; the
// error wraps ErrInvalid and names the first setting that breaks its rule.
func (s Service) Validate() error {
	for _, r := range []struct {
		broken    bool
		name, why string
	}{
		{s.DatabaseURL == "", "DATABASE_URL", "is required"},
		{s.MetricsAddr == "", "METRICS_ADDR", "is empty"},
		{s.ShutdownGrace <= 0, "SHUTDOWN_GRACE", "must be positive"},
		{s.StoreTimeout <= 0, "STORE_TIMEOUT", "must be positive"},
		{s.DBMaxOpenConns < 1, "DB_MAX_OPEN_CONNS", "must be at least 1"},
	} {
		if r.broken {
			return fmt.Errorf("%w: %s %s", ErrInvalid, r.name, r.why)
		}
	}
	_, err := ParseLogLevel(s.LogLevel)
	return err
}

// Logger is every binary's logger: JSON lines on w at LOG_LEVEL. level is a
// value the binary's config already checked with ParseLogLevel; one it did
// not accept logs at info.
func Logger(w io.Writer, level string) *slog.Logger {
	l, err := ParseLogLevel(level)
	if err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l}))
}
