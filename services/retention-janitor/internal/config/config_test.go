package config

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestLoadConfigDefaults(t *testing.T) {
	c, err := Load(nil, envOf(map[string]string{"DATABASE_URL": "postgres://j@db/x"}), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := Config{DatabaseURL: "postgres://j@db/x", Timeout: 10 * time.Minute, BatchSize: 100, MaxRowsPerSecond: 10_000, WALCompression: "lz4", PushTimeout: 10 * time.Second, LogLevel: "info"}
	if c != want {
		t.Fatalf("config = %+v, want %+v", c, want)
	}
}

func TestLoadConfigEnvAndFlags(t *testing.T) {
	env := envOf(map[string]string{
		"DATABASE_URL":                "postgres://env@db/x",
		"JANITOR_TIMEOUT":             "90s",
		"JANITOR_BATCH_SIZE":          "250",
		"JANITOR_MAX_ROWS_PER_SECOND": "2500",
		"JANITOR_WAL_COMPRESSION":     "pglz",
		"PUSHGATEWAY_URL":             "http://pushgateway:9091",
		"PUSHGATEWAY_TIMEOUT":         "3s",
		"LOG_LEVEL":                   "warn",
	})
	c, err := Load(nil, env, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := Config{DatabaseURL: "postgres://env@db/x", Timeout: 90 * time.Second, BatchSize: 250, MaxRowsPerSecond: 2_500, WALCompression: "pglz", PushgatewayURL: "http://pushgateway:9091", PushTimeout: 3 * time.Second, LogLevel: "warn"}
	if c != want {
		t.Fatalf("env config = %+v, want %+v", c, want)
	}
	// A flag wins over its environment variable; both dash forms work.
	c, err = Load([]string{"--janitor-timeout", "2m", "-janitor-batch-size=7", "--janitor-max-rows-per-second", "0", "--janitor-wal-compression", "server", "--database-url", "postgres://flag@db/x", "--pushgateway-url="}, env, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want = Config{DatabaseURL: "postgres://flag@db/x", Timeout: 2 * time.Minute, BatchSize: 7, MaxRowsPerSecond: 0, WALCompression: "server", PushTimeout: 3 * time.Second, LogLevel: "warn"}
	if c != want {
		t.Fatalf("flag config = %+v, want %+v", c, want)
	}
}

func TestLoadConfigHelpListsEverySetting(t *testing.T) {
	var out bytes.Buffer
	_, err := Load([]string{"-h"}, envOf(map[string]string{"DATABASE_URL": "postgres://j:pw-help-secret@db/x"}), &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v, want flag.ErrHelp", err)
	}
	for _, name := range []string{"-database-url", "-janitor-timeout", "-janitor-batch-size", "-pushgateway-url", "-pushgateway-timeout", "-log-level",
		"DATABASE_URL", "JANITOR_TIMEOUT", "JANITOR_BATCH_SIZE", "JANITOR_MAX_ROWS_PER_SECOND", "JANITOR_WAL_COMPRESSION", "PUSHGATEWAY_URL"} {
		if !strings.Contains(out.String(), name) {
			t.Errorf("-h output lacks %q:\n%s", name, out.String())
		}
	}
	// Defaults shown are the documented ones, never the environment's.
	if strings.Contains(out.String(), "pw-help-secret") {
		t.Fatalf("-h printed the DATABASE_URL from the environment:\n%s", out.String())
	}
	if !strings.Contains(out.String(), `default 10m0s`) {
		t.Errorf("-h does not show the JANITOR_TIMEOUT default:\n%s", out.String())
	}
}

func TestLoadConfigRefusals(t *testing.T) {
	base := map[string]string{"DATABASE_URL": "postgres://j:pw-secret@db/x"}
	cases := []struct {
		name    string
		env     map[string]string
		args    []string
		mention string
	}{
		{"no database url", map[string]string{}, nil, "DATABASE_URL is required"},
		{"timeout not a duration", map[string]string{"JANITOR_TIMEOUT": "ten minutes"}, nil, "JANITOR_TIMEOUT"},
		{"timeout zero", nil, []string{"--janitor-timeout", "0s"}, "JANITOR_TIMEOUT"},
		{"timeout negative", map[string]string{"JANITOR_TIMEOUT": "-1m"}, nil, "JANITOR_TIMEOUT"},
		{"batch zero", map[string]string{"JANITOR_BATCH_SIZE": "0"}, nil, "JANITOR_BATCH_SIZE"},
		{"batch above contract", map[string]string{"JANITOR_BATCH_SIZE": "1001"}, nil, "JANITOR_BATCH_SIZE"},
		{"batch not a number", nil, []string{"--janitor-batch-size", "many"}, "JANITOR_BATCH_SIZE"},
		{"rate negative", map[string]string{"JANITOR_MAX_ROWS_PER_SECOND": "-1"}, nil, "JANITOR_MAX_ROWS_PER_SECOND"},
		{"rate not a number", nil, []string{"--janitor-max-rows-per-second", "fast"}, "JANITOR_MAX_ROWS_PER_SECOND"},
		{"rate too high", map[string]string{"JANITOR_MAX_ROWS_PER_SECOND": "1000001"}, nil, "JANITOR_MAX_ROWS_PER_SECOND"},
		{"wal compression unknown", map[string]string{"JANITOR_WAL_COMPRESSION": "gzip"}, nil, "JANITOR_WAL_COMPRESSION"},
		{"wal compression on", nil, []string{"--janitor-wal-compression", "on"}, "JANITOR_WAL_COMPRESSION"},
		{"wal compression empty flag", nil, []string{"--janitor-wal-compression="}, "JANITOR_WAL_COMPRESSION"},
		{"pushgateway scheme", map[string]string{"PUSHGATEWAY_URL": "ftp://u:pw-push@gw"}, nil, "PUSHGATEWAY_URL"},
		{"pushgateway no host", map[string]string{"PUSHGATEWAY_URL": "http://"}, nil, "PUSHGATEWAY_URL"},
		{"push timeout", map[string]string{"PUSHGATEWAY_TIMEOUT": "soon"}, nil, "PUSHGATEWAY_TIMEOUT"},
		{"log level", map[string]string{"LOG_LEVEL": "loud"}, nil, "LOG_LEVEL"},
		{"stray argument", nil, []string{"run"}, "unexpected argument"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{}
			if tc.name != "no database url" {
				for k, v := range base {
					env[k] = v
				}
			}
			for k, v := range tc.env {
				env[k] = v
			}
			_, err := Load(tc.args, envOf(env), &bytes.Buffer{})
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("error %q does not mention %q", err, tc.mention)
			}
			if strings.Contains(err.Error(), "pw-") {
				t.Errorf("error %q echoes a credential", err)
			}
		})
	}
	if _, err := Load([]string{"--no-such-flag"}, envOf(base), &bytes.Buffer{}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("unknown flag: %v, want ErrInvalid", err)
	}
	// The Pushgateway URL can hold credentials: -h shows none from the
	// environment either.
	var out bytes.Buffer
	if _, err := Load([]string{"-h"}, envOf(map[string]string{"PUSHGATEWAY_URL": "https://u:pw-gw@gw"}), &out); !errors.Is(err, flag.ErrHelp) ||
		strings.Contains(out.String(), "pw-gw") {
		t.Fatalf("-h: %v\n%s", err, out.String())
	}
}
