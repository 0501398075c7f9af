package envflag

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestServiceValidate(t *testing.T) {
	good := Service{DatabaseURL: "postgres://x", MetricsAddr: ":9090", ShutdownGrace: time.Second,
		StoreTimeout: time.Second, DBMaxOpenConns: 1, LogLevel: "warn"}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid settings: %v", err)
	}
	cases := []struct {
		name   string
		change func(*Service)
		want   string
	}{
		{"no database", func(s *Service) { s.DatabaseURL = "" }, "DATABASE_URL is required"},
		{"no metrics address", func(s *Service) { s.MetricsAddr = "" }, "METRICS_ADDR is empty"},
		{"zero grace", func(s *Service) { s.ShutdownGrace = 0 }, "SHUTDOWN_GRACE must be positive"},
		{"negative store timeout", func(s *Service) { s.StoreTimeout = -time.Second }, "STORE_TIMEOUT must be positive"},
		{"no connections", func(s *Service) { s.DBMaxOpenConns = 0 }, "DB_MAX_OPEN_CONNS must be at least 1"},
		{"log level", func(s *Service) { s.LogLevel = "INFO" }, "LOG_LEVEL must be debug, info, warn or error"},
		{"first broken rule", func(s *Service) { s.StoreTimeout, s.LogLevel = 0, "" }, "STORE_TIMEOUT"},
	}
	for _, c := range cases {
		s := good
		c.change(&s)
		err := s.Validate()
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrInvalid naming %q", c.name, err, c.want)
		}
	}
}

func TestLogger(t *testing.T) {
	var buf bytes.Buffer
	log := Logger(&buf, "warn")
	log.Info("hidden")
	log.Warn("shown")
	if out := buf.String(); strings.Contains(out, "hidden") || !strings.Contains(out, `"msg":"shown"`) {
		t.Fatalf("warn logger wrote %q", out)
	}
	buf.Reset()
	Logger(&buf, "loud").Debug("hidden")
	Logger(&buf, "loud").Info("shown")
	if out := buf.String(); strings.Contains(out, "hidden") || !strings.Contains(out, `"level":"INFO"`) {
		t.Fatalf("unchecked level logged %q, want info", out)
	}
}
