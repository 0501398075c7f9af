package config

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const goodSecrets = `{"ep":["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]}`

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secrets.json")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func base(t *testing.T) map[string]string {
	return map[string]string{
		"DATABASE_URL":         "postgres://u:hunter2@db/x",
		"WEBHOOK_SECRETS_FILE": writeFile(t, goodSecrets),
	}
}

func TestDefaults(t *testing.T) {
	c, err := Load(nil, envOf(base(t)), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.MetricsAddr != ":9090" || c.Lease != 30*time.Second || c.BackoffBase != time.Second ||
		c.BackoffMax != 10*time.Minute || c.HTTPTimeout != 10*time.Second || c.AllowInsecureLoopback ||
		c.ClaimSize != 100 || c.ShutdownGrace <= 0 || c.OutboxPayloadRetention != 2160*time.Hour {
		t.Fatalf("defaults %+v", c)
	}
}

func TestFlagsMirrorEnvAndWin(t *testing.T) {
	env := base(t)
	env["DELIVERY_LEASE"] = "1m"
	env["DELIVERY_ALLOW_INSECURE_LOOPBACK"] = "true"
	env["DELIVERY_CONCURRENCY"] = "4"
	env["OUTBOX_PAYLOAD_RETENTION"] = "720h"
	c, err := Load([]string{"--delivery-lease", "2m", "--delivery-http-timeout=20s", "--delivery-limit-tokens", "7",
		"--delivery-limit-interval", "2s", "--outbox-payload-retention", "48h"}, envOf(env), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Lease != 2*time.Minute || c.HTTPTimeout != 20*time.Second || !c.AllowInsecureLoopback || c.Concurrency != 4 ||
		c.LimitTokens != 7 || c.LimitInterval != 2*time.Second || c.OutboxPayloadRetention != 48*time.Hour {
		t.Fatalf("config %+v", c)
	}
	c, err = Load([]string{"--delivery-allow-insecure-loopback"}, envOf(base(t)), &bytes.Buffer{})
	if err != nil || !c.AllowInsecureLoopback {
		t.Fatalf("bare bool flag: %v %v", c.AllowInsecureLoopback, err)
	}
}

func TestHelpListsEverySettingAndHidesTheDSN(t *testing.T) {
	var out bytes.Buffer
	_, err := Load([]string{"-h"}, envOf(base(t)), &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err %v", err)
	}
	for _, name := range []string{"DATABASE_URL", "METRICS_ADDR", "WEBHOOK_SECRETS_FILE", "DELIVERY_LEASE",
		"DELIVERY_BACKOFF_BASE", "DELIVERY_BACKOFF_MAX", "DELIVERY_HTTP_TIMEOUT", "DELIVERY_ALLOW_INSECURE_LOOPBACK",
		"DELIVERY_CONCURRENCY", "DELIVERY_TENANT_MAX_INFLIGHT", "-delivery-tenant-max-inflight", "DELIVERY_LIMIT_TOKENS", "DELIVERY_LIMIT_INTERVAL", "SHUTDOWN_GRACE",
		"-delivery-allow-insecure-loopback", "-webhook-secrets-file", "OUTBOX_PAYLOAD_RETENTION", "-outbox-payload-retention"} {
		if !strings.Contains(out.String(), name) {
			t.Errorf("-h does not mention %s", name)
		}
	}
	if strings.Contains(out.String(), "hunter2") {
		t.Fatal("-h printed the DSN")
	}
}

func TestRefusals(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"no database", map[string]string{"DATABASE_URL": ""}, nil, "DATABASE_URL is required"},
		{"no secrets file", map[string]string{"WEBHOOK_SECRETS_FILE": ""}, nil, "WEBHOOK_SECRETS_FILE is required"},
		{"missing secrets file", map[string]string{"WEBHOOK_SECRETS_FILE": "/nonexistent/secrets.json"}, nil, "WEBHOOK_SECRETS_FILE"},
		{"bad duration", map[string]string{"DELIVERY_LEASE": "soon"}, nil, "DELIVERY_LEASE: not a Go duration"},
		{"zero lease", map[string]string{"DELIVERY_LEASE": "0s"}, nil, "DELIVERY_LEASE must be positive"},
		{"long lease", map[string]string{"DELIVERY_LEASE": "2h"}, nil, "DELIVERY_LEASE"},
		{"max below base", map[string]string{"DELIVERY_BACKOFF_BASE": "1m", "DELIVERY_BACKOFF_MAX": "30s"}, nil, "DELIVERY_BACKOFF_MAX"},
		{"zero base", map[string]string{"DELIVERY_BACKOFF_BASE": "0s"}, nil, "DELIVERY_BACKOFF_BASE"},
		{"concurrency", map[string]string{"DELIVERY_CONCURRENCY": "0"}, nil, "DELIVERY_CONCURRENCY"},
		{"tenant share zero", map[string]string{"DELIVERY_TENANT_MAX_INFLIGHT": "0"}, nil, "DELIVERY_TENANT_MAX_INFLIGHT must be between 1 and DELIVERY_CONCURRENCY"},
		{"tenant share negative", nil, []string{"--delivery-tenant-max-inflight", "-3"}, "DELIVERY_TENANT_MAX_INFLIGHT must be between"},
		{"tenant share above concurrency", map[string]string{"DELIVERY_CONCURRENCY": "16", "DELIVERY_TENANT_MAX_INFLIGHT": "17"}, nil, "DELIVERY_TENANT_MAX_INFLIGHT must be between 1 and DELIVERY_CONCURRENCY"},
		{"tenant share above default concurrency", nil, []string{"--delivery-tenant-max-inflight=201"}, "DELIVERY_TENANT_MAX_INFLIGHT"},
		{"tenant share not a number", map[string]string{"DELIVERY_TENANT_MAX_INFLIGHT": "half"}, nil, "DELIVERY_TENANT_MAX_INFLIGHT: not an integer"},
		{"claim size", nil, []string{"--delivery-claim-size", "101"}, "DELIVERY_CLAIM_SIZE"},
		{"tokens", map[string]string{"DELIVERY_LIMIT_TOKENS": "0"}, nil, "DELIVERY_LIMIT_TOKENS"},
		{"negative tokens", map[string]string{"DELIVERY_LIMIT_TOKENS": "-1"}, nil, "not a non-negative integer"},
		{"interval", map[string]string{"DELIVERY_LIMIT_INTERVAL": "0s"}, nil, "DELIVERY_LIMIT_INTERVAL"},
		{"interval under 1ms", map[string]string{"DELIVERY_LIMIT_INTERVAL": "999us"}, nil, "DELIVERY_LIMIT_INTERVAL"},
		{"tokens over 1,000,000", map[string]string{"DELIVERY_LIMIT_TOKENS": "1000001"}, nil, "DELIVERY_LIMIT_TOKENS"},
		{"bool", map[string]string{"DELIVERY_ALLOW_INSECURE_LOOPBACK": "yes please"}, nil, "not true or false"},
		{"grace", map[string]string{"SHUTDOWN_GRACE": "0s"}, nil, "SHUTDOWN_GRACE"},
		{"log level", map[string]string{"LOG_LEVEL": "loud"}, nil, "LOG_LEVEL"},
		{"retention not a duration", map[string]string{"OUTBOX_PAYLOAD_RETENTION": "90d"}, nil, "OUTBOX_PAYLOAD_RETENTION: not a Go duration"},
		{"retention zero", map[string]string{"OUTBOX_PAYLOAD_RETENTION": "0s"}, nil, "OUTBOX_PAYLOAD_RETENTION must be between 1s and 87600h"},
		{"retention negative", nil, []string{"--outbox-payload-retention=-1h"}, "OUTBOX_PAYLOAD_RETENTION must be between"},
		{"retention under a second", map[string]string{"OUTBOX_PAYLOAD_RETENTION": "500ms"}, nil, "OUTBOX_PAYLOAD_RETENTION"},
		{"retention over ten years", map[string]string{"OUTBOX_PAYLOAD_RETENTION": "87601h"}, nil, "OUTBOX_PAYLOAD_RETENTION"},
		{"unknown flag", nil, []string{"--nope"}, "invalid configuration"},
		{"extra argument", nil, []string{"extra"}, "unexpected argument"},
	}
	for _, c := range cases {
		env := base(t)
		for k, v := range c.env {
			env[k] = v
		}
		_, err := Load(c.args, envOf(env), &bytes.Buffer{})
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrInvalid mentioning %q", c.name, err, c.want)
		}
	}
}

// The tenant share defaults to a quarter of the concurrency (at least 1),
// follows a concurrency given by flag or environment, and a given share
// (up to and including the concurrency: no bound) wins, flag over env.
func TestTenantMaxInflight(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		args []string
		want int
	}{
		{nil, nil, 50}, // DELIVERY_CONCURRENCY 200
		{map[string]string{"DELIVERY_CONCURRENCY": "16"}, nil, 4},
		{map[string]string{"DELIVERY_CONCURRENCY": "10"}, nil, 2},
		{map[string]string{"DELIVERY_CONCURRENCY": "3"}, nil, 1},
		{nil, []string{"--delivery-concurrency", "1"}, 1},
		{map[string]string{"DELIVERY_CONCURRENCY": "16", "DELIVERY_TENANT_MAX_INFLIGHT": "16"}, nil, 16},
		{map[string]string{"DELIVERY_TENANT_MAX_INFLIGHT": "7"}, nil, 7},
		{map[string]string{"DELIVERY_TENANT_MAX_INFLIGHT": "7"}, []string{"--delivery-tenant-max-inflight", "9"}, 9},
	} {
		env := base(t)
		for k, v := range c.env {
			env[k] = v
		}
		cfg, err := Load(c.args, envOf(env), io.Discard)
		if err != nil {
			t.Fatalf("%v %v: %v", c.env, c.args, err)
		}
		if cfg.TenantMaxInflight != c.want {
			t.Errorf("%v %v: tenant max in flight %d, want %d", c.env, c.args, cfg.TenantMaxInflight, c.want)
		}
	}
}

func TestRefusesBadSecretsFileWithoutEchoingIt(t *testing.T) {
	env := base(t)
	env["WEBHOOK_SECRETS_FILE"] = writeFile(t, `{"ep":["whsec_c2hvcnRzZWNyZXQ="]}`)
	_, err := Load(nil, envOf(env), &bytes.Buffer{})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "shorter than 24") {
		t.Fatalf("short secret: %v", err)
	}
	if strings.Contains(err.Error(), "c2hvcnRzZWNyZXQ") {
		t.Fatal("error echoes the secret")
	}
}

// A lease too short for the HTTP timeout shortens the timeout (to 72% of the
// lease) instead of refusing to start: an attempt must end before 4/5 of it.
func TestLoadShortensTimeoutToFitLease(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want time.Duration
	}{
		{map[string]string{"DELIVERY_LEASE": "2s"}, 1440 * time.Millisecond},
		{map[string]string{"DELIVERY_LEASE": "10s", "DELIVERY_HTTP_TIMEOUT": "8s"}, 7200 * time.Millisecond},
		{map[string]string{"DELIVERY_LEASE": "10s", "DELIVERY_HTTP_TIMEOUT": "7s"}, 7 * time.Second},
	} {
		env := base(t)
		for k, v := range c.env {
			env[k] = v
		}
		cfg, err := Load(nil, envOf(env), io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", c.env, err)
		}
		if cfg.HTTPTimeout != c.want {
			t.Fatalf("%v: HTTP timeout %v, want %v", c.env, cfg.HTTPTimeout, c.want)
		}
	}
}
