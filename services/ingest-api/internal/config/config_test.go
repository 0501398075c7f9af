package config

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestDefaults(t *testing.T) {
	c, err := Load(nil, env(map[string]string{"DATABASE_URL": "postgres://x"}), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		DatabaseURL: "postgres://x", IngestAddr: ":8080", MetricsAddr: ":9090",
		PayloadRetention: 2160 * time.Hour, ReplayWindow: 2160 * time.Hour, MaxSequenceAhead: 1024,
		SyncLimitTokens: 100, SyncLimitInterval: time.Second, PeerLimitTokens: 1000, PeerLimitInterval: time.Second,
		ShutdownGrace: 25 * time.Second, StoreTimeout: 10 * time.Second, DBMaxOpenConns: 32,
		CredentialCacheTTL: time.Second, GroupCommitMaxItems: 100, GroupCommitConcurrency: 8, LogLevel: "info",
		OutboundKeysReload: 5 * time.Second, MaxInflightBodyBytes: 64 << 20, OutboxLimitTokens: 100, OutboxLimitInterval: time.Second,
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("defaults:\n got %+v\nwant %+v", c, want)
	}
}

func TestEnvironmentAndFlagsMirror(t *testing.T) {
	e := env(map[string]string{
		"DATABASE_URL":                   "postgres://env",
		"INGEST_ADDR":                    ":1111",
		"SYNC_LIMIT_TOKENS":              "7",
		"SYNC_LIMIT_INTERVAL":            "2m",
		"PEER_LIMIT_TOKENS":              "9",
		"REPLAY_WINDOW":                  "48h",
		"MAX_SEQUENCE_AHEAD":             "5",
		"INGEST_MAX_INFLIGHT_BODY_BYTES": "8388608",
	})
	c, err := Load([]string{"--ingest-addr", ":2222", "--peer-limit-interval=3s", "--payload-retention", "1h", "--shutdown-grace", "4s"}, e, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.IngestAddr != ":2222" {
		t.Errorf("flag did not win over env: %q", c.IngestAddr)
	}
	if c.DatabaseURL != "postgres://env" || c.SyncLimitTokens != 7 || c.SyncLimitInterval != 2*time.Minute ||
		c.PeerLimitTokens != 9 || c.PeerLimitInterval != 3*time.Second || c.ReplayWindow != 48*time.Hour ||
		c.MaxSequenceAhead != 5 || c.MaxInflightBodyBytes != 8<<20 || c.PayloadRetention != time.Hour || c.ShutdownGrace != 4*time.Second {
		t.Errorf("unexpected config %+v", c)
	}
}

func TestHelpListsEveryVariableAndHidesDSN(t *testing.T) {
	var out bytes.Buffer
	_, err := Load([]string{"-h"}, env(map[string]string{"DATABASE_URL": "postgres://u:hunter2@h/db"}), &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v, want flag.ErrHelp", err)
	}
	text := out.String()
	for _, name := range []string{"DATABASE_URL", "INGEST_ADDR", "METRICS_ADDR", "OUTBOUND_SIGNING_KEYS_FILE",
		"PAYLOAD_RETENTION", "SYNC_LIMIT_TOKENS", "SYNC_LIMIT_INTERVAL", "PEER_LIMIT_TOKENS", "PEER_LIMIT_INTERVAL",
		"REPLAY_WINDOW", "MAX_SEQUENCE_AHEAD", "SHUTDOWN_GRACE", "OUTBOUND_SIGNING_KEYS_RELOAD_INTERVAL",
		"INGEST_MAX_INFLIGHT_BODY_BYTES", "OUTBOX_LIMIT_TOKENS", "OUTBOX_LIMIT_INTERVAL", "TRUSTED_PROXIES"} {
		flagName := "-" + strings.ReplaceAll(strings.ToLower(name), "_", "-")
		if !strings.Contains(text, "env "+name+")") || !strings.Contains(text, flagName) {
			t.Errorf("-h does not document %s / %s", name, flagName)
		}
	}
	if strings.Contains(text, "hunter2") {
		t.Error("-h printed the database password")
	}
}

func TestRefusals(t *testing.T) {
	base := map[string]string{"DATABASE_URL": "postgres://x"}
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"missing dsn", map[string]string{}, nil, "DATABASE_URL is required"},
		{"bad duration", map[string]string{"PAYLOAD_RETENTION": "90d"}, nil, "PAYLOAD_RETENTION"},
		{"zero retention", map[string]string{"PAYLOAD_RETENTION": "0s"}, nil, "PAYLOAD_RETENTION"},
		{"negative tokens", map[string]string{"SYNC_LIMIT_TOKENS": "-1"}, nil, "SYNC_LIMIT_TOKENS"},
		{"zero tokens", nil, []string{"--peer-limit-tokens", "0"}, "PEER_LIMIT_TOKENS"},
		{"zero interval", map[string]string{"SYNC_LIMIT_INTERVAL": "0s"}, nil, "SYNC_LIMIT_INTERVAL"},
		{"ahead", map[string]string{"MAX_SEQUENCE_AHEAD": "0"}, nil, "MAX_SEQUENCE_AHEAD"},
		{"cache ttl", map[string]string{"CREDENTIAL_CACHE_TTL": "3s"}, nil, "CREDENTIAL_CACHE_TTL"},
		{"inflight at the body limit", map[string]string{"INGEST_MAX_INFLIGHT_BODY_BYTES": "1048576"}, nil, "INGEST_MAX_INFLIGHT_BODY_BYTES"},
		{"inflight flag not a number", nil, []string{"--ingest-max-inflight-body-bytes", "64MiB"}, "ingest-max-inflight-body-bytes"},
		{"log level", map[string]string{"LOG_LEVEL": "loud"}, nil, "LOG_LEVEL"},
		{"unknown flag", nil, []string{"--nope"}, "nope"},
		{"stray arg", nil, []string{"extra"}, "unexpected argument"},
		{"tokens above the range", map[string]string{"PEER_LIMIT_TOKENS": "1000001"}, nil, "PEER_LIMIT_TOKENS/PEER_LIMIT_INTERVAL: limiter: invalid policy: tokens must be between 1 and 1000000, not 1000001"},
		{"interval below 1ms", map[string]string{"SYNC_LIMIT_INTERVAL": "999us"}, nil, "SYNC_LIMIT_TOKENS/SYNC_LIMIT_INTERVAL: limiter: invalid policy: interval must be at least 1ms"},
		{"outbox tokens", map[string]string{"OUTBOX_LIMIT_TOKENS": "0"}, nil, "OUTBOX_LIMIT_TOKENS/OUTBOX_LIMIT_INTERVAL: limiter: invalid policy: tokens must be between 1 and 1000000, not 0"},
		{"outbox interval", nil, []string{"--outbox-limit-interval", "0s"}, "OUTBOX_LIMIT_TOKENS/OUTBOX_LIMIT_INTERVAL"},
		{"outbox inherits a bad sync interval", map[string]string{"SYNC_LIMIT_INTERVAL": "1us", "SYNC_LIMIT_TOKENS": "5"}, nil, "SYNC_LIMIT_TOKENS/SYNC_LIMIT_INTERVAL"},
		{"trusted proxy without prefix length", map[string]string{"TRUSTED_PROXIES": "10.0.0.0/8,127.0.0.1"}, nil, `TRUSTED_PROXIES: limiter: invalid trusted proxies: "127.0.0.1" is not a CIDR prefix`},
		{"trusted proxy flag", nil, []string{"--trusted-proxies", "10.0.0.0/40"}, "trusted-proxies"},
		{"keys reload", map[string]string{"OUTBOUND_SIGNING_KEYS_RELOAD_INTERVAL": "0s"}, nil, "OUTBOUND_SIGNING_KEYS_RELOAD_INTERVAL"},
		{"missing keys file", map[string]string{"OUTBOUND_SIGNING_KEYS_FILE": filepath.Join(t.TempDir(), "absent.json")}, nil, "OUTBOUND_SIGNING_KEYS_FILE"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := map[string]string{}
			if tc.name != "missing dsn" {
				for k, v := range base {
					m[k] = v
				}
			}
			for k, v := range tc.env {
				m[k] = v
			}
			_, err := Load(tc.args, env(m), &bytes.Buffer{})
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid mentioning %q", err, tc.want)
			}
		})
	}
}

func TestSigningKeysFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.json", `{"tenant-a":{"key_id":"out-1","seed":"KIO_S0ew6MPXybUvdYSrK6jI_JnEzWWHZBdQVXXv1ZE"}}`)
	notJSON := write("bad.json", `secret-seed-material`)
	shortSeed := write("short.json", `{"tenant-a":{"key_id":"out-1","seed":"AAAA"}}`)
	base := map[string]string{"DATABASE_URL": "postgres://x"}
	base["OUTBOUND_SIGNING_KEYS_FILE"] = good
	if _, err := Load(nil, env(base), &bytes.Buffer{}); err != nil {
		t.Fatalf("good file refused: %v", err)
	}
	for _, p := range []string{notJSON, shortSeed} {
		base["OUTBOUND_SIGNING_KEYS_FILE"] = p
		_, err := Load(nil, env(base), &bytes.Buffer{})
		if !errors.Is(err, ErrInvalid) {
			t.Fatalf("%s: err = %v, want ErrInvalid", p, err)
		}
		if strings.Contains(err.Error(), "secret-seed-material") {
			t.Fatal("error message quotes the secret file")
		}
	}
}

func TestLimiterPoliciesInTheContractRangeStart(t *testing.T) {
	for _, tokens := range []string{"1", "31623", "100000", "1000000"} {
		for _, interval := range []string{"1ms", "1s", "1h", "720h"} {
			c, err := Load(nil, env(map[string]string{"DATABASE_URL": "postgres://x",
				"PEER_LIMIT_TOKENS": tokens, "PEER_LIMIT_INTERVAL": interval,
				"SYNC_LIMIT_TOKENS": tokens, "SYNC_LIMIT_INTERVAL": interval}), &bytes.Buffer{})
			if err != nil {
				t.Fatalf("%s per %s: %v", tokens, interval, err)
			}
			if c.OutboxLimitTokens != c.SyncLimitTokens {
				t.Fatalf("outbox tokens %d, want the sync limiter's %d", c.OutboxLimitTokens, c.SyncLimitTokens)
			}
		}
	}
}

func TestOutboxLimitFollowsSyncUnlessSet(t *testing.T) {
	load := func(e map[string]string, args ...string) Config {
		t.Helper()
		e["DATABASE_URL"] = "postgres://x"
		c, err := Load(args, env(e), &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := load(map[string]string{"SYNC_LIMIT_TOKENS": "7", "SYNC_LIMIT_INTERVAL": "2m"})
	if c.OutboxLimitTokens != 7 || c.OutboxLimitInterval != 2*time.Minute {
		t.Errorf("unset: outbox %d per %v, want the sync limiter's 7 per 2m", c.OutboxLimitTokens, c.OutboxLimitInterval)
	}
	c = load(map[string]string{"SYNC_LIMIT_TOKENS": "7", "SYNC_LIMIT_INTERVAL": "2m", "OUTBOX_LIMIT_TOKENS": "3"})
	if c.OutboxLimitTokens != 3 || c.OutboxLimitInterval != 2*time.Minute {
		t.Errorf("tokens set: outbox %d per %v, want 3 per 2m", c.OutboxLimitTokens, c.OutboxLimitInterval)
	}
	c = load(map[string]string{"SYNC_LIMIT_TOKENS": "7"}, "--outbox-limit-interval", "1h", "--sync-limit-tokens", "8")
	if c.SyncLimitTokens != 8 || c.OutboxLimitTokens != 8 || c.OutboxLimitInterval != time.Hour {
		t.Errorf("flags: outbox %d per %v (sync %d), want 8 per 1h", c.OutboxLimitTokens, c.OutboxLimitInterval, c.SyncLimitTokens)
	}
	var out bytes.Buffer
	if _, err := Load([]string{"-h"}, env(map[string]string{}), &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(out.String(), "\n") {
		if strings.Contains(line, "panic") || (strings.Contains(line, "OUTBOX_LIMIT") && strings.Contains(line, "(default ")) {
			t.Errorf("-h: %q (an inherited setting has no default of its own)", line)
		}
	}
}

func TestTrustedProxies(t *testing.T) {
	c, err := Load([]string{"--trusted-proxies", "10.0.0.0/8, fd00::/8"}, env(map[string]string{"DATABASE_URL": "postgres://x", "TRUSTED_PROXIES": "192.0.2.0/24"}), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.TrustedProxies.String(); got != "10.0.0.0/8,fd00::/8" {
		t.Fatalf("TrustedProxies = %q, want the flag's list", got)
	}
	c, err = Load(nil, env(map[string]string{"DATABASE_URL": "postgres://x"}), &bytes.Buffer{})
	if err != nil || !c.TrustedProxies.Empty() {
		t.Fatalf("default TrustedProxies = %q, %v; want none", c.TrustedProxies.String(), err)
	}
}
